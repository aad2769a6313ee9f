//! A core over a real device process on `sim:h100`, client 1 connected and
//! an empty kernel loaded, and a chain of its one-block launches through it:
//! what the ends-known-ahead tests (`ends_ahead*.rs`) share. Each of those is
//! a test binary of its own because the switches they set are read from the
//! environment by the device processes they start.
#![allow(dead_code)]

use gpumux_engine::device::Command;
use gpumux_engine::ids::{KernelId, LaunchId, OpId, ProcessId};
use gpumux_engine::kernel::{KernelDesc, KernelShape};
use gpumux_engine::ranges::BlockRanges;
use gpumux_engine::smset::SmSet;
use gpumux_proto::{Launch, Reply, Request, ServerFrame, StreamId};
use gpumuxd::backend::remote::RemoteBackend;
use gpumuxd::backend::{Backend, OpWork};
use gpumuxd::config::ClientLimits;
use gpumuxd::conn::Inbound;
use gpumuxd::core::Core;
use gpumuxd::session::Peer;
use std::path::Path;
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sends `request` as client 1's request `id` and pumps until its reply (10 s at most).
pub fn call(core: &mut Core, rx: &Receiver<ServerFrame>, id: u64, request: Request) -> Result<Reply, String> {
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

/// The count before `what` in `words` (`"... 12 retired launches ..."`), 0 if none.
pub fn count_before(words: &str, what: &str) -> u64 {
    words.find(what).and_then(|i| words[..i].split_whitespace().last()).and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// A core over a device process of this test's `gpumuxd` on `sim:h100`, with
/// client 1 connected as `name`: the core, client 1's frames, and a launch of
/// an empty one-block kernel on stream 0 (20 µs blocks, as the simulated
/// device scripted by `GPUMUX_SIM_ENDS_AHEAD` runs ahead).
pub fn core_with_empty_kernel(name: &str) -> (Core, Receiver<ServerFrame>, Launch) {
    let exe = Path::new(env!("CARGO_BIN_EXE_gpumuxd"));
    let backend = RemoteBackend::start(exe, "sim:h100").expect("the device process starts");
    let mut core = Core::new(Box::new(backend), None).expect("a core");
    let (tx, rx) = channel();
    core.connect(1, Peer { pid: 1, uid: 1000, gid: 1000 }, ClientLimits::default(), tx);
    assert!(matches!(call(&mut core, &rx, 1, Request::hello(name, 0)), Ok(Reply::Welcome(_))));
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
    (core, rx, launch)
}

/// `n` launches of `launch` (requests 10 on) and a sync (request 100), with
/// what holds when the device ran every kernel after the first ahead: none
/// refused; each answered from its end seen ahead, in the engine turn that
/// launched it (a few device rounds for the chain, not one per kernel: issue
/// 35); no SMs left held; every kernel counted done, once.
pub fn chain_answered_ahead(core: &mut Core, rx: &Receiver<ServerFrame>, launch: &Launch, n: u64) {
    for i in 0..n {
        core.inbound(1, Inbound::Request { id: 10 + i, request: Request::Launch(launch.clone()), fd: None });
    }
    assert_eq!(call(core, rx, 100, Request::SyncStream(StreamId(0))), Ok(Reply::Done));
    let errors: Vec<_> = rx.try_iter().filter(|f| matches!(f, ServerFrame::Reply { result: Err(_), .. })).collect();
    assert!(errors.is_empty(), "a launch was refused: {errors:?}");
    assert_eq!(core.ends_answered(), n - 1, "every kernel after the first answered from its end seen ahead");
    let (rounds, in_turn) = core.device_rounds();
    assert_eq!(in_turn, n - 1, "every answer read in the turn that made its launch");
    assert!(rounds < n / 3, "{rounds} device rounds for a chain of {n} kernels");
    assert_eq!(core.sms_held(), 0, "no launch left holding SMs");
    let done = core.status().clients.iter().find(|c| c.client == 1).map(|c| c.kernels_done);
    assert_eq!(done, Some(n), "every kernel counted done, once");
}

/// Five more launches (answered or run) and a sync: the device process is
/// still in step, and never failed.
pub fn still_in_step(core: &mut Core, rx: &Receiver<ServerFrame>, launch: &Launch) {
    for i in 0..5 {
        core.inbound(1, Inbound::Request { id: 200 + i, request: Request::Launch(launch.clone()), fd: None });
    }
    assert_eq!(call(core, rx, 300, Request::SyncStream(StreamId(0))), Ok(Reply::Done));
    assert_eq!(core.status().context_rebuilds, 0, "the device process never failed");
}

/// A device process of this test's `gpumuxd` on `sim:h100` with an empty
/// kernel loaded, driven by hand (no core), and the work of a one-block
/// launch of that kernel bound after an operation (or none).
pub fn device_process_with_empty_kernel() -> (RemoteBackend, impl Fn(Option<OpId>) -> OpWork) {
    let exe = Path::new(env!("CARGO_BIN_EXE_gpumuxd"));
    let mut backend = RemoteBackend::start(exe, "sim:h100").expect("the device process starts");
    let image = backend.load_module("m.cu", "__global__ void j() {}\n", &[]).expect("the module loads");
    let code = image.kernels[0].code;
    let work = move |after| OpWork::Kernel {
        code,
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_bytes: 0,
        params: Vec::new(),
        after,
        range: None,
    };
    (backend, work)
}

/// The engine's launch command for operation `op` of the device process's
/// one-block kernel ([`device_process_with_empty_kernel`]): launch, kernel
/// and operation all numbered `op`, its one block on SM 0.
pub fn one_block_launch(op: u64) -> Command {
    Command::Launch {
        launch: LaunchId(op),
        kernel: KernelId(op),
        op: OpId(op),
        process: ProcessId(0),
        priority: 0,
        desc: Arc::new(KernelDesc::new("j", KernelShape::new(1, 32, 32))),
        time_key: op,
        blocks: BlockRanges::full(1),
        restore: Vec::new(),
        sms: SmSet::range(0, 1),
    }
}
