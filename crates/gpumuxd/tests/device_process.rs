//! The core on a device in a child process ([`RemoteBackend`]), driven
//! directly: after the device process is killed and restarted, the device's
//! own memory account matches the buffers the sessions hold again.

use gpumux_proto::{Notice, Reply, Request, ServerFrame, MAGIC, VERSION};
use gpumuxd::backend::remote::RemoteBackend;
use gpumuxd::config::ClientLimits;
use gpumuxd::conn::Inbound;
use gpumuxd::core::Core;
use gpumuxd::session::Peer;
use std::path::Path;
use std::sync::mpsc::{channel, Receiver};
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
    let hello = Request::Hello { magic: MAGIC, version: VERSION, name: "acct".into(), priority: 0, weight: 1.0 };
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
