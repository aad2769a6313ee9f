//! `gpumuxd --record` and `gpumux replay` on the simulated device: the
//! simulator replaying a recording of itself must agree closely (the CI
//! self-check of issue 42's second goal, as `calibrate.rs` is of the first),
//! and a malformed recording is refused with its line and reason.

mod common;

use common::{gpumux, stderr, temp_dir};
use gpumux_client::{Arg, Client, ConnectOptions, LaunchConfig, StreamId};
use std::collections::{HashMap, HashSet};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

const SOURCE: &str = "extern \"C\" __global__ void work(float* p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] += 1.0f; }";

/// This file's tests run one at a time: the recording test times a simulated daemon in real
/// time, and the others start daemons and replays that would take the CPU from it on a
/// 2-core CI host.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    // A test that failed holding it poisons it; the next still runs.
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `gpumux daemon` on `sim:h100` recording to `record`; stopped by [`Daemon::stop`].
struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    fn start(dir: &Path, tag: &str, record: &Path) -> Daemon {
        let socket = dir.join(format!("{tag}.sock"));
        let child = Command::new(env!("CARGO_BIN_EXE_gpumux"))
            .env("RUST_LOG", "warn")
            .args(["daemon", "--device", "sim:h100", "--socket"])
            .arg(&socket)
            .arg("--record")
            .arg(record)
            .stdout(Stdio::null())
            .spawn()
            .expect("gpumux daemon starts");
        let deadline = Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "the daemon did not listen on {}", socket.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        Daemon { child, socket }
    }

    /// SIGTERM and wait: the recording is complete once the daemon has stopped.
    fn stop(mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().expect("the daemon stops");
        assert!(status.success(), "the daemon exited with {status}");
    }
}

/// A client as the examples are: inputs in, `launches` kernels of `blocks`
/// blocks of `block_ns` each, a sync, the output back.
#[derive(Clone, Copy)]
struct Job {
    name: &'static str,
    launches: u32,
    blocks: u32,
    block_ns: u64,
}

const JOBS: [Job; 2] = [
    Job { name: "short-blocks", launches: 20, blocks: 1056, block_ns: 1_000_000 },
    Job { name: "long-blocks", launches: 5, blocks: 528, block_ns: 4_000_000 },
];

/// Runs `job`; `launched` is called once its launches are sent, before its sync.
fn run_job(socket: &Path, job: Job, launched: impl FnOnce()) {
    let client =
        Client::connect(ConnectOptions { socket: Some(socket.to_path_buf()), ..ConnectOptions::named(job.name) })
            .expect("connects");
    let n = 1024;
    let buf = client.alloc(n as u64 * 4).expect("alloc");
    let input = vec![1u8; n * 4];
    client.copy_to_device(&buf, 0, &input, StreamId::DEFAULT).expect("copy in");
    let module = client.load_module("work.cu", SOURCE, &[]).expect("module");
    let k = module.kernel("work").expect("kernel");
    let config = LaunchConfig::new([job.blocks, 1, 1], [256, 1, 1]).block_time_ns(job.block_ns);
    for _ in 0..job.launches {
        client.launch(&k, &config, &[Arg::buffer(&buf), (n as i32).into()]).expect("launch");
    }
    launched();
    client.sync(StreamId::DEFAULT).expect("sync");
    let mut out = vec![0u8; n * 4];
    client.copy_to_host(&buf, 0, &mut out, StreamId::DEFAULT).expect("copy out");
    client.close().expect("close");
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .expect("the recording")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a line that is not JSON: {e}: {l}")))
        .collect()
}

/// Every operation of every client is there once, with its times in order,
/// and each client's lines lie between its hello and its goodbye.
fn check_recording(path: &Path, clients: usize) {
    let lines = lines(path);
    assert_eq!(lines[0]["kind"], "daemon", "the first line names the daemon: {}", lines[0]);
    assert_eq!(lines[0]["device"], "sim:h100");
    let mut hello: HashMap<u64, (String, u64)> = HashMap::new();
    let mut gone: HashMap<u64, u64> = HashMap::new();
    let mut ops = HashSet::new();
    let mut kernels: HashMap<String, u32> = HashMap::new();
    let mut syncs: HashMap<String, u32> = HashMap::new();
    for l in &lines[1..] {
        let client = l["client"].as_u64().expect("a client");
        match l["kind"].as_str() {
            Some("hello") => {
                let name = l["name"].as_str().expect("a name").to_string();
                hello.insert(client, (name, l["at_ns"].as_u64().expect("a time")));
            }
            Some("gone") => {
                gone.insert(client, l["at_ns"].as_u64().expect("a time"));
            }
            Some("op") => {
                let (name, at) = hello.get(&client).cloned().expect("an op after its client's hello");
                assert!(!gone.contains_key(&client), "an op of client {client} after it left: {l}");
                assert!(ops.insert(l["op"].as_u64().expect("an op id")), "an op recorded twice: {l}");
                let (s, e) = (l["submitted_ns"].as_u64().unwrap(), l["ended_ns"].as_u64().unwrap());
                assert!(at <= s && s <= e, "hello {at} <= submitted {s} <= ended {e}: {l}");
                if let Some(st) = l["started_ns"].as_u64() {
                    assert!(s <= st && st <= e, "submitted <= started <= ended: {l}");
                }
                assert_eq!(l["completed"], true, "{l}");
                match l["what"]["type"].as_str() {
                    Some("kernel") => {
                        assert!(l["sms"].as_u64().unwrap() > 0 && l["launches"].as_u64().unwrap() >= 1, "{l}");
                        *kernels.entry(name).or_default() += 1;
                    }
                    Some("sync") => *syncs.entry(name).or_default() += 1,
                    _ => {}
                }
            }
            other => panic!("an unexpected line {other:?}: {l}"),
        }
    }
    assert_eq!(hello.len(), clients, "every client's hello");
    assert_eq!(gone.len(), clients, "every client's goodbye");
    for job in JOBS {
        assert_eq!(kernels.get(job.name), Some(&job.launches), "every launch of {} once", job.name);
        assert_eq!(syncs.get(job.name), Some(&1), "the sync of {}", job.name);
    }
}

/// Records the jobs alone and together on `sim:h100` and replays the shared
/// recording with the alone one: the replay's JSON report, and its table.
fn record_and_replay(dir: &Path, attempt: u32) -> (serde_json::Value, String, PathBuf) {
    let tag = |t: &str| format!("{t}{attempt}");
    let alone = dir.join(tag("alone.jsonl"));
    let shared = dir.join(tag("shared.jsonl"));
    let d = Daemon::start(dir, &tag("alone"), &alone);
    for job in JOBS {
        run_job(&d.socket, job, || {});
    }
    d.stop();
    // Shared: the long blocks first, the short ones from a few ms into the long ones' first
    // kernel. Started together, which came first was a race that the host decided, and each
    // order is a different schedule (the one first holds SMs the other waits a block time
    // for: up to 4 ms of a 23 ms client); the replay, given submission times read off a
    // wall clock, could take the other order, and missed by 4-20 % in one attempt in three
    // on an idle 2-core host. In this order the short-block client finds the SMs the long
    // one leaves free, and both replays and recordings take the same schedule.
    let d = Daemon::start(dir, &tag("shared"), &shared);
    let [short, long] = JOBS;
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        let socket = d.socket.clone();
        s.spawn(move || run_job(&socket, long, move || tx.send(()).expect("the test waits")));
        rx.recv().expect("the long-block client launched");
        std::thread::sleep(Duration::from_millis(3));
        run_job(&d.socket, short, || {});
    });
    d.stop();
    check_recording(&alone, 2);
    check_recording(&shared, 2);
    let (json, toml) = (dir.join(tag("out.json")), dir.join(tag("w.toml")));
    let args = [
        "replay",
        shared.to_str().unwrap(),
        "--alone",
        alone.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "-o",
        toml.to_str().unwrap(),
        "--goal-pct",
        "5",
    ];
    let out = gpumux(&args);
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{}{printed}", stderr(&out));
    eprintln!("attempt {attempt}:\n{printed}");
    (serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap(), printed, toml)
}

/// Whether a replay's figures are within 5 % of the recording's; the first miss if not.
fn within_five_percent(r: &serde_json::Value) -> Result<(), String> {
    // False for a missing figure (NaN) too.
    let within = |a: f64, b: f64| (a / b - 1.0).abs() < 0.05;
    let clients = r["clients"].as_array().ok_or("no clients")?;
    if clients.len() != 2 {
        return Err(format!("{} clients", clients.len()));
    }
    for c in clients {
        let f = |k: &str| c[k].as_f64().unwrap_or(f64::NAN);
        if !within(f("simulated_ms"), f("recorded_ms")) {
            return Err(format!("shared turnaround not within 5 %: {c}"));
        }
        if !within(f("simulated_alone_ms"), f("recorded_alone_ms")) {
            return Err(format!("alone turnaround not within 5 %: {c}"));
        }
    }
    let (rec, sim) = (&r["recorded"], &r["simulated"]);
    for (i, what) in [(0, "ANTT"), (1, "STP")] {
        if !within(sim[i].as_f64().unwrap_or(f64::NAN), rec[i].as_f64().unwrap_or(f64::NAN)) {
            return Err(format!("{what} not within 5 %: recorded {rec}, simulated {sim}"));
        }
    }
    Ok(())
}

/// Recordings the test below makes before it gives up.
const ATTEMPTS: u32 = 5;

/// The sim recorded alone and together, then replayed: each client's
/// simulated turnaround, alone and shared, within 5 % of the recorded one,
/// and ANTT and STP too (measured on an idle 2-core host: 25 attempts of 25
/// within 1 %). The simulated daemon runs in real time on a host that CI
/// shares, and the core's clock reads are the recording's times: a run in
/// which another process held the daemon's or the clients' threads off the CPU
/// for milliseconds (one busy loop beside it on 2 cores: a client off by 5-37 %
/// in one attempt in three, a copy or an end seen up to 8 ms late) is recorded
/// again, up to five times in all; each attempt's table is printed, and a
/// failure gives the host's load.
#[test]
fn the_simulator_replays_a_recording_of_itself_within_a_few_percent() {
    let _one = one_at_a_time();
    let dir = temp_dir("replay");
    let mut last = Err(String::new());
    for attempt in 1..=ATTEMPTS {
        let (r, printed, toml) = record_and_replay(dir.path(), attempt);
        for c in r["clients"].as_array().expect("clients") {
            assert!(c["recorded_ms"].as_f64().unwrap() > 10.0, "a client of tens of ms: {c}");
        }
        // The two shared a device: sharing slowed them down, or the check checks nothing. A
        // recording in which they did not (CI once recorded ANTT 0.97: an alone run held off the
        // CPU by the host's load, slower than the shared one) is a disturbed run like the others
        // below: recorded again.
        if r["recorded"][0].as_f64().is_none_or(|antt| antt <= 1.1) {
            last = Err(format!("recorded ANTT not above 1.1 (sharing must slow them): {}", r["recorded"]));
            continue;
        }
        // The workload written is one gpumux runs.
        let run = gpumux(&["run", toml.to_str().unwrap(), "--device", "sim:h100", "--policy", "fcfs", "-q"]);
        assert!(run.status.success(), "{}", stderr(&run));
        last = within_five_percent(&r);
        // The report's verdict judges ANTT and STP; this test also each client's turnarounds,
        // so it is the stricter of the two: the report may pass a run that this test records
        // again (CI once had a client's shared turnaround at -5.0 % with ANTT and STP within
        // 3 %), but never fail one that this test passes. The printed verdict is the report's.
        let verdict = r["within_goal"].as_bool().expect("the report has a within_goal verdict");
        assert!(printed.contains(if verdict { "PASS" } else { "FAIL" }), "{printed}");
        if last.is_ok() {
            assert!(verdict, "the report failed a run whose every figure is within 5 %: {r}");
            break;
        }
    }
    if let Err(why) = last {
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_else(|e| format!("unknown ({e})"));
        panic!(
            "{ATTEMPTS} recordings in a row disturbed or replayed off by more than 5 % (the host's load average: \
             {}); the last: {why}",
            load.trim()
        );
    }
}

const DAEMON: &str = r#"{"kind":"daemon","format":1,"device":"sim:h100","policy":"fcfs","sms":132,"at_ns":0}"#;
const HELLO: &str = r#"{"kind":"hello","client":1,"name":"a","priority":0,"weight":1.0,"at_ns":5}"#;

fn op(client: u64, submitted: u64, started: u64, ended: u64) -> String {
    format!(
        r#"{{"kind":"op","client":{client},"op":1,"stream":0,"what":{{"type":"kernel","name":"k","grid":[1,1,1],"block":[32,1,1],"shared_bytes":0,"regs_per_thread":32,"block_time_ns":1000}},"submitted_ns":{submitted},"started_ns":{started},"ended_ns":{ended},"reply":false,"launches":1,"sms":1,"completed":true}}"#
    )
}

/// Each bad recording is refused with its line and what is wrong.
#[test]
fn a_malformed_recording_is_refused_with_its_line_and_reason() {
    let _one = one_at_a_time();
    let dir = temp_dir("replay-bad");
    let good = op(1, 10, 20, 30);
    let cases: Vec<(String, &str)> = vec![
        (format!("{HELLO}\n"), ":1: the first line must be the daemon's"),
        (format!("{DAEMON}\n{{not json\n"), ":2: not a recording line"),
        (
            format!("{DAEMON}\n{HELLO}\n{}\n", op(1, 30, 31, 20)),
            ":3: operation 1 of client 1: ended at 20 ns, before it was submitted at 30 ns",
        ),
        (
            format!("{DAEMON}\n{HELLO}\n{}\n", op(1, 10, 40, 30)),
            ":3: operation 1 of client 1: started at 40 ns, outside",
        ),
        (format!("{DAEMON}\n{}\n", good), ":2: operation 1 of client 1, which never said hello"),
        (format!("{DAEMON}\n{HELLO}\n{good}\n{good}\n"), ":4: operation 1 recorded twice"),
        (format!("{DAEMON}\n{HELLO}\n{DAEMON}\n"), ":3: a second recording starts here"),
        (DAEMON.replace("\"format\":1", "\"format\":9"), ":1: recording format 9"),
        (format!("{DAEMON}\n{HELLO}\n"), "no client completed an operation"),
        (
            format!("{DAEMON}\n{HELLO}\n{}\n", good.replace("[32,1,1]", "[2048,1,1]")),
            ":3: operation 1 of client 1: kernel `k`: a block of 2048 threads",
        ),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.jsonl"));
        std::fs::write(&path, text).unwrap();
        let out = gpumux(&["replay", path.to_str().unwrap()]);
        let e = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "case {i} refused: {e}");
        assert!(e.contains(want), "case {i}: wanted {want:?} in: {e}");
        assert!(!e.contains("panicked"), "{e}");
    }
    // And a good one of the same shape is taken.
    let path = dir.path().join("good.jsonl");
    std::fs::write(&path, format!("{DAEMON}\n{HELLO}\n{good}\n")).unwrap();
    let out = gpumux(&["replay", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A recording that cannot be written (a full disk) ends the recording, not
/// the daemon: its clients are served as before.
#[test]
fn a_recording_that_cannot_be_written_stops_and_the_daemon_serves_on() {
    let _one = one_at_a_time();
    let dir = temp_dir("replay-full");
    let d = Daemon::start(dir.path(), "full", Path::new("/dev/full"));
    for job in JOBS {
        run_job(&d.socket, Job { launches: 2, block_ns: 10_000, ..job }, || {});
    }
    d.stop();
}

/// A recording of client `name` (id `id`) running one kernel `kernel` from `start` to `end` ns.
fn one_kernel(id: u64, name: &str, kernel: &str, start: u64, end: u64) -> String {
    format!(
        "{{\"kind\":\"hello\",\"client\":{id},\"name\":\"{name}\",\"priority\":0,\"weight\":1.0,\"at_ns\":{start}}}\n\
         {{\"kind\":\"op\",\"client\":{id},\"op\":{id},\"stream\":0,\"what\":{{\"type\":\"kernel\",\"name\":\"{kernel}\",\
         \"grid\":[4224,1,1],\"block\":[256,1,1],\"shared_bytes\":0,\"regs_per_thread\":32,\"block_time_ns\":1000}},\
         \"submitted_ns\":{start},\"started_ns\":{start},\"ended_ns\":{end},\"reply\":false,\"launches\":1,\"sms\":132,\
         \"completed\":true}}\n"
    )
}

/// `--mem-intensity`: a kernel given memory intensity 1 still takes its recorded time
/// alone, and on half the SMs (spatial-even) next to a compute-bound one it loses little,
/// since half the SMs saturate DRAM already (κ = 2.5 on sim:h100: demand 1.25); the
/// compute-bound one is unchanged. That is what the H200 replay misses with intensity 0
/// (docs/calibration.md). A name the recording lacks, or an intensity outside [0, 1], is refused.
#[test]
fn a_given_memory_intensity_keeps_the_alone_time_and_shrinks_the_shared_slowdown() {
    let _one = one_at_a_time();
    let dir = temp_dir("replay-mem");
    let daemon = DAEMON.replace("fcfs", "spatial-even");
    let alone = dir.path().join("alone.jsonl");
    let shared = dir.path().join("shared.jsonl");
    std::fs::write(
        &alone,
        format!("{daemon}\n{}{}", one_kernel(1, "a", "k", 0, 1_000_000), one_kernel(2, "b", "c", 2_000_000, 3_000_000)),
    )
    .unwrap();
    std::fs::write(
        &shared,
        format!("{daemon}\n{}{}", one_kernel(1, "a", "k", 0, 1_500_000), one_kernel(2, "b", "c", 0, 1_500_000)),
    )
    .unwrap();
    let replay = |extra: &[&str]| -> serde_json::Value {
        let json = dir.path().join("r.json");
        let mut args = vec!["replay", shared.to_str().unwrap(), "--alone", alone.to_str().unwrap()];
        args.extend_from_slice(&["--json", json.to_str().unwrap()]);
        args.extend_from_slice(extra);
        let out = gpumux(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
    };
    let ms = |r: &serde_json::Value, key: &str| -> Vec<f64> {
        r["clients"].as_array().unwrap().iter().map(|c| c[key].as_f64().unwrap()).collect()
    };
    let compute = replay(&[]);
    let memory = replay(&["--mem-intensity", "k=1"]);
    let m_of = |r: &serde_json::Value, k: &str| {
        r["kernels"].as_array().unwrap().iter().find(|x| x["name"] == k).and_then(|x| x["mem_intensity"].as_f64())
    };
    assert_eq!((m_of(&compute, "k"), m_of(&compute, "c")), (Some(0.0), Some(0.0)));
    assert_eq!((m_of(&memory, "k"), m_of(&memory, "c")), (Some(1.0), Some(0.0)));
    for (c, m) in ms(&compute, "simulated_alone_ms").iter().zip(ms(&memory, "simulated_alone_ms")) {
        assert!((m / c - 1.0).abs() < 0.01, "alone: {m} ms with m = 1 against {c} ms with m = 0");
        assert!((c - 1.0).abs() < 0.02, "alone {c} ms, recorded 1 ms");
    }
    let (c, m) = (ms(&compute, "simulated_ms"), ms(&memory, "simulated_ms"));
    // Half the SMs: ~2x alone with intensity 0; with 1, its blocks stretch by 1.25 instead of
    // 2.5 (DRAM still saturated, by it alone): ~1x. The compute-bound client: ~2x either way.
    assert!(c[0] > 1.8 && m[0] < 0.7 * c[0], "client a shared: {} ms with m = 1, {} ms with m = 0", m[0], c[0]);
    assert!((m[1] / c[1] - 1.0).abs() < 0.05, "client b shared: {} ms, then {} ms", c[1], m[1]);
    for (args, want) in [
        (vec!["--mem-intensity", "nope=1"], "names kernel \"nope\", which"),
        (vec!["--mem-intensity", "k=x"], "is not a number"),
        (vec!["--mem-intensity", "k=1.5"], "must be between 0 and 1, got 1.5"),
        (vec!["--mem-intensity", "k"], "expected KERNEL=M"),
    ] {
        let mut a = vec!["replay", shared.to_str().unwrap()];
        a.extend_from_slice(&args);
        let out = gpumux(&a);
        let e = stderr(&out);
        assert!(!out.status.success() && e.contains(want), "{args:?}: wanted {want:?} in: {e}");
        assert!(!e.contains("panicked"), "{e}");
    }
}
