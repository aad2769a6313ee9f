//! Runs that go on between the daemon's polls (issue 35; gpumuxd's device
//! process asks by default, unless `GPUMUX_DEEPEN_BETWEEN=0`).
//!
//! **Why.** A run of kernels queued natively ([`super::ahead`], "Deep") holds
//! a launch record per kernel not seen ended, and gets records back only
//! when a poll sees its kernels end. In the daemon's device process a poll
//! comes only once the core has used up the ends the last one reported (an
//! engine turn and an answered launch command per kernel), so the runs went
//! on once a cycle and the launcher thread ran dry from its last launch to
//! the next poll: the programs bench's chain took ~8.2 µs a kernel through
//! the daemon against its launcher's ~5.6 and the GPU's ~5.3 (H200, 653c7f0;
//! docs/program-speed.md, "What bounds the chain next").
//!
//! **How.** Between the daemon's messages, when a run's end landed in host
//! memory ([`ClientDevice::run_end_landed`]), the device process asks for a
//! look ([`ClientDevice::look_between`]): the runs are walked as at a poll,
//! but from host memory alone (no end event queried, so no driver call and
//! no wait for the launcher thread's `cuLaunchKernel` on the driver's lock),
//! their kernels seen ended give their records back, and the runs go on by
//! at most a given number of posts, so that a message from the daemon waits
//! for a few µs at most; a look that stopped there is owed the rest
//! (`more`), which the device process's next look queues (after its next
//! message, or while none waits).
//!
//! **What stays.** A look makes no event and ends no launch: launches end
//! at polls, and the ends a look saw are reported ahead with the next
//! poll's answer, once each and in stream order (the poll's own list). A
//! launch command that comes for a kernel a look saw ended before any poll
//! reported it ends that launch itself, and the report is dropped
//! ([`ClientDevice::adopt`]); so is one of an operation unbound meanwhile
//! (its client died). A kernel that faults never publishes its end, and
//! neither does any after it on its stream: a look sees none of them, and
//! the poll finds the fault by its end event as before. A run's bounds
//! ([`super::ahead::DEEP_MAX`], [`super::ahead::DEEP_HOLD_NS`], a peer's
//! [`super::peers::PEER_HOLD_NS`], a higher priority's hold,
//! [`super::ahead::ENDED_WAITING_MAX`]) are the poll's: the same function
//! queues the next kernel.
//!
//! **Tried before** (docs/program-speed.md, "Measured and not taken"): a look
//! every 4 µs while idle on the link (158875a) and after each message
//! (88141cc), and a look at each launch command (026a0d1), all lost. They
//! looked whether or not an end had landed, walked with driver calls (end
//! events queried), and queued a run's whole next burst in one go when a
//! post cost 3.8-8 µs: the main thread, then the chain's pacer, only took on
//! more (a look ~11 µs, the core's polls waited for it). This one looks only
//! when an end landed, walks host memory only and bounds its posts; a post
//! costs ~1.6-2.5 µs now.

use super::ClientDevice;
use gpumux_engine::device::DeviceError;

/// What one look between polls did ([`ClientDevice::look_between`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Looked {
    /// Kernels queued natively seen ended (their records given back; their
    /// ends reported ahead with the next poll's answer).
    pub ended: u64,
    /// Kernels queued natively behind a run's last one.
    pub queued: u64,
    /// It stopped at its bound of posts while a run might go on: look again
    /// when no message waits, whether or not another end landed.
    pub more: bool,
}

impl ClientDevice {
    /// A look between the daemon's polls (module doc): the runs' ends seen
    /// from host memory, and the runs on by at most `posts` kernels. No
    /// event, no driver call but what a kernel's post or a record's reuse
    /// makes (none in a chain of one kernel function). Only where ends are
    /// reported ahead ([`ClientDevice::set_report_ends_ahead`]): elsewhere
    /// the engine would never hear of what the look saw.
    pub fn look_between(&mut self, posts: usize) -> Result<Looked, DeviceError> {
        let mut looked = Looked::default();
        if !self.report_ends || self.st.as_ref().is_none_or(|st| st.ahead.is_empty()) {
            self.between_owed = false;
            return Ok(looked);
        }
        let before = self.ahead_counts;
        let saw = self.poll_ahead_in(true)?;
        if saw || std::mem::take(&mut self.between_owed) {
            looked.more = self.deepen_tails_upto(posts.max(1))?;
            self.between_owed = looked.more;
            if !looked.more {
                // What a poll would deepen for is done.
                self.refill_ahead = false;
            }
        }
        let c = &mut self.ahead_counts;
        looked.ended = c.ended_ahead - before.ended_ahead;
        looked.queued = c.deep - before.deep;
        c.ended_between += looked.ended;
        c.queued_between += looked.queued;
        c.looks_between += u64::from(looked.ended + looked.queued > 0);
        Ok(looked)
    }
}
