//! How much CPU the engine spends on an urgent kernel's path: a low-priority
//! process keeps 132 SMs full with kernels of 20 µs blocks, an urgent one
//! submits a one-wave kernel every 500 µs (20,000 of them, simulated time on the
//! scripted device, no GPU). Every engine call is timed; the figure that
//! matters is the engine's time from the urgent kernel's submit to its launch
//! command (two policy rounds and the release events between), which on a GPU
//! lies on the urgent kernel's path (gpumuxd's `decide`, docs/daemon.md).
//!
//!     cargo run --release -p gpumux-engine --example urgent_turn_cost [POLICY]
//!
//! docs/history/benchmarks.md ("The engine's turn on an urgent kernel's path") has what it measured.
mod common;

use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
use gpumux_engine::scripted::ScriptedDevice;
use gpumux_engine::{policies, Device, DeviceError, Engine, ProcessId, ProcessInfo, StreamOp};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() {
    let policy = std::env::args().nth(1).unwrap_or_else(|| "ppq-even-drain".into());
    let info = common::h100_like();
    let mut engine = Engine::new(info.clone(), policies::by_name(&policy).expect("policy")).expect("engine");
    let mut dev = ScriptedDevice::new(info);
    let lp = engine.add_process(ProcessInfo::new(ProcessId(0), "lp").with_priority(0)).unwrap();
    let hp = engine.add_process(ProcessInfo::new(ProcessId(1), "hp").with_priority(10)).unwrap();
    let lp_kernel = |blocks| StreamOp::Kernel {
        desc: Arc::new(
            KernelDesc::new("lp", KernelShape::new(blocks, 256, 32)).with_sim_timing(SimTiming::new(20_000)),
        ),
        time_key: 0,
    };
    let hp_kernel = StreamOp::Kernel {
        desc: Arc::new(KernelDesc::new("hp", KernelShape::new(132, 256, 32)).with_sim_timing(SimTiming::new(15_000))),
        time_key: 0,
    };
    let mut now = 0;
    let mut in_engine = Duration::ZERO;
    let mut events = Vec::new();
    let (mut urgent, mut next_urgent) = (0u32, 200_000u64);
    let mut lp_queued = 0;
    // Engine time from an urgent kernel's submit to its launch command.
    let (mut urgent_path, mut waiting) = (Duration::ZERO, false);
    let start = Instant::now();
    while urgent < 20000 {
        if lp_queued < 4 {
            let t = Instant::now();
            engine.submit(now, lp, lp_kernel(20 * 132 * 8)).unwrap();
            in_engine += t.elapsed();
            lp_queued += 1;
        }
        if now >= next_urgent {
            let t = Instant::now();
            engine.submit(now, hp, hp_kernel.clone()).unwrap();
            in_engine += t.elapsed();
            urgent_path += t.elapsed();
            waiting = true;
            urgent += 1;
            next_urgent = now + 500_000;
        }
        let t = Instant::now();
        let mut polling = Duration::ZERO;
        loop {
            let tp = Instant::now();
            let Some(cmd) = engine.poll_command().unwrap() else {
                polling += tp.elapsed();
                break;
            };
            polling += tp.elapsed();
            if waiting {
                urgent_path += tp.elapsed();
            }
            if let gpumux_engine::Command::Launch { process, .. } = &cmd {
                if process.0 == 1 {
                    waiting = false;
                }
            }
            dev.submit(now, cmd).unwrap();
        }
        let _ = t;
        in_engine += polling;
        let t = Instant::now();
        while let Some(c) = engine.poll_completion() {
            if c.slot == lp {
                lp_queued -= 1;
            }
        }
        in_engine += t.elapsed();
        let deadline = engine.poll_timeout().map_or(next_urgent, |d| d.min(next_urgent));
        events.clear();
        now = match dev.advance(Some(deadline), &mut events) {
            Ok(t) => t,
            Err(DeviceError::Stalled { .. }) => next_urgent,
            Err(e) => panic!("{e}"),
        };
        let t = Instant::now();
        for e in events.drain(..) {
            engine.handle_event(now, e).unwrap();
        }
        if engine.poll_timeout().is_some_and(|d| d <= now) {
            engine.handle_timeout(now);
        }
        in_engine += t.elapsed();
        if waiting {
            urgent_path += t.elapsed();
        }
    }
    println!(
        "{policy}: {urgent} urgent kernels over {:.1} ms simulated; engine {:.1} µs per urgent kernel (all engine calls, LP included), {:.1} µs from its submit to its launch command; wall {:.0} ms",
        now as f64 / 1e6,
        in_engine.as_secs_f64() * 1e6 / urgent as f64,
        urgent_path.as_secs_f64() * 1e6 / urgent as f64,
        start.elapsed().as_secs_f64() * 1e3
    );
}
