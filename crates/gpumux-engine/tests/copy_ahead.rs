//! A stream's next copy is queued on the device behind the copy at its head
//! (`Engine::copy_ahead`, issue 40's pipeline): when only markers lie
//! between them and both go the same way, its command goes out at once, at
//! most one ahead; it still completes in stream order, after the markers
//! between, even if the device reports it first. A wait for an operation
//! that has ended is no barrier: the copy behind it goes out as that
//! operation ends, while the head's copy still runs.

mod common;

use common::device;
use gpumux_engine::device::{Command, CopyDirection, Event};
use gpumux_engine::ids::CopyId;
use gpumux_engine::{policies, Engine, OpId, ProcessId, ProcessInfo, Slot, StreamOp};

fn up(bytes: u64) -> StreamOp {
    StreamOp::Copy { direction: CopyDirection::HostToDevice, bytes }
}

fn setup() -> (Engine, Slot, Slot) {
    let mut e = Engine::new(device(), policies::by_name("fcfs").expect("fcfs")).expect("engine");
    let a = e.add_process(ProcessInfo::new(ProcessId(0), "a")).expect("a");
    let b = e.add_process(ProcessInfo::new(ProcessId(1), "b")).expect("b");
    (e, a, b)
}

/// The copy commands the engine has for the device now: (copy, op).
fn copies_out(e: &mut Engine) -> Vec<(CopyId, OpId)> {
    let mut out = Vec::new();
    while let Some(c) = e.poll_command().expect("commands") {
        if let Command::Copy { copy, op, .. } = c {
            out.push((copy, op));
        }
    }
    out
}

fn completed(e: &mut Engine) -> Vec<OpId> {
    std::iter::from_fn(|| e.poll_completion()).map(|c| c.op).collect()
}

#[test]
fn the_next_copy_goes_out_behind_the_head_one_ahead_at_most() {
    let (mut e, a, _) = setup();
    let c0 = e.submit(0, a, up(1 << 20)).expect("c0");
    let m0 = e.submit(0, a, StreamOp::Sync).expect("m0");
    let c1 = e.submit(0, a, up(1 << 20)).expect("c1");
    let m1 = e.submit(0, a, StreamOp::Sync).expect("m1");
    let c2 = e.submit(0, a, up(1 << 20)).expect("c2");
    let out = copies_out(&mut e);
    assert_eq!(out.iter().map(|o| o.1).collect::<Vec<_>>(), vec![c0, c1], "the head and one ahead, not c2");
    assert!(completed(&mut e).is_empty(), "nothing ends before the device says");

    e.handle_event(10, Event::CopyDone { copy: out[0].0 }).expect("c0 done");
    assert_eq!(completed(&mut e), vec![c0, m0], "the marker after c0 ends with it, c1 still runs");
    let next = copies_out(&mut e);
    assert_eq!(next.iter().map(|o| o.1).collect::<Vec<_>>(), vec![c2], "c1 at the head: c2 goes ahead of it");

    // Reported out of order (c2 before c1): c2 waits for c1 and its marker.
    e.handle_event(20, Event::CopyDone { copy: next[0].0 }).expect("c2 done early");
    assert!(completed(&mut e).is_empty(), "c2 does not end before c1");
    e.handle_event(30, Event::CopyDone { copy: out[1].0 }).expect("c1 done");
    assert_eq!(completed(&mut e), vec![c1, m1, c2], "in stream order");
    assert!(copies_out(&mut e).is_empty(), "each copy went out once");
}

#[test]
fn no_copy_goes_ahead_of_a_wait_a_kernel_a_hold_or_the_other_direction() {
    let (mut e, a, b) = setup();
    let other = e.submit(0, b, common::kernel("long", 3)).expect("kernel on b");
    let c0 = e.submit(0, a, up(1 << 20)).expect("c0");
    e.submit(0, a, StreamOp::WaitFor { slot: b, op: other }).expect("wait");
    e.submit(0, a, up(1 << 20)).expect("after the wait");
    assert_eq!(copies_out(&mut e).iter().map(|o| o.1).collect::<Vec<_>>(), vec![c0], "not across a wait");

    let (mut e, a, _) = setup();
    let c0 = e.submit(0, a, up(1 << 20)).expect("c0");
    e.submit(0, a, StreamOp::Copy { direction: CopyDirection::DeviceToHost, bytes: 1 << 20 }).expect("down");
    assert_eq!(copies_out(&mut e).iter().map(|o| o.1).collect::<Vec<_>>(), vec![c0], "not the other direction");

    let (mut e, a, _) = setup();
    let c0 = e.submit(0, a, up(1 << 20)).expect("c0");
    e.submit(0, a, StreamOp::Hold).expect("hold");
    e.submit(0, a, up(1 << 20)).expect("after the hold");
    e.submit(0, a, common::kernel("k", 1)).expect("kernel");
    assert_eq!(copies_out(&mut e).iter().map(|o| o.1).collect::<Vec<_>>(), vec![c0], "not across a hold");
}

#[test]
fn a_removed_process_copies_ahead_are_ignored_when_they_end() {
    let (mut e, a, _) = setup();
    e.submit(0, a, up(1 << 20)).expect("c0");
    e.submit(0, a, up(1 << 20)).expect("c1");
    let out = copies_out(&mut e);
    assert_eq!(out.len(), 2);
    e.remove_process(5, a).expect("remove");
    let dropped = completed(&mut e);
    assert_eq!(dropped.len(), 2, "both reported dropped");
    // A new process may take the slot: the old copies' ends touch nothing of it.
    let n = e.add_process(ProcessInfo::new(ProcessId(2), "n")).expect("n");
    let c = e.submit(6, n, up(1 << 20)).expect("n's copy");
    let mine = copies_out(&mut e);
    for (copy, _) in &out {
        e.handle_event(7, Event::CopyDone { copy: *copy }).expect("old copy ends");
    }
    assert!(completed(&mut e).is_empty(), "n's copy is still on the device");
    e.handle_event(8, Event::CopyDone { copy: mine[0].0 }).expect("n's copy ends");
    assert_eq!(completed(&mut e), vec![c]);
}

/// Issue 40's pipeline: the copy-out stream is a wait for each chunk's
/// kernel, then its copy; chunk 1's kernel (a hold of another stream here)
/// ends while chunk 0's copy runs. Without this, chunk 1's copy went out
/// only once chunk 0's had ended: an engine round on the copy engine per
/// chunk.
#[test]
fn a_copy_goes_ahead_across_a_wait_once_what_it_waits_for_has_ended() {
    let (mut e, a, b) = setup();
    let kernel1 = e.submit(0, b, StreamOp::Hold).expect("b's hold");
    let c0 = e.submit(0, a, up(1 << 20)).expect("c0");
    let w = e.submit(0, a, StreamOp::WaitFor { slot: b, op: kernel1 }).expect("wait");
    let c1 = e.submit(0, a, up(1 << 20)).expect("c1");
    let out = copies_out(&mut e);
    assert_eq!(out.iter().map(|o| o.1).collect::<Vec<_>>(), vec![c0], "not across a wait still waiting");
    assert!(completed(&mut e).is_empty());

    // What it waits for ends while c0 runs: c1 goes out behind c0 at once.
    assert!(e.release(5, b, kernel1).expect("release"));
    assert_eq!(completed(&mut e), vec![kernel1]);
    let ahead = copies_out(&mut e);
    assert_eq!(ahead.iter().map(|o| o.1).collect::<Vec<_>>(), vec![c1], "c1 behind c0 once the wait is met");

    // Reported first, c1 still ends after c0 and the wait.
    e.handle_event(10, Event::CopyDone { copy: ahead[0].0 }).expect("c1 done early");
    assert!(completed(&mut e).is_empty(), "c1 does not end before c0");
    e.handle_event(20, Event::CopyDone { copy: out[0].0 }).expect("c0 done");
    assert_eq!(completed(&mut e), vec![c0, w, c1], "in stream order");
    assert!(copies_out(&mut e).is_empty(), "each copy went out once");

    // A wait submitted after what it waits for ended is no barrier either.
    let (mut e, a, b) = setup();
    let h = e.submit(0, b, StreamOp::Hold).expect("hold");
    e.release(1, b, h).expect("release");
    let c0 = e.submit(2, a, up(1 << 20)).expect("c0");
    e.submit(2, a, StreamOp::WaitFor { slot: b, op: h }).expect("wait for an ended op");
    let c1 = e.submit(2, a, up(1 << 20)).expect("c1");
    assert_eq!(copies_out(&mut e).iter().map(|o| o.1).collect::<Vec<_>>(), vec![c0, c1]);
}
