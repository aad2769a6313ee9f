//! Co-located or on SMs of their own: for two kernels that co-run at one
//! priority, the device tries both placements and keeps the one under which
//! the pair gets more done.
//!
//! **Why.** Co-locating two kernels (each launch at its share of every SM,
//! [`super::placement`]) beats giving each SMs of its own for most pairs:
//! sgemm + histogram 1.344 against 1.023 STP, sgemm + sgemm 1.055 against
//! 1.004 (docs/history/benchmarks.md, run 74). Not for a memory-bound kernel beside a
//! compute-bound one: triad + FMA 1.403 co-located against 1.530 on SMs of
//! their own, the FMA's warps taking the triad's issue slots on shared SMs.
//! Nothing the device can read before they run says which kind a pair is (no
//! hardware counters without a profiler), so it measures: Slate's profile
//! of a kernel, taken on the pair itself.
//!
//! **How.** A pair is two kernels (loaded functions) whose launches run
//! beside each other at one priority, one of each. Once the pair has run
//! together for [`WARM`] (its first launches are timed, and compiles and
//! warm-up launches make them irregular), it is *probed*: its launches are
//! placed co-located, then on their own SMs, then co-located, then on their
//! own SMs again, each for [`PROBE`] and at least [`PROBE_LAUNCHES`]
//! launches of each kernel, and each kernel's blocks completed by launches
//! placed in the window's mode are counted. Alternating twice spreads what a
//! switch costs (launches in flight keep the old placement) over both
//! modes. Own SMs win if the pair's rates there, each over its rate
//! co-located, add up to more than 2 by [`MARGIN`] (each kernel's speed-up
//! of one mode over the other, weighted alike, the way STP weighs each
//! kernel's progress alike). The choice holds for [`HOLD`], then the pair
//! is probed again (a kernel's phases change, and so may its partner); a
//! probe that confirms the choice doubles its hold, up to [`HOLD_MAX`], so
//! a steady pair spends less and less time in the placement it does not
//! want (each probe runs half its windows in it).
//!
//! Launches in flight at a switch keep their placement; queued workers
//! placed the old way are restarted when the engine's launch finds them
//! elsewhere (the queue-ahead adoption rule). Both placements are correct
//! for any pair; only speed is at stake.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a new pair runs co-located before it is probed.
pub const WARM: Duration = Duration::from_millis(20);
/// How long each window of a probe lasts (four windows a probe).
pub const PROBE: Duration = Duration::from_millis(15);
/// How long a new choice holds before the pair is probed again.
pub const HOLD: Duration = Duration::from_secs(1);
/// The longest hold (a choice confirmed probe after probe).
pub const HOLD_MAX: Duration = Duration::from_secs(16);
/// Launches of each kernel a window must have seen end before it closes.
pub const PROBE_LAUNCHES: u32 = 8;
/// Windows a probe alternates through: co-located, own, co-located, own.
const WINDOWS: u8 = 4;
/// Own SMs must beat co-location by this much (the sum of the two rate
/// ratios over 2) to be chosen: co-location is the default.
pub const MARGIN: f64 = 0.05;

/// A kernel, as the device tells kernels apart: its loaded worker function.
pub(super) type KernelKey = usize;

/// How a launch beside a peer is placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    /// At its share of every SM its priority may use.
    CoLocated,
    /// On the SMs the engine gave it, at full occupancy.
    OwnSms,
}

/// What the chooser did so far ([`super::ClientDevice::corun_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoRunCounts {
    /// Probes completed (each: two windows of each placement).
    pub probes: u64,
    /// Of those, the ones that chose SMs of their own.
    pub chose_own_sms: u64,
}

/// Blocks completed by the launches of each kernel (and how many ended).
#[derive(Clone, Copy, Debug, Default)]
struct Window {
    since: Option<Instant>,
    blocks: [u64; 2],
    launches: [u32; 2],
}

/// Blocks and time summed over a probe's windows of one mode.
#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    blocks: [u64; 2],
    ns: u128,
}

#[derive(Clone, Copy, Debug)]
enum Phase {
    /// Co-located until `until` (a new pair).
    Warm { until: Instant },
    /// In window `step` (even: co-located, odd: own SMs); `last`: the
    /// choice before and how long it held.
    Probe { step: u8, window: Window, totals: [Totals; 2], last: Option<(Mode, Duration)> },
    /// `mode` chosen for `hold`, until `until`.
    Hold { mode: Mode, until: Instant, hold: Duration },
}

/// A pair's phase, and when a launch of it was last placed.
#[derive(Clone, Copy, Debug)]
struct Pair {
    phase: Phase,
    seen: Instant,
}

/// A pair not placed for this long is forgotten (the daemon keeps kernels
/// loaded, so pairs would otherwise pile up over a long life).
const FORGET: Duration = Duration::from_secs(60);

/// The chooser (module doc). Kernel 0 of a pair is the smaller key.
#[derive(Debug, Default)]
pub(super) struct CoRunChooser {
    pairs: HashMap<(KernelKey, KernelKey), Pair>,
    counts: CoRunCounts,
}

fn key(a: KernelKey, b: KernelKey) -> ((KernelKey, KernelKey), usize) {
    if a <= b {
        ((a, b), 0)
    } else {
        ((b, a), 1)
    }
}

fn step_mode(step: u8) -> Mode {
    if step.is_multiple_of(2) {
        Mode::CoLocated
    } else {
        Mode::OwnSms
    }
}

fn probe(last: Option<(Mode, Duration)>) -> Phase {
    Phase::Probe { step: 0, window: Window::default(), totals: [Totals::default(); 2], last }
}

impl CoRunChooser {
    /// The placement for a launch of `kernel` beside a launch of `peer` at `now`.
    pub(super) fn mode(&mut self, kernel: KernelKey, peer: KernelKey, now: Instant) -> Mode {
        let (k, _) = key(kernel, peer);
        if !self.pairs.contains_key(&k) {
            self.pairs.retain(|_, p| now.saturating_duration_since(p.seen) < FORGET);
        }
        let pair = self.pairs.entry(k).or_insert(Pair { phase: Phase::Warm { until: now + WARM }, seen: now });
        pair.seen = now;
        let phase = &mut pair.phase;
        match *phase {
            Phase::Warm { until } if now >= until => *phase = probe(None),
            Phase::Hold { mode, until, hold } if now >= until => *phase = probe(Some((mode, hold))),
            _ => {}
        }
        match *phase {
            Phase::Warm { .. } => Mode::CoLocated,
            Phase::Probe { step, .. } => step_mode(step),
            Phase::Hold { mode, .. } => mode,
        }
    }

    /// A launch of `kernel` placed in `mode` beside `peer` ended at `now`
    /// having completed `blocks` blocks.
    pub(super) fn ended(&mut self, kernel: KernelKey, peer: KernelKey, mode: Mode, blocks: u64, now: Instant) {
        let (k, i) = key(kernel, peer);
        let Some(phase) = self.pairs.get_mut(&k).map(|p| &mut p.phase) else { return };
        let Phase::Probe { step, mut window, mut totals, last } = *phase else { return };
        if mode != step_mode(step) {
            return;
        }
        // A window opens at the first end of a launch placed in its mode
        // (whose blocks, begun before, are not counted): from there, the
        // blocks of the launches that end are the kernel's throughput.
        let Some(since) = window.since else {
            window.since = Some(now);
            *phase = Phase::Probe { step, window, totals, last };
            return;
        };
        window.blocks[i] += blocks;
        window.launches[i] += 1;
        let elapsed = now.saturating_duration_since(since);
        if elapsed < PROBE || window.launches.iter().any(|&n| n < PROBE_LAUNCHES) {
            *phase = Phase::Probe { step, window, totals, last };
            return;
        }
        let t = &mut totals[(step % 2) as usize];
        t.ns += elapsed.as_nanos();
        t.blocks[0] += window.blocks[0];
        t.blocks[1] += window.blocks[1];
        if step + 1 < WINDOWS {
            *phase = Phase::Probe { step: step + 1, window: Window::default(), totals, last };
            return;
        }
        let rate = |t: &Totals| [t.blocks[0] as f64 / t.ns.max(1) as f64, t.blocks[1] as f64 / t.ns.max(1) as f64];
        let (co, own) = (rate(&totals[0]), rate(&totals[1]));
        let mode = choose(co, own);
        self.counts.probes += 1;
        if mode == Mode::OwnSms {
            self.counts.chose_own_sms += 1;
        }
        tracing::debug!(
            "co-run of kernels {:#x} and {:#x}: blocks/ns co-located {co:?}, own SMs {own:?}: {mode:?}",
            k.0,
            k.1
        );
        let hold = match last {
            Some((before, held)) if before == mode => (held * 2).min(HOLD_MAX),
            _ => HOLD,
        };
        *phase = Phase::Hold { mode, until: now + hold, hold };
    }

    /// What it did so far.
    pub(super) fn counts(&self) -> CoRunCounts {
        self.counts
    }

    /// Forgets pairs of kernels no longer loaded (a module's unload).
    pub(super) fn forget(&mut self, kernel: KernelKey) {
        self.pairs.retain(|&(a, b), _| a != kernel && b != kernel);
    }
}

/// Own SMs if the two kernels' rates there over their rates co-located add
/// up to more than 2 by [`MARGIN`]; co-located otherwise (and if either
/// kernel did nothing co-located, which says nothing of the pair).
fn choose(co: [f64; 2], own: [f64; 2]) -> Mode {
    if co.iter().any(|&r| r <= 0.0) {
        return Mode::CoLocated;
    }
    let score = own[0] / co[0] + own[1] / co[1];
    if score > 2.0 * (1.0 + MARGIN) {
        Mode::OwnSms
    } else {
        Mode::CoLocated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: KernelKey = 0x1000;
    const B: KernelKey = 0x2000;

    /// Runs a pair whose kernels complete `co` and `own` blocks per launch in
    /// each mode, one launch of each placed every 1 ms and ending 1 ms later,
    /// from `start` until the chooser holds a choice; returns it and when.
    fn probe_with(c: &mut CoRunChooser, co: [u64; 2], own: [u64; 2], start: Instant) -> (Mode, Instant) {
        let mut now = start;
        for _ in 0..1000 {
            let (mode_a, mode_b) = (c.mode(A, B, now), c.mode(B, A, now));
            if let Some(Phase::Hold { mode, .. }) = c.pairs.get(&(A, B)).map(|p| p.phase) {
                return (mode, now);
            }
            let blocks = |m, i: usize| if m == Mode::CoLocated { co[i] } else { own[i] };
            now += Duration::from_millis(1);
            c.ended(A, B, mode_a, blocks(mode_a, 0), now);
            c.ended(B, A, mode_b, blocks(mode_b, 1), now);
        }
        panic!("the probe never ended");
    }

    #[test]
    fn a_pair_faster_on_own_sms_gets_them_and_one_faster_co_located_keeps_sharing() {
        let t0 = Instant::now();
        // triad + FMA (run 74's figures): own SMs speed the slow one up by a quarter.
        let mut c = CoRunChooser::default();
        assert_eq!(probe_with(&mut c, [494, 906], [619, 911], t0).0, Mode::OwnSms);
        // sgemm + histogram: own SMs cost both.
        let mut c2 = CoRunChooser::default();
        assert_eq!(probe_with(&mut c2, [787, 559], [503, 521], t0).0, Mode::CoLocated);
        // Within the margin: sharing stays.
        let mut c3 = CoRunChooser::default();
        assert_eq!(probe_with(&mut c3, [1000, 1000], [1040, 1040], t0).0, Mode::CoLocated);
        assert_eq!((c.counts().probes, c.counts().chose_own_sms), (1, 1));
        assert_eq!((c2.counts().probes, c2.counts().chose_own_sms), (1, 0));
    }

    #[test]
    fn a_new_pair_warms_up_co_located_and_a_choice_holds_then_is_probed_again() {
        let t0 = Instant::now();
        let mut c = CoRunChooser::default();
        assert_eq!(c.mode(A, B, t0), Mode::CoLocated);
        assert!(matches!(c.pairs[&(A, B)].phase, Phase::Warm { .. }));
        // Ends while warming say nothing.
        c.ended(A, B, Mode::CoLocated, 1_000_000, t0 + WARM / 2);
        assert!(matches!(c.pairs[&(A, B)].phase, Phase::Warm { .. }));
        let (mode, at) = probe_with(&mut c, [494, 906], [619, 911], t0);
        assert_eq!(mode, Mode::OwnSms);
        assert!(at >= t0 + WARM + 4 * PROBE, "warmed, then four windows");
        assert_eq!(c.mode(A, B, at + HOLD / 2), Mode::OwnSms, "held");
        assert_eq!(c.mode(B, A, at + HOLD), Mode::CoLocated, "probed again, co-located first, no warm-up");
        // Confirmed: held twice as long.
        let (mode, at) = probe_with(&mut c, [494, 906], [619, 911], at + HOLD);
        assert_eq!(mode, Mode::OwnSms);
        assert_eq!(c.mode(A, B, at + HOLD * 3 / 2), Mode::OwnSms, "still held");
        assert_eq!(c.mode(A, B, at + HOLD * 2), Mode::CoLocated, "probed again after twice the hold");
        // The kernels changed: now sharing wins, and holds for the first hold.
        let (mode, at) = probe_with(&mut c, [787, 559], [503, 521], at + HOLD * 2);
        assert_eq!(mode, Mode::CoLocated);
        assert!(matches!(c.pairs[&(A, B)].phase, Phase::Hold { hold: HOLD, .. }));
        assert!(at > t0);
        assert_eq!(c.counts().probes, 3);
    }

    #[test]
    fn launches_placed_in_the_other_mode_and_short_windows_do_not_count() {
        let t0 = Instant::now();
        let mut c = CoRunChooser::default();
        assert_eq!(c.mode(A, B, t0), Mode::CoLocated);
        let t = t0 + WARM;
        assert_eq!(c.mode(A, B, t), Mode::CoLocated, "the first window: co-located");
        // A launch still placed on its own SMs says nothing of co-location.
        c.ended(A, B, Mode::OwnSms, 1_000_000, t);
        // The window opens at the first end; past its time but with too few launches it stays open.
        for n in 0..PROBE_LAUNCHES {
            let at = t + PROBE * 2 + Duration::from_micros(n as u64);
            c.ended(A, B, Mode::CoLocated, 10, at);
            c.ended(B, A, Mode::CoLocated, 10, at);
        }
        assert_eq!(c.mode(A, B, t + PROBE * 3), Mode::CoLocated);
        c.ended(A, B, Mode::CoLocated, 10, t + PROBE * 3);
        c.ended(B, A, Mode::CoLocated, 10, t + PROBE * 3);
        assert_eq!(c.mode(A, B, t + PROBE * 3), Mode::OwnSms, "enough launches: own SMs measured next");
        c.forget(A);
        assert_eq!(c.mode(A, B, t + PROBE * 3), Mode::CoLocated, "a forgotten pair starts over");
        assert!(matches!(c.pairs[&(A, B)].phase, Phase::Warm { .. }));
    }

    #[test]
    fn pairs_not_placed_for_a_minute_are_dropped_when_a_new_one_comes() {
        let t0 = Instant::now();
        let mut c = CoRunChooser::default();
        c.mode(A, B, t0);
        c.mode(A, 0x3000, t0 + FORGET / 2);
        assert_eq!(c.pairs.len(), 2);
        c.mode(B, 0x3000, t0 + FORGET + Duration::from_secs(1));
        assert!(!c.pairs.contains_key(&(A, B)), "the first pair was not placed for over a minute");
        assert_eq!(c.pairs.len(), 2);
    }
}
