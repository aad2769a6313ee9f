//! Issue 11: runs that cannot be represented, runs that would take hours,
//! progress on long runs, and run cost that grows with the square of the
//! number of processes. Every child gets a deadline, so a regression fails
//! instead of hanging the suite.

mod common;

use common::stderr;
use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs gpumux with `args` (and `env`), killing it after `limit`.
fn gpumux_within(args: &[&str], env: &[(&str, &str)], limit: Duration) -> (Output, Duration) {
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpumux"))
        .args(args)
        .envs(env.iter().copied())
        .current_dir(common::repo_root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the gpumux binary starts");
    // Drain both pipes on threads so a chatty child cannot block on a full pipe.
    let mut out_pipe = child.stdout.take().expect("stdout piped");
    let mut err_pipe = child.stderr.take().expect("stderr piped");
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out_pipe.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err_pipe.read_to_end(&mut v);
        v
    });
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for gpumux") {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gpumux {args:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = start.elapsed();
    let stdout = out_reader.join().expect("stdout reader");
    let stderr = err_reader.join().expect("stderr reader");
    (Output { status, stdout, stderr }, elapsed)
}

fn gpumux(args: &[&str]) -> Output {
    gpumux_within(args, &[], Duration::from_secs(120)).0
}

fn temp_file(name: &str, text: &str) -> common::TempFile {
    common::temp_file("long-runs", name, text)
}

/// Fails with a message, exit status 1 and nothing on stdout.
fn assert_fails_with(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "exit status; stderr: {err}");
    assert!(o.stdout.is_empty(), "a failed run printed a result: {}", String::from_utf8_lossy(&o.stdout));
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
}

#[test]
fn a_clock_that_would_overflow_is_an_error_not_a_clamped_makespan() {
    // 20000 × 10^12 µs = 2 × 10^19 ns, past u64::MAX; it used to print
    // "makespan_ns": 18446000000000000000 and exit 0.
    for reps in ["20000", "1000000"] {
        let f = temp_file(
            &format!("cpu-{reps}.toml"),
            &format!("[[process]]\nname = \"p\"\nrepetitions = {reps}\n[[process.op]]\nkind = \"cpu\"\nus = 1e12\n"),
        );
        let o = gpumux(&["run", f.as_str(), "--device", "sim:h100", "--policy", "fcfs", "--json", "-q"]);
        assert_fails_with(&o, &["simulated time overflows", "host (cpu) operation 1 of process `p`", "584 years"]);
    }
}

#[test]
fn copies_that_would_overflow_the_clock_are_an_error() {
    // 2^50 bytes over PCIe take about 45000 s; a million of them do not fit.
    let f = temp_file(
        "copies.toml",
        "[[process]]\nname = \"mover\"\nrepetitions = 1000000\n[[process.op]]\nkind = \"h2d\"\nbytes = 1125899906842624\n",
    );
    let o = gpumux(&["run", f.as_str(), "--device", "sim:h100", "--policy", "fcfs", "--json", "-q"]);
    assert_fails_with(&o, &["simulated time overflows", "a copy of 1125899906842624 bytes for process"]);
}

#[test]
fn a_run_estimated_at_days_stops_at_once_with_the_estimate_and_the_flag() {
    // 2^40 blocks, the documented maximum grid: about three days per policy.
    let f = temp_file(
        "huge-grid.toml",
        "[[process]]\nname = \"p\"\n[[process.op]]\nkind = \"kernel\"\nname = \"k\"\ngrid = [1048576, 1048576]\n\
         block = 128\nregs_per_thread = 32\nblock_time_us = 10.0\n",
    );
    let (o, took) = gpumux_within(&["run", f.as_str(), "--device", "sim:h100", "-q"], &[], Duration::from_secs(60));
    assert_fails_with(&o, &["would simulate about 9.9e12 blocks", "days", "--max-work 9.9e12", "--max-work unlimited"]);
    assert!(took < Duration::from_secs(10), "the refusal took {took:?}: it must come before any simulation");
}

#[test]
fn replaying_a_million_runs_in_a_tiny_file_is_refused() {
    let f = temp_file(
        "replay.toml",
        "replay_min_runs = 1000000\n[[process]]\nname = \"p\"\n[[process.op]]\nkind = \"kernel\"\nname = \"k\"\n\
         grid = 2000\nblock = 128\nregs_per_thread = 32\nblock_time_us = 10.0\n",
    );
    let o = gpumux(&["run", f.as_str(), "--device", "sim:h100", "-q", "--json"]);
    assert_fails_with(&o, &["would simulate about", "over the limit of 1.0e9 (--max-work)", "--max-work 1."]);
}

#[test]
fn max_work_is_the_limit_and_unlimited_lifts_it() {
    let f = temp_file(
        "small.toml",
        "[[process]]\nname = \"p\"\nrepetitions = 10\n[[process.op]]\nkind = \"kernel\"\nname = \"k\"\n\
         grid = 1000\nblock = 128\nregs_per_thread = 32\nblock_time_us = 10.0\n",
    );
    // 10 runs alone + 10 under fcfs, 1008 each, + 100 per process per run.
    let args = ["run", f.as_str(), "--device", "sim:h100", "--policy", "fcfs", "-q", "--json", "--max-work"];
    let o = gpumux(&[&args[..], &["20000"]].concat());
    assert_fails_with(&o, &["estimated work 20360", "over the limit of 20000", "--max-work 20360"]);
    for ok in ["20360", "unlimited"] {
        let o = gpumux(&[&args[..], &[ok]].concat());
        assert!(o.status.success(), "--max-work {ok}: {}", stderr(&o));
    }
    let o = gpumux(&[&args[..], &["lots"]].concat());
    assert_eq!(o.status.code(), Some(2), "clap rejects a bad value: {}", stderr(&o));
    assert!(stderr(&o).contains("expected a number of blocks >= 1 (e.g. 1e10) or `unlimited`"), "{}", stderr(&o));
}

#[test]
fn a_replayed_run_that_takes_no_time_is_refused_instead_of_hanging() {
    // Process a's runs take 0 ns: with replay it looped for ever at t = 0.
    let f = temp_file(
        "zero.toml",
        "replay_min_runs = 1\n[[process]]\nname = \"a\"\n[[process.op]]\nkind = \"cpu\"\nus = 0\n\
         [[process]]\nname = \"b\"\n[[process.op]]\nkind = \"cpu\"\nus = 10\n",
    );
    let (o, _) = gpumux_within(&["run", f.as_str(), "--device", "sim:h100", "-q"], &[], Duration::from_secs(20));
    assert_fails_with(&o, &["process `a` takes no simulated time per run", "replay_min_runs"]);
}

#[test]
fn progress_goes_to_stderr_off_a_terminal_and_leaves_the_json_alone() {
    let f = temp_file(
        "progress.toml",
        "[[process]]\nname = \"p\"\nrepetitions = 15\n[[process.op]]\nkind = \"kernel\"\nname = \"k\"\n\
         grid = 200000\nblock = 128\nregs_per_thread = 32\nblock_time_us = 10.0\nblock_time_spread = 0.2\n",
    );
    let args = ["run", f.as_str(), "--device", "sim:h100", "--policy", "fcfs,dss-cs", "--json", "--threads", "1"];
    let every = [("GPUMUX_PROGRESS_EVERY_MS", "100")];
    let (loud, took) = gpumux_within(&args, &every, Duration::from_secs(120));
    assert!(loud.status.success(), "{}", stderr(&loud));
    assert!(took > Duration::from_millis(400), "the run must outlast a few progress lines, took {took:?}");
    let err = stderr(&loud);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("gpumux run: ")).collect();
    assert!(!lines.is_empty(), "no progress line on stderr: {err:?}");
    assert!(lines
        .iter()
        .all(|l| l.contains("% of the estimated work after") || l.contains("more work than estimated")));
    assert!(lines.iter().any(|l| l.contains(" left (")), "no ETA in {lines:?}");
    let (quiet, _) = gpumux_within(&[&args[..], &["-q"]].concat(), &every, Duration::from_secs(120));
    assert!(quiet.status.success(), "{}", stderr(&quiet));
    assert!(quiet.stderr.is_empty(), "--quiet printed: {}", stderr(&quiet));
    assert_eq!(loud.stdout, quiet.stdout, "progress changed stdout");
}

/// `n` processes of one 4-block kernel each, all arriving at 0.
fn processes(n: usize) -> String {
    let mut s = String::new();
    for i in 0..n {
        s += &format!(
            "[[process]]\nname = \"p{i}\"\n[[process.op]]\nkind = \"kernel\"\nname = \"k\"\ngrid = 4\nblock = 128\n\
             regs_per_thread = 32\nblock_time_us = 10.0\n"
        );
    }
    s
}

#[test]
fn run_cost_grows_linearly_with_processes() {
    // 32 times the processes must cost about 32 times as much, not 1024 times
    // (before: 0.18 s for 1000 processes, 9.3 s for 16000, >400 s for 10^5).
    // Best of three, so a busy moment on a shared machine does not decide it.
    let time = |n: usize, tries: usize| {
        let f = temp_file(&format!("processes-{n}.toml"), &processes(n));
        let args = ["run", f.as_str(), "--device", "sim:h100", "--policy", "fcfs", "-q", "--json", "--threads", "1"];
        (0..tries)
            .map(|_| {
                let (o, took) = gpumux_within(&args, &[], Duration::from_secs(600));
                assert!(o.status.success(), "{n} processes: {}", stderr(&o));
                took
            })
            .min()
            .unwrap_or_default()
    };
    let (small, large) = (time(1000, 3), time(32000, 2));
    let ratio = large.as_secs_f64() / small.as_secs_f64().max(1e-3);
    assert!(ratio < 96.0, "32× the processes took {ratio:.0}× as long ({small:?} → {large:?}): not linear");
}
