//! Orders between streams and with the host: `StreamOp::WaitFor` (a stream
//! waits for another's operation, `cudaStreamWaitEvent`) and `StreamOp::Hold`
//! (a stream holds until the front-end releases it, a host function in
//! stream order), on the scripted device. The randomised test under every
//! policy is gpumux-sim's `stream_waits`.

mod common;

use common::{kernel, Bench, WAVE_NS};
use gpumux_engine::{Command, OpOutcome, StreamOp};

/// When the first launch of front-end process `id` went to the device.
fn first_launch(b: &Bench, id: u32) -> Option<u64> {
    b.dev.log().iter().find_map(|(t, c)| match c {
        Command::Launch { process, .. } if process.0 == id => Some(*t),
        _ => None,
    })
}

fn ended_at(b: &Bench, op: gpumux_engine::OpId) -> Option<u64> {
    b.completions.iter().find(|(_, c)| c.op == op).map(|(t, _)| *t)
}

#[test]
fn a_stream_waiting_for_another_starts_only_when_that_operation_ends() {
    for policy in ["fcfs", "ppq-excl-cs", "ppq-even-drain", "dss-flush", "rr"] {
        let mut b = Bench::new(policy);
        let a = b.add(0, 0);
        let waiter = b.add(1, 9);
        b.submit(a, kernel("long", 5));
        let event = b.submit(a, StreamOp::Sync);
        let wait = b.submit(waiter, StreamOp::WaitFor { slot: a, op: event });
        let k = b.submit(waiter, kernel("after", 1));
        b.run(None);
        let event_end = ended_at(&b, event).expect("the event ends");
        assert!(event_end >= 5 * WAVE_NS, "{policy}: the long kernel takes 5 waves");
        assert_eq!(ended_at(&b, wait), Some(event_end), "{policy}: the wait ends with the event");
        let started = first_launch(&b, 1).expect("the waiting stream's kernel runs");
        assert!(started >= event_end, "{policy}: launched at {started}, before the event at {event_end}");
        assert_eq!(b.outcomes(waiter), vec![OpOutcome::Completed; 2], "{policy}");
        assert!(ended_at(&b, k).is_some_and(|t| t > event_end));
    }
}

#[test]
fn a_wait_for_an_operation_that_ended_or_was_dropped_goes_on_at_once() {
    let mut b = Bench::new("fcfs");
    let a = b.add(0, 0);
    let w = b.add(1, 0);
    let done = b.submit(a, StreamOp::Sync);
    b.flush();
    let wait = b.submit(w, StreamOp::WaitFor { slot: a, op: done });
    b.flush();
    assert_eq!(ended_at(&b, wait), Some(0), "an ended operation does not hold the stream");

    // Waiting for an operation of a process removed before it ran.
    b.submit(a, kernel("doomed", 3));
    let doomed_event = b.submit(a, StreamOp::Sync);
    let wait = b.submit(w, StreamOp::WaitFor { slot: a, op: doomed_event });
    b.submit(w, kernel("after", 1));
    b.run(Some(WAVE_NS));
    assert!(ended_at(&b, wait).is_none(), "still waiting while the kernel runs");
    b.engine.remove_process(b.now, a).expect("a live slot");
    b.run(None);
    assert!(ended_at(&b, wait).is_some(), "the waiter goes on once what it waits for is dropped");
    assert_eq!(b.outcomes(w), vec![OpOutcome::Completed; 3]);
}

#[test]
fn a_hold_keeps_the_stream_until_released_before_or_after_it_reaches_the_head() {
    let mut b = Bench::new("fcfs");
    let p = b.add(0, 0);
    b.submit(p, kernel("first", 1));
    let reached = b.submit(p, StreamOp::Sync);
    let hold = b.submit(p, StreamOp::Hold);
    let after = b.submit(p, kernel("after", 1));
    b.run(None);
    assert!(ended_at(&b, reached).is_some(), "the marker before the hold ends");
    assert!(ended_at(&b, hold).is_none() && ended_at(&b, after).is_none(), "nothing passes an unreleased hold");
    let launches = b.dev.log().iter().filter(|(_, c)| matches!(c, Command::Launch { .. })).count();
    assert_eq!(launches, 1, "only the first kernel was launched");

    let released_at = b.now;
    assert!(b.engine.release(released_at, p, hold).expect("a live slot"));
    assert!(!b.engine.release(released_at, p, hold).expect("a live slot"), "released twice");
    b.run(None);
    assert_eq!(ended_at(&b, hold), Some(released_at));
    assert!(ended_at(&b, after).is_some_and(|t| t > released_at));

    // Released before it reaches the head: it passes as a marker.
    let before = b.submit(p, kernel("before", 2));
    let hold = b.submit(p, StreamOp::Hold);
    let last = b.submit(p, kernel("last", 1));
    b.flush();
    assert!(b.engine.release(b.now, p, hold).expect("a live slot"));
    b.run(None);
    let (before_end, hold_end) = (ended_at(&b, before), ended_at(&b, hold));
    assert!(before_end.is_some() && hold_end == before_end, "it ends with the kernel before it");
    assert!(ended_at(&b, last).is_some(), "a hold released early does not block");
}
