//! Issue 11: inputs that exhausted memory, a closed pipe that panicked,
//! output paths that failed only after the work, and names and numbers that
//! were accepted silently or reported vaguely. Each test drives the binary.

mod common;

use common::{gpumux, repo_root, stderr};
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output, Stdio};

fn temp_file(name: &str, text: &str) -> common::TempFile {
    common::temp_file("bad-input", name, text)
}

/// Fails with a message containing each of `want`, and without a panic.
fn assert_fails(args: &[&str], want: &[&str]) -> Output {
    let o = gpumux(args);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{args:?} must fail with exit 1: {e}");
    for w in want {
        assert!(e.contains(w), "{args:?}: expected `{w}` in: {e}");
    }
    assert!(!e.contains("panicked"), "{args:?} panicked: {e}");
    o
}

/// `gpumux` under a 2 GiB address-space limit, so that reading without a
/// bound fails fast (an allocation failure aborts the program) instead of
/// taking the machine's memory.
fn gpumux_limited(args: &[&str], stdin: Stdio) -> std::process::Child {
    Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 2097152 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_gpumux"))
        .args(args)
        .current_dir(repo_root())
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sh runs")
}

#[test]
fn endless_inputs_stop_at_the_size_limit() {
    for args in [&["run", "/dev/zero"][..], &["rt", "analyze", "/dev/zero"][..]] {
        let o = gpumux_limited(args, Stdio::null()).wait_with_output().expect("wait");
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {e}");
        assert!(e.contains("/dev/zero") && e.contains("more than the 67108864 bytes"), "{args:?}: {e}");
    }
    // `yes | gpumux run /dev/stdin`: a pipe that never ends.
    let mut child = gpumux_limited(&["run", "/dev/stdin"], Stdio::piped());
    let mut input = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || {
        let chunk = "y\n".repeat(1 << 15);
        // Ends when gpumux closes the pipe (the test process ignores SIGPIPE).
        while input.write_all(chunk.as_bytes()).is_ok() {}
    });
    let o = child.wait_with_output().expect("wait");
    let _ = writer.join();
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("/dev/stdin") && e.contains("more than the 67108864 bytes"), "{e}");
}

/// Runs `args` with stdout a pipe whose reader is already closed.
fn with_closed_stdout(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    Command::new(env!("CARGO_BIN_EXE_gpumux"))
        .args(args)
        .current_dir(repo_root())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("the gpumux binary runs")
}

#[test]
fn a_closed_stdout_ends_every_subcommand_quietly() {
    let cases: &[&[&str]] = &[
        &["policies"],
        &["devices"],
        &["experiment", "list"],
        &["rt", "analyze", "examples/rt/table4.toml"],
        &["rt", "assign", "examples/rt/table4.toml"],
        &["rt", "bench", "--sets", "2", "--sizes", "3"],
        &["rt", "generate"],
        &["run", "examples/two-procs.toml", "--policy", "fcfs", "-q"],
    ];
    for args in cases {
        let o = with_closed_stdout(args);
        // Ended by SIGPIPE, as `cat` or `grep` would be, with nothing on stderr.
        assert_eq!(o.status.signal(), Some(13), "{args:?}: {:?}, stderr: {}", o.status, stderr(&o));
        assert_eq!(stderr(&o), "", "{args:?}");
    }
}

#[test]
fn output_paths_are_checked_before_the_work() {
    let dir = common::temp_dir("bad-input");
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a folder").expect("file");
    let file = file.to_str().expect("utf8");
    let missing = dir.path().join("no/such/folder/t.json");
    let missing = missing.to_str().expect("utf8");
    // /proc/self exists as a folder in which nobody, root included, can create a file.
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["run", "parboil-k20c:mix=8,seed=1", "--device", "sim:k20c", "-q", "--plot", file], "--plot"),
        (vec!["run", "parboil-k20c:mix=8,seed=1", "--device", "sim:k20c", "-q", "--trace", missing], "--trace"),
        (vec!["run", "parboil-k20c:mix=8,seed=1", "--device", "sim:k20c", "-q", "--plot", "/proc/self"], "--plot"),
        (vec!["bench", "sim", "--quick", "--json", missing], "--json"),
        // Before the GPU is opened (on a machine without one, that error came first).
        (vec!["bench", "cuda", "all", "--json", missing], "--json"),
        (vec!["rt", "experiment", "fig7", "--sets", "50", "--quiet", "--out", "/proc/self"], "--out"),
        // Before a daemon is started and the set run for seconds.
        (vec!["rt", "run", "examples/rt/small-sim.toml", "--device", "sim:h100x2", "--json", missing], "--json"),
        (vec!["experiment", "adriaens-even", "--quick", "--quiet", "--out", "/proc/self"], "--out"),
    ];
    for (args, flag) in cases {
        let o = assert_fails(&args, &[flag]);
        // Nothing ran: no table, no report.
        assert!(o.stdout.is_empty(), "{args:?} printed results before failing: {}", String::from_utf8_lossy(&o.stdout));
    }
    assert_eq!(std::fs::read_to_string(file).ok().as_deref(), Some("not a folder"), "the file is left alone");
}

#[test]
fn policy_names_say_what_is_wrong() {
    let run = |policy: &str, want: &[&str]| {
        assert_fails(&["run", "examples/two-procs.toml", "-q", "--policy", policy], want);
    };
    run("rr-18446744073709551615us", &["rr-18446744073709551615us", "at most 1000000000000us"]);
    run("rr-0us", &["bad policy `rr-0us`", "at least 1us"]);
    run("rr-0.5us", &["bad policy `rr-0.5us`", "whole number of microseconds"]);
    run("rr-500", &["needs its unit"]);
    run("ppq-excl-teleport", &["unknown preemption mechanism `teleport`"]);
    run("fcfs,fcfs", &["names `fcfs` twice"]);
    run("ppq-cs,dss,ppq-excl-cs", &["names `ppq-excl-cs` twice (as `ppq-cs` and `ppq-excl-cs`)"]);
}

#[test]
fn thread_counts_out_of_range_are_refused() {
    for n in ["0", "100000"] {
        let o = gpumux(&["run", "examples/two-procs.toml", "-q", "--threads", n]);
        assert_eq!(o.status.code(), Some(2), "--threads {n} must be a usage error: {}", stderr(&o));
        assert!(stderr(&o).contains("--threads") && stderr(&o).contains("1..=1024"), "{}", stderr(&o));
    }
}

const FAT_KERNEL: &str = "[[process]]\nname = \"p\"\n[[process.op]]\nkind = \"kernel\"\nname = \"fat\"\n\
                          grid = 4\nblock = 1024\nregs_per_thread = 255\nblock_time_us = 1\n";

#[test]
fn a_kernel_that_cannot_fit_names_the_file_and_the_process() {
    let f = temp_file("fat.toml", FAT_KERNEL);
    let path = f.as_str();
    assert_fails(&["run", path, "--device", "sim:k20c", "-q"], &[path, "process \"p\"", "kernel `fat` cannot fit"]);
}

#[test]
fn an_unknown_suite_kernel_is_run_on_the_simulator_with_a_warning() {
    let text = "[[process]]\nname = \"p\"\n[[process.op]]\nkind = \"kernel\"\nname = \"k\"\ngrid = 4\nblock = 64\n\
                regs_per_thread = 16\nblock_time_us = 1\nsuite = { name = \"nope\" }\n";
    let f = temp_file("nope.toml", text);
    let o = gpumux(&["run", f.as_str(), "--device", "sim:h100", "--policy", "fcfs", "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("warning:") && e.contains("`nope`") && e.contains("no GPU can"), "{e}");
    // A known suite kernel gets no warning.
    let f = temp_file("triad.toml", &text.replace("name = \"nope\"", "name = \"triad\", params = { n = 4096 }"));
    let o = gpumux(&["run", f.as_str(), "--device", "sim:h100", "--policy", "fcfs", "-q"]);
    assert!(o.status.success() && !stderr(&o).contains("warning"), "{}", stderr(&o));
}

#[test]
fn a_huge_copy_size_is_reported_in_a_few_characters() {
    let text = "[[process]]\nname = \"p\"\n[[process.op]]\nkind = \"h2d\"\nmb = 1e300\n";
    let f = temp_file("huge-copy.toml", text);
    let o = assert_fails(&["run", f.as_str(), "-q"], &["mb must be <= 1073741824, got 1e300"]);
    assert!(stderr(&o).len() < 300, "{}", stderr(&o));
}
