//! Issue 36's hostile and careless clients, one test per case it numbers,
//! on the simulated device. Each would have failed on 717b546, and says how.

mod common;

use common::{launch, Client, Daemon};
use gpumux_proto::{Reply, Request, StreamId};
use std::time::{Duration, Instant};

/// Case 4: a launch of 2^31 − 2 short blocks (the most a launch may have)
/// must not freeze the core. On 717b546 the simulated device chased the
/// clock through billions of block ends in one poll: no other client was
/// served (186 s measured) and SIGTERM took 19 s. The device now works in
/// bounded polls and runs behind the clock; the core serves between them.
#[test]
fn a_huge_grid_does_not_freeze_the_core_for_other_clients() {
    let mut d = Daemon::start(None);
    let (mut hog, _) = Client::hello(&d, "hog", 0);
    let k = hog.load("__global__ void k() {}")[0].kernel;
    let mut huge = launch(k, u32::MAX / 2 - 1, 1_000, vec![]);
    if let Request::Launch(l) = &mut huge {
        l.block = [1024, 1, 1];
    }
    hog.launch_ok(huge);
    // Let the core start on it.
    std::thread::sleep(Duration::from_millis(200));

    let (mut other, _) = Client::hello(&d, "other", 0);
    let t = Instant::now();
    assert!(matches!(other.call(Request::Status), Ok(Reply::Status(_))), "Status answered");
    let status = t.elapsed();
    let k2 = other.load("__global__ void j() {}")[0].kernel;
    let t = Instant::now();
    other.launch_ok(launch(k2, 1, 1_000, vec![]));
    other.ok(Request::SyncStream(StreamId(0)));
    let launch_sync = t.elapsed();
    eprintln!("beside a grid of 2^31 - 2 blocks: Status {status:?}, another client's launch + sync {launch_sync:?}");
    assert!(status < Duration::from_secs(2), "Status took {status:?} beside the huge grid");
    assert!(launch_sync < Duration::from_secs(10), "a 1-block launch + sync took {launch_sync:?} beside the huge grid");

    let t = Instant::now();
    let exit = d.stop();
    assert!(exit.success(), "the daemon stopped cleanly: {exit:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "SIGTERM took {:?} to stop the daemon", t.elapsed());
}
