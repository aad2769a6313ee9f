//! A poll answered before the runs go on (issue 35): in the daemon's device
//! process, the runs of kernels queued natively go on from the kernels a
//! poll saw ended only once that poll's answer is on its way.
//!
//! **Why.** A poll that sees a run's kernels ended gives their launch
//! records back and queues the run's next kernels
//! ([`ClientDevice::deepen_tails`]): on the H200's chain, 15 posts to the
//! launcher thread at ~3.8 µs each of the device process's main thread, ~57
//! µs, all before the answer went back (the stage stamps of 687b320: a held
//! poll ~80 µs from its receipt to its answer, its posts ~52 µs of it). The
//! daemon's core waited for that answer, and only then turned its ends into
//! launch commands (15 at ~3.6 µs each) and polled again; the GPU ran the
//! burst meanwhile and idled from its end to the next poll's posts. So each
//! cycle of ~145 µs (~15 kernels) was the poll's posts, then the core's
//! commands, one after the other.
//!
//! **How.** Where the device process asks
//! ([`ClientDevice::go_on_after_answers`], switched by [`ANSWER_FIRST_VAR`]),
//! a poll notes that the runs may go on instead of queueing their kernels,
//! and the device process calls [`ClientDevice::go_on`] right after it sent
//! the answer, before it reads the next message: the core turns the ends
//! into launch commands while the device process posts the next kernels,
//! which the launcher thread launches as they come.
//!
//! **What stays.** The same walk and the same queueing, only later in the
//! device process's turn: nothing is reported that was not seen at a poll
//! (the ends were taken before the answer), a run goes on within the same
//! bounds, and no message is handled before [`ClientDevice::go_on`] (the
//! device process calls it before its next read), so the device still sees
//! every command and poll in the core's order. Should it not come, the next
//! poll goes on first, as a poll did before. A failure of the queueing
//! (a lost context) is the next poll's answer, as for a command's.

use super::ClientDevice;
use gpumux_engine::device::DeviceError;

/// The daemon's environment (its device process inherits it): unset or `1`,
/// a device process answers a poll before the runs go on; `0`, they go on in
/// the poll, before its answer (the behaviour before). The default is the
/// one believed faster until the H200 says otherwise (module doc).
pub const ANSWER_FIRST_VAR: &str = "GPUMUX_ANSWER_FIRST";

/// [`ANSWER_FIRST_VAR`]'s value (`None`: unset): whether polls answer first;
/// an unknown value is the default, with a warning.
pub fn answer_first_from(v: Option<&str>) -> bool {
    match v.map(str::trim) {
        None | Some("") | Some("1") => true,
        Some("0") => false,
        Some(other) => {
            tracing::warn!("{ANSWER_FIRST_VAR}={other:?} is not 0 or 1: 1");
            true
        }
    }
}

impl ClientDevice {
    /// A device process asks: from now on a poll leaves the runs' next
    /// kernels to [`ClientDevice::go_on`], called once its answer is sent,
    /// if [`ANSWER_FIRST_VAR`] allows. Whether it does.
    pub fn go_on_after_answers(&mut self) -> bool {
        self.answer_first = answer_first_from(std::env::var(ANSWER_FIRST_VAR).ok().as_deref());
        self.answer_first
    }

    /// Sets [`ClientDevice::go_on_after_answers`] without the environment (tests).
    pub fn set_answer_first(&mut self, on: bool) {
        self.answer_first = on;
    }

    /// After a poll's answer: the runs go on from the kernels the poll saw
    /// ended (nothing if it saw none). A poll that found this undone does
    /// it first itself.
    pub fn go_on(&mut self) -> Result<(), DeviceError> {
        if std::mem::take(&mut self.go_on_due) {
            let (t, queued) = (std::time::Instant::now(), self.ahead_counts.queued);
            self.deepen_tails()?;
            self.poll_clock.went_on(t.elapsed(), self.ahead_counts.queued - queued);
        }
        Ok(())
    }

    /// A poll's end: the runs go on now, or once the answer is sent.
    pub(super) fn runs_go_on(&mut self) -> Result<(), DeviceError> {
        if self.answer_first {
            self.go_on_due = true;
            Ok(())
        } else {
            self.deepen_tails()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_reads_0_and_1_and_defaults_to_answering_first() {
        assert!(answer_first_from(None));
        assert!(answer_first_from(Some("1")));
        assert!(answer_first_from(Some(" ")));
        assert!(!answer_first_from(Some(" 0 ")));
        assert!(answer_first_from(Some("later")));
    }
}
