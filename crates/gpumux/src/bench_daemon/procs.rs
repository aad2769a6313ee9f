//! The processes of one bench setting: role processes (this executable's
//! hidden `bench-role`), a gpumuxd to serve them, an MPS control daemon in a
//! private pipe directory. Everything started here is stopped here, on
//! errors too.

use super::jobs::{Job, JobResult};
use super::role::{Mode, RoleResult};
use anyhow::{anyhow, bail, Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long a role may take to prepare (context, NVRTC, inputs, warm-up).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a role may run after `go`.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// One process of a setting: how it reaches the GPU and its jobs.
#[derive(Clone, Debug)]
pub struct ProcPlan {
    pub mode: Mode,
    pub jobs: Vec<Job>,
    /// Environment of this process alone (a client's `GPUMUX_CLASS`), over the setting's.
    pub vars: Vec<(String, String)>,
}

impl ProcPlan {
    pub fn native(jobs: Vec<Job>) -> ProcPlan {
        ProcPlan { mode: Mode::Native, jobs, vars: Vec::new() }
    }
    pub fn daemon(jobs: Vec<Job>) -> ProcPlan {
        ProcPlan { mode: Mode::Daemon, jobs, vars: Vec::new() }
    }
}

/// Where role processes find the GPU.
#[derive(Clone, Debug, Default)]
pub struct Env {
    /// The daemon's socket, for daemon-mode roles.
    pub socket: Option<PathBuf>,
    /// Extra environment (MPS's pipe directory).
    pub vars: Vec<(String, String)>,
    pub ordinal: i32,
}

struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// It ends by itself: it has a job that does (its `Fill` jobs stop when its finite jobs are done).
    finite: bool,
    result: Option<RoleResult>,
}

impl Running {
    /// The next line, or an error naming what was awaited.
    fn line(&mut self, deadline: Instant, what: &str) -> Result<String> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(l) => Ok(l),
            Err(RecvTimeoutError::Timeout) => bail!("a role process did not {what} in time"),
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                bail!("a role process ended ({status}) before it could {what}")
            }
        }
    }

    fn say(&mut self, word: &str) {
        if let Some(s) = self.stdin.as_mut() {
            // A role that is gone reports itself through its output.
            let _ = writeln!(s, "{word}").and_then(|_| s.flush());
        }
    }

    fn await_result(&mut self, deadline: Instant) -> Result<()> {
        loop {
            let l = self.line(deadline, "report its result")?;
            if let Some(json) = l.strip_prefix("result ") {
                self.result = Some(serde_json::from_str(json).context("a role's result")?);
                return Ok(());
            }
            if let Some(msg) = l.strip_prefix("error ") {
                bail!("a role process failed: {msg}");
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.result.is_none() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

fn spawn(exe: &Path, plan: &ProcPlan, env: &Env, name: &str) -> Result<Running> {
    let mut cmd = Command::new(exe);
    cmd.arg("bench-role")
        .arg("--mode")
        .arg(match plan.mode {
            Mode::Native => "native",
            Mode::Daemon => "daemon",
        })
        .arg("--ordinal")
        .arg(env.ordinal.to_string())
        .arg("--name")
        .arg(name)
        .arg("--jobs")
        .arg(serde_json::to_string(&plan.jobs)?);
    if let Some(s) = &env.socket {
        cmd.arg("--socket").arg(s);
    }
    for (k, v) in env.vars.iter().chain(&plan.vars) {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {} bench-role", exe.display()))?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout of a role process"))?;
    let rx = lines_of(stdout);
    Ok(Running { child, stdin, lines: rx, finite: plan.jobs.iter().any(Job::finite), result: None })
}

/// Runs one setting: starts every process, waits until all are prepared,
/// starts them together, waits for the processes whose jobs all end by
/// themselves (or `stop_after`), then stops the others. Returns each
/// process's job results, in plan order.
pub fn run_setting(
    exe: &Path,
    plans: &[ProcPlan],
    env: &Env,
    stop_after: Option<Duration>,
) -> Result<Vec<Vec<JobResult>>> {
    let mut procs = Vec::new();
    for (i, p) in plans.iter().enumerate() {
        procs.push(spawn(exe, p, env, &format!("bench-{i}"))?);
    }
    let deadline = Instant::now() + READY_TIMEOUT;
    for p in procs.iter_mut() {
        loop {
            let l = p.line(deadline, "get ready")?;
            if l == "ready" {
                break;
            }
            if let Some(msg) = l.strip_prefix("error ") {
                bail!("a role process failed to prepare: {msg}");
            }
        }
    }
    for p in procs.iter_mut() {
        p.say("go");
    }
    let deadline = Instant::now() + RUN_TIMEOUT;
    if let Some(d) = stop_after {
        std::thread::sleep(d);
    } else {
        for p in procs.iter_mut().filter(|p| p.finite) {
            p.await_result(deadline)?;
        }
    }
    for p in procs.iter_mut() {
        p.say("stop");
    }
    for p in procs.iter_mut().filter(|p| p.result.is_none()) {
        p.await_result(deadline)?;
    }
    Ok(procs.iter_mut().map(|p| p.result.take().map(|r| r.jobs).unwrap_or_default()).collect())
}

/// The last `lines` non-empty lines of the file at `path` (what a daemon
/// that would not start said), or why there are none.
fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let kept: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            if kept.is_empty() {
                "(nothing)".into()
            } else {
                kept[kept.len().saturating_sub(lines)..].join("\n")
            }
        }
        Err(e) => format!("(unreadable: {e})"),
    }
}

/// A gpumuxd started for the bench, stopped (SIGTERM) when dropped.
pub struct Daemon {
    child: Child,
    pub socket: PathBuf,
    /// Its log (what it said about each client, e.g. the GPU it placed it on).
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `gpumux daemon` (this executable; its device process is the
    /// gpumuxd beside it) on a private socket and waits until it answers.
    /// Its log goes to `log`.
    pub fn start(exe: &Path, device: &str, policy: &str, extra: &[String], dir: &Path, log: &Path) -> Result<Daemon> {
        let socket = dir.join(format!("gpumuxd-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&socket);
        let log_file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(exe)
            .arg("daemon")
            .arg("--socket")
            .arg(&socket)
            .arg("--device")
            .arg(device)
            .arg("--policy")
            .arg(policy)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {} daemon", exe.display()))?;
        let mut d = Daemon { child, socket, log: log.to_path_buf() };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let options = gpumux_client::ConnectOptions {
                socket: Some(d.socket.clone()),
                shm_bytes: 0,
                ..gpumux_client::ConnectOptions::named("bench-probe")
            };
            if let Ok(c) = gpumux_client::Client::connect(options) {
                let _ = c.close();
                return Ok(d);
            }
            if let Ok(Some(status)) = d.child.try_wait() {
                bail!(
                    "gpumuxd ({policy} on {device}) exited before it served: {status}; its log ({}) ends:\n{}",
                    log.display(),
                    log_tail(log, 3)
                );
            }
            if Instant::now() > deadline {
                bail!("gpumuxd ({policy} on {device}) did not answer within 60 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Daemon {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How it ended, if it has.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                let _ = std::fs::remove_file(&self.socket);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// An MPS control daemon in a private pipe directory (it changes no device
/// setting and needs no reset), quit when dropped.
pub struct Mps {
    vars: Vec<(String, String)>,
}

impl Mps {
    /// Starts it; an error says why MPS cannot be measured here.
    pub fn start(dir: &Path) -> Result<Mps> {
        let pipe = dir.join("mps-pipe");
        let log = dir.join("mps-log");
        std::fs::create_dir_all(&pipe)?;
        std::fs::create_dir_all(&log)?;
        let vars = vec![
            ("CUDA_MPS_PIPE_DIRECTORY".to_owned(), pipe.display().to_string()),
            ("CUDA_MPS_LOG_DIRECTORY".to_owned(), log.display().to_string()),
        ];
        let status = Command::new("nvidia-cuda-mps-control")
            .arg("-d")
            .envs(vars.iter().map(|(k, v)| (k, v)))
            .status()
            .context("running nvidia-cuda-mps-control (is MPS installed?)")?;
        if !status.success() {
            bail!("nvidia-cuda-mps-control -d failed: {status}");
        }
        std::thread::sleep(Duration::from_millis(500));
        Ok(Mps { vars })
    }

    /// The environment that makes a CUDA process an MPS client of this daemon.
    pub fn vars(&self) -> &[(String, String)] {
        &self.vars
    }
}

impl Drop for Mps {
    fn drop(&mut self) {
        let quit = Command::new("nvidia-cuda-mps-control")
            .envs(self.vars.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                if let Some(mut i) = c.stdin.take() {
                    let _ = writeln!(i, "quit");
                }
                c.wait()
            });
        if let Err(e) = quit {
            eprintln!("warning: stopping MPS: {e}");
        }
        std::thread::sleep(Duration::from_millis(1000));
    }
}

/// A child's stdout as lines on a channel, read by a thread of its own (so a
/// wait for the next line can time out).
pub(super) fn lines_of(stdout: std::process::ChildStdout) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}
