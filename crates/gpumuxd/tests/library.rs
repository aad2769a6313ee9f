//! The client library against a real daemon (sim): the rules the library
//! adds on top of the protocol.

mod common;

use common::Daemon;
use gpumux_client::{Arg, Client, ConnectOptions, ErrorKind, LaunchConfig};

const SOURCE: &str = "extern \"C\" __global__ void k(float* p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] += 1.0f; }";

#[test]
fn a_refused_launch_reports_its_error_once_at_the_next_sync() {
    let d = Daemon::start(None);
    let client =
        Client::connect(ConnectOptions { socket: Some(d.socket.clone()), ..ConnectOptions::named("t") }).unwrap();
    let module = client.load_module("m", SOURCE, &[]).unwrap();
    let k = module.kernel("k").unwrap();
    let buf = client.alloc(4096).unwrap();
    let args = [Arg::buffer(&buf), Arg::bytes(1024i32.to_le_bytes())];
    let stream = client.create_stream().unwrap();
    // Launches do not wait for the daemon: a block of 2048 threads is
    // refused by the daemon, and the launch call itself succeeds.
    client.launch(&k, &LaunchConfig::new([1, 1, 1], [2048, 1, 1]).stream(stream), &args).unwrap();
    client.launch(&k, &LaunchConfig::new([4, 1, 1], [256, 1, 1]).stream(stream), &args).unwrap();
    let e = client.sync(stream).unwrap_err();
    assert_eq!(e.kind(), Some(&ErrorKind::Invalid), "{e}");
    assert!(e.to_string().contains("2048 threads"), "the refused launch's own message: {e}");
    // Reported once: the stream's good launch ran, later calls work.
    client.sync(stream).unwrap();
    client.launch(&k, &LaunchConfig::new([4, 1, 1], [256, 1, 1]).stream(stream), &args).unwrap();
    client.sync(stream).unwrap();
    // Waiting on an event after a refused launch reports it, once.
    client.launch(&k, &LaunchConfig::new([1, 1, 1], [2048, 1, 1]).stream(stream), &args).unwrap();
    let ev = client.record_event(stream).unwrap();
    client.wait_event(ev).unwrap_err();
    client.wait_event(ev).unwrap();
    client.close().unwrap();
}

fn pattern(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32).map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

/// A copy larger than the shared region grows it once (to the copy's size
/// rounded up to a power of two, at most `shm_max_bytes` and the daemon's
/// `shm` limit) and goes through four slots, its bytes moved on four
/// threads; the data round-trips bitwise both ways, at an odd offset and
/// length. A client whose `shm_max_bytes` is at most its region never grows it.
#[test]
fn a_large_copy_grows_the_region_and_round_trips_through_four_slots_on_four_threads() {
    let uid = common::own_uid();
    let d = Daemon::start(Some(&format!("[[allow]]\nuid = {uid}\nshm = \"16 MiB\"\n")));
    let options = ConnectOptions { socket: Some(d.socket.clone()), copy_threads: 4, ..ConnectOptions::named("t") };
    let client = Client::connect(options).unwrap();
    assert_eq!(client.shm_bytes(), 8 << 20, "the default region");
    assert_eq!(client.copy_threads(), 4);
    let n = (40 << 20) + 12_345;
    let data = pattern(n, 7);
    let buf = client.alloc(n as u64 + 3).unwrap();
    let stream = client.create_stream().unwrap();
    client.copy_to_device(&buf, 3, &data, stream).unwrap();
    assert_eq!(client.shm_bytes(), 16 << 20, "grown to the daemon's limit (the default cap is 32 MiB)");
    let mut back = vec![0u8; n];
    client.copy_to_host(&buf, 3, &mut back, stream).unwrap();
    assert!(back == data, "40 MiB round-trip through 4 MiB slots");
    // A copy within a slot, and one of a few slots, still work after the growth.
    let mut small = vec![0u8; 1000];
    client.copy_to_host(&buf, 3 + 5000, &mut small, stream).unwrap();
    assert_eq!(small, data[5000..6000]);
    let mid = pattern(9 << 20, 9);
    client.copy_to_device(&buf, 0, &mid, gpumux_client::StreamId::DEFAULT).unwrap();
    let mut mid_back = vec![0u8; mid.len()];
    client.copy_to_host(&buf, 0, &mut mid_back, gpumux_client::StreamId::DEFAULT).unwrap();
    assert!(mid_back == mid);
    assert_eq!(client.shm_bytes(), 16 << 20, "grown once");
    client.close().unwrap();

    // A client that keeps its region: shm_max_bytes at most shm_bytes.
    let options = ConnectOptions {
        socket: Some(d.socket.clone()),
        shm_max_bytes: 0,
        copy_threads: 1,
        ..ConnectOptions::named("fixed")
    };
    let client = Client::connect(options).unwrap();
    let buf = client.alloc(n as u64).unwrap();
    client.copy_to_device(&buf, 0, &data, gpumux_client::StreamId::DEFAULT).unwrap();
    let mut back = vec![0u8; n];
    client.copy_to_host(&buf, 0, &mut back, gpumux_client::StreamId::DEFAULT).unwrap();
    assert!(back == data);
    assert_eq!(client.shm_bytes(), 8 << 20, "never grown");
    client.close().unwrap();
}
