//! Ends known ahead (issue 35; docs/daemon.md, "The submission path").
//!
//! The CUDA device queues a stream's kernels natively behind a native
//! launch, a run of them (`gpumux_cuda::client` docs, queue ahead, "Deep"),
//! so the GPU may finish a kernel before the engine has even sent its launch
//! command. A device process reports such ends by operation with its poll
//! answers ([`EndAhead`]); the daemon's side ([`KnownEnds`]) then answers
//! the engine's launch command for such an operation itself: its SMs
//! released and its blocks done at the next poll of the backend, with no
//! round trip to the device process (a lockstep exchange, ~9 µs on the
//! H100, plus the device process's own work). The command still goes to the
//! device, marked as answered, so that the device adopts the kernel's
//! launch record and ends the launch as for any other; the device process
//! drops that launch's events ([`Silenced`]), which the engine had already
//! (the CUDA device, told by [`super::Backend::submit_answered`], reports
//! only the launch's end, not one release per SM). By default (unless
//! `GPUMUX_RETIRE_ANSWERED=0`) a command whose operation's unbind follows at
//! once goes with it as one `Retire` instead ([`super::remote`], "Retired"):
//! the device makes no launch and sends no event, so nothing is silenced.
//!
//! What keeps this correct:
//! * only a kernel that ran its whole grid is reported (a native grid runs
//!   every block, from block 0), and only once its end was seen on the GPU
//!   in stream order; a faulted kernel never publishes its end, so its fault
//!   is found by the device's polls as before, and the kernels behind it
//!   are never reported;
//! * a launch is answered only if it asks for blocks the kernel ran;
//! * an end reported for an operation whose launch command had already gone
//!   to the device (the report and the command crossed) is ignored: the
//!   device answers that launch itself;
//! * the engine's time for the end is the poll's, after its launch command;
//! * a grow or retreat of an answered launch sent before the engine read its
//!   end is dropped: the launch ran every block, and the engine frees its SMs
//!   with the end;
//! * a device that ends an answered launch with blocks left contradicts what
//!   the engine was told: the device process reports it as a fatal error;
//! * a `Retire` stands for exactly an answered launch command and the unbind
//!   of its operation sent right after it (anything sent between, or the
//!   release of the core's held sends, sends the command first, as it was):
//!   the device gets the same work in the same order; one asked to retire an
//!   operation it did not see end refuses it, at the next poll, as a fatal
//!   error (the daemon stops: the engine was told the kernel ran).

use super::ended_at_once_into;
use crate::core::id_map::IdMap;
use gpumux_engine::device::{Command, Event};
use gpumux_engine::ids::{LaunchId, OpId};
use serde::{Deserialize, Serialize};

/// A kernel operation that ran every block of its grid, `[0, blocks)`, on
/// the device before the engine launched it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndAhead {
    /// The operation.
    pub op: OpId,
    /// Its grid's blocks, all run.
    pub blocks: u64,
}

/// The daemon's side: ends reported ahead, and the launches answered with them.
#[derive(Debug, Default)]
pub struct KnownEnds {
    /// Reported and not yet launched, by operation: its blocks.
    ends: IdMap<OpId, u64>,
    /// What the engine hears of the launches answered, for the next poll.
    answers: Vec<Event>,
    /// Launches answered whose end the engine has not read yet: one or a
    /// few between two reads (a list, not a hashed set: issue 35's callgrind).
    answered: Vec<LaunchId>,
    /// Launches answered so far.
    count: u64,
}

impl KnownEnds {
    /// Notes ends the device reported; `launched` says whether an
    /// operation's launch command already went to the device (then the device
    /// answers it, and the report is stale).
    pub fn learn(&mut self, ends: impl IntoIterator<Item = EndAhead>, launched: impl Fn(OpId) -> bool) {
        for e in ends {
            if !launched(e.op) {
                self.ends.insert(e.op, e.blocks);
            }
        }
    }

    /// Answers `command` if it launches an operation that ended ahead with
    /// blocks the operation ran: true, and its events are kept for
    /// [`KnownEnds::take`]. The command must still go to the device, marked
    /// answered.
    pub fn answer(&mut self, command: &Command) -> bool {
        let Command::Launch { launch, op, blocks, restore, .. } = command else { return false };
        let Some(&ran) = self.ends.get(op) else { return false };
        if !restore.is_empty() || blocks.ranges().iter().any(|r| r.end > ran) {
            return false;
        }
        self.ends.remove(op);
        ended_at_once_into(command, &mut self.answers);
        self.answered.push(*launch);
        self.count += 1;
        true
    }

    /// `command` grows or retreats a launch answered here whose end the
    /// engine has not read yet: it is dropped (module doc).
    pub fn drops(&self, command: &Command) -> bool {
        match command {
            Command::Grow { launch, .. } | Command::Retreat { launch, .. } => self.answered.contains(launch),
            Command::Launch { .. } | Command::Copy { .. } => false,
        }
    }

    /// Answers wait for the next poll.
    pub fn pending(&self) -> bool {
        !self.answers.is_empty()
    }

    /// Appends the answers (the engine reads them now).
    pub fn take(&mut self, events: &mut Vec<Event>) {
        events.append(&mut self.answers);
        self.answered.clear();
    }

    /// `op` is gone (unbound): a report of it is dropped.
    pub fn forget(&mut self, op: OpId) {
        self.ends.remove(&op);
    }

    /// Launches answered so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Ends reported and not yet launched (a leak check).
    pub fn known(&self) -> usize {
        self.ends.len()
    }
}

/// The device process's side: launches the daemon answered itself, whose
/// events it does not send.
#[derive(Debug, Default)]
pub struct Silenced {
    /// A few at a time (those answered since the device's last poll): a
    /// look at each of a launch's events (one per SM) is a scan of these.
    launches: Vec<LaunchId>,
}

impl Silenced {
    /// `launch` was answered by the daemon.
    pub fn add(&mut self, launch: LaunchId) {
        self.launches.push(launch);
    }

    /// Removes the events of answered launches from `events`. A launch that
    /// ended with blocks left is an error: the engine was told it ran them.
    pub fn filter(&mut self, events: &mut Vec<Event>) -> Result<(), String> {
        if self.launches.is_empty() {
            return Ok(());
        }
        let mut wrong = None;
        let launches = &mut self.launches;
        events.retain(|e| match e {
            Event::SmReleased { launch, .. } => !launches.contains(launch),
            Event::LaunchEnded { launch, remaining, .. } => {
                let Some(i) = launches.iter().position(|l| l == launch) else { return true };
                launches.swap_remove(i);
                if !remaining.is_empty() && wrong.is_none() {
                    wrong = Some(format!(
                        "launch {launch}, answered as ended from its end seen ahead, ended with {} blocks left",
                        remaining.len()
                    ));
                }
                false
            }
            Event::CopyDone { .. } => true,
        });
        wrong.map_or(Ok(()), Err)
    }

    /// Answered launches not yet ended on the device.
    pub fn len(&self) -> usize {
        self.launches.len()
    }

    /// None is waiting.
    pub fn is_empty(&self) -> bool {
        self.launches.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumux_engine::device::{Mechanism, ReleaseCause};
    use gpumux_engine::ids::{KernelId, ProcessId, SmId};
    use gpumux_engine::kernel::{KernelDesc, KernelShape};
    use gpumux_engine::ranges::BlockRanges;
    use gpumux_engine::smset::SmSet;
    use std::sync::Arc;

    fn launch(lid: u64, op: u64, blocks: BlockRanges) -> Command {
        Command::Launch {
            launch: LaunchId(lid),
            kernel: KernelId(op),
            op: OpId(op),
            process: ProcessId(0),
            priority: 0,
            desc: Arc::new(KernelDesc::new("k", KernelShape::new(blocks.len().max(1), 32, 32))),
            time_key: op,
            blocks,
            restore: Vec::new(),
            sms: SmSet::range(0, 4),
        }
    }

    #[test]
    fn a_launch_of_an_operation_that_ended_ahead_is_answered_once_with_its_sms_and_blocks() {
        let mut k = KnownEnds::default();
        k.learn([EndAhead { op: OpId(7), blocks: 10 }], |_| false);
        assert!(!k.answer(&launch(1, 6, BlockRanges::full(10))), "another operation is not answered");
        assert!(k.answer(&launch(2, 7, BlockRanges::full(10))));
        assert!(k.pending());
        let mut events = Vec::new();
        k.take(&mut events);
        let released: Vec<SmId> = events
            .iter()
            .filter_map(|e| match e {
                Event::SmReleased { launch: LaunchId(2), sm, cause: ReleaseCause::Exhausted } => Some(*sm),
                _ => None,
            })
            .collect();
        assert_eq!(released.len(), 4, "every SM of the launch released: {events:?}");
        assert!(
            matches!(events.last(), Some(Event::LaunchEnded { launch: LaunchId(2), remaining, completed: 10, .. }) if remaining.is_empty()),
            "then its end, every block done: {events:?}"
        );
        assert!(!k.pending());
        assert!(!k.answer(&launch(3, 7, BlockRanges::full(10))), "an end answers one launch");
        assert_eq!(k.count(), 1);
    }

    #[test]
    fn a_stale_report_and_a_launch_asking_blocks_the_kernel_did_not_run_go_to_the_device() {
        let mut k = KnownEnds::default();
        // Its launch command had gone to the device before the report came.
        k.learn([EndAhead { op: OpId(1), blocks: 10 }, EndAhead { op: OpId(2), blocks: 10 }], |op| op == OpId(1));
        assert!(!k.answer(&launch(1, 1, BlockRanges::full(10))));
        assert!(!k.answer(&launch(2, 2, BlockRanges::full(11))), "blocks beyond what ran");
        assert!(k.answer(&launch(3, 2, BlockRanges::full(10))));
        k.forget(OpId(2));
        assert_eq!(k.known(), 0);
        k.learn([EndAhead { op: OpId(4), blocks: 3 }], |_| false);
        k.forget(OpId(4));
        assert!(!k.answer(&launch(4, 4, BlockRanges::full(3))), "an operation unbound is forgotten");
    }

    #[test]
    fn a_retreat_of_an_answered_launch_is_dropped_until_the_engine_reads_its_end() {
        let mut k = KnownEnds::default();
        k.learn([EndAhead { op: OpId(5), blocks: 8 }], |_| false);
        assert!(k.answer(&launch(9, 5, BlockRanges::full(8))));
        let retreat = Command::Retreat { launch: LaunchId(9), sms: SmSet::range(0, 2), mechanism: Mechanism::Drain };
        let other = Command::Retreat { launch: LaunchId(8), sms: SmSet::range(0, 2), mechanism: Mechanism::Drain };
        assert!(k.drops(&retreat));
        assert!(!k.drops(&other));
        k.take(&mut Vec::new());
        assert!(!k.drops(&retreat), "once read, the engine sends it nothing more");
    }

    #[test]
    fn the_device_process_drops_an_answered_launchs_events_and_refuses_one_with_blocks_left() {
        let mut s = Silenced::default();
        s.add(LaunchId(2));
        let ended = |lid: u64, left: u64| Event::LaunchEnded {
            launch: LaunchId(lid),
            remaining: BlockRanges::full(left),
            saved: Vec::new(),
            completed: 4,
        };
        let released =
            |lid: u64| Event::SmReleased { launch: LaunchId(lid), sm: SmId(0), cause: ReleaseCause::Exhausted };
        let mut events = vec![released(1), released(2), ended(2, 0), ended(1, 0)];
        s.filter(&mut events).expect("clean");
        assert_eq!(events, vec![released(1), ended(1, 0)], "launch 2's events dropped, launch 1's kept");
        assert!(s.is_empty());
        s.add(LaunchId(3));
        let mut events = vec![ended(3, 2)];
        let e = s.filter(&mut events).expect_err("blocks left");
        assert!(e.contains("launch 3") && e.contains("2 blocks left"), "{e}");
    }
}
