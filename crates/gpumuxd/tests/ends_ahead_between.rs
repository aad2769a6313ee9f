//! Looks between the daemon's messages (`device_host`, "Between messages";
//! `GPUMUX_DEEPEN_BETWEEN=1`) through a real device process, with the
//! simulated device scripted to run one-block kernels ahead
//! (`GPUMUX_SIM_ENDS_AHEAD=1`): the device process sees their ends while it
//! waits for the core's next message, not only at polls, and the next poll
//! reports them; every launch still completes once, in order, answered
//! from its end seen ahead. A file of its own: both variables are set for
//! this process, whose device processes inherit them (read once, at start).

mod chain_core;

use chain_core::{
    chain_answered_ahead, core_with_empty_kernel, count_before, device_process_with_empty_kernel, one_block_launch,
    still_in_step,
};
use gpumuxd::backend::sim::ENDS_AHEAD_VAR;
use gpumuxd::device_host::DEEPEN_BETWEEN_VAR;
use std::time::Duration;

/// Both switches, before any device process starts.
fn switches_on() {
    std::env::set_var(ENDS_AHEAD_VAR, "1");
    std::env::set_var(DEEPEN_BETWEEN_VAR, "1");
}

/// A chain through the core with the looks on: the stream completes as
/// without them, every launch once, answered from its end seen ahead.
#[test]
fn with_looks_between_messages_a_chain_completes_once_in_order_from_its_ends_seen_ahead() {
    switches_on();
    let (mut core, rx, launch) = core_with_empty_kernel("between");
    let _ = core.device_link_lap();
    let n = 40u64;
    chain_answered_ahead(&mut core, &rx, &launch, n);

    // How many ends the looks saw rather than the polls depends on the
    // machine's timing (a burst of binds straight into a poll leaves the
    // device process no pause to look in): the next test paces the messages.
    let words = core.device_link_lap().unwrap_or_default();
    eprintln!("looks between messages: {}", count_before(&words, " looks between messages"));

    // Still in step: more launches, answered or run, and a sync.
    still_in_step(&mut core, &rx, &launch);
}

/// The device process on its own, its messages paced by hand: kernels bound
/// to follow another are seen ended by a look while it waits for the next
/// message (its account says so), and the next poll reports each once:
/// every launch of them is then answered from its end seen ahead, once, and
/// the engine reads their ends in the order launched.
#[test]
fn a_look_between_messages_sees_ends_that_the_next_poll_reports_once_each() {
    use gpumux_engine::device::Event;
    use gpumux_engine::ids::OpId;

    use gpumuxd::backend::Backend;

    switches_on();
    let (mut backend, work) = device_process_with_empty_kernel();
    backend.bind(OpId(1), work(None));
    let _ = backend.exchange_lap();
    // A kernel bound behind the last, then a pause with no message: the
    // device process spins on the link for a while after a message, and
    // looks then. One such pause is enough, however loaded the machine.
    let (mut looks, mut last) = (0, 1u64);
    for op in 2..40u64 {
        backend.bind(OpId(op), work(Some(OpId(op - 1))));
        last = op;
        std::thread::sleep(Duration::from_micros(200));
        let mut events = Vec::new();
        backend.poll(&mut events).expect("the device process answers");
        assert!(events.is_empty(), "a look makes no event: {events:?}");
        looks += count_before(&backend.exchange_lap().unwrap_or_default(), " looks between messages");
        if looks >= 3 && op >= 10 {
            break;
        }
    }
    assert!(looks > 0, "the device process never looked between messages");
    // Every kernel bound behind another was reported ahead, once: each
    // launch of one is answered, in the order launched.
    let launch = one_block_launch;
    for op in 2..=last {
        backend.submit(launch(op)).expect("the launch is sent");
    }
    assert_eq!(backend.ends_answered(), last - 1, "every launch after the first answered, once");
    let mut events = Vec::new();
    backend.poll(&mut events).expect("the device process answers");
    let ended: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            Event::LaunchEnded { launch, remaining, .. } if remaining.is_empty() => Some(launch.0),
            _ => None,
        })
        .collect();
    assert_eq!(ended, (2..=last).collect::<Vec<_>>(), "each answered launch ended once, in order");
}
