//! How a kernel launch runs on the real GPU: as the untransformed (native)
//! kernel, or as preemptible workers claiming `chunk` blocks at a time. The
//! choice is a pure function of what the device knows about the launch
//! (blocks, resident slots, SMs it may use) and of the kernel's block time,
//! measured on its first launch and cached with its module ([`ProfileCache`]).
//!
//! The rule (issue 10; the figures behind it are in docs/cuda.md):
//!
//! * **Unmeasured kernel: workers, chunk 1.** Nothing is known about its block
//!   time, so the first launch must be preemptible at block granularity; it is
//!   timed and gives the block time. The first [`TIMED_LAUNCHES`] launches of a
//!   kernel shape are timed and the least block time kept: a kernel's first
//!   launch in a fresh module also loads its code (CUDA loads lazily).
//! * **Short or single-wave launch: native.** A launch whose whole expected
//!   duration (block time × waves) is at most [`SHORT_LAUNCH_NS`] can never hold
//!   the GPU longer than a retreat would take, so it needs no preemption and pays
//!   none of the workers' fixed cost (a full grid of workers, most of them leaving
//!   at once). A launch whose blocks all fit in one wave gains nothing from
//!   workers either: every block is claimed as the workers start, so a retreat
//!   could only wait for the same blocks a native grid runs (H100: nbody's 512
//!   blocks of 11 ms cost +5% as workers; a wavefront's 511 launches of 1-256
//!   blocks +60%). Both only on the whole GPU and from block 0: a native grid
//!   cannot be kept to an SM set or started half way.
//! * **Otherwise: workers, chunk = ⌈[`CLAIM_NS`] / block time⌉**, at most
//!   ⌊[`PREEMPT_CHUNK_NS`] / block time⌋ (at least 1) and [`MAX_CHUNK`]. The
//!   first bound keeps the one same-address atomic per claim rare enough not to
//!   serialise at L2 (chunk 1 on 0.7 µs bfs blocks cost +65%); the second keeps a
//!   retreat's wait (one chunk of blocks) inside the preemption-latency target.
//!   Kernels whose blocks take 20 µs or more always get chunk 1.
//!
//! The workers also shrink their claims near the end of a launch (guided
//! self-scheduling, `gmx_claim` in `cuda/prelude.cuh`), so a large chunk does
//! not leave one worker with a long tail while the others are done.

use std::collections::HashMap;
use std::sync::Mutex;

/// A launch expected to take at most this long runs natively (ns).
pub const SHORT_LAUNCH_NS: f64 = 20_000.0;
/// The longest a launch may be expected to hold the GPU and still run
/// natively when its client is alone at its priority (ns). A native grid
/// cannot be asked to leave: a peer of the same priority that comes
/// meanwhile waits for all of it. A huge grid of an empty kernel (2^31
/// blocks, ~10 s) held a well-behaved peer's launch for 5.4 s (issue 36's
/// soak, H200): beyond this bound a launch runs as workers, which leave
/// within a chunk.
pub const NATIVE_HOLD_MAX_NS: f64 = 10_000_000.0;
/// A wave of an untimed kernel is taken to last at least this long (ns)
/// when its launch's length is bounded for [`NATIVE_HOLD_MAX_NS`]: only
/// grids of more than 10,000 waves are then too long to run natively
/// before the kernel has been timed.
pub const WAVE_FLOOR_NS: f64 = 1_000.0;
/// Each claim should cover at least this much block time (ns). H100, 1,056
/// workers: bfs (1.07 µs blocks) cost +5.0% at chunk 8 and −0.7% at 16; chunk 1
/// costs tiny-block kernels 20-66% (docs/benchmarks.md).
pub const CLAIM_NS: f64 = 12_000.0;
/// One chunk must not take longer than this (ns): a retreat waits for it.
pub const PREEMPT_CHUNK_NS: f64 = 20_000.0;
/// Largest chunk the rule picks.
pub const MAX_CHUNK: u32 = 64;
/// Launches of one kernel shape that are timed; the least block time is kept.
/// One is not enough: the first launch of a kernel also loads its code, and
/// through gpumuxd on an H100 (run 40) blocks that spin for 20 µs were timed
/// at 44-81 µs on it, an empty kernel's one block at 13-46 µs.
pub const TIMED_LAUNCHES: u32 = 2;

/// Whether a grid of `blocks` on `slots` resident slots may take longer than
/// [`NATIVE_HOLD_MAX_NS`]: its waves times the block time (`block_ns`, once
/// timed) or [`WAVE_FLOOR_NS`] (untimed).
pub fn holds_too_long(blocks: u64, slots: u64, block_ns: Option<f64>) -> bool {
    let waves = blocks.div_ceil(slots.max(1)) as f64;
    waves * block_ns.unwrap_or(WAVE_FLOOR_NS) > NATIVE_HOLD_MAX_NS
}

/// Whether a grid of `blocks` on `slots` resident slots is known to be
/// short: its shape was timed (`block_ns`) and its waves take at most
/// [`SHORT_LAUNCH_NS`]. Untimed, nothing is known: not short. Kernels this
/// short of peers of one priority may run natively (the CUDA client
/// device's `peers` rule), which a one-wave grid of long blocks may not: it
/// would hold its slots on every SM for a whole block time.
pub fn known_short(blocks: u64, slots: u64, block_ns: Option<f64>) -> bool {
    let waves = blocks.div_ceil(slots.max(1)).max(1) as f64;
    block_ns.is_some_and(|bt| bt.is_finite() && bt >= 0.0 && waves * bt <= SHORT_LAUNCH_NS)
}

/// Blocks per claim: fixed, or chosen per launch by [`plan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Chunk {
    /// The rule above (the default everywhere but in benchmarks and tests).
    #[default]
    Auto,
    /// Always workers, with this many blocks per claim (at least 1).
    Fixed(u32),
}

impl std::str::FromStr for Chunk {
    type Err = String;
    fn from_str(s: &str) -> Result<Chunk, String> {
        if s == "auto" {
            return Ok(Chunk::Auto);
        }
        match s.parse::<u32>() {
            Ok(n) if n >= 1 => Ok(Chunk::Fixed(n)),
            _ => Err(format!("bad chunk `{s}`: expected `auto` or a number of blocks >= 1")),
        }
    }
}

impl serde::Serialize for Chunk {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl std::fmt::Display for Chunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Chunk::Auto => f.write_str("auto"),
            Chunk::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// How one launch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// The untransformed kernel, whole grid, not preemptible.
    Native,
    /// Preemptible workers claiming `chunk` blocks at a time; `measure`: time
    /// this launch to learn the kernel's block time.
    Workers {
        /// Blocks per claim.
        chunk: u32,
        /// Time this launch to learn the kernel's block time.
        measure: bool,
    },
}

/// What [`plan`] needs to know about one launch.
#[derive(Clone, Copy, Debug)]
pub struct LaunchFacts {
    /// Blocks this launch runs.
    pub blocks: u64,
    /// Blocks resident at once on the SMs it may use (occupancy × SMs).
    pub slots: u64,
    /// It may use every SM and starts at block 0 of its grid.
    pub whole_grid_on_whole_gpu: bool,
    /// A native build of the kernel is at hand.
    pub native_available: bool,
}

/// Chooses how a launch runs (module doc). `block_ns`: the kernel's measured
/// time per block at full occupancy, if known.
pub fn plan(chunk: Chunk, facts: LaunchFacts, block_ns: Option<f64>) -> Plan {
    let bt = match (chunk, block_ns) {
        (Chunk::Fixed(n), _) => return Plan::Workers { chunk: n.max(1), measure: false },
        (Chunk::Auto, None) => return Plan::Workers { chunk: 1, measure: true },
        (Chunk::Auto, Some(bt)) if bt.is_finite() && bt > 0.0 => bt,
        // A measurement of zero or garbage: be safe, preemptible at block granularity.
        (Chunk::Auto, Some(_)) => return Plan::Workers { chunk: 1, measure: false },
    };
    let waves = facts.blocks.div_ceil(facts.slots.max(1)).max(1);
    if facts.native_available && facts.whole_grid_on_whole_gpu && (waves == 1 || bt * waves as f64 <= SHORT_LAUNCH_NS) {
        return Plan::Native;
    }
    Plan::Workers { chunk: auto_chunk(bt), measure: false }
}

/// The chunk for a block time (ns), as in the module doc.
pub fn auto_chunk(block_ns: f64) -> u32 {
    let latency_bound = (PREEMPT_CHUNK_NS / block_ns).floor().max(1.0);
    let claim_bound = (CLAIM_NS / block_ns).ceil().max(1.0);
    claim_bound.min(latency_bound).min(MAX_CHUNK as f64) as u32
}

/// Block time of a timed launch: `elapsed_ns` for `blocks` blocks with `slots`
/// resident at once. Waves are fractional here: a launch of half a wave took
/// one block time, not half of one.
pub fn block_ns_of(elapsed_ns: f64, blocks: u64, slots: u64) -> Option<f64> {
    if blocks == 0 || !(elapsed_ns.is_finite() && elapsed_ns > 0.0) {
        return None;
    }
    let waves = (blocks as f64 / slots.max(1) as f64).max(1.0);
    Some(elapsed_ns / waves)
}

/// Which launches of a kernel share a measured block time: its block shape and
/// dynamic shared memory (the grid only sets how many blocks there are).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProfileKey {
    /// Threads per block, x y z.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes.
    pub smem: u32,
}

/// What is known of one kernel shape's block time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    /// The least block time measured so far, ns.
    pub block_ns: f64,
    /// Launches timed so far (at most [`TIMED_LAUNCHES`]).
    pub launches: u32,
}

impl Timing {
    /// Whether launches of the shape are still timed.
    pub fn timing(&self) -> bool {
        self.launches < TIMED_LAUNCHES
    }
}

/// Measured block times of one module's kernels, kept as long as the module.
#[derive(Debug, Default)]
pub struct ProfileCache {
    /// kernel name → shape → timing (looked up by `&str`: every launch start
    /// asks, so no key is built for a lookup).
    times: Mutex<HashMap<String, HashMap<ProfileKey, Timing>>>,
}

impl ProfileCache {
    /// What is known of `kernel` at shape `key`, if it was timed.
    pub fn get(&self, kernel: &str, key: ProfileKey) -> Option<Timing> {
        self.times.lock().ok()?.get(kernel)?.get(&key).copied()
    }
    /// Adds a timed launch's block time; returns the timing when this one
    /// completed it (the [`TIMED_LAUNCHES`]th), for a log line.
    pub fn record(&self, kernel: &str, key: ProfileKey, block_ns: f64) -> Option<Timing> {
        let Ok(mut t) = self.times.lock() else { return None };
        let timing = t.entry(kernel.to_string()).or_default().entry(key).or_insert(Timing { block_ns, launches: 0 });
        if !timing.timing() {
            return None;
        }
        timing.block_ns = timing.block_ns.min(block_ns);
        timing.launches += 1;
        (!timing.timing()).then_some(*timing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(blocks: u64, slots: u64) -> LaunchFacts {
        LaunchFacts { blocks, slots, whole_grid_on_whole_gpu: true, native_available: true }
    }

    #[test]
    fn only_timed_grids_whose_waves_fit_the_short_bound_are_known_short() {
        // Untimed: nothing known, whatever the grid.
        assert!(!known_short(1, 1056, None));
        // One wave of short blocks, and several waves that still fit.
        assert!(known_short(1, 1056, Some(3_000.0)));
        assert!(known_short(4 * 1056, 1056, Some(5_000.0)));
        // Just over: five waves of 5 µs; one wave of long blocks is not short.
        assert!(!known_short(4 * 1056 + 1, 1056, Some(5_000.0)));
        assert!(!known_short(1, 1056, Some(SHORT_LAUNCH_NS + 1.0)));
        // A garbage measurement is not taken as short.
        assert!(!known_short(1, 1056, Some(f64::NAN)));
        assert!(!known_short(1, 1056, Some(-1.0)));
        // No slots counts as one (no division by zero).
        assert!(known_short(2, 0, Some(1_000.0)));
    }

    #[test]
    fn unmeasured_kernels_are_preemptible_per_block_and_timed() {
        assert_eq!(plan(Chunk::Auto, facts(1 << 20, 1056), None), Plan::Workers { chunk: 1, measure: true });
        assert_eq!(plan(Chunk::Fixed(16), facts(1, 1056), Some(10.0)), Plan::Workers { chunk: 16, measure: false });
        assert_eq!(plan(Chunk::Fixed(0), facts(1, 1056), None), Plan::Workers { chunk: 1, measure: false });
    }

    #[test]
    fn short_launches_run_natively_only_whole_and_on_every_sm() {
        // 256 blocks of 2 µs on 4224 slots: one wave, 2 µs.
        assert_eq!(plan(Chunk::Auto, facts(256, 4224), Some(2_000.0)), Plan::Native);
        // 10 waves of 2 µs = 20 µs: still short; 11 waves are not.
        assert_eq!(plan(Chunk::Auto, facts(10 * 1056, 1056), Some(2_000.0)), Plan::Native);
        assert!(matches!(plan(Chunk::Auto, facts(11 * 1056, 1056), Some(2_000.0)), Plan::Workers { .. }));
        // One wave of long blocks: a retreat could not stop any of them.
        assert_eq!(plan(Chunk::Auto, facts(512, 1056), Some(11e6)), Plan::Native);
        assert!(matches!(plan(Chunk::Auto, facts(1057, 1056), Some(11e6)), Plan::Workers { chunk: 1, .. }));
        let part = LaunchFacts { whole_grid_on_whole_gpu: false, ..facts(256, 4224) };
        assert_eq!(plan(Chunk::Auto, part, Some(2_000.0)), Plan::Workers { chunk: 6, measure: false });
        let no_native = LaunchFacts { native_available: false, ..facts(256, 4224) };
        assert!(matches!(plan(Chunk::Auto, no_native, Some(2_000.0)), Plan::Workers { .. }));
    }

    #[test]
    fn chunk_amortises_the_claim_and_bounds_the_retreat_wait() {
        // Long blocks: one per claim (a retreat waits one block).
        assert_eq!(auto_chunk(20_000.0), 1);
        assert_eq!(auto_chunk(100_000.0), 1);
        // 10 µs: two blocks fill the 20 µs a retreat may wait.
        assert_eq!(auto_chunk(10_000.0), 2);
        // 3.6 µs (transpose): 4 blocks = 14.4 µs per claim.
        assert_eq!(auto_chunk(3_600.0), 4);
        // 1.07 µs (bfs): 12 blocks = 12.8 µs.
        assert_eq!(auto_chunk(1_070.0), 12);
        // Tiny blocks: capped.
        assert_eq!(auto_chunk(10.0), MAX_CHUNK);
        for bt in [50.0, 400.0, 1_000.0, 2_500.0, 7_000.0, 15_000.0, 19_999.0, 40_000.0] {
            let c = auto_chunk(bt) as f64;
            assert!(c >= 1.0);
            assert!(c * bt <= PREEMPT_CHUNK_NS || c == 1.0, "chunk {c} of {bt} ns blocks outlasts the target");
        }
    }

    #[test]
    fn block_time_from_a_timed_launch() {
        // 4 waves in 40 µs: 10 µs per block.
        assert_eq!(block_ns_of(40_000.0, 4 * 1056, 1056), Some(10_000.0));
        // Less than a wave: the whole launch is one block time.
        assert_eq!(block_ns_of(5_000.0, 10, 1056), Some(5_000.0));
        assert_eq!(block_ns_of(0.0, 10, 1056), None);
        assert_eq!(block_ns_of(f64::NAN, 10, 1056), None);
        assert_eq!(block_ns_of(10.0, 0, 1056), None);
    }

    #[test]
    fn the_cache_keeps_the_least_of_the_timed_launches_per_shape() {
        let c = ProfileCache::default();
        let k = ProfileKey { block: [256, 1, 1], smem: 0 };
        assert_eq!(c.get("triad", k), None);
        // The first launch also loaded the code: slower.
        assert_eq!(c.record("triad", k, 9_999.0), None);
        assert_eq!(c.get("triad", k), Some(Timing { block_ns: 9_999.0, launches: 1 }));
        assert!(c.get("triad", k).is_some_and(|t| t.timing()));
        let done = c.record("triad", k, 1_200.0);
        assert_eq!(done, Some(Timing { block_ns: 1_200.0, launches: TIMED_LAUNCHES }));
        // Settled: later measurements change nothing.
        assert_eq!(c.record("triad", k, 100.0), None);
        assert_eq!(c.get("triad", k).map(|t| (t.block_ns, t.timing())), Some((1_200.0, false)));
        assert_eq!(c.get("triad", ProfileKey { block: [128, 1, 1], smem: 0 }), None);
        assert_eq!(c.get("sgemm", k), None);
    }

    #[test]
    fn chunk_names_parse() {
        assert_eq!("auto".parse::<Chunk>(), Ok(Chunk::Auto));
        assert_eq!("4".parse::<Chunk>(), Ok(Chunk::Fixed(4)));
        assert!("0".parse::<Chunk>().is_err());
        assert!("x".parse::<Chunk>().is_err());
        assert_eq!(Chunk::Fixed(16).to_string(), "16");
    }

    #[test]
    fn a_grid_that_could_hold_a_peer_past_the_bound_is_too_long_for_native() {
        let slots = 132 * 2;
        // issue 36's huge grid: 2^31 - 2 blocks of 1024 threads, ~8.1 M waves.
        assert!(holds_too_long((1 << 31) - 2, slots, None), "untimed: at least 1 µs a wave");
        assert!(holds_too_long((1 << 31) - 2, slots, Some(100.0)), "even at 0.1 µs a block");
        // An ordinary big launch (1 M elements, 256 threads a block): 4096 blocks.
        assert!(!holds_too_long(4096, 132 * 8, None));
        assert!(!holds_too_long(4096, 132 * 8, Some(50_000.0)), "4 waves of 50 µs");
        // 10,000 waves at the floor is the bound itself; one more wave passes it.
        assert!(!holds_too_long(10_000 * slots, slots, None));
        assert!(holds_too_long(10_001 * slots, slots, None));
        // A timed block time decides once known: 101 waves of 100 µs.
        assert!(holds_too_long(101 * slots, slots, Some(100_000.0)));
        assert!(!holds_too_long(99 * slots, slots, Some(100_000.0)));
    }
}
