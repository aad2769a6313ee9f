//! How much CPU the engine spends per kernel when many processes launch small
//! kernels as fast as they can: 8 processes (the daemon's 8 clients of
//! `gpumux bench daemon`'s launch rate), each keeping 64 one-block kernels
//! queued, on the scripted device (simulated time, no GPU), until 200,000
//! kernels have completed. Every engine call is timed, by kind: on a GPU the
//! daemon's core makes them between its device exchanges, and its own work
//! per launch bounds the aggregate launch rate (docs/history/benchmarks.md, "Where an
//! 8-client launch's time goes").
//!
//!     cargo run --release -p gpumux-engine --example launch_rate_cost [POLICY] [PROCESSES]
mod common;

use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
use gpumux_engine::scripted::ScriptedDevice;
use gpumux_engine::{policies, Device, DeviceError, Engine, ProcessId, ProcessInfo, StreamOp};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KERNELS: u64 = 200_000;
const QUEUED: u32 = 64;

fn main() {
    let policy = std::env::args().nth(1).unwrap_or_else(|| "ppq-even-drain".into());
    let processes: u32 = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(8);
    let info = common::h100_like();
    let mut engine = Engine::new(info.clone(), policies::by_name(&policy).expect("policy")).expect("engine");
    let mut dev = ScriptedDevice::new(info);
    let slots: Vec<_> = (0..processes)
        .map(|i| engine.add_process(ProcessInfo::new(ProcessId(i), format!("client-{i}"))).expect("process"))
        .collect();
    let kernel = StreamOp::Kernel {
        desc: Arc::new(KernelDesc::new("empty", KernelShape::new(1, 32, 16)).with_sim_timing(SimTiming::new(5_000))),
        time_key: 0,
    };
    let mut queued = vec![0u32; slots.len()];
    let (mut submit, mut commands, mut events_t, mut completions) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let (mut n_commands, mut n_events) = (0u64, 0u64);
    let mut done = 0u64;
    let mut now = 0;
    let mut events = Vec::new();
    let start = Instant::now();
    while done < KERNELS {
        for (i, &slot) in slots.iter().enumerate() {
            while queued[i] < QUEUED {
                let t = Instant::now();
                engine.submit(now, slot, kernel.clone()).expect("submit");
                submit += t.elapsed();
                queued[i] += 1;
            }
        }
        loop {
            let t = Instant::now();
            let cmd = engine.poll_command().expect("command");
            commands += t.elapsed();
            let Some(cmd) = cmd else { break };
            n_commands += 1;
            dev.submit(now, cmd).expect("device");
        }
        let t = Instant::now();
        while let Some(c) = engine.poll_completion() {
            if let Some(i) = slots.iter().position(|&s| s == c.slot) {
                queued[i] -= 1;
                done += 1;
            }
        }
        completions += t.elapsed();
        events.clear();
        now = match dev.advance(engine.poll_timeout(), &mut events) {
            Ok(t) => t,
            Err(DeviceError::Stalled { now }) => now,
            Err(e) => panic!("{e}"),
        };
        let t = Instant::now();
        n_events += events.len() as u64;
        for e in events.drain(..) {
            engine.handle_event(now, e).expect("event");
        }
        if engine.poll_timeout().is_some_and(|d| d <= now) {
            engine.handle_timeout(now);
        }
        events_t += t.elapsed();
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / done as f64;
    println!(
        "{policy}, {processes} processes: {done} kernels; engine µs per kernel: {:.2} in all = submit {:.2} + commands {:.2} \
         ({:.2} commands a kernel) + events {:.2} ({:.2} a kernel) + completions {:.2}; wall {:.0} ms",
        per(submit + commands + events_t + completions),
        per(submit),
        per(commands),
        n_commands as f64 / done as f64,
        per(events_t),
        n_events as f64 / done as f64,
        per(completions),
        start.elapsed().as_secs_f64() * 1e3
    );
}
