//! `gpumux bench daemon` end to end on the simulated GPU: every role
//! process, the daemon starts and stops, the line protocol and the report
//! (the GPU figures themselves come from a GPU run: docs/benchmarks.md).

use std::process::Command;

#[test]
fn the_daemon_bench_runs_on_the_simulated_gpu_and_reports_every_experiment() {
    let dir = tempfile::Builder::new().prefix("gpumux-bench-daemon-test-").tempdir().expect("a temporary directory");
    let json = dir.path().join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_gpumux"))
        .args(["bench", "daemon", "--device", "sim:h100", "--quick", "--block-us", "100"])
        .args(["--priority-policies", "", "--corun-policies", "ppq-even-drain,fcfs"])
        .arg("--logs")
        .arg(dir.path().join("logs"))
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let tables = [
        "Cross-process priority",
        "Co-run throughput",
        "Request overhead",
        "launches per second",
        "Programs:",
        "Copy beside",
    ];
    for table in tables {
        assert!(stdout.contains(table), "no `{table}` table:\n{stdout}");
    }
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let prio = r["priority"].as_array().unwrap();
    assert_eq!(prio.len(), 1, "{prio:?}");
    assert_eq!(prio[0]["setting"], "gpumux ppq-even-drain");
    assert!(prio[0]["hp_p50_us"].as_f64().unwrap() > 0.0);
    assert!(prio[0]["lp_blocks_per_s"].as_f64().unwrap() > 0.0);
    // Three pairs under two policies; the sim's outputs equal its alone runs'.
    let corun = r["corun"].as_array().unwrap();
    assert_eq!(corun.len(), 6, "{corun:?}");
    for row in corun {
        assert_eq!(row["outputs_equal"], true, "{row}");
        let stp = row["stp"].as_f64().unwrap();
        assert!(stp.is_finite() && stp > 0.0, "{row}");
    }
    let rates = r["overhead"]["daemon_launches_per_s"].as_array().unwrap();
    assert_eq!(rates.len(), 4);
    assert!(rates.iter().all(|x| x[1].as_f64().unwrap() > 0.0), "{rates:?}");
    // No native baseline on a simulated device, and the report says so.
    assert!(r["overhead"]["native_p50_us"].is_null());
    assert!(r["notes"][0].as_str().unwrap().contains("simulated"));
    assert_eq!(r["programs"].as_array().unwrap().len(), 4, "{}", r["programs"]);
}

/// `gpumux bench daemon --quick ARGS`, its logs in a temporary directory
/// removed when it returns.
fn quick_bench(args: &[&str]) -> std::process::Output {
    let dir = tempfile::Builder::new().prefix("gpumux-bench-daemon-test-").tempdir().expect("a temporary directory");
    Command::new(env!("CARGO_BIN_EXE_gpumux"))
        .args(["bench", "daemon", "--quick"])
        .args(args)
        .arg("--logs")
        .arg(dir.path().join("logs"))
        .output()
        .expect("gpumux runs")
}

/// The programs experiment on the simulated GPU: the three programs through
/// the default daemon (the copy from a `Vec` and from a `HostBuffer`), each
/// timed, their checks skipped with the reason (the simulated device
/// computes nothing), and no native row (there is no GPU).
#[test]
fn the_programs_run_through_the_daemon_on_the_simulated_gpu_with_their_checks_skipped() {
    let dir = tempfile::Builder::new().prefix("gpumux-bench-daemon-test-").tempdir().expect("a temporary directory");
    let json = dir.path().join("report.json");
    let out = quick_bench(&["--device", "sim:h100", "--only", "programs", "--json", json.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("Programs: ms from the first launch or copy to the final sync"), "{stdout}");
    for table in ["Cross-process priority", "Co-run throughput", "Request overhead"] {
        assert!(!stdout.contains(table), "`{table}` ran, not asked for:\n{stdout}");
    }
    let setting = "gpumux ppq-even-drain";
    for program in ["chain", "stencil", "copy, pageable", "copy, pinned"] {
        let row = stdout.lines().find(|l| l.starts_with(&format!("{program}: {setting} "))).unwrap_or_else(|| {
            panic!("no `{program}` row:\n{stdout}");
        });
        assert!(row.contains(" skipped "), "{row}");
        let reason = format!("{program}: {setting}: check skipped: the simulated device computes nothing");
        assert!(stdout.contains(&reason), "no `{reason}`:\n{stdout}");
    }
    assert!(stdout.contains("511 dependent launches of 1-256 blocks of 16 threads"), "no legend:\n{stdout}");
    assert_eq!(stdout.matches("the 64 MiB made the round trip unchanged").count(), 2, "{stdout}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = r["programs"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{rows:?}");
    for row in rows {
        assert_eq!(row["setting"], setting, "{row}");
        assert_eq!(row["check"]["status"], "skipped", "{row}");
        assert_eq!(row["reps"], 2, "{row}");
        let (lo, mid, hi) =
            (row["min_ms"].as_f64().unwrap(), row["median_ms"].as_f64().unwrap(), row["max_ms"].as_f64().unwrap());
        assert!(0.0 < lo && lo <= mid && mid <= hi, "{row}");
        // No native row on a simulated device, so nothing to compare with.
        assert!(row["vs_native"].is_null(), "{row}");
    }
    for (copy, host) in [(&rows[2], "pageable"), (&rows[3], "pinned")] {
        assert_eq!(copy["program"], format!("copy, {host}"));
        assert_eq!(copy["bytes"], 64 << 20);
        let (up, down) = (copy["upload_gb_s"].as_f64().unwrap(), copy["download_gb_s"].as_f64().unwrap());
        assert!(up > 0.0 && down > 0.0, "{copy}");
    }
}

/// `--programs` runs the programs it names and no other (a profile of one
/// needs a long run of it alone).
#[test]
fn only_the_programs_named_run() {
    let out = quick_bench(&["--device", "sim:h100", "--only", "programs", "--programs", "chain"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.lines().any(|l| l.starts_with("chain: gpumux ppq-even-drain ")), "no chain row:\n{stdout}");
    for program in ["stencil", "copy, pageable", "copy, pinned"] {
        assert!(!stdout.lines().any(|l| l.starts_with(&format!("{program}: "))), "`{program}` ran:\n{stdout}");
    }
}

/// The copy-beside experiment on the simulated GPU: the chain alone, then
/// beside a client copying 64 MiB round after round from a `Vec` and from a
/// `HostBuffer`, through the default daemon. The copier's checks pass (a
/// simulated device moves the bytes), the chain's are skipped with the
/// reason, and each run beside prints its summary line. No timing is
/// asserted: the figures come from a GPU run.
#[test]
fn the_copy_beside_experiment_runs_on_the_simulated_gpu_and_every_copier_round_checks() {
    let dir = tempfile::Builder::new().prefix("gpumux-bench-daemon-test-").tempdir().expect("a temporary directory");
    let json = dir.path().join("report.json");
    let out = quick_bench(&["--device", "sim:h100", "--only", "copy-beside", "--json", json.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("Copy beside short launches"), "{stdout}");
    assert!(!stdout.contains("Programs:"), "the programs ran, not asked for:\n{stdout}");
    let setting = "gpumux ppq-even-drain";
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let c = &r["copy_beside"];
    assert_eq!((c["bytes"].as_u64(), c["rounds"].as_u64(), c["goal"].as_f64()), (Some(64 << 20), Some(1), Some(1.1)));
    let rows = r["copy_beside"]["rows"].as_array().unwrap();
    let copiers: Vec<&serde_json::Value> = rows.iter().map(|row| &row["copier"]).collect();
    assert_eq!(copiers, [&serde_json::Value::Null, &"pageable".into(), &"pinned".into()], "{rows:?}");
    for row in rows {
        assert_eq!(row["setting"], setting, "{row}");
        assert_eq!((row["reps"].as_u64(), &row["check"]["status"]), (Some(3), &"skipped".into()), "{row}");
        assert!(row["median_ms"].as_f64().unwrap() > 0.0, "{row}");
    }
    assert!(rows[0]["vs_alone"].is_null() && rows[0]["copier_check"].is_null(), "{}", rows[0]);
    for row in &rows[1..] {
        assert_eq!(row["copier_check"]["status"], "ok", "{row}");
        assert!(row["copier_rounds"].as_u64().unwrap() >= 1, "{row}");
        let (up, down) = (row["copier_up_gb_s"].as_f64().unwrap(), row["copier_down_gb_s"].as_f64().unwrap());
        assert!(up > 0.0 && down > 0.0 && row["vs_alone"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["min_vs_alone"].as_f64().unwrap() > 0.0, "{row}");
        let summary = format!("copy-beside: {} copier, {setting}: chain ", row["copier"].as_str().unwrap());
        let line =
            stdout.lines().find(|l| l.starts_with(&summary)).unwrap_or_else(|| panic!("no `{summary}`:\n{stdout}"));
        assert!(line.ends_with("; checks skipped"), "{line}");
    }
}

/// A misspelt policy, option or experiment is refused before anything runs
/// (on a GPU the baselines before the first daemon take minutes), with what
/// is known.
#[test]
fn bad_bench_arguments_are_refused_before_anything_runs() {
    let cases: [(&[&str], &str); 14] = [
        (&["--corun-policies", "ppq-even-drain,warp-drive"], "unknown policy `warp-drive`; known: fcfs"),
        (&["--priority-policies", "ppq-even-drain+own"], "unknown `+own` (known: +own-sms"),
        (
            &["--only", "co-run"],
            "unknown experiment `co-run` in --only (known: priority, corun, overhead, programs, copy-beside, multi-gpu)",
        ),
        (&["--policy", ""], "it names no policy"),
        (&["--only", "multi-gpu"], "the multi-gpu experiment needs a --device of 2 GPUs or more"),
        (&["--block-us", "20,0"], "invalid value '0' for '--block-us"),
        (&["--lp-launch-ms", "0"], "invalid value '0' for '--lp-launch-ms"),
        (&["--corun-seconds", "0"], "0 s: expected more than 0"),
        (&["--corun-seconds", "NaN"], "NaN s: expected more than 0"),
        (&["--program-reps", "0"], "invalid value '0' for '--program-reps"),
        (&["--program-copy-mib", "0"], "invalid value '0' for '--program-copy-mib"),
        (&["--copy-beside-reps", "0"], "invalid value '0' for '--copy-beside-reps"),
        (&["--copy-beside-rounds", "0"], "invalid value '0' for '--copy-beside-rounds"),
        (&["--programs", "chain,wavefront"], "invalid value 'wavefront' for '--programs"),
    ];
    for (args, want) in cases {
        let out = quick_bench(&[&["--device", "sim:h100"], args].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(want), "{args:?}: no `{want}` in\n{stderr}");
        assert!(!stderr.contains("starting gpumux"), "{args:?}: a daemon started before the refusal:\n{stderr}");
    }
}

/// A daemon that will not start says why: the bench quotes the end of its log.
#[test]
fn a_daemon_that_will_not_start_is_reported_with_its_reason() {
    let out = quick_bench(&["--device", "sim:nope", "--only", "overhead"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "sim:nope was accepted");
    assert!(stderr.contains("exited before it served"), "{stderr}");
    assert!(
        stderr.contains("unknown simulated device `sim:nope`; known: sim:k20c"),
        "the daemon's reason is not quoted:\n{stderr}"
    );
}

/// Issue 38's STP goal on the simulated 2-GPU device: each case's four
/// loops at once through a daemon of both GPUs and through one of the
/// first, each against itself alone. The default placement spreads the
/// identical clients two and two and puts each declared memory-bound client
/// beside a compute-bound one; `least-loaded` is run beside it for the pairs;
/// each case's ratio is its STP over one GPU's (the simulated GPUs' kernels
/// take wall-clock time, so the figures themselves are not checked here; the
/// GPU figures come from `--device cuda:0,1` on the device: docs/multi-gpu.md).
#[test]
fn the_multi_gpu_experiment_places_each_case_and_reports_its_stps_on_the_simulated_pair() {
    let dir = tempfile::Builder::new().prefix("gpumux-bench-daemon-test-").tempdir().expect("a temporary directory");
    let json = dir.path().join("report.json");
    let args =
        ["--device", "sim:h100x2", "--only", "multi-gpu", "--corun-seconds", "0.1", "--json", json.to_str().unwrap()];
    let out = quick_bench(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("Multi-GPU `identical`: four identical GPU-filling clients (SGEMM) on 2 GPUs (sim:h100x2) against the same on one (sim:h100)"), "{stdout}");
    assert!(stdout.contains("best this mix allows"), "{stdout}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let cases = r["multi_gpu"]["cases"].as_array().unwrap();
    let names: Vec<&str> = cases.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["identical", "pairs", "loops"]);
    for c in cases {
        let rows = c["rows"].as_array().unwrap();
        let runs = c["runs"].as_array().unwrap();
        for row in rows {
            assert_eq!(row["outputs_equal"], true, "{row}");
            assert!(row["alone_ms"].as_f64().unwrap() > 0.0 && row["one_gpu_ms"].as_f64().unwrap() > 0.0, "{row}");
            assert_eq!(row["all_gpus_ms"].as_array().unwrap().len(), runs.len(), "{row}");
        }
        // Each run's GPUs per client, in the case's client order.
        let gpus = |run: usize| -> Vec<u64> {
            rows.iter().map(|x| x["gpu"][run].as_u64().unwrap_or_else(|| panic!("no GPU in {x}"))).collect()
        };
        let one = c["stp_one"].as_f64().unwrap();
        for (i, run) in runs.iter().enumerate() {
            let g = gpus(i);
            assert_eq!(g.iter().filter(|&&x| x == 0).count(), 2, "two on each GPU: {c}");
            let (stp, ratio) = (run["stp"].as_f64().unwrap(), run["ratio"].as_f64().unwrap());
            assert!(one > 0.0 && (ratio - stp / one).abs() < 1e-9, "{c}");
        }
        assert!((c["best_ratio"].as_f64().unwrap() - 4.0 / one).abs() < 1e-9, "{c}");
        assert_eq!(c["met"], runs[0]["ratio"].as_f64().unwrap() >= 1.9);
        // Not asserted: that two GPUs' STP is above one's. The simulated GPUs' kernels take
        // wall-clock time on the host's cores, so on a 2-core CI machine two simulated GPUs
        // can run slower than one (it failed so under load); the figure is the GPU bench's.
        if c["name"] == "pairs" {
            // Triad (memory) and FMA (compute) twice: the default, pairs, puts one of each on each GPU.
            let g = gpus(0);
            assert!(g[0] != g[2] && g[1] != g[3], "pairs placement split each class: {g:?} in {c}");
            assert_eq!(runs[1]["placement"], "least-loaded");
        }
    }
}
