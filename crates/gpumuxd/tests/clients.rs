//! The four example clients (examples/clients/: two Rust, two C) as separate
//! processes at once against one `gpumuxd --device sim:h100`, each with
//! `--check`: on a simulated device that checks that their inputs
//! round-trip bitwise through alloc, copy, launch, sync and copy back. And
//! issue 40's two (a 4-stream pipeline with stream waits, a kernel timed
//! with events), small, one after the other, and scripts/pipeline-times.py
//! reading what the pipeline prints.
//!
//! The programs are cargo's build outputs, found from this test binary's
//! path: `cargo test` builds the Rust examples (`<profile>/examples/`) and
//! `libgpumux_client.so` (`<profile>/deps/`); the C
//! programs are compiled here with `cc` against `include/gpumux.h` (skipped,
//! saying so on stderr, where there is no `cc`).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// `<target>/<profile>`: this binary is `<target>/<profile>/deps/clients-<hash>`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary knows its path");
    exe.parent().and_then(Path::parent).map(Path::to_path_buf).expect("the test binary lies in <target>/<profile>/deps")
}

/// `cargo build` with this profile's flag: how to build what is missing.
fn cargo_build(what: &str) -> String {
    let release = if profile_dir().ends_with("release") { " --release" } else { "" };
    format!("cargo build{release} -p gpumux-client{what}")
}

/// A build output that must be there, or the command that makes it.
fn built(path: PathBuf, build: &str) -> PathBuf {
    assert!(path.exists(), "{} is missing: build it with `{}`", path.display(), cargo_build(build));
    path
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Why there is no C compiler to use, if there is none.
fn no_c_compiler() -> Option<String> {
    match Command::new("cc").arg("--version").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!("no working C compiler (`cc --version`: {})", o.status)),
        Err(e) => Some(format!("no C compiler (`cc`: {e})")),
    }
}

/// Compiles `examples/clients/<name>.c` into `dir` as the Makefile does, and
/// returns the program.
fn compile_c_example(name: &str, dir: &Path) -> PathBuf {
    let root = repo_root();
    // `cargo test` leaves the cdylib in deps/ (`cargo build` also links it
    // one level up): the one this build made.
    let lib_dir = profile_dir().join("deps");
    built(lib_dir.join("libgpumux_client.so"), "");
    let out = dir.join(name);
    let kernel_dir = root.join("examples/clients/kernels");
    let o = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-std=c11"])
        .arg(format!("-I{}", root.join("crates/gpumux-client/include").display()))
        .arg(format!("-DKERNEL_DIR=\"{}\"", kernel_dir.display()))
        .arg(root.join(format!("examples/clients/{name}.c")))
        .arg("-o")
        .arg(&out)
        .arg(format!("-L{}", lib_dir.display()))
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .args(["-lgpumux_client", "-lm"])
        .output()
        .expect("cc runs");
    assert!(o.status.success(), "cc {name}.c failed:\n{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// The status of `daemon` once no example client is connected any more: the
/// observer `me` is its only client.
fn status_once_alone(me: &mut Client) -> gpumux_proto::Status {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = me.status();
        if s.clients.len() == 1 || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn four_example_clients_at_once_round_trip_their_inputs_and_leave_nothing_held() {
    let uid = own_uid();
    let d = Daemon::start(Some(&format!("[[allow]]\nuid = {uid}\nmemory = \"1 GiB\"\n")));
    let (mut observer, welcome) = Client::hello(&d, "observer", 0);
    assert_eq!(welcome.device, "sim:h100");
    let baseline = observer.status();
    assert_eq!(baseline.memory_used, 0);

    let examples = profile_dir().join("examples");
    let mut programs =
        vec![built(examples.join("vector_add"), " --examples"), built(examples.join("histogram"), " --examples")];
    let c_dir = tempfile::Builder::new().prefix("gpumuxd-clients-").tempdir().expect("a temporary directory");
    match no_c_compiler() {
        None => {
            programs.extend(["matmul", "stencil"].map(|name| compile_c_example(name, c_dir.path())));
        }
        Some(why) => eprintln!("SKIPPED clients, C examples matmul.c and stencil.c: {why}"),
    }

    let children: Vec<_> = programs
        .iter()
        .map(|p| {
            // The C programs' rpath names deps/, but `cargo test` puts the
            // profile directory on LD_LIBRARY_PATH, which goes first: a
            // library `cargo build` left there would speak the protocol of
            // its day, not this build's.
            let child = Command::new(p)
                .env("LD_LIBRARY_PATH", profile_dir().join("deps"))
                .arg("--check")
                .arg("--socket")
                .arg(&d.socket)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("{} does not start: {e}", p.display()));
            (p, child)
        })
        .collect();
    let outputs: Vec<(&PathBuf, Output)> =
        children.into_iter().map(|(p, c)| (p, c.wait_with_output().expect("the client runs"))).collect();
    for (program, o) in &outputs {
        let name = program.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{name} failed ({}):\n{stdout}{stderr}", o.status);
        // On sim, `--check` compares the inputs read back with what was sent, byte for byte.
        assert!(stdout.contains("sim:h100: simulated device"), "{name} did not see the simulated device:\n{stdout}");
        assert!(stdout.contains(&format!("{name}: check passed")), "{name} did not check:\n{stdout}");
    }

    let s = status_once_alone(&mut observer);
    assert_eq!(s.clients.len(), 1, "the example clients are still connected: {s:?}");
    assert_eq!(s.memory_used, baseline.memory_used, "client memory is still held: {s:?}");
    assert!(s.clients.iter().all(|c| c.memory_used == 0 && c.sms_held == 0), "{s:?}");
}

/// The numbers of `key=a,b,c` in `out`.
fn reps(out: &str, key: &str) -> Vec<f64> {
    let list =
        out.split_whitespace().find_map(|w| w.strip_prefix(key)).unwrap_or_else(|| panic!("no {key} in:\n{out}"));
    list.split(',').map(|x| x.parse().unwrap_or_else(|e| panic!("{key}{list}: {x:?}: {e}"))).collect()
}

/// scripts/pipeline-times.py (the GPU check's comparison) reads what
/// stream_pipeline prints: the same run given as both sides pairs into one
/// run a side of 3 repetitions, at 1.000x.
fn pipeline_times_reads(stdout: &str) {
    let dir = tempfile::Builder::new().prefix("gpumuxd-pipeline-times-").tempdir().expect("a temporary directory");
    let log = dir.path().join("run.log");
    std::fs::write(&log, stdout).expect("the log written");
    let script = repo_root().join("scripts/pipeline-times.py");
    let o = match Command::new("python3")
        .arg(&script)
        .args(["--limit", "1.10", "--native"])
        .arg(&log)
        .arg("--daemon")
        .arg(&log)
        .output()
    {
        Ok(o) => o,
        Err(e) => return eprintln!("SKIPPED pipeline_times_reads: no python3 ({e})"),
    };
    let out = String::from_utf8_lossy(&o.stdout);
    // 0 passes, 1 fails the limit or the overlap (on a simulated device the
    // copies' time is the host's, anything); 2 is a log it could not read.
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "pipeline-times.py ({}):\n{out}{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("pipeline: 1.000x (limit 1.10x)"), "{out}");
    assert!(out.contains("medians of 3 and 3 repetitions over 1 run a side"), "{out}");
}

#[test]
fn the_pipeline_and_event_timing_examples_check_on_the_simulated_device() {
    let d = Daemon::start(None);
    let examples = profile_dir().join("examples");
    for (name, key) in [("stream_pipeline", "pipeline_reps_ms="), ("event_timing", "kernel_reps_ms=")] {
        let program = built(examples.join(name), " --examples");
        let o = Command::new(&program)
            .args(["--check", "--chunks", "4", "--chunk-mib", "1", "--repeat", "3", "--socket"])
            .arg(&d.socket)
            .env_remove("LCG_TIMING")
            .output()
            .unwrap_or_else(|e| panic!("{name} does not start: {e}"));
        let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{name} failed ({}):\n{stdout}{stderr}", o.status);
        assert!(stdout.contains(&format!("{name}: check passed")), "{name} did not check:\n{stdout}");
        assert!(stdout.contains("device sim:h100"), "{name}:\n{stdout}");
        // Every timed repetition is printed for the GPU check to pool, the
        // untimed warm-up not among them.
        let times = reps(&stdout, key);
        assert_eq!(times.len(), 3, "{name}: {key} has {} times for --repeat 3:\n{stdout}", times.len());
        assert!(times.iter().all(|&t| t > 0.0), "{name}: {key}{times:?}");
        if name == "stream_pipeline" {
            pipeline_times_reads(&stdout);
        }

        // LCG_TIMING takes "old" or "new", and says so before it connects.
        let o = Command::new(&program).args(["--socket"]).arg(&d.socket).env("LCG_TIMING", "0ld").output();
        let o = o.unwrap_or_else(|e| panic!("{name} does not start: {e}"));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && stderr.contains("LCG_TIMING=\"0ld\""), "{name} took LCG_TIMING=0ld: {stderr}");
    }
}
