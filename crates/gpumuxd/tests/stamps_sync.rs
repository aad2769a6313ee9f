//! Issue 35's stage stamps of a launch + sync, end to end: a daemon with a
//! device process on the simulated device, a client doing launch + sync back
//! to back and then 3 ms apart, every process stamping with
//! `GPUMUX_STAMPS=DIR` (the daemon and its device process inherit it). Each
//! sync is joined with its launch (`gpumux_stamps::syncs`): every stage of
//! both frames is there, client to device and back, in causal order, and the
//! report splits the trips by the pause before them. A file of its own: the
//! variable is read once per process.

mod common;

use common::Daemon;
use gpumux_client::{Arg, LaunchConfig, StreamId};
use gpumux_stamps::syncs::{self, TripStage, TRIP};
use gpumux_stamps::Stage;

const SOURCE: &str = "extern \"C\" __global__ void step(float* p, int n) { }";
/// Launch + sync back to back, then this many 3 ms apart.
const BACK: usize = 30;
const APART: usize = 10;

#[test]
fn a_launch_and_its_sync_are_stamped_from_the_client_to_the_device_and_back_in_order() {
    let dir = tempfile::Builder::new().prefix("gpumux-stamps-sync-").tempdir().expect("a temporary directory");
    // Before anything stamps (the variable is read once per process).
    std::env::set_var(gpumux_stamps::VAR, dir.path());
    let mut d = Daemon::start_with(None, &["--device-process"]);
    {
        let (client, k, buf) = common::library_client(&d, "stamps-sync", SOURCE, "step");
        let cfg = LaunchConfig::new([1, 1, 1], [32, 1, 1]).block_time_ns(1_000);
        for i in 0..BACK + APART {
            if i >= BACK {
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
            client.launch(&k, &cfg, &[Arg::buffer(&buf), Arg::bytes(0i32.to_le_bytes())]).expect("launches");
            client.sync(StreamId::DEFAULT).expect("syncs");
        }
        // Dropping the client writes its stamps.
    }
    assert!(d.stop().success(), "the daemon stops cleanly");
    let lines = gpumux_stamps::analysis::read_dir(dir.path()).expect("the stamps read back");
    let trips = syncs::trips(&lines);
    assert_eq!(trips.len(), BACK + APART, "one trip per sync the core took");
    let t = |trip: &syncs::Trip, s: TripStage| {
        trip.t(s).unwrap_or_else(|| panic!("trip {} lacks {}", trip.frame, s.name()))
    };
    use TripStage::{Launch as L, Sync as S};
    for trip in &trips {
        assert_eq!(trip.client, std::process::id(), "trip {} joined to another client", trip.frame);
        for st in TRIP {
            t(trip, st);
        }
        // Causal order along both frames' ways, and the reply after the end
        // (every stage is stamped before the hand-off that the next one follows).
        let chains: [&[TripStage]; 3] = [
            &[
                L(Stage::ClientCall),
                L(Stage::ClientWrite),
                L(Stage::ReaderRead),
                L(Stage::CoreRead),
                // Not `core_launch`: the core stamps it after its send, which
                // the device process may receive (`host_launch`) first.
                L(Stage::HostLaunch),
                L(Stage::LaunchStart),
                L(Stage::LaunchReturn),
                L(Stage::EndSeen),
                L(Stage::CoreEnd),
                S(Stage::CoreReply),
            ],
            &[
                L(Stage::ClientWrite),
                S(Stage::WaitCall),
                S(Stage::ReaderRead),
                S(Stage::CoreSync),
                S(Stage::CoreReply),
                S(Stage::ReplySeen),
                S(Stage::WaitReturn),
            ],
            &[S(Stage::WaitCall), S(Stage::WaitPoll), S(Stage::WaitReturn)],
        ];
        for chain in chains {
            for w in chain.windows(2) {
                assert!(
                    t(trip, w[0]) <= t(trip, w[1]),
                    "trip {}: {} after {}: {:?}",
                    trip.frame,
                    w[0].name(),
                    w[1].name(),
                    trip.at
                );
            }
        }
    }
    // In the order the core took them: the last APART came 3 ms after the trip before.
    let paused = |t: &syncs::Trip| t.away_ns.is_some_and(|a| a >= syncs::PAUSE_NS);
    assert!(trips[BACK..].iter().all(paused), "the trips 3 ms apart came after a pause");
    assert!(trips[0].away_ns.is_none(), "the first trip has none before it");
    let report = syncs::report(&lines);
    eprintln!("{report}");
    assert!(report.contains(&format!("after a pause of at least 1 ms: {APART} launch + sync")), "{report}");
}
