//! The engine's live interface, on the scripted device: processes added and
//! removed mid-run, priorities and weights changed mid-run, streams and
//! their completions, and the errors a front-end or a device can cause.

mod common;

use common::{desc, device, kernel, Bench, PER_SM, SMS, WAVE_NS};
use gpumux_engine::device::{CopyDirection, Event, ReleaseCause};
use gpumux_engine::driver;
use gpumux_engine::scripted::ScriptedDevice;
use gpumux_engine::smset::SmSet;
use gpumux_engine::time::Nanos;
use gpumux_engine::{
    policies, Command, Device, DeviceError, EngineError, LaunchId, Message, Op, OpOutcome, ProcessId, ProcessInfo,
    ProcessSpec, ProtocolError, Replay, Slot, StreamOp, Workload,
};
use std::sync::Arc;

#[test]
fn a_process_added_mid_run_gets_sms_under_every_policy() {
    for (name, _) in policies::CATALOGUE {
        let mut b = Bench::new(name);
        let a = b.add(0, 0);
        b.submit(a, kernel("a", 10));
        b.run(Some(3 * WAVE_NS));
        assert!(!b.sms_running(0).is_empty(), "{name}: the first process is running");
        let added_at = b.now;
        let late = b.add(1, 0);
        b.submit(late, kernel("late", 2));
        b.run(None);
        let k = b.kernel_of(1).unwrap_or_else(|| panic!("{name}: the added process was never launched"));
        assert!(!b.sms_given(k, added_at).is_empty(), "{name}: the added process got no SM");
        assert_eq!(b.dev.blocks_done(k), 2 * PER_SM * SMS as u64, "{name}: its kernel ran every block");
        assert_eq!(b.outcomes(late), vec![OpOutcome::Completed], "{name}");
        assert_eq!(b.outcomes(a), vec![OpOutcome::Completed], "{name}");
        assert!(b.dev.ran_twice().is_empty(), "{name}: {:?}", b.dev.ran_twice());
    }
}

#[test]
fn a_process_removed_while_running_loses_nothing_of_the_others_and_its_sms_go_to_them() {
    for (name, _) in policies::CATALOGUE {
        let mut b = Bench::new(name);
        let doomed = b.add(0, 0);
        let keep = b.add(1, 0);
        b.submit(doomed, kernel("doomed", 20));
        b.submit(doomed, StreamOp::Copy { direction: CopyDirection::DeviceToHost, bytes: 64 });
        b.submit(keep, kernel("keep", 20));
        b.run(Some(3 * WAVE_NS));
        let held = b.sms_running(0);
        assert!(!held.is_empty(), "{name}: the doomed process holds SMs when it is removed");
        let removed_at = b.now;
        b.engine.remove_process(b.now, doomed).expect("a live slot");
        b.run(None);

        // Its running kernel retreated from every SM it held; its queued work was dropped.
        let retreated = b.commands_since(removed_at).fold(SmSet::EMPTY, |acc, c| match c {
            Command::Retreat { sms, .. } => acc.union(sms),
            _ => acc,
        });
        assert_eq!(retreated.intersection(&held), held, "{name}: every SM it held was retreated");
        assert_eq!(b.outcomes(doomed), vec![OpOutcome::Dropped; 2], "{name}");
        assert!(
            b.commands_since(removed_at).all(|c| !matches!(c, Command::Launch { process, .. } if process.0 == 0)),
            "{name}: nothing of a removed process is launched"
        );
        // The other process lost nothing and took over its SMs.
        let k = b.kernel_of(1).unwrap_or_else(|| panic!("{name}: the kept process was never launched"));
        assert_eq!(b.dev.blocks_done(k), 20 * PER_SM * SMS as u64, "{name}: every block of the other ran");
        assert_eq!(b.outcomes(keep), vec![OpOutcome::Completed], "{name}");
        assert_eq!(b.sms_given(k, removed_at).intersection(&held), held, "{name}: its SMs went to the other");
        assert!(b.dev.ran_twice().is_empty(), "{name}: {:?}", b.dev.ran_twice());
    }
}

#[test]
fn a_priority_changed_at_run_time_takes_effect_at_the_next_decision() {
    let mut b = Bench::new("ppq-excl-cs");
    let low = b.add(0, 0);
    let raised = b.add(1, 0);
    b.submit(low, kernel("low", 10));
    b.submit(raised, kernel("raised", 1));
    b.run(Some(WAVE_NS / 2));
    assert_eq!(b.sms_running(0).len(), SMS as u32, "equal priorities: the first kernel has the GPU");
    assert!(b.kernel_of(1).is_none());

    b.engine.set_priority(raised, 5).expect("a live slot");
    assert_eq!(b.engine.process(raised).map(|p| p.priority), Some(5));
    // The very next command takes the GPU back for it.
    match b.engine.poll_command().expect("engine") {
        Some(cmd @ Command::Retreat { sms, .. }) => {
            assert_eq!(sms, SmSet::range(0, SMS));
            b.dev.submit(b.now, cmd).expect("device accepts the retreat");
        }
        other => panic!("expected a retreat for the raised process, got {other:?}"),
    }
    b.run(None);
    let launched = b.dev.log().iter().find_map(|(t, c)| match c {
        Command::Launch { process, priority, .. } if process.0 == 1 => Some((*t, *priority)),
        _ => None,
    });
    assert_eq!(launched, Some((WAVE_NS / 2, 5)), "launched at once, with its new priority");
    assert_eq!(b.outcomes(low), vec![OpOutcome::Completed]);
}

#[test]
fn a_weight_changed_at_run_time_takes_effect_at_the_next_decision() {
    let mut b = Bench::new("dss-cs");
    let heavy = b.add(0, 0);
    let light = b.add(1, 0);
    b.submit(heavy, kernel("heavy", 10));
    b.submit(light, kernel("light", 10));
    b.run(Some(WAVE_NS / 2));
    assert_eq!((b.sms_running(0).len(), b.sms_running(1).len()), (4, 4), "equal weights: equal shares");

    b.engine.set_weight(heavy, 3.0).expect("a live slot");
    // Tokens 6 against 2: two of the light process's SMs go to the heavy one.
    match b.engine.poll_command().expect("engine") {
        Some(cmd @ Command::Retreat { sms, .. }) => {
            assert_eq!(sms.intersection(&b.sms_running(1)).len(), 2);
            b.dev.submit(b.now, cmd).expect("device accepts the retreat");
        }
        other => panic!("expected a retreat from the light process, got {other:?}"),
    }
    b.run(Some(WAVE_NS));
    assert_eq!((b.sms_running(0).len(), b.sms_running(1).len()), (6, 2));
}

#[test]
fn a_stream_runs_in_order_and_reports_each_end() {
    let mut b = Bench::new("fcfs");
    let p = b.add(0, 0);
    // A sync on an empty stream completes at once, in `submit`.
    let first = b.submit(p, StreamOp::Sync);
    b.flush();
    assert_eq!(b.completions.iter().map(|(t, c)| (*t, c.op)).collect::<Vec<_>>(), vec![(0, first)]);
    let copy = b.submit(p, StreamOp::Copy { direction: CopyDirection::HostToDevice, bytes: 1 << 20 });
    let k = b.submit(p, kernel("k", 1));
    let empty = b.submit(p, StreamOp::Kernel { desc: desc("empty", 0), time_key: 0 });
    let sync = b.submit(p, StreamOp::Sync);
    b.run(None);
    // Copy 1 us, kernel one wave; the empty grid and the sync end with it.
    let ends: Vec<(Nanos, _)> = b.completions.iter().skip(1).map(|(t, c)| (*t, c.op)).collect();
    let k_end = 1_000 + WAVE_NS;
    assert_eq!(ends, vec![(1_000, copy), (k_end, k), (k_end, empty), (k_end, sync)]);
    assert!(b.completions.iter().all(|(_, c)| c.outcome == OpOutcome::Completed && c.slot == p));
    assert_eq!(b.engine.kernels_completed(), 2);
}

#[test]
fn a_copy_in_flight_of_a_removed_process_is_dropped_and_its_end_ignored() {
    let mut b = Bench::new("fcfs");
    let p = b.add(0, 0);
    let other = b.add(1, 0);
    b.submit(p, StreamOp::Copy { direction: CopyDirection::HostToDevice, bytes: 64 });
    b.submit(p, kernel("never", 1));
    b.flush();
    b.engine.remove_process(0, p).expect("a live slot");
    b.submit(other, kernel("other", 1));
    b.run(None);
    assert_eq!(b.outcomes(p), vec![OpOutcome::Dropped; 2]);
    assert_eq!(b.outcomes(other), vec![OpOutcome::Completed]);
    assert!(b.kernel_of(0).is_none(), "the removed process's kernel never launched");
}

#[test]
fn requests_for_a_process_that_is_not_live_are_refused() {
    let mut b = Bench::new("fcfs");
    let gone = b.add(0, 0);
    b.engine.remove_process(0, gone).expect("a live slot");
    let unknown = |r: Result<(), EngineError>| matches!(r, Err(EngineError::UnknownSlot(s)) if s == gone);
    assert!(unknown(b.engine.remove_process(0, gone)));
    assert!(unknown(b.engine.set_priority(gone, 1)));
    assert!(unknown(b.engine.set_weight(gone, 2.0)));
    assert!(unknown(b.engine.submit(0, gone, StreamOp::Sync).map(|_| ())));
    // Its index goes to the next process; the stale slot still reaches nobody.
    let next = b.add(1, 0);
    assert_eq!(next.index(), gone.index());
    assert_ne!(next, gone);
    assert!(unknown(b.engine.set_priority(gone, 1)));
    assert!(b.engine.process(next).is_some() && b.engine.process(gone).is_none());
}

#[test]
fn a_weight_that_is_not_a_finite_number_at_least_zero_is_refused() {
    let mut b = Bench::new("dss-cs");
    let p = b.add(0, 0);
    for w in [f64::NAN, f64::INFINITY, -1.0] {
        assert!(matches!(b.engine.set_weight(p, w), Err(EngineError::BadWeight(_))), "{w}");
        let info = ProcessInfo::new(ProcessId(1), "q").with_weight(w);
        assert!(matches!(b.engine.add_process(info), Err(EngineError::BadWeight(_))), "{w}");
    }
    assert_eq!(b.engine.process(p).map(|i| i.weight), Some(1.0), "a refused weight changes nothing");
    b.engine.set_weight(p, 0.0).expect("zero is a weight");
}

#[test]
fn a_kernel_that_cannot_fit_is_refused_when_submitted() {
    let mut b = Bench::new("fcfs");
    let p = b.add(0, 0);
    let mut huge = (*desc("huge", 1)).clone();
    huge.shape.threads_per_block = 4096;
    let r = b.engine.submit(0, p, StreamOp::Kernel { desc: Arc::new(huge), time_key: 0 });
    assert!(matches!(r, Err(EngineError::DoesNotFit(_))), "{r:?}");
}

#[test]
fn a_device_that_breaks_the_protocol_gets_a_typed_error() {
    let mut b = Bench::new("fcfs");
    let p = b.add(0, 0);
    b.submit(p, kernel("k", 1));
    b.flush();
    let sm_of_nobody =
        Event::SmReleased { launch: LaunchId(99), sm: gpumux_engine::SmId(0), cause: ReleaseCause::Retreated };
    match b.engine.handle_event(0, sm_of_nobody) {
        Err(EngineError::Protocol(ProtocolError::UnknownLaunch { launch, by })) => {
            assert_eq!((launch, by), (LaunchId(99), Message::SmReleased));
        }
        other => panic!("expected an unknown launch, got {other:?}"),
    }
    let early_end =
        Event::LaunchEnded { launch: LaunchId(0), remaining: Default::default(), saved: Vec::new(), completed: 0 };
    match b.engine.handle_event(0, early_end) {
        Err(EngineError::Protocol(ProtocolError::EndedHoldingSms { launch, sms })) => {
            assert_eq!((launch, sms), (LaunchId(0), SmSet::range(0, SMS)));
        }
        other => panic!("expected a launch ending with SMs held, got {other:?}"),
    }
    let e = b.dev.submit(0, Command::Grow { launch: LaunchId(7), sms: SmSet::single(gpumux_engine::SmId(1)) });
    assert!(matches!(
        e,
        Err(DeviceError::Protocol(ProtocolError::UnknownLaunch { launch: LaunchId(7), by: Message::Grow }))
    ));
}

/// Replay is a front-end like any other: host time, repetitions and run
/// spans come out as worked by hand on the scripted device.
#[test]
fn replay_on_the_scripted_device_gives_the_hand_worked_spans() {
    let ops = vec![
        Op::CopyToDevice { bytes: 64 },
        Op::Kernel(desc("a", PER_SM * SMS as u64)),
        Op::Cpu { ns: 5_000 },
        Op::Kernel(desc("b", PER_SM * SMS as u64)),
    ];
    let spec = ProcessSpec {
        name: "p".into(),
        priority: 0,
        weight: 1.0,
        arrival_ns: 2_000,
        repetitions: 2,
        async_depth: 0,
        ops,
    };
    let w = Workload { name: "w".into(), processes: vec![spec], replay_min_runs: None };
    let mut replay = Replay::new(&w, device(), policies::by_name("fcfs").expect("fcfs"), None).expect("replay");
    let mut dev = ScriptedDevice::new(device());
    let out = driver::run(&mut replay, &mut dev, &mut driver::NoHooks).expect("run");
    // Copy 1 us, kernel 10 us, host 5 us, kernel 10 us: 26 us a run.
    let spans: Vec<(Nanos, Nanos)> = out.record.processes[0].runs.iter().map(|r| (r.start_ns, r.end_ns)).collect();
    assert_eq!(spans, vec![(2_000, 28_000), (28_000, 54_000)]);
    assert_eq!((out.record.kernels_completed, replay.ops_issued()), (4, 8));
}

/// On a device that frees a retreat's SMs in the command, an urgent
/// kernel's launch follows the retreat that makes room for it in the same
/// turn: the engine sends both before the device reports anything, and the
/// device's `SmReleased` for those SMs, when it comes, is taken in stride.
/// On a device that frees them later, the launch waits for the release.
#[test]
fn an_urgent_launch_follows_its_retreat_in_one_turn_when_the_device_frees_sms_in_the_command() {
    for freeing in [true, false] {
        let mut b = if freeing { Bench::freeing_at_once("ppq-shared-drain") } else { Bench::new("ppq-shared-drain") };
        let lp = b.add(0, 0);
        b.submit(lp, kernel("lp", 20));
        b.run(Some(WAVE_NS / 2));
        assert_eq!(b.sms_running(0).len(), u32::from(SMS), "the low-priority kernel fills the device");
        let hp = b.add(1, 5);
        b.submit(hp, kernel("hp", 1));
        let before = b.dev.log().len();
        // One turn: every command the engine has now, with no device event between.
        b.flush();
        let turn: Vec<&Command> = b.dev.log()[before..].iter().map(|(_, c)| c).collect();
        let retreat = turn.iter().position(|c| matches!(c, Command::Retreat { .. }));
        let launch = turn.iter().position(|c| matches!(c, Command::Launch { process, .. } if process.0 == 1));
        assert!(retreat.is_some(), "freeing {freeing}: the urgent kernel makes the low-priority one retreat: {turn:?}");
        if freeing {
            assert!(launch > retreat, "freeing at once: the urgent launch follows its retreat in the turn: {turn:?}");
        } else {
            assert!(launch.is_none(), "freeing later: the launch waits for the release: {turn:?}");
        }
        b.run(None);
        let k = b.kernel_of(1).expect("the urgent kernel ran");
        assert_eq!(b.dev.blocks_done(k), PER_SM * SMS as u64, "freeing {freeing}: every urgent block ran");
        assert_eq!(b.outcomes(hp), vec![OpOutcome::Completed], "freeing {freeing}");
        assert_eq!(b.outcomes(lp), vec![OpOutcome::Completed], "freeing {freeing}");
        assert!(b.dev.ran_twice().is_empty(), "freeing {freeing}: {:?}", b.dev.ran_twice());
    }
}

mod chaos {
    //! Random live changes under every policy: processes come with work, go
    //! mid-run, change priority and weight. Nobody else's work is lost.

    use super::*;
    use proptest::prelude::*;

    /// A process of the run: its slot, front-end id, what it was sent and whether it was removed.
    struct Tracked {
        slot: Slot,
        id: u32,
        ops: Vec<gpumux_engine::OpId>,
        blocks: u64,
        removed: bool,
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn live_changes_lose_no_work(
            policy in 0..policies::CATALOGUE.len(),
            steps in proptest::collection::vec((0u64..40, 0u8..5, any::<u32>()), 1..24),
            freeing in any::<bool>(),
        ) {
            let name = policies::CATALOGUE[policy].0;
            // Half the cases on a device that frees a retreat's SMs in the command.
            let mut b = if freeing { Bench::freeing_at_once(name) } else { Bench::new(name) };
            let mut procs: Vec<Tracked> = Vec::new();
            for (dt, kind, arg) in steps {
                b.run(Some(b.now + dt * 1_000));
                let live: Vec<usize> = (0..procs.len()).filter(|&i| !procs[i].removed).collect();
                let pick = |n: usize| live[arg as usize % n];
                match kind {
                    // Static spatial splits the SMs over every live process: at most one SM each.
                    0..=1 if live.len() < SMS as usize => {
                        let id = procs.len() as u32;
                        let slot = b.add(id, (arg % 3) as i32);
                        let (k1, k2) = (1 + u64::from(arg % 300), 1 + u64::from(arg >> 16) % 100);
                        let mut ops = vec![b.submit(slot, StreamOp::Kernel { desc: desc("k1", k1), time_key: 0 })];
                        if arg % 2 == 0 {
                            ops.push(b.submit(slot, StreamOp::Copy { direction: CopyDirection::DeviceToHost, bytes: 8 }));
                        }
                        ops.push(b.submit(slot, StreamOp::Sync));
                        ops.push(b.submit(slot, StreamOp::Kernel { desc: desc("k2", k2), time_key: 0 }));
                        procs.push(Tracked { slot, id, ops, blocks: k1 + k2, removed: false });
                    }
                    2 if !live.is_empty() => {
                        let i = pick(live.len());
                        b.engine.remove_process(b.now, procs[i].slot).expect("a live slot");
                        procs[i].removed = true;
                    }
                    3 if !live.is_empty() => {
                        b.engine.set_priority(procs[pick(live.len())].slot, (arg % 5) as i32).expect("a live slot");
                    }
                    4 if !live.is_empty() => {
                        b.engine.set_weight(procs[pick(live.len())].slot, f64::from(1 + arg % 4)).expect("a live slot");
                    }
                    _ => {}
                }
            }
            b.run(None);

            prop_assert!(b.dev.ran_twice().is_empty(), "{}: {:?}", name, b.dev.ran_twice());
            for p in &procs {
                let reported: Vec<_> = b.completions.iter().filter(|(_, c)| c.slot == p.slot).map(|(_, c)| (c.op, c.outcome)).collect();
                // Every operation is reported once, in order.
                prop_assert_eq!(reported.iter().map(|r| r.0).collect::<Vec<_>>(), p.ops.clone(), "{}: process {}", name, p.id);
                if p.removed {
                    // What ended before the removal completed; the rest was dropped.
                    let first_dropped = reported.iter().position(|r| r.1 == OpOutcome::Dropped).unwrap_or(reported.len());
                    prop_assert!(reported[first_dropped..].iter().all(|r| r.1 == OpOutcome::Dropped), "{}", name);
                } else {
                    prop_assert!(reported.iter().all(|r| r.1 == OpOutcome::Completed), "{}: process {}", name, p.id);
                    let blocks: u64 = b
                        .dev
                        .log()
                        .iter()
                        .filter_map(|(_, c)| match c {
                            Command::Launch { kernel, process, .. } if process.0 == p.id => Some(*kernel),
                            _ => None,
                        })
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .map(|k| b.dev.blocks_done(k))
                        .sum();
                    prop_assert_eq!(blocks, p.blocks, "{}: every block of process {} ran", name, p.id);
                }
            }
        }
    }
}
