//! A launch's SMs released in one call (`Engine::handle_released`, what
//! gpumuxd's core does with a run of `SmReleased` events) leave every policy
//! deciding exactly as the events one by one did (issue 35: one event per SM
//! was most of the engine's work on a launch's end): the same seeded
//! workloads, with preemption, departures and launches of every size, give
//! the same commands and completions at the same times.

mod common;

use common::{seeded_run_merged, Bench};
use gpumux_engine::policies;

fn same_with_and_without(policy: &str, freeing_at_once: bool) -> u64 {
    let mut merged_any = 0;
    for seed in 1..=8u64 {
        let bench = |coalesce: bool| {
            let mut b = if freeing_at_once { Bench::freeing_at_once(policy) } else { Bench::new(policy) };
            b.coalesce = coalesce;
            b
        };
        let (want_cmds, want_done, _) = seeded_run_merged(bench(false), seed);
        let (got_cmds, got_done, merged) = seeded_run_merged(bench(true), seed);
        assert!(want_cmds.len() > 20, "{policy}, seed {seed}: a workload that does something");
        assert_eq!(got_cmds, want_cmds, "{policy}, seed {seed}: the commands differ");
        assert_eq!(got_done, want_done, "{policy}, seed {seed}: the completions differ");
        merged_any += merged;
    }
    merged_any
}

#[test]
fn every_policy_decides_the_same_with_a_launchs_releases_merged() {
    for (name, _) in policies::CATALOGUE {
        let merged = same_with_and_without(name, false);
        assert!(merged > 0, "{name}: no release merged, so nothing was compared");
    }
}

#[test]
fn the_same_with_retreats_freeing_their_sms_in_the_command() {
    for name in ["ppq-even-drain", "ppq-shared-drain", "dss-drain"] {
        same_with_and_without(name, true);
    }
}
