//! Issue 36's attacks on the daemon's socket side (cases 1, 2, 3) and its
//! config mistakes (case 8), on the simulated device, one test per case. Each
//! says how it would have failed on 717b546.

mod common;

use common::{own_uid, Client, Daemon};
use gpumux_proto::{decode_frame_body, encode_frame, ClientFrame, ErrorKind, FrameReader, Reply, Request, ServerFrame};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A field of /proc/PID/status (`Threads`, `VmRSS` in kB).
fn proc_status(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the daemon's /proc status");
    let line = text.lines().find(|l| l.starts_with(&format!("{field}:"))).expect("the field");
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("a number")
}

fn threads(d: &Daemon) -> u64 {
    proc_status(d.child.id(), "Threads")
}

fn rss_mb(d: &Daemon) -> f64 {
    proc_status(d.child.id(), "VmRSS") as f64 / 1024.0
}

fn hello_bytes(id: u64) -> Vec<u8> {
    let request = Request::hello("t", 0);
    encode_frame(&ClientFrame { id, request }).unwrap()
}

/// What came on a raw connection within `within`.
#[derive(Debug)]
enum Heard {
    Frame(ServerFrame),
    End,
    Nothing,
}

/// The next frame on `sock` (or its end), waiting at most `within`.
fn hear(sock: &mut UnixStream, reader: &mut FrameReader, within: Duration) -> Heard {
    let until = Instant::now() + within;
    loop {
        if let Some(body) = reader.next_body().expect("a well-formed frame from the daemon") {
            return Heard::Frame(decode_frame_body(&body).expect("a frame the client decodes"));
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Heard::Nothing;
        }
        sock.set_read_timeout(Some(left)).unwrap();
        let mut buf = [0u8; 4096];
        match sock.read(&mut buf) {
            Ok(0) => return Heard::End,
            Ok(n) => reader.extend(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            // A reset is an end too (the daemon closed with bytes of ours unread).
            Err(_) => return Heard::End,
        }
    }
}

/// An error frame with this kind and a message that names `limit`, then the end.
fn refused_naming(sock: &mut UnixStream, kind: ErrorKind, limit: &str, within: Duration) -> Result<(), String> {
    let mut reader = FrameReader::new();
    match hear(sock, &mut reader, within) {
        Heard::Frame(ServerFrame::Reply { id: 0, result: Err(e) }) if e.kind == kind && e.message.contains(limit) => {}
        other => return Err(format!("expected a {kind:?} error naming {limit}, got {other:?}")),
    }
    match hear(sock, &mut reader, within) {
        Heard::End => Ok(()),
        other => Err(format!("the connection stayed open after the refusal: {other:?}")),
    }
}

/// Connects and says Hello: `Ok` with the connection if welcomed, `Err` with
/// the error the daemon sent (then the connection must end).
fn try_hello(d: &Daemon) -> Result<UnixStream, gpumux_proto::ErrorReply> {
    let mut sock = UnixStream::connect(&d.socket).expect("the socket accepts (the daemon refuses after)");
    // The refusal comes before the Hello is read: a write may find the socket closed.
    let _ = sock.write_all(&hello_bytes(1));
    let mut reader = FrameReader::new();
    match hear(&mut sock, &mut reader, Duration::from_secs(10)) {
        Heard::Frame(ServerFrame::Reply { result: Ok(Reply::Welcome(_)), .. }) => Ok(sock),
        Heard::Frame(ServerFrame::Reply { result: Err(e), .. }) => {
            assert!(matches!(hear(&mut sock, &mut reader, Duration::from_secs(10)), Heard::End), "closed after");
            Err(e)
        }
        other => panic!("neither welcomed nor refused: {other:?}"),
    }
}

/// `Status` from `c`, and how long it took.
fn timed_status(c: &mut Client) -> Duration {
    let t = Instant::now();
    assert!(matches!(c.call(Request::Status), Ok(Reply::Status(_))), "Status answered");
    t.elapsed()
}

/// Opens `tries` connections (each says Hello) while `normal` keeps asking
/// for `Status`; returns those welcomed and checks that the others were
/// refused naming `limit`, that `normal` was answered within a second
/// throughout and that the daemon's threads stayed within `max_threads`.
fn flood(d: &Daemon, normal: &mut Client, tries: usize, limit: &str, max_threads: u64) -> Vec<UnixStream> {
    let mut welcomed = Vec::new();
    let mut refused = 0;
    let mut slowest = Duration::ZERO;
    let mut most_threads = 0;
    for i in 0..tries {
        match try_hello(d) {
            Ok(sock) => welcomed.push(sock),
            Err(e) => {
                assert_eq!(e.kind, ErrorKind::Quota, "{e:?}");
                assert!(e.message.contains(limit), "the refusal names {limit}: {}", e.message);
                refused += 1;
            }
        }
        if i % 20 == 0 {
            slowest = slowest.max(timed_status(normal));
            most_threads = most_threads.max(threads(d));
        }
    }
    eprintln!(
        "{tries} connections: {} welcomed, {refused} refused naming {limit}; the other client's Status \
         within {slowest:?}; at most {most_threads} daemon threads",
        welcomed.len()
    );
    assert!(slowest < Duration::from_secs(1), "the other client waited {slowest:?}");
    assert!(most_threads <= max_threads, "{most_threads} threads, over {max_threads}");
    welcomed
}

/// Connects to `socket` as effective uid `uid`, from a thread of its own
/// (setresuid as a raw system call changes only the calling thread, and
/// SO_PEERCRED reports the connecting thread's credentials). Root only.
fn connect_as(uid: u32, socket: &std::path::Path) -> UnixStream {
    let socket = socket.to_path_buf();
    std::thread::spawn(move || {
        // SAFETY: raw setresuid on this thread only; -1 keeps the real and saved uids (root).
        unsafe {
            assert_eq!(libc::syscall(libc::SYS_setresuid, -1i32, uid as i32, -1i32), 0);
        }
        let sock = UnixStream::connect(&socket);
        // SAFETY: as above, back to root (the saved uid).
        unsafe { libc::syscall(libc::SYS_setresuid, -1i32, 0i32, -1i32) };
        sock.expect("connect as another uid")
    })
    .join()
    .unwrap()
}

/// Case 1: a connection flood. On 717b546 every connection was taken, each
/// with two threads before its Hello (at ~7,800 it aborted, exit 134, its
/// socket left behind): run without `[limits]` against the daemon as it was,
/// all 300 here were welcomed and the daemon reached 568 threads, so the
/// refusal and thread assertions fail.
/// Now `[limits] connections_per_uid` and `connections` refuse the extra ones
/// at accept (a `Quota` frame naming the key, before any thread), another uid
/// still gets in, a closed connection gives its place back, and a client
/// connected all along is answered throughout.
#[test]
fn case_1_connections_are_limited_per_uid_and_in_all_and_others_are_served_throughout() {
    let config =
        "[limits]\nconnections = 64\nconnections_per_uid = 16\nhello_timeout = \"60 s\"\n\n[[allow]]\nany = true\n";
    let d = Daemon::start(Some(config));
    let (mut normal, _) = Client::hello(&d, "normal", 0);
    let base = threads(&d);
    // 15 more of this uid (the normal client is the 16th); two threads each.
    let mut mine = flood(&d, &mut normal, 300, "connections_per_uid", base + 2 * 15 + 4);
    assert_eq!(mine.len(), 15, "16 connections per uid, one of them the normal client's");

    // A closed connection gives its place back (once both its threads end).
    mine.truncate(10);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut again = Vec::new();
    while again.len() < 5 {
        match try_hello(&d) {
            Ok(sock) => again.push(sock),
            Err(e) => assert!(e.message.contains("connections_per_uid"), "{e:?}"),
        }
        assert!(Instant::now() < deadline, "the places of closed connections did not come back");
    }
    assert!(try_hello(&d).is_err(), "back at the limit");

    if own_uid() == 0 {
        // Another uid is not held to this one's limit.
        let dir = d.socket.parent().and_then(|p| p.parent()).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut other = connect_as(65534, &d.socket);
        other.write_all(&hello_bytes(1)).unwrap();
        let mut reader = FrameReader::new();
        match hear(&mut other, &mut reader, Duration::from_secs(10)) {
            Heard::Frame(ServerFrame::Reply { result: Ok(Reply::Welcome(_)), .. }) => {}
            other => panic!("uid 65534 was not welcomed beside uid 0 at its limit: {other:?}"),
        }
    } else {
        eprintln!("not root: another uid's connection not tried");
    }
    drop((mine, again));

    // In all: one uid allowed more than the daemon's total.
    let config =
        "[limits]\nconnections = 24\nconnections_per_uid = 64\nhello_timeout = \"60 s\"\n\n[[allow]]\nany = true\n";
    let d = Daemon::start(Some(config));
    let (mut normal, _) = Client::hello(&d, "normal", 0);
    let base = threads(&d);
    let all = flood(&d, &mut normal, 300, "[limits] connections", base + 2 * 23 + 4);
    assert_eq!(all.len(), 23, "24 connections in all, one of them the normal client's");
    drop(all);
    assert!(timed_status(&mut normal) < Duration::from_secs(1));
}

/// Case 2: a client that pipelines `Status` requests and never reads a reply.
/// On 717b546 the daemon read them all, queued every reply, and answered
/// them ahead of everyone else: against the daemon as it was, the hog sent
/// 23 M requests, the daemon grew from 6 MB to 4.37 GB and the other
/// client's `Status` waited 10.3 s (until the daemon dropped the hog), so
/// every assertion fails. Now the reader stops reading a
/// client whose backlog (requests not yet taken by the core, replies not yet
/// written) is at `[limits] outstanding`: the hog's writes block, the daemon
/// holds at most that many of its requests and replies.
#[test]
fn case_2_a_client_that_never_reads_its_replies_is_not_read_either_and_others_are_served() {
    let d = Daemon::start(None);
    let (mut normal, _) = Client::hello(&d, "normal", 0);
    let (hog, _) = Client::hello(&d, "hog", 0);
    // Warm the daemon up (its threads' first allocations) before the baseline.
    for _ in 0..20 {
        timed_status(&mut normal);
    }
    let base = rss_mb(&d);

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let flood = {
        let (stop, sent) = (stop.clone(), sent.clone());
        let mut sock = hog.sock.try_clone().unwrap();
        std::thread::spawn(move || {
            // The same id each time (the daemon does not mind): frames of one size.
            let frame = encode_frame(&ClientFrame { id: 100, request: Request::Status }).unwrap();
            let batch = frame.repeat(8192);
            sock.set_write_timeout(Some(Duration::from_millis(20))).unwrap();
            let mut at = 0;
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                match sock.write(&batch[at..]) {
                    Ok(n) => {
                        sent.fetch_add(n as u64, Ordering::Relaxed);
                        at = (at + n) % batch.len();
                    }
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                    Err(e) => {
                        // The daemon dropped it (a write it gave up on): the flood is over.
                        eprintln!("the hog's write failed after {:?}: {e}", started.elapsed());
                        return;
                    }
                }
            }
        })
    };

    let start = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut most = base;
    let mut asked = 0;
    while start.elapsed() < Duration::from_secs(6) {
        slowest = slowest.max(timed_status(&mut normal));
        most = most.max(rss_mb(&d));
        asked += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    let frame_bytes = encode_frame(&ClientFrame { id: 100, request: Request::Status }).unwrap().len() as u64;
    let sent = sent.load(Ordering::Relaxed) / frame_bytes;
    eprintln!(
        "a client sent {sent} Status requests without reading a reply: the daemon's RSS {base:.1} -> at most \
         {most:.1} MB; the other client's {asked} Status calls took at most {slowest:?}"
    );
    assert!(slowest < Duration::from_secs(1), "the other client waited {slowest:?} for Status");
    assert!(most - base < 48.0, "the daemon grew by {:.1} MB", most - base);
    // The hog was stopped, not read without bound: what it could send is
    // the daemon's backlog plus the socket's buffers, far below a million.
    assert!(sent < 1_000_000, "{sent} requests were taken from a client that reads no reply");
    drop(hog);
    assert!(timed_status(&mut normal) < Duration::from_secs(1));
}

/// Case 3: a frame's length, then all of its body but one byte, left open;
/// and a connection that never says Hello. On 717b546 nothing timed out:
/// the 40 connections here keep about 330 MB of the daemon's memory and none
/// is closed; against the daemon as it was, the first wait (for the silent
/// connection's `hello_timeout` error) got nothing in 5 s and failed. Now `[limits] frame_timeout` runs from a frame's first byte and
/// `hello_timeout` from the accept: the connection gets a `Protocol` error
/// naming the limit and is closed, and the memory is given back. A client
/// idle between frames is not cut off.
#[test]
fn case_3_a_half_sent_frame_and_a_missing_hello_are_cut_off_at_their_deadlines() {
    let config =
        format!("[limits]\nhello_timeout = \"1 s\"\nframe_timeout = \"1 s\"\n\n[[allow]]\nuid = {}\n", own_uid());
    let d = Daemon::start(Some(&config));
    let (mut idle, _) = Client::hello(&d, "idle", 0);
    timed_status(&mut idle);
    let base = rss_mb(&d);

    // Hello never sent, or only half of it.
    let mut silent = UnixStream::connect(&d.socket).unwrap();
    let mut half_hello = UnixStream::connect(&d.socket).unwrap();
    half_hello.write_all(&hello_bytes(1)[..6]).unwrap();
    let t = Instant::now();
    refused_naming(&mut silent, ErrorKind::Protocol, "hello_timeout", Duration::from_secs(5)).unwrap();
    refused_naming(&mut half_hello, ErrorKind::Protocol, "hello_timeout", Duration::from_secs(5)).unwrap();
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(4), "cut off after {took:?}");

    // 40 frames of 8 MiB, each but its last byte sent.
    const BODY: usize = 8 << 20;
    let body = vec![0x5au8; BODY - 1];
    let mut held = Vec::new();
    let t = Instant::now();
    for _ in 0..40 {
        let mut c = Client::hello(&d, "half", 0).0;
        c.sock.write_all(&(BODY as u32).to_le_bytes()).unwrap();
        c.sock.write_all(&body).unwrap();
        held.push((c.sock, Instant::now()));
    }
    let peak = rss_mb(&d);
    eprintln!("40 half-sent frames of 8 MiB sent in {:?}; the daemon's RSS {base:.1} -> {peak:.1} MB", t.elapsed());
    for (mut sock, sent_at) in held {
        refused_naming(&mut sock, ErrorKind::Protocol, "frame_timeout", Duration::from_secs(5)).unwrap();
        let after = sent_at.elapsed();
        assert!(after < Duration::from_secs(4), "a half-sent frame was cut off only {after:?} after it");
    }
    // The readers are gone with their buffers.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut now = rss_mb(&d);
    while now - base > 64.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        now = rss_mb(&d);
    }
    eprintln!("after the cut: {now:.1} MB");
    assert!(now - base < 64.0, "the daemon kept {:.1} MB after the connections were closed", now - base);

    // Idle between frames for longer than both deadlines: still served.
    assert!(timed_status(&mut idle) < Duration::from_secs(1));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(timed_status(&mut idle) < Duration::from_secs(1), "an idle client was cut off");
}

/// Runs gpumuxd with `config`; its exit status and stderr once it exits or
/// after `within` (then stopped with SIGTERM).
fn run_with_config(config: &str, within: Duration) -> (Option<i32>, String) {
    let dir = tempfile::Builder::new().prefix("gpumuxd-config-").tempdir().unwrap();
    let path = dir.path().join("gpumuxd.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpumuxd"))
        .args(["--device", "sim:h100", "--socket"])
        .arg(dir.path().join("g.sock"))
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + within;
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > until {
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    (code, stderr)
}

/// A uid no passwd entry names.
fn unknown_uid() -> u32 {
    (4_000_000_000u32..).find(|&u| unsafe { libc::getpwuid(u) }.is_null()).expect("a uid no one has")
}

/// Case 8: config mistakes. On 717b546 each error was printed twice (logged,
/// then printed on exit), `"-5 GiB"` was an `unknown unit`, and
/// `max_priority = -5`, a config naming only an unknown uid, or (new keys)
/// `[limits]` of 0 started a daemon that then refused every client, each
/// silently: every case below fails there. Now each stops start-up with one
/// line that says what is wrong, and an unknown uid beside a known one is a
/// warning that names it.
#[test]
fn case_8_config_mistakes_stop_start_up_with_the_reason_said_once() {
    let uid = own_uid();
    let nobody = unknown_uid();
    let cases = [
        (format!("[[allow]]\nuid = {uid}\nmemory = \"-5 GiB\"\n"), "a byte count cannot be negative"),
        (format!("[[allow]]\nuid = {uid}\nshm = -5\n"), "a byte count cannot be negative"),
        (format!("[[allow]]\nuid = {uid}\nmax_priority = -5\n"), "max_priority = -5 is below 0"),
        (format!("[[allow]]\nuid = {nobody}\n"), "admits nobody"),
        ("[daemon]\npolicy = \"fcfs\"\n".to_string(), "admits nobody"),
        (format!("[limits]\nconnections = 0\n\n[[allow]]\nuid = {uid}\n"), "connections = 0"),
        (format!("[limits]\nhello_timeout = \"-1 s\"\n\n[[allow]]\nuid = {uid}\n"), "a duration cannot be negative"),
        (format!("[limits]\nframe_timeut = 5\n\n[[allow]]\nuid = {uid}\n"), "unknown field `frame_timeut`"),
    ];
    for (config, says) in &cases {
        let (code, stderr) = run_with_config(config, Duration::from_secs(20));
        assert_eq!(code, Some(1), "{config}: it did not stop with status 1: {stderr}");
        assert_eq!(stderr.matches(says).count(), 1, "{config}: `{says}` is not said exactly once: {stderr}");
        assert!(stderr.contains("gpumuxd: config "), "{config}: {stderr}");
        assert!(!stderr.contains("unknown unit"), "{config}: {stderr}");
        if *says == "admits nobody" && config.contains("uid") {
            assert!(stderr.contains(&format!("uid {nobody}")), "the unknown uid is named: {stderr}");
        }
    }
    // An unknown uid beside a known one: a warning naming it, and the daemon runs.
    let (code, stderr) =
        run_with_config(&format!("[[allow]]\nuid = {nobody}\n\n[[allow]]\nuid = {uid}\n"), Duration::from_secs(3));
    assert_eq!(code, None, "it should have run until stopped: {stderr}");
    let warning = stderr.lines().find(|l| l.contains("WARN")).unwrap_or_default();
    assert!(warning.contains(&format!("uid {nobody}")) && warning.contains("entry 1"), "{stderr}");
    assert_eq!(stderr.matches(&format!("uid {nobody}")).count(), 1, "{stderr}");
}
