//! `gpumux bench daemon --hostile`: issue 36's soak test. One daemon with
//! its default config serves two well-behaved clients alone, then beside
//! four abusive ones, then after them ([`super::abusers`] has every
//! client):
//!
//! 0. the two clients connect and warm up; the four abusers start and wait
//!    (never-read has said `Hello`, huge-grids has loaded its module); the
//!    daemon's baseline is read;
//! 1. **alone** (`--hostile-seconds`): the two clients launch + sync an
//!    empty kernel in a loop, each latency counted;
//! 2. **abused** (as long): the same clients, connected throughout, while
//!    never-read, half-frames, huge-grids and, from [`FLOOD_DELAY`] on, flood
//!    run, each a process of its own speaking the raw protocol (all of the
//!    bench's uid, so they share the daemon's per-uid connection limit: the
//!    flood, started last, takes the slots the others leave);
//! 3. **after**: the abusers stop; the clients go on for [`SETTLE`] while the
//!    daemon's memory is watched; then a new client connects, launches and
//!    syncs, and asks for `Status`.
//!
//! Goals (the issue's): the abused p99 within 2x of the alone p99; no
//! restart (the same daemon process alive throughout, the same device
//! process, no context rebuilt, a new client served); the well-behaved
//! clients never see an error; the daemon's memory back to its baseline
//! (taken before phase 1) within [`RSS_SLACK_BYTES`] or [`RSS_SLACK_SHARE`],
//! whichever is larger. The daemon's resident memory, threads and
//! descriptors come from `/proc/PID/status` and `/proc/PID/fd`, sampled
//! every [`SAMPLE`].

use super::abusers::{AbuserResult, Hist, HostileRole, SteadyResult};
use super::gpu::{MODULE, SOURCE};
use super::procs::{lines_of, Daemon};
use super::report::table;
use super::DaemonBenchArgs;
use anyhow::{anyhow, bail, Context, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Well-behaved clients.
pub const STEADY_CLIENTS: usize = 2;
/// How long phase 3 watches the daemon's memory come back before the verdict.
pub const SETTLE: Duration = Duration::from_secs(5);
/// How often the daemon's memory, threads and descriptors are read.
const SAMPLE: Duration = Duration::from_millis(100);
/// Memory back to baseline means within this many bytes of it...
pub const RSS_SLACK_BYTES: u64 = 16 << 20;
/// ... or within this share of it, whichever is larger.
pub const RSS_SLACK_SHARE: f64 = 0.10;
/// The abused p99 may be at most this many times the alone p99.
pub const P99_GOAL: f64 = 2.0;
/// How long after the other abusers the flood starts (module doc).
const FLOOD_DELAY: Duration = Duration::from_secs(1);
/// How long a client may take to prepare (on a GPU the daemon compiles the kernels).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a client may take to report once told to stop.
const RESULT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the new client after the abusers may take to connect, load, launch, sync and get `Status`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// One process's resident memory, threads and open descriptors.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ProcSample {
    pub rss_bytes: u64,
    /// Of which anonymous memory (the heap; the rest is files and shared memory).
    pub rss_anon_bytes: u64,
    pub threads: u64,
    pub fds: u64,
}

/// `/proc/PID` now; `None` once the process is gone (or a zombie).
fn sample(pid: u32) -> Option<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line[name.len()..].split_whitespace().next()?.parse().ok()
    };
    let rss_bytes = field("VmRSS:")? * 1024;
    let rss_anon_bytes = field("RssAnon:").unwrap_or(0) * 1024;
    let threads = field("Threads:")?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    Some(ProcSample { rss_bytes, rss_anon_bytes, threads, fds })
}

/// The live child processes of `pid` (the daemon's device process on a GPU).
fn children(pid: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return pids };
    for entry in dir.flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // pid (comm) state ppid ...: comm may hold spaces, so read after its last ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let mut f = rest.split_whitespace();
        let (state, ppid) = (f.next(), f.next().and_then(|p| p.parse::<u32>().ok()));
        if ppid == Some(pid) && state != Some("Z") {
            pids.push(child);
        }
    }
    pids.sort_unstable();
    pids
}

/// The highest of each figure over a phase.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Peak {
    pub rss_bytes: u64,
    pub threads: u64,
    pub fds: u64,
}

impl Peak {
    fn add(&mut self, s: ProcSample) {
        self.rss_bytes = self.rss_bytes.max(s.rss_bytes);
        self.threads = self.threads.max(s.threads);
        self.fds = self.fds.max(s.fds);
    }
}

/// A `bench-hostile-role` process and its line protocol.
struct Role {
    role: HostileRole,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    done: bool,
}

impl Role {
    fn spawn(exe: &Path, role: HostileRole, socket: &Path, name: &str, flood: u32) -> Result<Role> {
        let mut child = Command::new(exe)
            .arg("bench-hostile-role")
            .arg("--role")
            .arg(role.name())
            .arg("--socket")
            .arg(socket)
            .arg("--name")
            .arg(name)
            .arg("--flood")
            .arg(flood.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {} bench-hostile-role --role {}", exe.display(), role.name()))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout of a {} process", role.name()))?;
        let rx = lines_of(stdout);
        Ok(Role { role, child, stdin, lines: rx, done: false })
    }

    fn say(&mut self, word: &str) {
        if let Some(s) = self.stdin.as_mut() {
            // A process that is gone reports itself through its output.
            let _ = writeln!(s, "{word}").and_then(|_| s.flush());
        }
    }

    fn line(&mut self, deadline: Instant, what: &str) -> Result<String> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(l) => Ok(l),
            Err(RecvTimeoutError::Timeout) => bail!("the {} process did not {what} in time", self.role.name()),
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                bail!("the {} process ended ({status}) before it could {what}", self.role.name())
            }
        }
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let l = self.line(deadline, "get ready")?;
            if l == "ready" {
                return Ok(());
            }
            if let Some(msg) = l.strip_prefix("error ") {
                bail!("the {} process failed to prepare: {msg}", self.role.name());
            }
        }
    }

    /// Says `stop` (unless said) and reads the result.
    fn result<T: DeserializeOwned>(&mut self) -> Result<T> {
        self.say("stop");
        self.stdin = None;
        let deadline = Instant::now() + RESULT_TIMEOUT;
        loop {
            let l = self.line(deadline, "report its result")?;
            if let Some(json) = l.strip_prefix("result ") {
                self.done = true;
                return serde_json::from_str(json).with_context(|| format!("the {} result", self.role.name()));
            }
            if let Some(msg) = l.strip_prefix("error ") {
                self.done = true;
                bail!("the {} process failed: {msg}", self.role.name());
            }
        }
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The well-behaved clients' latency in one phase, both clients together.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseRow {
    /// `alone`, `abused`, `after`.
    pub phase: String,
    pub seconds: f64,
    pub launches: u64,
    pub launches_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// This p99 over the alone p99.
    pub p99_vs_alone: Option<f64>,
}

impl PhaseRow {
    fn of(phase: &str, seconds: f64, h: &Hist) -> PhaseRow {
        let us = |ns: u64| ns as f64 / 1e3;
        PhaseRow {
            phase: phase.into(),
            seconds,
            launches: h.count,
            launches_per_s: if seconds > 0.0 { h.count as f64 / seconds } else { 0.0 },
            p50_us: us(h.percentile(50.0)),
            p99_us: us(h.percentile(99.0)),
            max_us: us(h.max_ns),
            p99_vs_alone: None,
        }
    }
}

/// A process's figures over the run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProcFigures {
    pub pid: u32,
    /// Before phase 1: the clients connected and warmed up, the abusers
    /// started and idle (two of them connected).
    pub baseline: Option<ProcSample>,
    /// At the end of phase 1.
    pub end_of_alone: Option<ProcSample>,
    /// The highest during phase 2.
    pub peak_abused: Peak,
    /// At the end of phase 3.
    pub after: Option<ProcSample>,
    /// Seconds from the abusers' `stop` until the memory was first seen back
    /// within the slack (read once their results are in, then every [`SAMPLE`]).
    pub rss_back_after_s: Option<f64>,
}

impl ProcFigures {
    /// Resident memory back within the slack of the baseline.
    pub fn rss_back(&self) -> bool {
        match (self.baseline, self.after) {
            (Some(b), Some(a)) => a.rss_bytes <= b.rss_bytes + slack(b.rss_bytes),
            _ => false,
        }
    }
}

/// The slack of memory back to a baseline of `bytes` (module doc).
pub fn slack(bytes: u64) -> u64 {
    RSS_SLACK_BYTES.max((bytes as f64 * RSS_SLACK_SHARE) as u64)
}

/// One of the goals.
#[derive(Clone, Debug, Serialize)]
pub struct Goal {
    pub goal: String,
    pub pass: bool,
    pub detail: String,
}

/// Everything the soak measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HostileReport {
    pub device: String,
    pub policy: String,
    /// Seconds of the alone and the abused phase each.
    pub seconds: u32,
    pub settle_seconds: f64,
    pub flood_wave: u32,
    /// The abusers run (`--hostile-abusers`).
    pub abuser_roles: Vec<String>,
    pub phases: Vec<PhaseRow>,
    /// The abused p99 over the alone p99.
    pub p99_ratio: Option<f64>,
    pub daemon: ProcFigures,
    /// The device process (a GPU's; none for a simulator in the daemon's process).
    pub device_process: Option<ProcFigures>,
    pub device_process_same: bool,
    pub daemon_alive: bool,
    pub context_rebuilds: Option<u32>,
    /// Clients in the daemon's `Status` after the abusers went (the two
    /// well-behaved ones and the new one are 3).
    pub clients_after: Option<usize>,
    /// A new client's launch + sync after the abusers went, µs (or why it failed).
    pub new_client_us: Option<f64>,
    pub new_client_error: Option<String>,
    /// Errors the well-behaved clients got (none expected).
    pub client_errors: Vec<String>,
    pub abusers: Vec<AbuserResult>,
    /// What each abuser does.
    pub legend: Vec<String>,
    /// Abusers whose process failed (their counts are missing).
    pub abuser_failures: Vec<String>,
    pub goals: Vec<Goal>,
    pub pass: bool,
}

/// Reads the daemon (and its device process) every [`SAMPLE`] for `d`, keeping the peaks.
fn watch(pid: u32, dev: Option<u32>, d: Duration, peak: &mut Peak, dev_peak: &mut Peak) {
    let end = Instant::now() + d;
    loop {
        if let Some(s) = sample(pid) {
            peak.add(s);
        }
        if let Some(s) = dev.and_then(sample) {
            dev_peak.add(s);
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(SAMPLE.min(left));
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

/// A new client after the abusers: connect, load, launch + sync, `Status`.
fn new_client(socket: &Path) -> Result<(f64, gpumux_client::Status)> {
    let options = gpumux_client::ConnectOptions {
        socket: Some(socket.to_path_buf()),
        shm_bytes: 0,
        ..gpumux_client::ConnectOptions::named("hostile-probe")
    };
    let c = gpumux_client::Client::connect(options).context("connecting")?;
    let m = c.load_module(MODULE, SOURCE, &[]).context("loading the bench kernels")?;
    let k = m.kernel("empty")?;
    let config = gpumux_client::LaunchConfig::new([1, 1, 1], [32, 1, 1]).block_time_ns(1_000);
    let t = Instant::now();
    c.launch(&k, &config, &[])?;
    c.sync(gpumux_client::StreamId::DEFAULT)?;
    let us = t.elapsed().as_secs_f64() * 1e6;
    let status = c.status()?;
    let _ = c.close();
    Ok((us, status))
}

/// Runs the soak (module doc) against a daemon it starts; the report, pass or not.
pub fn run(args: &DaemonBenchArgs, exe: &Path, dir: &Path, device: &str) -> Result<HostileReport> {
    let say = |what: &str| eprintln!("[bench daemon --hostile] {what}");
    let roles = HostileRole::abusers(&args.hostile_abusers)?;
    let seconds = if args.quick { args.hostile_seconds.min(3) } else { args.hostile_seconds };
    let phase = Duration::from_secs(seconds as u64);
    let extra: Vec<String> = args.daemon_args.split_whitespace().map(str::to_owned).collect();
    let log: PathBuf = args.logs.join("hostile.log");
    say(&format!("starting gpumux {} on {device} (log: {})", args.policy, log.display()));
    let mut d = Daemon::start(exe, device, &args.policy, &extra, dir, &log)?;
    let pid = d.pid();
    let mut report = HostileReport {
        device: device.into(),
        policy: args.policy.clone(),
        seconds,
        settle_seconds: SETTLE.as_secs_f64(),
        flood_wave: args.hostile_flood,
        abuser_roles: roles.iter().map(|r| r.name().to_owned()).collect(),
        legend: roles.iter().map(|r| format!("{}: {}", r.name(), r.describe(args.hostile_flood))).collect(),
        ..HostileReport::default()
    };
    report.daemon.pid = pid;
    let dev_before = children(pid);
    let dev_pid = dev_before.first().copied();

    say(&format!("{STEADY_CLIENTS} well-behaved clients"));
    let mut steady = Vec::new();
    for i in 0..STEADY_CLIENTS {
        steady.push(Role::spawn(exe, HostileRole::Steady, &d.socket, &format!("steady-{i}"), args.hostile_flood)?);
    }
    for s in steady.iter_mut() {
        s.wait_ready()?;
    }
    // The abusers are started now, idle until `go`: phase 1 is not disturbed by
    // their start-up, and phase 2 starts when they do.
    say("starting the abusers (idle until phase 2)");
    let mut abusers = Vec::new();
    for &role in &roles {
        let mut a = Role::spawn(exe, role, &d.socket, role.name(), args.hostile_flood)?;
        a.wait_ready()?;
        abusers.push(a);
    }
    std::thread::sleep(Duration::from_millis(500));
    report.daemon.baseline = sample(pid);
    let mut dev = dev_pid.map(|p| ProcFigures { pid: p, baseline: sample(p), ..ProcFigures::default() });

    say(&format!("phase 1: alone, {seconds} s"));
    for s in steady.iter_mut() {
        s.say("phase 1");
        s.say("go");
    }
    let (mut peak, mut dev_peak) = (Peak::default(), Peak::default());
    let t1 = Instant::now();
    watch(pid, dev_pid, phase, &mut peak, &mut dev_peak);
    report.daemon.end_of_alone = sample(pid);
    if let Some(f) = dev.as_mut() {
        f.end_of_alone = sample(f.pid);
    }

    say(&format!("phase 2: beside {} abusers, {seconds} s", abusers.len()));
    for s in steady.iter_mut() {
        s.say("phase 2");
    }
    let alone_s = t1.elapsed().as_secs_f64();
    let t2 = Instant::now();
    for a in abusers.iter_mut().filter(|a| a.role != HostileRole::Flood) {
        a.say("go");
    }
    let (mut peak, mut dev_peak) = (Peak::default(), Peak::default());
    let delay = FLOOD_DELAY.min(phase / 2);
    watch(pid, dev_pid, delay, &mut peak, &mut dev_peak);
    for a in abusers.iter_mut().filter(|a| a.role == HostileRole::Flood) {
        a.say("go");
    }
    watch(pid, dev_pid, phase - delay, &mut peak, &mut dev_peak);
    for a in abusers.iter_mut() {
        a.say("stop");
    }
    for s in steady.iter_mut() {
        s.say("phase 3");
    }
    let abused_s = t2.elapsed().as_secs_f64();
    let t3 = Instant::now();
    report.daemon.peak_abused = peak;
    if let Some(f) = dev.as_mut() {
        f.peak_abused = dev_peak;
    }
    say("phase 3: the abusers stop");
    for a in abusers.iter_mut() {
        match a.result::<AbuserResult>() {
            Ok(r) => report.abusers.push(r),
            Err(e) => report.abuser_failures.push(format!("{e:#}")),
        }
    }
    drop(abusers);
    // Watch the memory come back for the rest of the settle window.
    let settle_end = t3 + SETTLE;
    loop {
        let now = Instant::now();
        for f in std::iter::once(&mut report.daemon).chain(dev.as_mut()) {
            if let (Some(b), Some(s), None) = (f.baseline, sample(f.pid), f.rss_back_after_s) {
                if s.rss_bytes <= b.rss_bytes + slack(b.rss_bytes) {
                    f.rss_back_after_s = Some(now.duration_since(t3).as_secs_f64());
                }
            }
        }
        if now >= settle_end {
            break;
        }
        std::thread::sleep(SAMPLE.min(settle_end - now));
    }
    report.daemon.after = sample(pid);
    if let Some(f) = dev.as_mut() {
        f.after = sample(f.pid);
    }
    let (tx, rx) = channel();
    let socket = d.socket.clone();
    // On a thread: a daemon that does not answer must not hold the bench.
    std::thread::spawn(move || {
        let _ = tx.send(new_client(&socket));
    });
    let probe = rx
        .recv_timeout(PROBE_TIMEOUT)
        .unwrap_or_else(|_| Err(anyhow!("no answer within {} s", PROBE_TIMEOUT.as_secs())));
    match probe {
        Ok((us, status)) => {
            report.new_client_us = Some(us);
            report.context_rebuilds = Some(status.context_rebuilds);
            report.clients_after = Some(status.clients.len());
        }
        Err(e) => report.new_client_error = Some(format!("{e:#}")),
    }
    let after_s = t3.elapsed().as_secs_f64();
    let mut hists: [Hist; 3] = Default::default();
    for (i, s) in steady.iter_mut().enumerate() {
        match s.result::<SteadyResult>() {
            Ok(r) => {
                for p in &r.phases {
                    if (1..=3).contains(&p.phase) {
                        hists[p.phase as usize - 1].merge(&p.hist);
                    }
                }
                if let Some((phase, e)) = r.error {
                    report.client_errors.push(format!("steady-{i}, phase {phase}: {e}"));
                }
            }
            Err(e) => report.client_errors.push(format!("steady-{i}: {e:#}")),
        }
    }
    drop(steady);
    report.daemon_alive = d.exited().is_none() && sample(pid).is_some();
    let dev_after = children(pid);
    report.device_process_same = dev_after == dev_before;
    report.device_process = dev;

    let names = ["alone", "abused", "after"];
    let secs = [alone_s, abused_s, after_s];
    report.phases = (0..3).map(|i| PhaseRow::of(names[i], secs[i], &hists[i])).collect();
    let alone_p99 = report.phases[0].p99_us;
    for r in report.phases.iter_mut() {
        r.p99_vs_alone = (alone_p99 > 0.0 && r.launches > 0).then(|| r.p99_us / alone_p99);
    }
    report.p99_ratio = report.phases[1].p99_vs_alone;
    report.goals = goals(&report, &dev_before, &dev_after);
    report.pass = report.goals.iter().all(|g| g.pass);
    Ok(report)
}

/// The goals, judged.
fn goals(r: &HostileReport, dev_before: &[u32], dev_after: &[u32]) -> Vec<Goal> {
    let mut goals = Vec::new();
    let (alone, abused) = (&r.phases[0], &r.phases[1]);
    goals.push(Goal {
        goal: format!("abused p99 within {P99_GOAL}x of alone"),
        pass: r.p99_ratio.is_some_and(|x| x <= P99_GOAL),
        detail: match r.p99_ratio {
            Some(x) => format!("{x:.2}x ({:.1} µs alone, {:.1} µs abused)", alone.p99_us, abused.p99_us),
            None => format!("no ratio: {} launches alone, {} abused", alone.launches, abused.launches),
        },
    });
    let served = r.new_client_us.is_some();
    let rebuilt = r.context_rebuilds.unwrap_or(0);
    let mut why = Vec::new();
    if !r.daemon_alive {
        why.push(format!("the daemon (pid {}) is gone", r.daemon.pid));
    }
    if !r.device_process_same {
        why.push(format!("its device process changed: {dev_before:?} then {dev_after:?}"));
    }
    if rebuilt > 0 {
        why.push(format!("{rebuilt} context rebuilds"));
    }
    if let Some(e) = &r.new_client_error {
        why.push(format!("a new client failed: {e}"));
    }
    goals.push(Goal {
        goal: "no daemon restart".into(),
        pass: why.is_empty() && served,
        detail: if why.is_empty() {
            format!(
                "pid {} up throughout{}, no context rebuilt; a new client's launch + sync took {:.0} µs",
                r.daemon.pid,
                if dev_before.is_empty() { String::new() } else { format!(", device process {dev_before:?} too") },
                r.new_client_us.unwrap_or(0.0)
            )
        } else {
            why.join("; ")
        },
    });
    goals.push(Goal {
        goal: "the well-behaved clients saw no error".into(),
        pass: r.client_errors.is_empty(),
        detail: if r.client_errors.is_empty() { "none".into() } else { r.client_errors.join("; ") },
    });
    let mut mem = Vec::new();
    let mut back = true;
    for (name, f) in
        std::iter::once(("daemon", &r.daemon)).chain(r.device_process.as_ref().map(|f| ("device process", f)))
    {
        back &= f.rss_back();
        match (f.baseline, f.after) {
            (Some(b), Some(a)) => mem.push(format!(
                "{name} {:.1} MiB before, {:.1} MiB at the peak, {:.1} MiB {:.0} s after (slack {:.0} MiB{})",
                mib(b.rss_bytes),
                mib(f.peak_abused.rss_bytes),
                mib(a.rss_bytes),
                r.settle_seconds,
                mib(slack(b.rss_bytes)),
                f.rss_back_after_s.map_or(", never back".into(), |s| format!(", back after {s:.1} s")),
            )),
            _ => mem.push(format!("{name}: no reading")),
        }
    }
    goals.push(Goal { goal: "memory back to baseline".into(), pass: back, detail: mem.join("; ") });
    goals
}

impl HostileReport {
    /// The tables, as printed.
    pub fn render(&self) -> String {
        let mut out = format!(
            "gpumux bench daemon --hostile on {} (gpumuxd {}, default config): {} s alone, {} s beside {} abusers, {:.0} s after\n",
            self.device,
            self.policy,
            self.seconds,
            self.seconds,
            self.abuser_roles.len(),
            self.settle_seconds
        );
        out +=
            &format!("\nWell-behaved clients: {STEADY_CLIENTS} clients, empty kernel launch + sync in a loop (µs)\n");
        let rows: Vec<Vec<String>> = self
            .phases
            .iter()
            .map(|p| {
                vec![
                    p.phase.clone(),
                    format!("{:.1}", p.seconds),
                    p.launches.to_string(),
                    format!("{:.0}", p.launches_per_s),
                    format!("{:.1}", p.p50_us),
                    format!("{:.1}", p.p99_us),
                    format!("{:.1}", p.max_us),
                    p.p99_vs_alone.map_or("-".into(), |x| format!("{x:.2}x")),
                ]
            })
            .collect();
        out += &table(&["phase", "s", "launches", "per s", "p50", "p99", "max", "p99 / alone"], &rows);

        let fmt = |s: Option<ProcSample>, f: fn(ProcSample) -> String| s.map_or("-".into(), f);
        let mut rows = Vec::new();
        for (name, f) in
            std::iter::once(("daemon", &self.daemon)).chain(self.device_process.as_ref().map(|f| ("device process", f)))
        {
            let peak = ProcSample {
                rss_bytes: f.peak_abused.rss_bytes,
                rss_anon_bytes: 0,
                threads: f.peak_abused.threads,
                fds: f.peak_abused.fds,
            };
            let cells = |g: fn(ProcSample) -> String| {
                vec![fmt(f.baseline, g), fmt(f.end_of_alone, g), g(peak), fmt(f.after, g)]
            };
            rows.push([vec![format!("{name} RSS (MiB)")], cells(|s| format!("{:.1}", mib(s.rss_bytes)))].concat());
            rows.push([vec![format!("{name} threads")], cells(|s| s.threads.to_string())].concat());
            rows.push([vec![format!("{name} descriptors")], cells(|s| s.fds.to_string())].concat());
        }
        out += &format!(
            "\nThe daemon (pid {}): before phase 1, at the end of it, the peak beside the abusers, {:.0} s after them\n",
            self.daemon.pid, self.settle_seconds
        );
        out += &table(&["", "baseline", "end alone", "peak abused", "after"], &rows);
        if let Some(n) = self.clients_after {
            out += &format!("clients in Status after the abusers: {n} (the 2 well-behaved, the new one)\n");
        }

        out += "\nAbusers: what each did, and what the daemon did to it\n";
        let rows: Vec<Vec<String>> = self
            .abusers
            .iter()
            .map(|a| {
                vec![
                    a.role.clone(),
                    a.opened.to_string(),
                    a.connect_failed.to_string(),
                    a.refused.to_string(),
                    a.closed.to_string(),
                    a.stalled.to_string(),
                    a.sent.to_string(),
                    if a.errors.is_empty() {
                        "-".into()
                    } else {
                        a.errors.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", ")
                    },
                ]
            })
            .collect();
        out += &table(
            &["abuser", "opened", "connect failed", "refused", "closed", "stalled", "sent", "error frames"],
            &rows,
        );
        for l in &self.legend {
            out += &format!("  {l}\n");
        }
        out += "  refused: a Quota frame at accept; closed: ended by the daemon otherwise; stalled: times its writes found the daemon not reading\n";
        for f in &self.abuser_failures {
            out += &format!("  abuser FAILED: {f}\n");
        }

        out += "\nGoals\n";
        for g in &self.goals {
            out += &format!("  {}  {}: {}\n", if g.pass { "PASS" } else { "FAIL" }, g.goal, g.detail);
        }
        out += &format!("hostile soak: {}\n", if self.pass { "PASS" } else { "FAIL" });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_sample_and_no_children_yet() {
        let s = sample(std::process::id()).expect("our own /proc");
        assert!(s.rss_bytes > 0 && s.threads >= 1 && s.fds >= 3, "{s:?}");
        assert_eq!(sample(u32::MAX), None);
    }

    #[test]
    fn the_slack_is_16_mib_or_a_tenth() {
        assert_eq!(slack(50 << 20), 16 << 20);
        assert_eq!(slack(1 << 30), (1u64 << 30) / 10);
    }
}
