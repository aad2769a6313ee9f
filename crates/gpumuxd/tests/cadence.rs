//! A client that comes back every 2 ms keeps its path awake (its cadence,
//! `gpumuxd::spin`), and once it stops, every thread on that path sleeps
//! again: an idle connection costs the daemon no CPU (issue 35). Prints what
//! the cadence costs (the daemon's CPU while the client launches every 2 ms)
//! and the launch + sync latency it buys; asserts only what does not depend
//! on the machine's load: the sleep afterwards.

mod common;

use common::Daemon;
use gpumux_client::{Arg, LaunchConfig, StreamId};
use std::time::{Duration, Instant};

const SOURCE: &str = "extern \"C\" __global__ void k(float* p, int n) { }";

/// CPU time (user + system) of process `pid` so far, from `/proc` (clock ticks of 10 ms).
fn cpu_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the daemon's /proc stat");
    // pid (comm) state ...: fields after the comm's last ')'; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).expect("a stat line");
    let f: Vec<u64> = rest.split_whitespace().skip(11).take(2).map(|x| x.parse().unwrap_or(0)).collect();
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_nanos((f[0] + f[1]) * 1_000_000_000 / tick)
}

#[test]
fn a_client_launching_every_2_ms_is_served_awake_and_its_idle_connection_then_costs_nothing() {
    let d = Daemon::start(None);
    let (client, k, buf) = common::library_client(&d, "cadence", SOURCE, "k");
    let args = [Arg::buffer(&buf), Arg::bytes(0i32.to_le_bytes())];
    let launch_sync = || {
        let t = Instant::now();
        client.launch(&k, &LaunchConfig::new([1, 1, 1], [32, 1, 1]), &args).expect("launches");
        client.sync(StreamId::DEFAULT).expect("syncs");
        t.elapsed()
    };
    for _ in 0..20 {
        launch_sync();
    }
    let pid = d.child.id();
    let (cpu0, own0, t0) = (cpu_of(pid), cpu_of(std::process::id()), Instant::now());
    let mut took = Vec::new();
    for _ in 0..300 {
        std::thread::sleep(Duration::from_millis(2));
        took.push(launch_sync());
    }
    let (busy, own, wall) = (cpu_of(pid) - cpu0, cpu_of(std::process::id()) - own0, t0.elapsed());
    took.sort();
    let share = |d: Duration| d.as_secs_f64() / wall.as_secs_f64() * 100.0;
    eprintln!(
        "cadence: launch + sync 2 ms apart p50 {:.1} µs, p99 {:.1} µs; meanwhile the daemon's CPU {:.0} % of a core, \
         the client's (its waiting calls and library's reader, this test) {:.0} %",
        took[took.len() / 2].as_secs_f64() * 1e6,
        took[took.len() * 99 / 100].as_secs_f64() * 1e6,
        share(busy),
        share(own)
    );
    // Connected and idle, past every window (5 ms at most): nothing polls.
    std::thread::sleep(Duration::from_millis(50));
    let (cpu0, own0, t0) = (cpu_of(pid), cpu_of(std::process::id()), Instant::now());
    std::thread::sleep(Duration::from_secs(1));
    let (idle, own, wall) = (cpu_of(pid) - cpu0, cpu_of(std::process::id()) - own0, t0.elapsed());
    let share = idle.as_secs_f64() / wall.as_secs_f64();
    let own_share = own.as_secs_f64() / wall.as_secs_f64();
    eprintln!(
        "cadence: with the client connected and idle, the daemon's CPU {:.1} % of a core, the client's {:.1} %",
        share * 100.0,
        own_share * 100.0
    );
    assert!(
        share < 0.05,
        "an idle connection must not keep the daemon polling: {:.1} % of a core over {:.2} s",
        share * 100.0,
        wall.as_secs_f64()
    );
    // Nor the client's library: its reader parks within its window and sleeps on the socket after it.
    assert!(
        own_share < 0.05,
        "an idle connection must not keep the client's library polling: {:.1} % of a core over {:.2} s",
        own_share * 100.0,
        wall.as_secs_f64()
    );
    // The path still answers after the sleep (the doorbells wake it).
    assert!(launch_sync() < Duration::from_secs(5));
    client.close().expect("closes");
}
