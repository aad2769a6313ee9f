//! A device in a child process ([`RemoteBackend`]), driven directly: it
//! keeps the engine's device contract when commands and the launch's end
//! cross, and after the device process is killed and restarted, the
//! device's own memory account matches the buffers the sessions hold again.

use gpumux_engine::device::{Command, Event, ReleaseCause};
use gpumux_engine::ids::{KernelId, LaunchId, OpId, ProcessId, SmId};
use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
use gpumux_engine::ranges::BlockRanges;
use gpumux_engine::smset::SmSet;
use gpumux_proto::{Notice, Reply, Request, ServerFrame};
use gpumuxd::backend::remote::RemoteBackend;
use gpumuxd::backend::Backend;
use gpumuxd::config::ClientLimits;
use gpumuxd::conn::Inbound;
use gpumuxd::core::Core;
use gpumuxd::session::Peer;
use std::path::Path;
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn start() -> RemoteBackend {
    RemoteBackend::start(Path::new(env!("CARGO_BIN_EXE_gpumuxd")), "sim:h100").expect("the device process starts")
}

/// Sends `request` as client 1's request `id`, pumps, and returns the reply.
fn call(core: &mut Core, rx: &Receiver<ServerFrame>, id: u64, request: Request) -> Reply {
    core.inbound(1, Inbound::Request { id, request, fd: None });
    core.pump().unwrap();
    for frame in rx.try_iter() {
        if let ServerFrame::Reply { id: got, result } = frame {
            assert_eq!(got, id);
            return result.unwrap();
        }
    }
    panic!("no reply to request {id}");
}

fn used(core: &mut Core) -> u64 {
    let m = core.device_memory().unwrap();
    m.total - m.free
}

#[test]
fn after_a_restart_the_device_holds_exactly_the_restored_buffers() {
    let backend = start();
    let pid = backend.pid() as i32;
    let mut core = Core::new(Box::new(backend), None).unwrap();
    let (tx, rx) = channel();
    core.connect(1, Peer { pid: 1, uid: 1000, gid: 1000 }, ClientLimits::default(), tx);
    let hello = Request::hello("acct", 0);
    assert!(matches!(call(&mut core, &rx, 1, hello), Reply::Welcome(_)));
    let baseline = used(&mut core);
    let sizes = [1u64 << 20, 3 << 20, 4096];
    let mut buffers = Vec::new();
    for (i, bytes) in sizes.iter().enumerate() {
        match call(&mut core, &rx, 2 + i as u64, Request::Alloc { bytes: *bytes }) {
            Reply::Buffer(b) => buffers.push(b),
            other => panic!("{other:?}"),
        }
    }
    call(&mut core, &rx, 9, Request::Free(buffers[1]));
    let held: u64 = sizes[0] + sizes[2];
    assert_eq!(core.memory_held(), held);
    assert_eq!(used(&mut core) - baseline, held);

    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while core.status().context_rebuilds == 0 {
        assert!(Instant::now() < deadline, "the device process's death was not noticed");
        std::thread::sleep(core.wait().min(Duration::from_millis(20)));
        core.pump().unwrap();
    }
    let notice = rx.try_iter().find_map(|f| match f {
        ServerFrame::Notice(Notice::ContextLost { what, lost, .. }) => Some((what, lost)),
        _ => None,
    });
    let (what, lost) = notice.expect("the client is told");
    assert!(what.contains(&format!("pid {pid}")) && what.contains("signal 9"), "{what}");
    assert_eq!(lost.buffers, [buffers[0], buffers[2]]);
    assert_eq!(core.memory_held(), held, "the sessions keep their buffers");
    assert_eq!(used(&mut core) - baseline, held, "the fresh device holds exactly those");
}

/// A launch of `blocks` blocks of 10 ms on SM 0, at most 4 resident at once.
fn launch_on_sm0(blocks: u64) -> Command {
    let shape = KernelShape::new(blocks, 128, 32).with_max_blocks_per_sm(4);
    let desc = KernelDesc::new("k", shape).with_sim_timing(SimTiming::new(10_000_000));
    Command::Launch {
        launch: LaunchId(1),
        kernel: KernelId(1),
        op: OpId(1),
        process: ProcessId(0),
        priority: 0,
        desc: Arc::new(desc),
        time_key: 1,
        blocks: BlockRanges::full(blocks),
        restore: Vec::new(),
        sms: SmSet::single(SmId(0)),
    }
}

/// Polls until launch 1 ends; every event, in order.
fn poll_until_ended(b: &mut RemoteBackend, mut events: Vec<Event>) -> Vec<Event> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !events.iter().any(|e| matches!(e, Event::LaunchEnded { .. })) {
        assert!(Instant::now() < deadline, "launch 1 did not end: {events:?}");
        if let Err(f) = b.poll(&mut events) {
            panic!("the device failed: {f:?} (after {events:?})");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    events
}

/// The engine's contract: every SM the launch was given (`Launch` and
/// `Grow`) is released, each before the launch's end, which comes once
/// with every block completed.
fn assert_released_before_end(events: &[Event], sms: &[u16], blocks: u64) {
    let end = events.iter().position(|e| matches!(e, Event::LaunchEnded { .. })).unwrap();
    let mut released: Vec<u16> = events[..end]
        .iter()
        .filter_map(|e| match e {
            Event::SmReleased { launch: LaunchId(1), sm, cause: ReleaseCause::Exhausted } => Some(sm.0),
            _ => None,
        })
        .collect();
    released.sort_unstable();
    assert_eq!(released, sms, "SMs released before the end: {events:?}");
    match &events[end] {
        Event::LaunchEnded { launch: LaunchId(1), remaining, saved, completed } => {
            assert!(remaining.is_empty() && saved.is_empty(), "{events:?}");
            assert_eq!(*completed, blocks);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(events.len(), end + 1, "nothing of launch 1 after its end: {events:?}");
}

/// The race of the H100 (remote.rs's module doc): the launch's last blocks
/// end on the device while a `Grow` for it is on its way. The device must
/// take the `Grow` first and release the grown SMs before the end.
#[test]
fn a_grow_sent_after_the_launch_finished_but_before_the_poll_is_released_before_its_end() {
    let mut b = start();
    let mut events = Vec::new();
    // The device's time is now (it runs commands at its last poll's time).
    b.poll(&mut events).unwrap();
    // 12 blocks, 4 at a time: three 10 ms waves, not exhausted at the next poll.
    b.submit(launch_on_sm0(12)).unwrap();
    b.poll(&mut events).unwrap();
    assert!(events.is_empty(), "the first wave just started: {events:?}");
    // In wall time the launch is over; the device has not been polled since.
    std::thread::sleep(Duration::from_millis(100));
    b.submit(Command::Grow { launch: LaunchId(1), sms: SmSet::range(1, 3) }).unwrap();
    let events = poll_until_ended(&mut b, events);
    assert_released_before_end(&events, &[0, 1, 2], 12);
}

/// The same with a launch that was exhausted at once (all its blocks fit),
/// not yet reported when the `Grow` comes: the grown SMs are handed back.
#[test]
fn a_grow_of_an_exhausted_unreported_launch_hands_the_sms_back_before_its_end() {
    let mut b = start();
    let mut events = Vec::new();
    b.poll(&mut events).unwrap();
    b.submit(launch_on_sm0(4)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    b.submit(Command::Grow { launch: LaunchId(1), sms: SmSet::range(1, 3) }).unwrap();
    let events = poll_until_ended(&mut b, events);
    assert_released_before_end(&events, &[0, 1, 2], 4);
}

/// A poll sent ahead (`start_poll`, while the core handles requests) is
/// answered to the next `poll`, and a call made while its answer is on its
/// way gets its own answer: the poll's is kept for the poll.
#[test]
fn a_call_while_a_poll_is_on_its_way_gets_its_own_answer_and_the_poll_keeps_its_events() {
    let mut b = start();
    let mut events = Vec::new();
    b.poll(&mut events).unwrap();
    b.submit(launch_on_sm0(4)).unwrap();
    // In wall time the launch (one wave of 10 ms) is over before the poll.
    std::thread::sleep(Duration::from_millis(50));
    assert!(b.start_poll(), "a device in another process answers polls later");
    assert!(b.start_poll(), "one poll on its way at a time: asking again sends nothing");
    let before = b.mem_info().expect("a call answered while the poll is on its way");
    assert!(before.total > 0 && before.free <= before.total, "{before:?}");
    assert!(b.poll_ready(), "the poll's answer came before the call's and was kept");
    b.poll(&mut events).unwrap();
    let events = poll_until_ended(&mut b, events);
    assert_released_before_end(&events, &[0], 4);
    assert!(b.poll_ready(), "nothing on its way any more");
}

/// The device process gets as many hardware work queues as the driver
/// allows (`CONNECTIONS_VAR`), unless the daemon's environment says otherwise.
#[test]
fn the_device_process_runs_with_the_most_hardware_queues() {
    use gpumuxd::backend::remote::{CONNECTIONS, CONNECTIONS_VAR};
    if std::env::var_os(CONNECTIONS_VAR).is_some() {
        eprintln!("SKIPPED: {CONNECTIONS_VAR} is set in this environment, so the child inherits it");
        return;
    }
    let b = start();
    let environ = std::fs::read(format!("/proc/{}/environ", b.pid())).expect("the child's environment");
    let expected = format!("{CONNECTIONS_VAR}={CONNECTIONS}");
    assert!(
        environ.split(|&c| c == 0).any(|kv| kv == expected.as_bytes()),
        "{expected} not in the device process's environment"
    );
}

/// A held poll (docs/daemon.md, "Held polls") is answered when the device
/// has news, the launch's end, not empty at once and not at the hold's end:
/// a 10 ms wave's end comes in a poll or two (the SM's release, at once;
/// the end), where polls answered at once would have taken hundreds.
#[test]
fn a_held_poll_brings_the_launchs_end_as_it_happens_not_at_the_holds_end() {
    let mut b = start();
    let mut events = Vec::new();
    b.poll(&mut events).unwrap();
    let t = Instant::now();
    b.submit(launch_on_sm0(4)).unwrap();
    let mut polls = 0;
    while !events.iter().any(|e| matches!(e, Event::LaunchEnded { .. })) {
        polls += 1;
        assert!(polls <= 3, "held polls came back without news: {events:?}");
        assert!(b.start_held_poll(Duration::from_secs(5)), "a device process answers polls later");
        b.poll(&mut events).unwrap();
    }
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(5), "the end of a 10 ms wave came after {took:?}");
    assert!(took < Duration::from_secs(2), "the hold of 5 s was not cut by the end: {took:?}");
    assert_released_before_end(&events, &[0], 4);
}

/// A call to the device while a held poll is out ends the hold: its answer
/// comes at once, the poll's is kept for the poll, and the device still
/// saw the poll before the call (the launch of 1 s has not ended in it).
#[test]
fn a_call_while_a_poll_is_held_ends_the_hold_and_gets_its_answer_at_once() {
    let mut b = start();
    let mut events = Vec::new();
    b.poll(&mut events).unwrap();
    // 400 blocks, 4 at a time: 100 waves of 10 ms.
    b.submit(launch_on_sm0(400)).unwrap();
    assert!(b.start_held_poll(Duration::from_secs(5)));
    let t = Instant::now();
    let info = b.mem_info().expect("a call answered while a poll is held");
    let took = t.elapsed();
    assert!(info.total > 0 && info.free <= info.total, "{info:?}");
    assert!(took < Duration::from_millis(500), "the call waited {took:?} for the held poll");
    assert!(b.poll_ready(), "the held poll's answer came first and was kept");
    b.poll(&mut events).unwrap();
    assert!(!events.iter().any(|e| matches!(e, Event::LaunchEnded { .. })), "{events:?}");
}
