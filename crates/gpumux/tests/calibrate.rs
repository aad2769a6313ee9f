//! `gpumux calibrate` against the simulator itself: the fit must recover the parameters the
//! workload gave (block time, spread, memory intensity where it is identifiable alone, the
//! link), find no launch or preemption overhead, and the calibrated prediction must match
//! the plain simulator run (issue 42). Deterministic: the simulator and its seed.

mod common;

use common::{gpumux, stderr, temp_dir};

const WORKLOAD: &str = r#"
name = "calib-test"

[kernels.stream]
grid = 2600
block = 256
regs_per_thread = 16
block_time_us = 20.0
block_time_spread = 0.1
mem_intensity = 0.8

[kernels.compute]
grid = 260
block = 128
regs_per_thread = 32
block_time_us = 50.0
block_time_spread = 0.2
mem_intensity = 0.1

[kernels.short]
grid = 13
block = 64
regs_per_thread = 16
block_time_us = 5.0

[[process]]
name = "a"
[[process.op]]
kind = "h2d"
mb = 4
[[process.op]]
kind = "kernel"
kernel = "stream"
launches = 5
[[process.op]]
kind = "d2h"
mb = 1

[[process]]
name = "b"
priority = 1
[[process.op]]
kind = "kernel"
kernel = "compute"
launches = 3

[[process]]
name = "c"
arrival_us = 100
[[process.op]]
kind = "kernel"
kernel = "short"
launches = 20
"#;

fn kernel<'a>(cal: &'a toml::Value, name: &str) -> &'a toml::Value {
    cal["kernel"].as_array().expect("[[kernel]]").iter().find(|k| k["name"].as_str() == Some(name)).expect(name)
}

fn f(v: &toml::Value, key: &str) -> f64 {
    v.get(key).and_then(|x| x.as_float()).unwrap_or_else(|| panic!("{key} in {v}"))
}

fn close(got: f64, want: f64, tol: f64, what: &str) {
    assert!((got - want).abs() <= tol, "{what}: got {got}, want {want} ± {tol}");
}

#[test]
fn calibrating_the_simulator_against_itself_recovers_the_workload_and_its_predictions() {
    let dir = temp_dir("calibrate");
    let w = dir.path().join("w.toml");
    std::fs::write(&w, WORKLOAD).expect("write the workload");
    let cal_path = dir.path().join("cal.toml");
    let json = dir.path().join("compare.json");
    let (w_s, cal_s, json_s) =
        (w.to_str().expect("utf-8"), cal_path.to_str().expect("utf-8"), json.to_str().expect("utf-8"));
    let o = gpumux(&["calibrate", "--device", "sim:k20c", w_s, "-o", cal_s, "--compare", "--json", json_s]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("calibrated within 10%: ANTT 8 of 8, STP 8 of 8"), "{out}");

    let cal: toml::Value = toml::from_str(&std::fs::read_to_string(&cal_path).expect("the file")).expect("TOML");
    for (name, bt, spread) in [("stream", 20.0, 0.1), ("compute", 50.0, 0.2), ("short", 5.0, 0.0)] {
        let k = kernel(&cal, name);
        close(f(k, "block_time_us"), bt, bt * 0.02, &format!("{name} block time"));
        close(f(k, "block_time_spread"), spread, 0.03, &format!("{name} spread"));
    }
    // stream saturates DRAM alone on the K20c (m κ = 2): its intensity is measured. compute
    // does not (m κ = 0.25): the file's value is kept, and a note says why.
    close(f(kernel(&cal, "stream"), "mem_intensity"), 0.8, 0.05, "stream mem_intensity");
    let compute = kernel(&cal, "compute");
    close(f(compute, "mem_intensity"), 0.1, 1e-9, "compute mem_intensity");
    assert!(compute["notes"]
        .as_array()
        .is_some_and(|n| n.iter().any(|s| s.as_str().is_some_and(|s| s.contains("not identifiable")))));

    let d = &cal["device"];
    close(f(d, "h2d_gb_s"), 6.0, 0.06, "H2D bandwidth");
    close(f(d, "d2h_gb_s"), 6.0, 0.06, "D2H bandwidth");
    close(f(d, "link_latency_us"), 10.0, 0.5, "link latency");
    close(f(d, "launch_overhead_us"), 0.0, 1.0, "launch overhead");
    close(f(d, "preempt_overhead_us"), 0.0, 1.0, "preemption overhead");
    assert!(d.get("mechanism").is_none(), "the simulator keeps each policy's mechanism");
    assert!(d.get("release").is_none(), "the simulator gives SMs back as it always does");

    // The comparison: every policy within 3% on ANTT and STP.
    let c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("JSON");
    let rows = c["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 8);
    for r in rows {
        for i in 0..2 {
            let (dev, calib) = (r["device"][i].as_f64().expect("number"), r["calibrated"][i].as_f64().expect("number"));
            assert!(r["error"].is_null());
            assert!((calib / dev - 1.0).abs() < 0.03, "{}: {dev} vs {calib}", r["policy"]);
        }
    }

    // `run --calibration` gives the comparison's calibrated figures.
    let o = gpumux(&["run", w_s, "--device", "sim:k20c", "--calibration", cal_s, "--policy", "fcfs", "--json", "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let run: serde_json::Value = serde_json::from_slice(&o.stdout).expect("run JSON");
    let fcfs = rows.iter().find(|r| r["policy"] == "fcfs").expect("fcfs row");
    assert_eq!(run["policies"][0]["antt"], fcfs["calibrated"][0]);

    // The calibrated workload beside the file runs as it is.
    let cw = dir.path().join("cal.workload.toml");
    let o = gpumux(&["run", cw.to_str().expect("utf-8"), "--device", "sim:k20c", "--policy", "fcfs", "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_calibration_that_lacks_a_kernel_or_targets_a_gpu_is_refused_with_the_reason() {
    let dir = temp_dir("calibrate-bad");
    let cal = dir.path().join("cal.toml");
    std::fs::write(
        &cal,
        r#"format = 1
measured_on = "sim:h100"
device_name = "x"
target = "sim:h100"
workload = "other"
[device]
h2d_gb_s = 50.0
d2h_gb_s = 50.0
link_latency_us = 5.0
preempt_overhead_us = 0.0
[[kernel]]
name = "not-here"
blocks = 1
threads_per_block = 1
block_time_us = 1.0
block_time_spread = 0.0
mem_intensity = 0.0
alone_us = 1.0
alone_sd_us = 0.0
runs = 1
notes = []
"#,
    )
    .expect("write");
    let c = cal.to_str().expect("utf-8");
    let o = gpumux(&["run", "examples/two-procs.toml", "--device", "sim:h100", "--calibration", c, "-q"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("has no entry in the calibration of \"other\""), "{}", stderr(&o));
    let o = gpumux(&["run", "examples/suite-h100.toml", "--device", "cuda:0", "--calibration", c, "-q"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--calibration is for a simulated device"), "{}", stderr(&o));
    // Without a GPU, calibrating one is a clear error, before any file is written.
    let out = dir.path().join("gpu.toml");
    let o = gpumux(&[
        "calibrate",
        "--device",
        "cuda:0",
        "examples/suite-h100.toml",
        "-o",
        out.to_str().expect("utf-8"),
        "--runs",
        "1",
    ]);
    if o.status.success() {
        eprintln!("SKIPPED the no-GPU part: a GPU is present");
    } else {
        assert!(stderr(&o).contains("cuda:0 cannot be opened"), "{}", stderr(&o));
        assert!(!out.exists());
    }
    // When SMs are given back: `at-end` or `at-issue`, nothing else.
    let text = std::fs::read_to_string(&cal).expect("read");
    std::fs::write(
        &cal,
        text.replace("preempt_overhead_us = 0.0\n", "preempt_overhead_us = 0.0\nrelease = \"sometimes\"\n"),
    )
    .expect("write");
    let o = gpumux(&["run", "examples/two-procs.toml", "--device", "sim:h100", "--calibration", c, "-q"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("release \"sometimes\": expected at-end or at-issue"), "{}", stderr(&o));
    std::fs::write(&cal, "format = 2\n").expect("write");
    let o = gpumux(&["run", "examples/two-procs.toml", "--calibration", c, "-q"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("missing field") || stderr(&o).contains("format 2"), "{}", stderr(&o));
}
