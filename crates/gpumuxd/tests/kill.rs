//! The kill test: 100 client processes are killed with SIGKILL at random
//! points of their work while 3 others run to completion. Afterwards the 3
//! have their data back bitwise and every kernel done, the daemon's memory
//! accounting is at its baseline, no SM is held, and a new client's big
//! kernel gets every SM.
//!
//! The clients are this test binary run again with [`ROLE_ENV`] set (so the
//! file has its own `main`: `harness = false`). A client written here,
//! next to the assertions about it, says exactly what a killed client held
//! and was doing (a buffer for life, copies chunked through a region smaller
//! than them, launches with block-time hints, syncs, in a loop); the example
//! programs run once and exit, and a loop mode would blur them as examples.
//!
//! `GPUMUXD_KILL_SEED=N` repeats a run's kill schedule (the seed is printed).

mod common;

use common::Daemon;
use gpumux_client::{Arg, Client, ConnectOptions, LaunchConfig, StreamId};
use std::error::Error;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

const TEST_NAME: &str = "kill_100_clients_while_3_run";
/// Set in a client process: `victim` or `survivor`.
const ROLE_ENV: &str = "GPUMUXD_KILL_TEST_ROLE";
const SEED_ENV: &str = "GPUMUXD_KILL_SEED";

/// 10 waves of 10 victims: each wave's victims are killed within
/// [`LONGEST_LIFE`] of their first request, several at the same instant.
const WAVES: usize = 10;
const VICTIMS_PER_WAVE: usize = 10;
const SURVIVORS: usize = 3;
const LONGEST_LIFE: Duration = Duration::from_millis(300);

/// Every kernel of the test: it would scale `x`; on the simulated device it
/// takes its block-time hint and computes nothing, so data round-trips.
const KERNEL: &str = "__global__ void scale(float* x, int n) {\n\
    int i = blockIdx.x * blockDim.x + threadIdx.x;\n\
    if (i < n) x[i] *= 2.0f;\n}\n";

/// A client's copies: 1 MiB through a 256 KiB region, so every copy is cut
/// into chunks that alternate between the region's halves.
const COPY_BYTES: usize = 1 << 20;
const REGION_BYTES: u64 = 256 << 10;

fn main() -> ExitCode {
    let role = std::env::var(ROLE_ENV).ok();
    let result = match role.as_deref() {
        Some("victim") => victim(),
        Some("survivor") => survivor(),
        Some(other) => Err(format!("{ROLE_ENV}={other}: expected victim or survivor").into()),
        None => return run_as_test(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kill-test {}: {e}", role.unwrap_or_default());
            ExitCode::FAILURE
        }
    }
}

/// Behaves as libtest does for the few arguments cargo passes: `--list`,
/// name filters (runs if none is given or one matches), `--ignored`.
fn run_as_test() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        println!("{TEST_NAME}: test");
        return ExitCode::SUCCESS;
    }
    const TAKES_VALUE: [&str; 6] = ["--test-threads", "--skip", "--color", "--format", "--logfile", "-Z"];
    let mut filters = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if TAKES_VALUE.contains(&a.as_str()) {
            it.next();
        } else if !a.starts_with('-') {
            filters.push(a.as_str());
        }
    }
    let selected = filters.is_empty() || filters.iter().any(|f| TEST_NAME.contains(f));
    if !selected || args.iter().any(|a| a == "--ignored") {
        println!("running 0 tests ({TEST_NAME} filtered out)");
        return ExitCode::SUCCESS;
    }
    println!("running 1 test");
    let t0 = Instant::now();
    kill_100_clients_while_3_run();
    println!("test {TEST_NAME} ... ok ({:.1} s)", t0.elapsed().as_secs_f64());
    ExitCode::SUCCESS
}

fn kill_100_clients_while_3_run() {
    let seed = std::env::var(SEED_ENV).ok().and_then(|s| s.parse::<u64>().ok()).unwrap_or_else(seed_from_clock);
    println!("{TEST_NAME}: seed {seed} ({SEED_ENV}={seed} repeats this kill schedule)");
    let mut rng = Rng::new(seed);
    let uid = common::own_uid();
    let mut d = Daemon::start(Some(&format!("[[allow]]\nuid = {uid}\nmemory = \"8 GiB\"\n")));
    let observer = connect(&d.socket, "observer", 0).expect("the observer connects");
    let baseline = observer.status().expect("Status");
    assert_eq!(baseline.clients.len(), 1, "only the observer: {baseline:?}");

    let mut survivors: Vec<Child> = (0..SURVIVORS).map(|_| spawn_client(&d.socket, "survivor")).collect();
    for wave in 0..WAVES {
        kill_a_wave(&d.socket, &mut rng, wave);
    }
    // Closing their stdin tells the survivors to finish the round they are in.
    for s in &mut survivors {
        drop(s.stdin.take());
    }
    for (i, s) in survivors.into_iter().enumerate() {
        let out = s.wait_with_output().expect("a survivor runs");
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "survivor {i} failed ({}): {stdout}{stderr}", out.status);
        assert!(stdout.contains("every byte round-tripped"), "survivor {i}: {stdout}");
        print!("{TEST_NAME}: survivor {i}: {stdout}");
    }

    let status = status_at_baseline(&observer, baseline.memory_used);
    assert_eq!(status.memory_used, baseline.memory_used, "memory of killed clients is still counted: {status:?}");
    assert_eq!(status.clients.len(), 1, "killed clients still have rows: {status:?}");
    assert!(status.clients.iter().all(|c| c.memory_used == 0 && c.sms_held == 0), "{status:?}");
    assert!(d.alive(), "the daemon died");
    a_new_clients_big_kernel_gets_every_sm(&d.socket, &observer);
    assert!(d.stop().success(), "the daemon stops cleanly on SIGTERM");
}

/// Starts [`VICTIMS_PER_WAVE`] victims, waits until each has sent its first
/// requests, and kills them at a few random instants each (several at once).
fn kill_a_wave(socket: &Path, rng: &mut Rng, wave: usize) {
    let mut victims: Vec<Child> = (0..VICTIMS_PER_WAVE).map(|_| spawn_client(socket, "victim")).collect();
    for v in &mut victims {
        wait_until_ready(v, wave);
    }
    let start = Instant::now();
    let instants: Vec<Duration> =
        (0..3).map(|_| Duration::from_micros(rng.below(LONGEST_LIFE.as_micros() as u64))).collect();
    let mut schedule: Vec<(Duration, usize)> =
        (0..victims.len()).map(|i| (instants[rng.below(instants.len() as u64) as usize], i)).collect();
    schedule.sort();
    for (at, i) in schedule {
        if let Some(wait) = at.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        // SAFETY: kill has no memory effects; the pid is our child's, not yet reaped.
        let rc = unsafe { libc::kill(victims[i].id() as i32, libc::SIGKILL) };
        assert_eq!(rc, 0, "kill -9 {}: {}", victims[i].id(), std::io::Error::last_os_error());
    }
    for mut v in victims {
        let status = v.wait().expect("wait for a killed victim");
        let mut stderr = String::new();
        if let Some(mut e) = v.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "a victim ended before its kill ({status}): {stderr}");
    }
}

/// A victim prints `ready` once it holds memory and its loop starts.
fn wait_until_ready(victim: &mut Child, wave: usize) {
    let mut line = String::new();
    if let Some(out) = victim.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    if line.trim() != "ready" {
        let _ = victim.kill();
        let _ = victim.wait();
        let mut stderr = String::new();
        if let Some(mut e) = victim.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        panic!("a victim of wave {wave} did not start: {stderr}");
    }
}

/// The status once every killed client's memory is freed and its kernels
/// are off the device (orphaned launches finish first), or after 20 s.
fn status_at_baseline(observer: &Client, memory: u64) -> gpumux_proto::Status {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = observer.status().expect("Status");
        let settled = s.memory_used == memory && s.clients.len() == 1 && s.clients.iter().all(|c| c.sms_held == 0);
        if settled || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A kernel of 40 rounds of every SM's resident blocks: while it runs, its
/// client holds every SM of the device.
fn a_new_clients_big_kernel_gets_every_sm(socket: &Path, observer: &Client) {
    let fresh = connect(socket, "fresh", 0).expect("the daemon accepts a new client after the kills");
    let sms = fresh.welcome().sms;
    let kernel = fresh.load_module("kill.cu", KERNEL, &[]).and_then(|m| m.kernel("scale")).expect("load");
    let buf = fresh.alloc(4096).expect("alloc");
    // 16 resident blocks of 128 threads per SM; 40 rounds of 20 ms: 800 ms alone.
    let config = LaunchConfig::new([sms * 16 * 40, 1, 1], [128, 1, 1]).block_time_ns(20_000_000);
    fresh.launch(&kernel, &config, &[Arg::buffer(&buf), 1024i32.into()]).expect("launch");
    let deadline = Instant::now() + Duration::from_millis(600);
    let held = loop {
        let s = observer.status().expect("Status");
        let held = s.clients.iter().find(|c| c.name == "fresh").map_or(0, |c| c.sms_held);
        if held == sms || Instant::now() > deadline {
            break held;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(held, sms, "a new client's big kernel got {held} of {sms} SMs: some are still reserved");
    fresh.sync(StreamId::DEFAULT).expect("the big kernel completes");
    fresh.free(buf).expect("free");
    fresh.close().expect("goodbye");
}

fn spawn_client(socket: &Path, role: &str) -> Child {
    Command::new(std::env::current_exe().expect("the test binary knows its path"))
        .env(ROLE_ENV, role)
        .env(gpumux_client::SOCKET_ENV, socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the test binary starts as a client")
}

fn connect(socket: &Path, name: &str, shm_bytes: u64) -> gpumux_client::Result<Client> {
    Client::connect(ConnectOptions { socket: Some(PathBuf::from(socket)), shm_bytes, ..ConnectOptions::named(name) })
}

fn socket_from_env() -> Result<PathBuf, Box<dyn Error>> {
    std::env::var_os(gpumux_client::SOCKET_ENV).map(PathBuf::from).ok_or_else(|| "no GPUMUX_SOCKET".into())
}

/// Bytes of a client's copies: different per process and round.
fn pattern(salt: u64) -> Vec<u8> {
    let mut rng = Rng::new(salt.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    (0..COPY_BYTES).map(|_| rng.next() as u8).collect()
}

/// One round: alloc, 1 MiB in, a kernel, sync, 1 MiB out, compared, free.
fn round(
    client: &Client,
    kernel: &gpumux_client::Kernel,
    data: &[u8],
    blocks: u32,
    block_ns: u64,
) -> Result<(), Box<dyn Error>> {
    let s = StreamId::DEFAULT;
    let buf = client.alloc(data.len() as u64)?;
    client.copy_to_device(&buf, 0, data, s)?;
    let config = LaunchConfig::new([blocks, 1, 1], [128, 1, 1]).block_time_ns(block_ns);
    client.launch(kernel, &config, &[Arg::buffer(&buf), ((data.len() / 4) as i32).into()])?;
    client.sync(s)?;
    let mut back = vec![0u8; data.len()];
    client.copy_to_host(&buf, 0, &mut back, s)?;
    if back != data {
        return Err("the data came back changed".into());
    }
    Ok(client.free(buf)?)
}

/// A client killed at some point of its loop: it holds a buffer for life and
/// runs rounds of alloc, chunked copies, launches and syncs until killed.
fn victim() -> Result<(), Box<dyn Error>> {
    let socket = socket_from_env()?;
    let client = connect(&socket, "victim", REGION_BYTES)?;
    let kernel = client.load_module("kill.cu", KERNEL, &[])?.kernel("scale")?;
    let mut rng = Rng::new(u64::from(std::process::id()) | 1);
    let data = pattern(rng.next());
    let held = client.alloc(data.len() as u64)?;
    client.copy_to_device(&held, 0, &data, StreamId::DEFAULT)?;
    println!("ready");
    std::io::stdout().flush()?;
    loop {
        // 1 to 4 waves of the device's resident blocks, 50 µs to 2 ms each.
        let blocks = client.welcome().sms * 16 * (1 + rng.below(4) as u32);
        round(&client, &kernel, &data, blocks, 50_000 + rng.below(1_950_000))?;
    }
}

/// A client that runs rounds until its stdin closes, then checks with the
/// daemon that all its kernels completed and it holds no memory.
fn survivor() -> Result<(), Box<dyn Error>> {
    let socket = socket_from_env()?;
    let client = connect(&socket, "survivor", REGION_BYTES)?;
    let kernel = client.load_module("kill.cu", KERNEL, &[])?.kernel("scale")?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_on_eof = stop.clone();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        stop_on_eof.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    let pid = std::process::id();
    let mut rounds = 0u64;
    while rounds == 0 || !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let data = pattern(u64::from(pid) << 32 | rounds);
        round(&client, &kernel, &data, client.welcome().sms * 4, 200_000)?;
        rounds += 1;
    }
    let status = client.status()?;
    let me = status.clients.iter().find(|c| c.pid == pid as i32).ok_or("no row of mine in Status")?;
    if me.kernels_done != rounds || me.memory_used != 0 {
        return Err(format!("{rounds} kernels launched and synced, but the daemon says {me:?}").into());
    }
    client.close()?;
    println!("{rounds} rounds, {rounds} kernels completed, every byte round-tripped");
    Ok(())
}

/// xorshift64*: small, and a seed repeats a run.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn seed_from_clock() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
}
