//! Issue 35's stage stamps end to end: daemons with a device process on the
//! simulated device, a client running short chains of dependent launches,
//! every process stamping with `GPUMUX_STAMPS=DIR` (the daemons and their
//! device processes inherit it from this test). The files are joined per
//! kernel (`gpumux_stamps::analysis`): every kernel has every stage, and its
//! stages are in causal order; with ends reported ahead
//! (`GPUMUX_SIM_ENDS_AHEAD=1`, the second daemon) as without. A file of its
//! own: the variables are set for this process, whose children inherit them.

mod common;

use common::Daemon;
use gpumux_client::{Arg, LaunchConfig, StreamId};
use gpumux_stamps::analysis;
use gpumux_stamps::Stage;
use gpumuxd::backend::sim::ENDS_AHEAD_VAR;

const SOURCE: &str = "extern \"C\" __global__ void step(float* p, int n) { }";
/// Kernels of a chain.
const N: u64 = 60;

/// Two chains of [`N`] one-block launches on a fresh daemon with a device
/// process, 20 ms apart (two runs); the daemon stopped cleanly after.
fn two_chains() {
    let mut d = Daemon::start_with(None, &["--device-process"]);
    {
        let (client, k, buf) = common::library_client(&d, "stamps", SOURCE, "step");
        for rep in 0..2 {
            for i in 0..N {
                let args = [Arg::buffer(&buf), Arg::bytes((i as i32).to_le_bytes())];
                let cfg = LaunchConfig::new([1, 1, 1], [16, 1, 1]).block_time_ns(5_000);
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
}

#[test]
fn a_chains_kernels_are_stamped_at_every_stage_in_every_process_and_joined_in_order() {
    let dir = tempfile::Builder::new().prefix("gpumux-stamps-").tempdir().expect("a temporary directory");
    // Before anything stamps (the variable is read once per process).
    std::env::set_var(gpumux_stamps::VAR, dir.path());
    std::env::remove_var(ENDS_AHEAD_VAR);
    two_chains();
    let plain = analysis::read_dir(dir.path()).expect("the stamps read back");
    // The second daemon's device reports the chain's kernels ended ahead.
    std::env::set_var(ENDS_AHEAD_VAR, "1");
    two_chains();
    let lines = analysis::read_dir(dir.path()).expect("the stamps read back");
    let files = std::fs::read_dir(dir.path()).expect("the folder").count();
    assert_eq!(files, 5, "a file from the client, and from each daemon and its device process");
    let kernels = analysis::join(&lines);
    assert_eq!(kernels.len() as u64, 4 * N, "every launch made an operation stamped as read");
    for k in &kernels {
        assert!(k.missing().is_empty(), "kernel {} lacks {:?}", k.op, k.missing());
        assert_eq!(k.out_of_order(), None, "kernel {}'s stages out of causal order: {k:?}", k.op);
        assert!(k.client == std::process::id(), "kernel {} joined to client {}", k.op, k.client);
    }
    let ahead = lines.iter().filter(|l| l.stage == Stage::EndSeenAhead).count() as u64;
    assert!(plain.iter().all(|l| l.stage != Stage::EndSeenAhead), "no end ahead without the script");
    // Every kernel bound after another of its stream: all but the stream's first
    // (a sync orders nothing on the GPU, so the second chain follows the first).
    assert_eq!(ahead, 2 * N - 1, "with the script, every kernel after the stream's first ended ahead");
    // Four runs, the first left out as a warm-up.
    let runs = analysis::runs(&kernels, 10);
    assert_eq!(runs.len(), 3);
    assert!(runs.iter().all(|r| r.len() as u64 == N));
    eprintln!("without ends ahead:\n{}", analysis::report(&plain, 10));
    eprintln!("with ends ahead (both daemons' runs):\n{}", analysis::report(&lines, 10));
    // The device processes answered the core's polls, one for one.
    let polls = lines.iter().filter(|l| l.stage == Stage::ExchangeStart).count();
    let answered = lines.iter().filter(|l| l.stage == Stage::HostAnswer).count();
    assert!(polls > 0 && answered == polls, "{polls} polls sent, {answered} answered");
}
