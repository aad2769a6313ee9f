//! Answered launches retired with their unbind as one message
//! (`GPUMUX_RETIRE_ANSWERED=1`, `backend::remote`, "Retired"), through a real
//! device process whose simulated device is scripted to run one-block
//! kernels ahead (`GPUMUX_SIM_ENDS_AHEAD=1`): each launch the daemon answers
//! from its end seen ahead and whose unbind follows at once goes as one
//! `Retire`; one whose unbind does not follow at once goes the old way
//! (`SubmitAnswered`, then `Unbind`). Either way every launch completes
//! once, in order, and the device process agrees (the simulated device
//! refuses a retire of a kernel it did not run ahead). A file of its own:
//! the variables are set for this process, whose device processes inherit
//! them (read once, at start).

mod chain_core;

use chain_core::{
    chain_answered_ahead, core_with_empty_kernel, count_before, device_process_with_empty_kernel, one_block_launch,
    still_in_step,
};
use gpumuxd::backend::remote::{RemoteBackend, RETIRE_ANSWERED_VAR};
use gpumuxd::backend::sim::ENDS_AHEAD_VAR;

/// Both switches, before any device process starts.
fn switches_on() {
    std::env::set_var(ENDS_AHEAD_VAR, "1");
    std::env::set_var(RETIRE_ANSWERED_VAR, "1");
}

/// The link's words split into what the daemon sent and what the device
/// process did (`exchange_clock`'s words: "...; sent ...; the device process ...").
fn sent_and_done(words: &str) -> (&str, &str) {
    words.split_once("; the device process").unwrap_or((words, ""))
}

/// A chain through the core: every launch after the first is answered from
/// its end seen ahead and retired with its unbind, one message each; the
/// stream completes as without the switch, every launch once.
#[test]
fn with_retires_a_chain_completes_once_in_order_and_each_answered_launch_goes_as_one_message() {
    switches_on();
    let (mut core, rx, launch) = core_with_empty_kernel("retire");
    let _ = core.device_link_lap();
    let n = 40u64;
    chain_answered_ahead(&mut core, &rx, &launch, n);

    // Still in step: more launches, answered or run, and a sync; its poll
    // brings the device process's account of the retires before it.
    still_in_step(&mut core, &rx, &launch);
    let words = core.device_link_lap().unwrap_or_default();
    let (sent, done) = sent_and_done(&words);
    let retired = count_before(sent, " retired launches");
    // In the chain an answered launch's unbind follows it at once: every one retired.
    assert_eq!(retired, core.ends_answered(), "every answered launch retired with its unbind: {words}");
    assert_eq!(count_before(sent, " answered launches"), 0, "none went the old way: {words}");
    assert!(
        count_before(done, " retired launches") >= n - 1,
        "the device process handled the chain's retires: {words}"
    );
}

/// The daemon's side on its own, its sends held and released by hand as the
/// core does: a launch whose unbind follows before the release goes as one
/// `Retire`; one released before its unbind, or with another message
/// between, goes as `SubmitAnswered` then `Unbind`. Every launch ends once,
/// in the order launched, and the device process takes both ways.
#[test]
fn an_answered_launch_is_retired_only_when_its_unbind_follows_at_once() {
    use gpumux_engine::device::Event;
    use gpumux_engine::ids::OpId;

    use gpumuxd::backend::Backend;

    switches_on();
    let (mut backend, work) = device_process_with_empty_kernel();
    let last = 9u64;
    backend.bind(OpId(1), work(None));
    for op in 2..=last {
        backend.bind(OpId(op), work(Some(OpId(op - 1))));
    }
    // The poll that reports ops 2..=last ended ahead.
    let mut events = Vec::new();
    backend.poll(&mut events).expect("the device process answers");
    assert!(events.is_empty(), "nothing launched yet: {events:?}");
    let _ = backend.exchange_lap();
    let launch = one_block_launch;
    let mut answered = Vec::new();
    let mut take = |backend: &mut RemoteBackend| {
        let mut got = Vec::new();
        assert!(backend.take_answered(&mut got), "the launch was answered at once");
        answered.extend(got);
    };
    // 2, 3: the unbind follows before the release: retired.
    for op in [2, 3] {
        backend.hold_sends();
        backend.submit(launch(op)).expect("sent");
        take(&mut backend);
        backend.unbind(OpId(op));
        backend.release_sends();
    }
    // 4: released before its unbind: the old way.
    backend.hold_sends();
    backend.submit(launch(4)).expect("sent");
    take(&mut backend);
    backend.release_sends();
    backend.unbind(OpId(4));
    // 5: another operation's unbind between (op 1, never launched here): the old way.
    backend.hold_sends();
    backend.submit(launch(5)).expect("sent");
    take(&mut backend);
    backend.unbind(OpId(1));
    backend.unbind(OpId(5));
    backend.release_sends();
    // 6: sent with no hold (a launch command outside the core's turn): the old way.
    backend.submit(launch(6)).expect("sent");
    take(&mut backend);
    backend.unbind(OpId(6));
    // 7..=last: retired again.
    for op in 7..=last {
        backend.hold_sends();
        backend.submit(launch(op)).expect("sent");
        take(&mut backend);
        backend.unbind(OpId(op));
        backend.release_sends();
    }
    assert_eq!(backend.ends_answered(), last - 1, "every launch answered, once");
    let mut events = Vec::new();
    backend.poll(&mut events).expect("the device process took every message (a refused retire fails its poll)");
    let from_device: Vec<&Event> = events.iter().filter(|e| matches!(e, Event::LaunchEnded { .. })).collect();
    assert!(from_device.is_empty(), "the device's ends of answered launches are dropped: {from_device:?}");
    let ended: Vec<u64> = answered
        .iter()
        .filter_map(|e| match e {
            Event::LaunchEnded { launch, remaining, .. } if remaining.is_empty() => Some(launch.0),
            _ => None,
        })
        .collect();
    assert_eq!(ended, (2..=last).collect::<Vec<_>>(), "each answered launch ended once, in order");
    let words = backend.exchange_lap().unwrap_or_default();
    let (sent, done) = sent_and_done(&words);
    let retired = 2 + (last - 6);
    assert_eq!(count_before(sent, " retired launches"), retired, "{words}");
    assert_eq!(count_before(sent, " answered launches"), 3, "4, 5 and 6 the old way: {words}");
    assert_eq!(count_before(done, " retired launches"), retired, "the device process handled each: {words}");
    assert_eq!(count_before(done, " answered launches"), 3, "{words}");
    assert_eq!(count_before(done, " unbinds"), 4, "4, 5, 6 and 1 unbound on their own: {words}");
}
