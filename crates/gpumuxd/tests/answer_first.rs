//! A device process that answers a poll before the runs it saw end go on
//! (`Backend::go_on`; `gpumux_cuda::client::ANSWER_FIRST_VAR`), against one
//! that lets them go on inside the poll: the simulated device, scripted by
//! `GPUMUX_SIM_ENDS_AHEAD=1` with 4 launch records (`AHEAD_RECORDS_VAR`),
//! runs a chain's one-block kernels ahead 4 at a time, the rest waiting for
//! the records a poll gives back, as the CUDA device's runs do. Both ways
//! the stream completes in order, every kernel once, and the kernels that
//! waited for records still ran ahead of their launches, so their launches
//! were answered from their ends: the kernels left for after the answer
//! went on before the device process read its next message.
//! A file of its own: the variables are set for this process, whose device
//! processes inherit them.

use gpumux_cuda::client::ANSWER_FIRST_VAR;
use gpumux_proto::{Launch, Reply, Request, ServerFrame, StreamId};
use gpumuxd::backend::remote::RemoteBackend;
use gpumuxd::backend::sim::{AHEAD_RECORDS_VAR, ENDS_AHEAD_VAR};
use gpumuxd::config::ClientLimits;
use gpumuxd::conn::Inbound;
use gpumuxd::core::Core;
use gpumuxd::session::Peer;
use std::path::Path;
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// Records for kernels run ahead (`AHEAD_RECORDS_VAR`).
const RECORDS: u64 = 4;

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

/// What one chain of `n` kernels through a device process gave.
struct Chain {
    answered: u64,
    done: Option<u64>,
}

/// A chain of `n` one-block kernels and a sync, through a device process
/// started with `ANSWER_FIRST_VAR` = `answer_first`.
fn chain(answer_first: &str, n: u64) -> Chain {
    std::env::set_var(ANSWER_FIRST_VAR, answer_first);
    let exe = Path::new(env!("CARGO_BIN_EXE_gpumuxd"));
    let backend = RemoteBackend::start(exe, "sim:h100").expect("the device process starts");
    let mut core = Core::new(Box::new(backend), None).expect("a core");
    let (tx, rx) = channel();
    core.connect(1, Peer { pid: 1, uid: 1000, gid: 1000 }, ClientLimits::default(), tx);
    let hello = Request::hello("answer-first", 0);
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
    for i in 0..n {
        core.inbound(1, Inbound::Request { id: 10 + i, request: Request::Launch(launch.clone()), fd: None });
    }
    assert_eq!(call(&mut core, &rx, 1_000, Request::SyncStream(StreamId(0))), Ok(Reply::Done), "{answer_first}");
    let errors: Vec<_> = rx.try_iter().filter(|f| matches!(f, ServerFrame::Reply { result: Err(_), .. })).collect();
    assert!(errors.is_empty(), "{answer_first}: a launch was refused: {errors:?}");
    assert_eq!(core.sms_held(), 0, "{answer_first}: no launch left holding SMs");
    assert_eq!(core.status().context_rebuilds, 0, "{answer_first}: the device process never failed");
    let done = core.status().clients.iter().find(|c| c.client == 1).map(|c| c.kernels_done);
    Chain { answered: core.ends_answered(), done }
}

#[test]
fn a_poll_answered_before_its_runs_go_on_still_feeds_every_kernel_ahead_and_the_stream_completes() {
    // Set before any device process starts, in a test binary of one test.
    std::env::set_var(ENDS_AHEAD_VAR, "1");
    std::env::set_var(AHEAD_RECORDS_VAR, RECORDS.to_string());
    let n = 40u64;
    for answer_first in ["1", "0"] {
        let c = chain(answer_first, n);
        assert_eq!(c.done, Some(n), "{answer_first}: every kernel counted done, once");
        // Only RECORDS kernels ran ahead at their binds; the others ran
        // when records came back, at a poll or after its answer. Had the
        // kernels left for after the answer not gone on before the next
        // message, their launches would have run the ordinary way.
        assert!(
            c.answered >= n / 2,
            "{answer_first}: {} of {n} launches answered from ends seen ahead ({RECORDS} records)",
            c.answered
        );
    }
}
