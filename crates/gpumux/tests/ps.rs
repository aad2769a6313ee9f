//! `gpumux ps` and `gpumux top --json` against a daemon (`gpumux daemon`,
//! on the simulated device): issue 36's cases 6 and 9 as a user meets them.
//! Each test says how it would have failed on 717b546.

mod common;

use common::{stderr, temp_dir};
use gpumux_client::{Arg, Client, ConnectOptions, LaunchConfig};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `gpumux daemon` on `sim:h100` at a socket of its own; stopped on drop.
struct Daemon {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// Started, not waited for: the README's `gpumuxd ... &`.
    fn spawn() -> Daemon {
        let dir = temp_dir("ps");
        let socket = dir.path().join("g.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_gpumux"))
            .env("RUST_LOG", "warn")
            .args(["daemon", "--device", "sim:h100", "--socket"])
            .arg(&socket)
            .stdout(Stdio::null())
            .spawn()
            .expect("gpumux daemon starts");
        Daemon { child, socket, _dir: dir }
    }

    fn client(&self, name: &str) -> Client {
        Client::connect(ConnectOptions { socket: Some(self.socket.clone()), ..ConnectOptions::named(name) }).unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// `gpumux ARGS --socket SOCKET`, with stdout to `stdout` if given.
fn gpumux_at(socket: &Path, args: &[&str], stdout: Option<std::fs::File>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpumux"));
    cmd.args(args).arg("--socket").arg(socket);
    if let Some(f) = stdout {
        cmd.stdout(f);
    }
    cmd.output().expect("gpumux runs")
}

/// Case 9, the README's race: `gpumux ps` right after `gpumuxd ... &`
/// answers. On 717b546 it failed ("no daemon listens on ...") 9 times in 10.
#[test]
fn ps_right_after_the_daemon_starts_answers() {
    let d = Daemon::spawn();
    let out = gpumux_at(&d.socket, &["ps"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("device sim:h100"));
}

/// Case 9: `gpumux ps > /dev/full` is an error with a message and exit
/// status 1. On 717b546 it panicked in `println!` (exit 101, "failed
/// printing to stdout").
#[test]
fn ps_to_a_full_disk_fails_with_a_message_not_a_panic() {
    let d = Daemon::spawn();
    for args in [&["ps"][..], &["ps", "--json"], &["top", "--json", "-n", "1"]] {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
        let out = gpumux_at(&d.socket, args, Some(full));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(err.contains("error: writing to standard output: No space left on device"), "{args:?}: {err}");
    }
}

/// Case 6: a client's name with a newline and ANSI escapes shows escaped,
/// in one row, in `ps`, `ps --json` and `top --json`. On 717b546 the newline
/// made a second row that looked like another client's, and the escapes
/// cleared the screen of whoever ran `ps`.
#[test]
fn a_hostile_name_is_printed_escaped_in_one_row() {
    let d = Daemon::spawn();
    let evil = "x\n   9     4242      0 root-train     9\x1b[2J\u{202e}";
    let _c = d.client(evil);
    let out = gpumux_at(&d.socket, &["ps"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(!table.chars().any(|c| c.is_control() && c != '\n'), "{table:?}");
    // Totals, blank line, header, and one row per client: the hostile one and `gpumux ps`.
    assert_eq!(table.lines().count(), 6, "{table}");
    assert!(table.lines().any(|l| l.contains(" x\\n   9     4242  ")), "{table}");
    assert!(!table.lines().any(|l| l.trim_start().starts_with("9 ")), "a faked row: {table}");
    for args in [&["ps", "--json"][..], &["top", "--json", "-n", "1"]] {
        let out = gpumux_at(&d.socket, args, None);
        assert!(out.status.success(), "{}", stderr(&out));
        let status: gpumux_client::Status = serde_json::from_slice(&out.stdout).unwrap();
        assert!(status
            .clients
            .iter()
            .any(|c| c.name == "x\\n   9     4242      0 root-train     9\\u{1b}[2J\\u{202e}"));
        assert!(status.clients.iter().all(|c| !c.name.chars().any(char::is_control)), "{status:?}");
    }
}

/// Case 9: after a client is killed mid-kernel, its memory stays held until
/// its blocks in flight end, and `ps` says so instead of showing memory no
/// row holds. On 717b546 `ps` showed "memory 1.0 MiB" above a table whose
/// rows held none, with no word, for as long as the blocks ran (about 2 s).
#[test]
fn ps_explains_the_memory_of_a_client_that_left_mid_kernel() {
    let d = Daemon::spawn();
    let victim = d.client("victim");
    let buf = victim.alloc(1 << 20).unwrap();
    let module = victim.load_module("k.cu", "__global__ void k(int* p) {}", &[]).unwrap();
    let k = module.kernel("k").unwrap();
    // One wave of 1.5 s blocks on every SM.
    let cfg = LaunchConfig::new([132, 1, 1], [128, 1, 1]).block_time_ns(1_500_000_000);
    victim.launch(&k, &cfg, &[Arg::buffer(&buf)]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    drop(victim);
    std::thread::sleep(Duration::from_millis(100));
    let out = gpumux_at(&d.socket, &["ps"], None);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        table.contains(
            "1.0 MiB of that memory is held for clients that have left, until their work still on the device ends"
        ),
        "{table}"
    );
    let t = Instant::now();
    loop {
        let table = String::from_utf8_lossy(&gpumux_at(&d.socket, &["ps"], None).stdout).into_owned();
        if !table.contains("have left") {
            assert!(table.contains("memory 0 B /"), "{table}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{table}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
