//! Issue 35's stage stamps end to end: a daemon with a device process on the
//! simulated device, a client running a short chain of dependent launches,
//! every process stamping with `GPUMUX_STAMPS=DIR` (the daemon and its device
//! process inherit it from this test). The files are joined per kernel
//! (`gpumux_stamps::analysis`): every kernel has every stage, and its stages
//! are in causal order. A file of its own: the variable is set for this
//! process, whose children inherit it.

mod common;

use common::Daemon;
use gpumux_client::{Arg, Client, ConnectOptions, LaunchConfig, StreamId};
use gpumux_stamps::analysis;
use gpumux_stamps::Stage;

const SOURCE: &str = "extern \"C\" __global__ void step(float* p, int n) { }";

#[test]
fn a_chains_kernels_are_stamped_at_every_stage_in_every_process_and_joined_in_order() {
    let dir = tempfile::Builder::new().prefix("gpumux-stamps-").tempdir().expect("a temporary directory");
    // Before anything stamps (the variable is read once per process).
    std::env::set_var(gpumux_stamps::VAR, dir.path());
    let mut d = Daemon::start_with(None, &["--device-process"]);
    let n = 60u64;
    {
        let client =
            Client::connect(ConnectOptions { socket: Some(d.socket.clone()), ..ConnectOptions::named("stamps") })
                .expect("connects");
        let module = client.load_module("m", SOURCE, &[]).expect("loads");
        let k = module.kernel("step").expect("the kernel");
        let buf = client.alloc(4096).expect("allocates");
        for rep in 0..2 {
            for i in 0..n {
                let args = [Arg::buffer(&buf), Arg::bytes((i as i32).to_le_bytes())];
                let cfg = LaunchConfig::new([1 + (i as u32 % 4), 1, 1], [16, 1, 1]);
                client.launch(&k, &cfg, &args).expect("launches");
            }
            client.sync(StreamId::DEFAULT).expect("syncs");
            if rep == 0 {
                // A pause: the second chain is a run of its own.
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        // Dropping the client writes its stamps.
    }
    assert!(d.stop().success(), "the daemon stops cleanly");
    let lines = analysis::read_dir(dir.path()).expect("the stamps read back");
    let files = std::fs::read_dir(dir.path()).expect("the folder").count();
    assert!(files >= 3, "a file from the client, the daemon and its device process: {files}");
    let kernels = analysis::join(&lines);
    assert_eq!(kernels.len() as u64, 2 * n, "every launch made an operation stamped as read");
    for k in &kernels {
        assert!(k.missing().is_empty(), "kernel {} lacks {:?}", k.op, k.missing());
        assert_eq!(k.out_of_order(), None, "kernel {}'s stages out of causal order: {k:?}", k.op);
        assert!(k.client == std::process::id(), "kernel {} joined to client {}", k.op, k.client);
    }
    // One chain a run: the first is taken as a warm-up and left out.
    let runs = analysis::runs(&kernels, 10);
    assert_eq!(runs.len(), 1, "two runs, the first left out");
    assert_eq!(runs[0].len() as u64, n);
    let report = analysis::report(&lines, 10);
    eprintln!("{report}");
    assert!(report.contains(&format!("{n} in the runs, {n} with every stage")), "{report}");
    // The device process answered the core's polls, one for one.
    let polls = lines.iter().filter(|l| l.stage == Stage::ExchangeStart).count();
    let answered = lines.iter().filter(|l| l.stage == Stage::HostAnswer).count();
    assert!(polls > 0 && answered == polls, "{polls} polls sent, {answered} answered");
}
