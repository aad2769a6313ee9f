//! Peers' short kernels run natively (issue 35): a kernel known to be short
//! whose priority has other clients' kernels (peers) runs as the client's
//! kernel itself, and its stream's next ones queue natively behind it, as a
//! client alone at its priority does ([`super::ahead`], "Deep").
//!
//! **Why.** Alone at its priority, a client's kernels run natively and
//! queue ahead deep: the device process reports their ends before the
//! engine launches them, and the daemon answers those launch commands at
//! once (docs/daemon.md, "A stream of native kernels skips hops 4-6 per
//! kernel"). With peers, every kernel ran as workers on the engine's SMs,
//! with one kernel queued ahead per stream: every launch then waited for
//! the engine's command and the device process's work on it (adopting the
//! queued workers, queueing the next: 5-6 µs on the H200) and a round trip
//! per kernel; 8 clients of empty kernels made 77-91k launches/s against
//! 123-131k for one.
//!
//! **What the engine believes.** Nothing changes for it: its policies still
//! give each peer's launch its SMs, and those are the launch's account, not
//! where a native grid runs (it takes free slots wherever they are, as a
//! lone client's native kernel does). For a short kernel that costs the
//! peers nothing they would gain from the partition: it holds its slots at
//! most [`SHORT_LAUNCH_NS`], and peers of one priority are interleaved by
//! the hardware anyway. Long kernels are untouched: a kernel not known to be
//! short (untimed, or its waves longer than [`SHORT_LAUNCH_NS`]) runs as
//! workers on the engine's SMs, co-run and co-located as before.
//!
//! **A long kernel of a peer that comes** finds the short kernels queued on
//! the other streams: each stream holds at most [`PEER_HOLD_NS`] of expected
//! GPU time queued natively and not seen ended (against
//! [`super::ahead::DEEP_HOLD_NS`] alone), so its workers wait for free slots
//! about one short kernel per stream, not a millisecond's run. If they find
//! none on their SMs at all (the native grids filled them as the worker grid
//! went through), the launch starts again, as after workers queued ahead
//! for another stream (`AheadCounts::unplaced`).
//!
//! **Fairness** between the peers: the same bound on every stream, and the
//! hardware interleaves streams of one priority; the engine's shares are
//! kept for the kernels that are long enough for them to matter.
//!
//! **Retreats.** A native kernel cannot retreat, and a short one needs not:
//! it ends within [`SHORT_LAUNCH_NS`], about one chunk of a worker's
//! preemption latency (`launch_plan::PREEMPT_CHUNK_NS`). Another priority
//! keeps what it had: beside another priority's workers the rule does not
//! apply (the engine's SMs keep the two apart there, as for a lone client's
//! short kernel), and a run of a lower priority stops queueing while a higher
//! one is active ([`super::higher`]).
//!
//! **Measured** on one H200 (2026-11-29, 86914c2, `scripts/device-session.sh
//! BIN overhead` alternating): 8 clients of empty kernels made 75-108k
//! launches/s over six runs against 69-73k in two with peers' kernels as
//! workers, one client no different; the switch that kept them workers is
//! in git (f0dceeb). [`PEER_HOLD_VAR`] sets the bound per stream.

use super::ahead::DEEP_HOLD_NS;
use crate::launch_plan::SHORT_LAUNCH_NS;

/// Set to a time in µs (1 to 1,000) to let a stream with peers hold that
/// much queued natively instead of [`PEER_HOLD_NS`]: how deep each peer's
/// stream runs ahead of the engine against how long a long kernel of a peer
/// may wait behind them. For measurements.
pub const PEER_HOLD_VAR: &str = "GPUMUX_PEER_HOLD_US";

/// Expected GPU time of the kernels queued natively ahead on one stream,
/// behind the launch running, not yet seen ended, at most (ns), while its
/// priority has peers: two short kernels (module doc). A twenty-fifth of
/// what a stream alone may hold. An empty kernel's expected time is its
/// timed block time, which counts the worker grid's launch (several µs on
/// the H200), so a stream of them holds a few queued.
pub const PEER_HOLD_NS: f64 = 2.0 * SHORT_LAUNCH_NS;
// Room for two short kernels behind the one running, and no more than a
// twentieth of what a lone stream may hold, whatever the constants become.
const _: () = assert!(PEER_HOLD_NS >= 2.0 * SHORT_LAUNCH_NS && PEER_HOLD_NS * 20.0 <= DEEP_HOLD_NS);

/// The rule's setting ([`ClientDevice`](super::ClientDevice)'s, from the
/// environment).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct PeerRule {
    /// What a stream with peers holds queued natively ([`PEER_HOLD_NS`], [`PEER_HOLD_VAR`]).
    pub hold_ns: f64,
}

impl PeerRule {
    /// From [`PEER_HOLD_VAR`].
    pub fn from_env() -> PeerRule {
        PeerRule::parse(std::env::var(PEER_HOLD_VAR).ok().as_deref())
    }

    /// From the variable's value: unset, [`PEER_HOLD_NS`]; a value it
    /// cannot read, the same, with a warning.
    pub fn parse(hold_us: Option<&str>) -> PeerRule {
        let hold_ns = match hold_us.map(|v| (v, v.trim().parse::<u32>())) {
            None => PEER_HOLD_NS,
            Some((_, Ok(us))) if (1..=1_000).contains(&us) => us as f64 * 1e3,
            Some((v, _)) => {
                tracing::warn!("{PEER_HOLD_VAR}={v:?} is not a time from 1 to 1000 µs: {PEER_HOLD_NS} ns held");
                PEER_HOLD_NS
            }
        };
        PeerRule { hold_ns }
    }

    /// Expected GPU time one stream may hold queued natively ahead and not
    /// seen ended (ns): [`DEEP_HOLD_NS`] alone at its priority, `hold_ns`
    /// beside peers.
    pub fn hold_ns(&self, alone: bool) -> f64 {
        if alone {
            DEEP_HOLD_NS
        } else {
            self.hold_ns
        }
    }
}

/// Kernels run natively by this rule (logged when the device closes): a
/// GPU run says whether the rule applied at all.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PeerCounts {
    /// Started so by a launch command.
    pub started: u64,
    /// Queued so ahead, behind a native kernel of their stream.
    pub queued: u64,
}

impl PeerCounts {
    /// In words, if the rule applied.
    pub fn summary(&self) -> Option<String> {
        (self.started + self.queued > 0).then(|| {
            format!(
                "peers' short kernels run natively: {} started by launch commands, {} queued ahead",
                self.started, self.queued
            )
        })
    }
}

/// Whether a kernel runs natively by this rule: hardware priority is on
/// (`ClientDevice::set_hw_priority`), its priority has peers (alone,
/// `hw_native` decides), launches of other priorities leave room for a
/// native grid (`beside_others`: none runs as workers, or some run
/// natively), and the kernel is known short.
pub(super) fn native_beside_peers(hw_priority: bool, alone: bool, beside_others: bool, short: bool) -> bool {
    hw_priority && !alone && beside_others && short
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hold_reads_a_time_and_defaults_to_the_bound() {
        let hold = |v| PeerRule::parse(v).hold_ns;
        assert_eq!(hold(None), PEER_HOLD_NS);
        assert_eq!(hold(Some("200")), 200_000.0);
        assert_eq!(hold(Some(" 1 ")), 1_000.0);
        for bad in ["0", "1001", "-5", "ten", ""] {
            assert_eq!(hold(Some(bad)), PEER_HOLD_NS, "{bad:?}");
        }
    }

    #[test]
    fn only_a_short_kernel_with_peers_and_no_other_prioritys_workers_beside_runs_natively() {
        assert!(native_beside_peers(true, false, true, true));
        // No hardware priority: never.
        assert!(!native_beside_peers(false, false, true, true));
        // Alone at its priority: not this rule's (`hw_native` decides).
        assert!(!native_beside_peers(true, true, true, true));
        // Another priority's workers beside: the engine's SMs keep them apart.
        assert!(!native_beside_peers(true, false, false, true));
        // Not known short (long, or untimed): workers, co-run as before.
        assert!(!native_beside_peers(true, false, true, false));
    }

    #[test]
    fn the_counts_say_nothing_until_the_rule_applied() {
        assert_eq!(PeerCounts::default().summary(), None);
        let words = PeerCounts { started: 3, queued: 40 }.summary().unwrap_or_default();
        assert!(words.contains("3 started") && words.contains("40 queued"), "{words}");
    }

    #[test]
    fn a_stream_with_peers_holds_far_less_queued_than_one_alone() {
        let rule = PeerRule::parse(None);
        assert_eq!(rule.hold_ns(true), DEEP_HOLD_NS);
        assert_eq!(rule.hold_ns(false), PEER_HOLD_NS);
        assert_eq!(PeerRule::parse(Some("100")).hold_ns(false), 100_000.0);
    }
}
