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
