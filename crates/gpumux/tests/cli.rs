//! End-to-end tests of the `gpumux` command on the simulated GPU.

mod common;

use common::{gpumux, stderr};
use std::path::PathBuf;

fn temp_file(name: &str, text: &str) -> common::TempFile {
    common::temp_file("cli", name, text)
}

#[test]
fn same_seed_gives_byte_identical_json_and_other_seed_differs() {
    let args = [
        "run",
        "parboil-k20c:mix=2,seed=4",
        "--device",
        "sim:k20c",
        "--policy",
        "fcfs,ppq-excl-cs,dss-drain,rr",
        "--json",
        "-q",
    ];
    let a = gpumux(&[&args[..], &["--seed", "5"]].concat());
    let b = gpumux(&[&args[..], &["--seed", "5", "--threads", "1"]].concat());
    assert!(a.status.success(), "{}", stderr(&a));
    assert_eq!(a.stdout, b.stdout, "same seed, different thread count: output must not change");
    let c = gpumux(&[&args[..], &["--seed", "6"]].concat());
    assert!(c.status.success(), "{}", stderr(&c));
    assert_ne!(a.stdout, c.stdout, "the seed must matter (block time spread)");
    // The JSON carries what the issue promises.
    let v: serde_json::Value = serde_json::from_slice(&a.stdout).expect("valid JSON");
    let policies = v["policies"].as_array().expect("policies array");
    assert_eq!(policies.len(), 4);
    for p in policies {
        for key in ["policy", "antt", "stp", "fairness"] {
            assert!(!p[key].is_null(), "missing {key}");
        }
        for proc_ in p["processes"].as_array().expect("processes") {
            assert!(proc_["name"].is_string() && proc_["ntt"].as_f64().is_some_and(|x| x >= 0.99));
            assert!(proc_["turnaround_ns"].as_u64().is_some_and(|x| x > 0));
        }
    }
}

#[test]
fn every_policy_completes_an_eight_process_parboil_mix() {
    // Regression: DSS once traded an SM between two kernels forever at one instant.
    let o = gpumux(&[
        "run",
        "parboil-k20c:mix=8,seed=2",
        "--device",
        "sim:k20c",
        "--policy",
        "dss-cs,dss-drain,dss-flush,ppq-shared-flush,rr-200us",
        "-q",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    for p in v["policies"].as_array().expect("policies") {
        let antt = p["antt"].as_f64().expect("antt");
        assert!(antt >= 1.0 && antt.is_finite(), "{p}");
    }
}

#[test]
fn priorities_help_the_urgent_process() {
    let o = gpumux(&["run", "examples/two-procs.toml", "--policy", "fcfs,ppq-excl-cs", "--json", "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    let hp = |i: usize| v["policies"][i]["high_priority_turnaround_ns"].as_f64().expect("hp turnaround");
    assert!(hp(1) < hp(0) * 0.5, "PPQ should at least halve the urgent turnaround: fcfs {} ppq {}", hp(0), hp(1));
}

#[test]
fn trace_and_plots_are_written() {
    let dir = common::temp_dir("cli-out");
    let trace = dir.path().join("t.json");
    let plots = dir.path().join("plots");
    let o = gpumux(&[
        "run",
        "examples/two-procs.toml",
        "--policy",
        "fcfs,dss-cs",
        "-q",
        "--trace",
        trace.to_str().expect("utf8"),
        "--plot",
        plots.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).expect("trace")).expect("trace JSON");
    let events = t["traceEvents"].as_array().expect("events");
    assert!(events.iter().any(|e| e["ph"] == "X" && e["cat"] == "kernel"));
    assert!(
        events.iter().any(|e| e["name"] == "thread_name" && e["args"]["name"] == "SM 131"),
        "a lane per SM of the H100"
    );
    for f in ["summary.svg", "ntt.svg", "timeline-dss-cs.svg"] {
        assert!(std::fs::read_to_string(plots.join(f)).expect(f).contains("<svg"));
    }
}

#[test]
fn bad_inputs_get_clear_errors() {
    // Held to the end: dropping one removes its file.
    let huge = temp_file(
        "huge.toml",
        "[[process]]\nname = \"p\"\n[[process.op]]\nkind = \"kernel\"\nname = \"fat\"\ngrid = 4\nblock = 1024\n\
         regs_per_thread = 255\nblock_time_us = 1\n",
    );
    let garbage = temp_file("garbage.toml", "[[process]\nname=");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["run".into(), "no/such/file.toml".into()], "no/such/file.toml"),
        (
            vec!["run".into(), "examples/two-procs.toml".into(), "--policy".into(), "fcfs,warp-drive".into()],
            "unknown policy `warp-drive`",
        ),
        (
            vec!["run".into(), "examples/two-procs.toml".into(), "--device".into(), "sim:voodoo".into()],
            "unknown device `sim:voodoo`",
        ),
        (
            vec!["run".into(), "examples/two-procs.toml".into(), "--device".into(), "cuda:x".into()],
            "expected cuda:<index>",
        ),
        (vec!["run".into(), "examples/two-procs.toml".into(), "--policy".into(), ",".into()], "names no policy"),
        (vec!["run".into(), "parboil-k20c:mix=99".into()], "mix"),
        (vec!["run".into(), huge.as_str().into(), "--device".into(), "sim:k20c".into()], "cannot fit one block"),
        (vec!["run".into(), garbage.as_str().into()], "garbage.toml"),
    ];
    for (args, want) in cases {
        let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let o = gpumux(&refs);
        assert!(!o.status.success(), "{args:?} should fail");
        let e = stderr(&o);
        assert!(e.contains(want), "{args:?}: expected `{want}` in: {e}");
        assert!(!e.contains("panicked"), "{args:?} panicked: {e}");
    }
}

#[test]
fn the_table_has_a_legend_and_marks_the_best_policy_but_json_does_not() {
    let args = ["run", "examples/two-procs.toml", "--policy", "fcfs,ppq-excl-cs", "-q"];
    let o = gpumux(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    for want in ["ANTT: mean NTT, lower is better", "STP: system throughput", "higher is", "fairness:", "* best"] {
        assert!(t.contains(want), "legend lacks `{want}`:\n{t}");
    }
    // PPQ is better than FCFS on every marked column here: its row carries the marks.
    let ppq = t.lines().find(|l| l.starts_with("ppq-excl-cs")).expect("ppq row");
    assert_eq!(ppq.matches('*').count(), 4, "ANTT, STP, fairness and hp turnaround of ppq are best: {ppq}");
    let fcfs = t.lines().find(|l| l.starts_with("fcfs")).expect("fcfs row");
    assert_eq!(fcfs.matches('*').count(), 1, "fcfs has the shortest makespan: {fcfs}");
    let j = gpumux(&[&args[..], &["--json"]].concat());
    assert!(serde_json::from_slice::<serde_json::Value>(&j.stdout).is_ok(), "--json is JSON only");
    assert!(!String::from_utf8_lossy(&j.stdout).contains("lower is better"));
}

#[test]
fn equal_priorities_are_named_as_why_hp_turnaround_is_empty() {
    let o = gpumux(&["run", "parboil-k20c:app=sad", "--device", "sim:k20c", "--policy", "fcfs,npq", "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(t.contains("every process has priority 0"), "{t}");
}

#[test]
fn help_names_the_default_policies_as_the_table_prints_them() {
    let o = gpumux(&["run", "--help"]);
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(help.contains("rr-1000us"), "{help}");
    let t = gpumux(&["run", "examples/two-procs.toml", "-q", "--device", "sim:h100", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&t.stdout).expect("JSON");
    for p in v["policies"].as_array().expect("policies") {
        let name = p["policy"].as_str().expect("name");
        assert!(help.contains(name), "`{name}` is in the table but not in --help's default");
    }
}

#[test]
fn the_protocol_log_shows_every_command_and_event_only_when_asked() {
    let run = |log: bool| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_gpumux"));
        c.args(["run", "examples/two-procs.toml", "--device", "sim:h100", "--policy", "fcfs", "--json", "-q"])
            .current_dir(common::repo_root());
        if log {
            c.env("GPUMUX_LOG_PROTOCOL", "1");
        } else {
            c.env_remove("GPUMUX_LOG_PROTOCOL");
        }
        c.output().expect("the gpumux binary runs")
    };
    let (plain, logged) = (run(false), run(true));
    assert!(plain.status.success() && logged.status.success(), "{}", stderr(&logged));
    assert_eq!(plain.stdout, logged.stdout, "the log changes no result");
    assert!(!stderr(&plain).contains(" -> "), "{}", stderr(&plain));
    let log = stderr(&logged);
    let launches = log.lines().filter(|l| l.contains(" -> Launch {")).count();
    let ends = log.lines().filter(|l| l.contains(" <- LaunchEnded {")).count();
    assert!(launches > 0, "{log}");
    assert_eq!(launches, ends, "every launch logged ends, logged");
}

/// The lines of a `--help` text's `Options:` section, but `--version` (only
/// a top-level command has it).
fn option_lines(help: &[u8]) -> Vec<String> {
    let help = String::from_utf8_lossy(help);
    let options = help.split_once("\nOptions:\n").map_or("", |(_, rest)| rest);
    options.lines().filter(|l| !l.contains("--version")).map(str::to_string).collect()
}

#[test]
fn gpumux_daemon_takes_the_same_options_as_gpumuxd() {
    // Cargo builds gpumuxd beside gpumux when it tests the workspace.
    let bin_dir = PathBuf::from(env!("CARGO_BIN_EXE_gpumux")).parent().map(PathBuf::from).unwrap_or_default();
    let gpumuxd = bin_dir.join("gpumuxd");
    let release = if bin_dir.ends_with("release") { " --release" } else { "" };
    assert!(gpumuxd.exists(), "{} is missing: build it with `cargo build{release} -p gpumuxd`", gpumuxd.display());
    let theirs = std::process::Command::new(&gpumuxd).arg("--help").output().expect("gpumuxd runs");
    let ours = gpumux(&["daemon", "--help"]);
    assert!(ours.status.success() && theirs.status.success(), "{}", stderr(&ours));
    let (ours, theirs) = (option_lines(&ours.stdout), option_lines(&theirs.stdout));
    assert!(ours.iter().any(|l| l.contains("--device")), "no options in `gpumux daemon --help`: {ours:?}");
    assert_eq!(ours, theirs, "`gpumux daemon --help` and `gpumuxd --help` list different options");
}
