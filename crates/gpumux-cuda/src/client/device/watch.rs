//! A run's ends read from host memory, for the held polls that watch them
//! (issue 35).
//!
//! **Why.** A run of kernels queued natively ([`super::ahead`], "Deep")
//! holds one launch record per kernel not seen ended, and only the device's
//! poll looks for their ends. In the daemon's device process a poll comes
//! when the daemon's core has used up the ends the last one reported: after
//! it turned each into an engine turn, and after the device process carried
//! out the launch command each turn sent (~4 µs each on the H200). So a run
//! goes on once a cycle, as a burst of as many kernels as there are spare
//! records (15 of 16), and the GPU idled from the burst's end to the next
//! poll that saw it (60-130 µs a cycle on the H200, the whole of the chain's
//! overhead; docs/program-speed.md, "What the stage stamps showed"): a held
//! poll polled the device back to back after a command, and those polls did
//! not see ends that a poll 5 µs later saw.
//!
//! **How.** The ends of a run's kernels that publish theirs are words in host
//! memory (`preempt::WorkerLaunch`'s published end): reading them takes no
//! driver call. A held poll of the daemon's device process reads them
//! ([`ClientDevice::run_end_landed`]; gpumuxd's `device_host::hold`) and
//! polls the device the moment one landed, and otherwise at its pace,
//! instead of back to back after a command. Ends are reported to the daemon
//! only with a poll's answer, once each and in stream order, and launches
//! end only at polls (the engine's device contract), as before.
//!
//! **Measured** (one H200, 2026-11-29, f6558f5, the programs bench's chain,
//! alternating in one call): 2.22x and 2.03x native with the watch, 2.53x
//! and 2.70x without; its answered launch commands cost the device process
//! 2.1 µs against 2.6-2.7.
//!
//! **Tried and removed: records recycled at launch commands.** Each launch
//! command also looked whether a queued kernel's end had landed and, if so,
//! walked the runs from host memory and let them go on between polls, so
//! that the GPU was fed through the cycle rather than in bursts. It lost to
//! the watch alone: 2.85x and 2.81x native in the same call (3.26x and 3.14x
//! before a bound on how far the engine may trail), its launch commands
//! costing 4.1-4.5 µs, since each post of a run's next kernel looks through
//! every kernel queued or seen ended. The code is in git: 026a0d1
//! (`GPUMUX_RECYCLE_AHEAD=1`; docs/program-speed.md).

use super::ClientDevice;

impl ClientDevice {
    /// Kernels are queued natively ahead and not seen ended: `Some`, with
    /// whether one of them has published its end in host memory since (no
    /// driver call: a read of each one's published word). `None`: no such
    /// kernel, nothing to watch. A held poll of the daemon's device process
    /// polls the device as soon as this says `Some(true)`.
    pub fn run_end_landed(&self) -> Option<bool> {
        let st = self.st.as_ref()?;
        let mut watched = false;
        for (_, a) in super::ahead::unended(st) {
            if !a.watched() {
                continue;
            }
            watched = true;
            if a.end_landed() {
                return Some(true);
            }
        }
        watched.then_some(false)
    }
}
