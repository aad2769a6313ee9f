//! Ends known ahead through a real device process (`backend::ends_ahead`):
//! the simulated device, scripted by `GPUMUX_SIM_ENDS_AHEAD=1`, reports the
//! one-block kernels bound after another as ended ahead; the daemon's side
//! answers their launches without a round trip, the device process drops
//! the events of those launches, and the client's stream completes in order.
//! A file of its own: the variable is set for this process, whose device
//! processes inherit it.

use gpumux_proto::{Launch, Reply, Request, ServerFrame, StreamId};
use gpumuxd::backend::remote::RemoteBackend;
use gpumuxd::backend::sim::ENDS_AHEAD_VAR;
use gpumuxd::config::ClientLimits;
use gpumuxd::conn::Inbound;
use gpumuxd::core::Core;
use gpumuxd::session::Peer;
use std::path::Path;
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// Sends `request` as client 1's request `id` and pumps until its reply (10 s at most).
fn call(core: &mut Core, rx: &Receiver<ServerFrame>, id: u64, request: Request) -> Result<Reply, String> {
    core.inbound(1, Inbound::Request { id, request, fd: None });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        core.pump().map_err(|e| e.to_string())?;
        for frame in rx.try_iter() {
            if let ServerFrame::Reply { id: got, result } = frame {
                if got == id {
                    return result.map_err(|e| format!("{e:?}"));
                }
            }
        }
        if Instant::now() > deadline {
            return Err(format!("no reply to request {id} in 10 s"));
        }
        std::thread::sleep(core.wait().min(Duration::from_micros(200)));
    }
}

#[test]
fn launches_of_kernels_the_device_ran_ahead_are_answered_without_a_round_trip_and_the_stream_completes() {
    // Set before any device process starts, in a test binary of one test.
    std::env::set_var(ENDS_AHEAD_VAR, "1");
    let exe = Path::new(env!("CARGO_BIN_EXE_gpumuxd"));
    let backend = RemoteBackend::start(exe, "sim:h100").expect("the device process starts");
    let mut core = Core::new(Box::new(backend), None).expect("a core");
    let (tx, rx) = channel();
    core.connect(1, Peer { pid: 1, uid: 1000, gid: 1000 }, ClientLimits::default(), tx);
    let hello = Request::hello("ahead", 0);
    assert!(matches!(call(&mut core, &rx, 1, hello), Ok(Reply::Welcome(_))));
    let module =
        Request::LoadModule { name: "m.cu".into(), source: "__global__ void j() {}\n".into(), options: Vec::new() };
    let kernel = match call(&mut core, &rx, 2, module) {
        Ok(Reply::Module { kernels, .. }) => kernels[0].kernel,
        other => panic!("the module did not load: {other:?}"),
    };
    let launch = Launch {
        kernel,
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_bytes: 0,
        args: Vec::new(),
        stream: StreamId(0),
        block_time_ns: Some(20_000),
    };
    let n = 30u64;
    for i in 0..n {
        core.inbound(1, Inbound::Request { id: 10 + i, request: Request::Launch(launch.clone()), fd: None });
    }
    assert_eq!(call(&mut core, &rx, 100, Request::SyncStream(StreamId(0))), Ok(Reply::Done));
    let errors: Vec<_> = rx.try_iter().filter(|f| matches!(f, ServerFrame::Reply { result: Err(_), .. })).collect();
    assert!(errors.is_empty(), "a launch was refused: {errors:?}");
    // The first kernel follows none: the device runs it. The 29 after it were
    // reported at the first poll, before the engine launched any of them.
    assert_eq!(core.ends_answered(), n - 1, "every kernel after the first answered from its end seen ahead");
    // Each answered in the engine turn that launched it: a few device rounds
    // for the chain, not one per kernel (issue 35).
    let (rounds, in_turn) = core.device_rounds();
    assert_eq!(in_turn, n - 1, "every answer read in the turn that made its launch");
    assert!(rounds < n / 3, "{rounds} device rounds for a chain of {n} kernels");
    assert_eq!(core.sms_held(), 0, "no launch left holding SMs");
    let done = core.status().clients.iter().find(|c| c.client == 1).map(|c| c.kernels_done);
    assert_eq!(done, Some(n), "every kernel counted done");

    // The device process is still in step: more launches, answered or run, and a sync.
    for i in 0..5 {
        core.inbound(1, Inbound::Request { id: 200 + i, request: Request::Launch(launch.clone()), fd: None });
    }
    assert_eq!(call(&mut core, &rx, 300, Request::SyncStream(StreamId(0))), Ok(Reply::Done));
    assert_eq!(core.status().context_rebuilds, 0, "the device process never failed");
}
