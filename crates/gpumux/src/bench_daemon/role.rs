//! A role process of `gpumux bench daemon` (`gpumux bench-role`, hidden):
//! the client programs of the bench. It runs its jobs, one thread and one
//! stream each, natively in one CUDA context or as gpumuxd clients.
//!
//! It speaks a line protocol with the bench on stdin/stdout:
//! it prints `ready` once every job is prepared, starts all jobs when it
//! reads `go`, stops its jobs that run until stopped (`Fill`, `Copier`)
//! when it reads `stop` or when its own finite jobs are done, and prints
//! `result <json>` (a [`RoleResult`]) or `error <message>` last.

use super::gpu::{DaemonGpu, JobGpu, NativeProcess};
use super::jobs::{self, Job, JobResult};
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::channel;
use std::sync::{Arc, Condvar, Mutex};

/// How a role's jobs reach the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Plain CUDA in this process (one context, one stream per job).
    Native,
    /// A gpumuxd client per job.
    Daemon,
}

/// `gpumux bench-role`'s arguments (written by the bench, not by hand).
#[derive(clap::Args, Debug)]
pub struct RoleArgs {
    #[arg(long, value_enum)]
    pub mode: Mode,
    /// The daemon's socket (daemon mode).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// The GPU (native mode).
    #[arg(long, default_value_t = 0)]
    pub ordinal: i32,
    /// Client name prefix shown by `gpumux ps`.
    #[arg(long, default_value = "bench")]
    pub name: String,
    /// The jobs, as JSON (a list of [`Job`]).
    #[arg(long)]
    pub jobs: String,
}

/// What a role prints last.
#[derive(Debug, Serialize, Deserialize)]
pub struct RoleResult {
    pub jobs: Vec<JobResult>,
}

/// Priority of an urgent job's client (the daemon's default config allows up to 10).
pub const URGENT_PRIORITY: i32 = 5;

/// The start signal the job threads wait on.
#[derive(Default)]
struct Start {
    go: Mutex<bool>,
    cv: Condvar,
}

impl Start {
    fn wait(&self) {
        let mut go = self.go.lock().unwrap_or_else(|e| e.into_inner());
        while !*go {
            go = self.cv.wait(go).unwrap_or_else(|e| e.into_inner());
        }
    }
    fn release(&self) {
        *self.go.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }
}

/// Runs the role (module doc); the exit status says whether it worked.
pub fn main(args: RoleArgs) -> Result<()> {
    match run(&args) {
        Ok(result) => {
            println!("result {}", serde_json::to_string(&result)?);
            Ok(())
        }
        Err(e) => {
            println!("error {}", format!("{e:#}").replace('\n', " "));
            Err(e)
        }
    }
}

fn run(args: &RoleArgs) -> Result<RoleResult> {
    let jobs: Vec<Job> = serde_json::from_str(&args.jobs).context("the --jobs JSON")?;
    if jobs.is_empty() {
        bail!("no jobs");
    }
    let native = match args.mode {
        Mode::Native => Some(Arc::new(NativeProcess::open(args.ordinal)?)),
        Mode::Daemon => None,
    };
    let start = Arc::new(Start::default());
    let stop = Arc::new(AtomicBool::new(false));
    let finite_left = Arc::new(AtomicUsize::new(jobs.iter().filter(|j| j.finite()).count()));
    let (ready_tx, ready_rx) = channel::<Result<()>>();
    let mut threads = Vec::new();
    for (i, job) in jobs.into_iter().enumerate() {
        let (native, start, stop, finite_left, ready) =
            (native.clone(), start.clone(), stop.clone(), finite_left.clone(), ready_tx.clone());
        let socket = args.socket.clone();
        let name = format!("{}-{i}", args.name);
        threads.push(std::thread::spawn(move || -> Result<JobResult> {
            let setup = || -> Result<(Box<dyn JobGpu>, jobs::Prepared)> {
                let mut gpu: Box<dyn JobGpu> = match &native {
                    Some(p) => {
                        let g = p.job(job.urgent())?;
                        g.bind()?;
                        Box::new(g)
                    }
                    None => {
                        let socket = socket.ok_or_else(|| anyhow!("daemon mode needs --socket"))?;
                        let priority = if job.urgent() { URGENT_PRIORITY } else { 0 };
                        Box::new(DaemonGpu::connect(&socket, &name, priority)?)
                    }
                };
                let prepared = jobs::prepare(gpu.as_mut(), &job)?;
                Ok((gpu, prepared))
            };
            let (mut gpu, prepared) = match setup() {
                Ok(x) => {
                    let _ = ready.send(Ok(()));
                    x
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    let _ = ready.send(Err(e));
                    bail!("{msg}");
                }
            };
            start.wait();
            let r = jobs::run(gpu.as_mut(), prepared, &stop);
            if job.finite() && finite_left.fetch_sub(1, Ordering::SeqCst) == 1 {
                stop.store(true, Ordering::SeqCst);
            }
            r
        }));
    }
    drop(ready_tx);
    for r in ready_rx.iter().take(threads.len()) {
        r?;
    }
    println!("ready");
    std::io::stdout().flush()?;
    // `go`, then (maybe) `stop`, on stdin; end of input counts as `stop`.
    let stdin_stop = stop.clone();
    let (go_tx, go_rx) = channel::<bool>();
    std::thread::spawn(move || {
        let mut lines = std::io::stdin().lock().lines();
        let go = matches!(lines.next(), Some(Ok(l)) if l.trim() == "go");
        let _ = go_tx.send(go);
        if go {
            while let Some(Ok(l)) = lines.next() {
                if l.trim() == "stop" {
                    break;
                }
            }
        }
        stdin_stop.store(true, Ordering::SeqCst);
    });
    if !go_rx.recv().unwrap_or(false) {
        bail!("the bench did not say `go`");
    }
    start.release();
    let mut results = Vec::new();
    for t in threads {
        results.push(t.join().map_err(|_| anyhow!("a job thread panicked"))??);
    }
    Ok(RoleResult { jobs: results })
}
