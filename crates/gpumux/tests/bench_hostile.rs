//! `gpumux bench daemon --hostile` (issue 36's soak) on the simulated GPU,
//! short: the bench runs end to end, the daemon survives the four abusers
//! and serves a new client, and its memory comes back.

use std::process::Command;

#[test]
fn the_hostile_soak_runs_and_the_daemon_survives_its_abusers() {
    let dir = tempfile::Builder::new().prefix("gpumux-bench-hostile-test-").tempdir().expect("a temporary directory");
    let json = dir.path().join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_gpumux"))
        .args(["bench", "daemon", "--device", "sim:h100", "--hostile", "--hostile-seconds", "3"])
        .arg("--logs")
        .arg(dir.path().join("logs"))
        .arg("--json")
        .arg(&json)
        // glibc raises its mmap threshold to the size of the largest block
        // freed, so once the half-frames abuser's 4 MiB buffers are freed the
        // next ones come from its arenas, which keep tens of MiB after they
        // are freed (up to 73 MiB after a 60 s soak, measured on sim:h100; back
        // within 5 MiB with the threshold fixed, as this sets it). A fixed
        // threshold keeps the check about leaks, not about the allocator;
        // the soak's own report shows the retention.
        .env("MALLOC_MMAP_THRESHOLD_", "131072")
        .output()
        .expect("gpumux runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The verdict may be FAIL (the latency ratio, below), which exits 1 after the report.
    assert!(
        out.status.success() || stderr.contains("did not meet its goals"),
        "the bench failed to run:\n{stdout}\n{stderr}"
    );
    for part in ["Well-behaved clients", "The daemon (pid", "Abusers: what each did", "Goals", "hostile soak: "] {
        assert!(stdout.contains(part), "no `{part}` in the report:\n{stdout}");
    }
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let phases = r["phases"].as_array().unwrap();
    let names: Vec<&str> = phases.iter().map(|p| p["phase"].as_str().unwrap()).collect();
    assert_eq!(names, ["alone", "abused", "after"]);
    for p in phases {
        assert!(p["launches"].as_u64().unwrap() > 0, "no launch in a phase: {p}");
    }
    // The latency ratio is reported, not asserted: on the simulated device a
    // grid of 2^31 - 2 blocks slows the device itself (every block is
    // simulated) and its launches flood the core, and on a 2-core machine
    // the abusers take the cores from everyone: 60-165x measured here with
    // all four abusers, 1.45x without huge-grids. The GPU run judges it.
    let ratio = r["p99_ratio"].as_f64().expect("a p99 ratio");
    assert!(ratio.is_finite() && ratio > 0.0, "{ratio}");
    eprintln!("hostile soak, 3 s: abused p99 / alone p99 = {ratio:.2}");

    // No restart: the same process throughout, no context rebuilt, a new client served.
    let goal = |name: &str| {
        r["goals"].as_array().unwrap().iter().find(|g| g["goal"] == name).unwrap_or_else(|| panic!("no goal {name}"))
    };
    assert_eq!(goal("no daemon restart")["pass"], true, "{}", goal("no daemon restart"));
    assert_eq!(r["daemon_alive"], true);
    assert_eq!(r["context_rebuilds"], 0);
    assert!(r["new_client_us"].as_f64().unwrap() > 0.0);
    // Only the two well-behaved clients and the new one are left.
    assert_eq!(r["clients_after"], 3, "abusers' sessions left behind");
    let client_errors = goal("the well-behaved clients saw no error");
    assert_eq!(client_errors["pass"], true, "{client_errors}");

    // Memory back, with a looser slack than the goal's 16 MiB (a loaded CI
    // machine; measured +5 to +15 MiB here with the threshold fixed). The
    // daemon grew to 1 GB in 5 s of never-read before it had its limits.
    let d = &r["daemon"];
    let (base, peak, after) = (
        d["baseline"]["rss_bytes"].as_u64().unwrap(),
        d["peak_abused"]["rss_bytes"].as_u64().unwrap(),
        d["after"]["rss_bytes"].as_u64().unwrap(),
    );
    eprintln!("daemon RSS: {} MiB before, {} MiB at the peak, {} MiB after", base >> 20, peak >> 20, after >> 20);
    assert!(after <= base + (32 << 20), "the daemon kept {} MiB over its baseline", (after - base) >> 20);
    // Threads and descriptors back too: none left from the abusers' connections.
    let threads = |k: &str| d[k]["threads"].as_u64().unwrap();
    assert!(
        threads("after") <= threads("baseline"),
        "threads {} after, {} before",
        threads("after"),
        threads("baseline")
    );
    let fds = |k: &str| d[k]["fds"].as_u64().unwrap();
    assert!(fds("after") <= fds("baseline"), "descriptors {} after, {} before", fds("after"), fds("baseline"));

    // Each abuser did its abuse, and the daemon's limits answered the flood.
    let abusers = r["abusers"].as_array().unwrap();
    let by =
        |role: &str| abusers.iter().find(|a| a["role"] == role).unwrap_or_else(|| panic!("no {role}: {abusers:?}"));
    assert!(by("flood")["opened"].as_u64().unwrap() >= 64, "{}", by("flood"));
    assert!(by("flood")["refused"].as_u64().unwrap() > 0, "no flood connection refused: {}", by("flood"));
    assert!(by("never-read")["sent"].as_u64().unwrap() > 0, "{}", by("never-read"));
    assert!(by("half-frames")["opened"].as_u64().unwrap() > 0, "{}", by("half-frames"));
    assert!(by("huge-grids")["sent"].as_u64().unwrap() > 0, "{}", by("huge-grids"));
}

/// A misspelt abuser is refused before a daemon starts.
#[test]
fn an_unknown_abuser_is_refused_before_anything_runs() {
    let dir = tempfile::Builder::new().prefix("gpumux-bench-hostile-test-").tempdir().expect("a temporary directory");
    let out = Command::new(env!("CARGO_BIN_EXE_gpumux"))
        .args(["bench", "daemon", "--device", "sim:h100", "--hostile", "--hostile-abusers", "flood,slow-loris"])
        .arg("--logs")
        .arg(dir.path().join("logs"))
        .output()
        .expect("gpumux runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(
            "unknown abuser `slow-loris` in --hostile-abusers (known: never-read, half-frames, huge-grids, flood)"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("starting gpumux"), "a daemon started before the refusal:\n{stderr}");
}
