//! Queue ahead: a stream's next kernel queued on the GPU behind the launch
//! running now.
//!
//! **Why.** Between two kernels of one stream the daemon takes a round trip:
//! the device sees the first launch end (a poll), the engine completes it
//! and runs its policy, the launch command for the next comes back, and the
//! device makes the CUDA launch calls. On the H100 that is 60-75 µs per
//! kernel (docs/benchmarks.md, the solo rows of runs 53-55), and the SMs of
//! the stream idle meanwhile: a client whose kernels are 100 µs long lost a
//! third of its rate to it.
//!
//! **How.** When a launch runs every block its kernel has left, and the
//! operation right after that kernel on its stream is a kernel already bound
//! ([`ClientDevice::bind_after`]), that kernel's workers are started on the
//! same CUDA stream, placed as the running launch's are (same SMs, same
//! co-located share). The GPU starts them the moment the last worker before
//! them leaves. When the engine's launch command for the operation comes,
//! the device **adopts** them as that launch's workers if the engine put it
//! where they run; otherwise it asks them to retreat and, once they left,
//! restarts the launch where the engine says (a retreat and restart, as for
//! a grow). Either way no block runs twice and none is lost: the control
//! record says where they stopped.
//!
//! **Stream order.** Queued workers start only once every worker of the
//! launch before them has left, and those leave early only when asked (a
//! retreat, a per-SM leave, a grow's restart). Any such command first
//! **cancels** what is queued behind the launch: the retreat of the queued
//! workers is written on the control stream before the launch's own, so
//! they find it when they start and leave with no block run. Queued workers
//! are never the kernel's native build (it could not be called back), unless
//! the launch before them is native too (it cannot retreat either).
//!
//! **What the engine sees.** Nothing: for it the SMs are idle from the first
//! launch's end to the next launch. Mostly the policy gives them straight
//! back to the stream; if it puts another kernel on them, the queued workers
//! there are cancelled (they leave after their current chunk, as from a
//! retreat), and if its process went away, its queued workers are
//! cancelled and reaped. The other kernel's workers may then find no room
//! on their SMs: a worker grid fills free slots wherever they are, and its
//! workers on SMs outside their launch's mask leave at once, so while the
//! cancelled workers still fill the launch's own SMs the whole grid can go
//! through another SM's free slots with no worker entering. Such a launch
//! (no worker ran, no block done, none asked to leave) starts again
//! ([`AheadCounts::unplaced`]); the cancelled workers leave within a chunk.
//! This was the "workers stopped with work left though no retreat was
//! asked" that stopped the daemon in runs 58-59 (found in run 62, whose
//! error named a launch that had started normally on SMs 66-131 and whose
//! one worker launch had no worker run). Nothing is queued behind a launch
//! (not over every SM) whose SMs other workers may still fill, since what
//! is queued would then run before it; if it were, the device stops on its
//! check rather than restart the launch after its successor.

use super::clock::Part;
use super::{
    all_left, failed, failed_with, hw_native, place, start_segs, state_of, still_to_run, ClientDevice, InContext, Live,
    Placement, SegPlan,
};
use crate::launch_plan::Plan;
use crate::preempt::{is_long, WorkerLaunch};
use crate::runtime::Stream;
use gpumux_engine::device::DeviceError;
use gpumux_engine::ids::{LaunchId, OpId};
use gpumux_engine::ranges::BlockRanges;
use gpumux_engine::smset::SmSet;
use std::collections::HashMap;

/// What queueing ahead did so far ([`ClientDevice::ahead_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AheadCounts {
    /// Kernels whose workers were queued behind the launch before them.
    pub queued: u64,
    /// Launches that took their queued workers as they were.
    pub adopted: u64,
    /// Launches whose queued workers were cancelled or placed elsewhere
    /// than the engine said: they left and the launch restarted.
    pub restarted: u64,
    /// Queued workers cancelled (a retreat or grow of the launch before
    /// them, another kernel given their SMs, or their operation dropped).
    pub cancelled: u64,
    /// Launches started again because none of their workers found room on
    /// their SMs: cancelled queued workers of another stream still held
    /// them while the grid went through other SMs' free slots (see
    /// "What the engine sees").
    pub unplaced: u64,
}

/// Workers of one kernel operation queued behind the launch before it.
pub(in crate::client) struct Ahead {
    /// The launch they are queued behind (it may have ended since).
    behind: LaunchId,
    /// The SMs `behind` held when they were queued: the engine gives them
    /// out again once `behind` ends, and a launch of another kernel there
    /// cancels these workers.
    held: SmSet,
    /// Where they run: `behind`'s placement.
    place: Placement,
    /// The operation's blocks left when they were queued (all of them run).
    covers: BlockRanges,
    /// `behind`'s stream, handed over when `behind` ends (their order on it).
    stream: Option<Stream>,
    segs: Vec<WorkerLaunch>,
    /// Asked to retreat: they leave, and the launch that adopts them starts over.
    cancelled: bool,
    /// The engine's priority of their process.
    priority: i32,
}

impl Ahead {
    /// Asks the workers to leave (errors ignored: for teardown).
    pub(super) fn stop(&mut self, ctl: &Stream) {
        for w in &self.segs {
            let _ = w.retreat(ctl);
        }
        self.cancelled = true;
    }

    /// Waits for the workers to leave (errors ignored: for teardown).
    pub(super) fn wait(&mut self) {
        for w in self.segs.iter_mut() {
            let _ = w.finish();
        }
    }
}

/// Queued workers of `priority`, not cancelled, are there (running, or
/// about to run once the launch before them ends).
pub(super) fn peer_running(ahead: &HashMap<OpId, Ahead>, priority: i32) -> bool {
    peers(ahead, priority).next().is_some()
}

/// Workers (not native launches) of a priority other than `priority` are
/// queued ahead, not cancelled.
pub(super) fn workers_of_others(ahead: &HashMap<OpId, Ahead>, priority: i32) -> bool {
    ahead
        .values()
        .filter(|a| a.priority != priority && !a.cancelled)
        .any(|a| a.segs.iter().any(|w| w.running() && !w.running_native()))
}

/// The operations of `priority` whose workers are queued ahead and not cancelled.
pub(super) fn peers(ahead: &HashMap<OpId, Ahead>, priority: i32) -> impl Iterator<Item = OpId> + '_ {
    ahead.iter().filter(move |(_, a)| a.priority == priority && !a.cancelled).map(|(&op, _)| op)
}

/// Workers are queued behind launch `lid` and not cancelled.
pub(super) fn queued_behind(ahead: &HashMap<OpId, Ahead>, lid: LaunchId) -> bool {
    ahead.values().any(|a| a.behind == lid && !a.cancelled)
}

/// `stream` of launch `lid`, which ended: handed to workers queued behind
/// the launch (their order on it must hold), else returned for reuse.
pub(super) fn take_stream(st: &mut InContext, lid: LaunchId, stream: Stream) -> Option<Stream> {
    let waiting = st.ahead.values_mut().chain(st.orphans.iter_mut().map(|o| &mut o.1));
    match waiting.into_iter().find(|a| a.behind == lid && a.stream.is_none()) {
        Some(a) => {
            a.stream = Some(stream);
            None
        }
        None => Some(stream),
    }
}

impl ClientDevice {
    /// What queueing ahead did so far.
    pub fn ahead_counts(&self) -> AheadCounts {
        self.ahead_counts
    }

    /// Kernel operation `op` is the one right after `after` on its stream.
    pub(super) fn follow(&mut self, after: OpId, op: OpId) {
        let Some(st) = self.st.as_mut() else { return };
        let Some(prev) = st.ops.get_mut(&after).filter(|o| !o.unbound) else { return };
        prev.next = Some(op);
        let running = st.launches.iter().filter(|(_, l)| l.op == after).map(|(&lid, _)| lid).next();
        if let Some(lid) = running {
            if let Err(e) = self.try_queue_ahead(lid) {
                // Not queued: the launch command starts it as usual.
                tracing::warn!("CUDA device: queueing {op} behind launch {lid}: {e}");
            }
        }
    }

    /// Queues the next kernel of `lid`'s stream behind `lid`'s workers, if
    /// `lid` runs every block its kernel has left and was not asked to
    /// leave any SM, and that kernel is bound and not started.
    pub(super) fn try_queue_ahead(&mut self, lid: LaunchId) -> Result<(), DeviceError> {
        if !self.queue_ahead {
            return Ok(());
        }
        let (chunk, sm_count, ctx, hw_priority) =
            (self.chunk, self.info.num_sms as u32, self.ctx.raw(), self.hw_priority);
        let st = state_of(&self.ctx, &mut self.st).map_err(failed("making the context current"))?;
        let InContext { launches, ops, spare, ahead, orphans, launcher, .. } = st;
        let Some(live) = launches.get(&lid) else { return Ok(()) };
        // A refilled launch runs on two streams: what queues behind one would not wait for the other.
        if live.stopping
            || !live.vacated.is_empty()
            || live.segs.is_empty()
            || live.sms.is_empty()
            || !live.leaving.is_empty()
            || live.cut.is_some()
        {
            return Ok(());
        }
        // Workers of other launches may still fill some of this launch's
        // SMs (leaving after a retreat, or cancelled ahead): its grid may
        // then find no room there and end with no block run (see "What the
        // engine sees"), and what is queued behind it would run first. Only
        // a launch over every SM cannot miss its SMs.
        let mask = live.place.mask;
        if mask.len() < sm_count {
            let touches = |m: &SmSet| !m.intersection(&mask).is_empty();
            let others = launches.iter().any(|(&l, x)| l != lid && !x.segs.is_empty() && touches(&x.place.mask));
            let queued = ahead
                .values()
                .chain(orphans.iter().map(|o| &o.1))
                .any(|a| !a.segs.is_empty() && touches(&a.place.mask));
            if others || queued {
                return Ok(());
            }
        }
        let Some(first) = ops.get(&live.op) else { return Ok(()) };
        let Some(next) = first.next else { return Ok(()) };
        // Every block the kernel has left is this launch's, and no other
        // launch of it is still leaving: its end is the kernel's end.
        if still_to_run(&live.requested, &first.left) != first.left
            || launches.iter().any(|(&l, x)| l != lid && (x.op == live.op || x.op == next))
            || ahead.contains_key(&next)
        {
            return Ok(());
        }
        let Some(covers) = ops.get(&next).filter(|o| !o.unbound).map(|o| o.left.clone()) else { return Ok(()) };
        if covers.is_empty() {
            return Ok(());
        }
        let native_before = live.segs.iter().all(|w| w.running() && w.last_plan() == Some(Plan::Native));
        let (native_anywhere, native_if_long) = hw_native(hw_priority, launches, ahead, live.priority, Some(lid));
        if native_if_long && !native_before {
            // A long next kernel would run natively (`hw_native`), and a
            // native kernel cannot wait queued behind workers (a retreat of
            // theirs would leave blocks to run after it): launched when the
            // engine says, not queued. A short one is queued as workers (never
            // native), as without hardware priority: with several clients of
            // one priority a launch is alone now and then between its peers'
            // kernels, and a stream that gave up queueing ahead each time would
            // wait a round trip per kernel (8 clients: 1 of 4 pairs as fast
            // as main's build with it, run 184).
            if let Some(o) = ops.get(&next).filter(|o| o.kernel.native.is_some()) {
                let threads = o.block.iter().product::<u32>();
                let fits = o.kernel.worker.blocks_per_sm(threads, o.smem).unwrap_or(0);
                if is_long(&o.kernel.worker, o.grid, o.block, o.smem, fits, sm_count) {
                    return Ok(());
                }
            }
        }
        // Behind a native launch, the next kernel runs natively as the launch
        // command would start it (`hw_native`), in stream order; the launcher
        // thread makes its calls as it does workers'.
        let how = SegPlan {
            place: live.place,
            never_native: !native_before,
            native_anywhere: native_before && native_anywhere,
            native_if_long: native_before && native_if_long,
            chunk,
            sm_count,
        };
        let mut segs = Vec::new();
        // Made by the launcher thread: nobody waits for these workers until
        // the engine launches `next` (`adopt` waits for the calls then).
        let post = launcher.as_ref().map(|l| (l, ctx));
        let started = start_segs(ops, spare, next, &covers, &live.stream, how, lid, &mut segs, post, &mut self.clock);
        let (held, place) = (live.sms, live.place);
        let priority = live.priority;
        let a = Ahead { behind: lid, held, place, covers, stream: None, segs, cancelled: false, priority };
        if let Some(l) = launches.get_mut(&lid) {
            l.note("the next kernel queued behind it");
        }
        // Even if a start failed, the ones that started are tracked (and
        // the error says the context is gone, or the daemon stops).
        tracing::trace!("CUDA device: {next} queued behind launch {lid} ({place:?})");
        self.native_launches += a.segs.iter().filter(|w| w.last_plan() == Some(Plan::Native)).count() as u64;
        ahead.insert(next, a);
        self.ahead_counts.queued += 1;
        started.map_err(failed_with(|| format!("queueing {next} behind launch {lid}")))
    }

    /// Cancels the workers queued behind launch `lid` (before it is asked
    /// to leave any SM: see the module doc).
    pub(super) fn cancel_ahead_behind(&mut self, lid: LaunchId) -> Result<(), DeviceError> {
        self.cancel_where(|_, a| a.behind == lid)
    }

    /// Cancels queued workers on SMs the engine gives to a launch of
    /// another operation than `except` (`sms`).
    pub(super) fn cancel_ahead_on(&mut self, sms: SmSet, except: Option<OpId>) -> Result<(), DeviceError> {
        self.cancel_where(|op, a| Some(op) != except && !a.held.intersection(&sms).is_empty())
    }

    fn cancel_where(&mut self, which: impl Fn(OpId, &Ahead) -> bool) -> Result<(), DeviceError> {
        let hit = |st: &Option<InContext>| {
            st.as_ref().is_some_and(|st| st.ahead.iter().any(|(&op, a)| !a.cancelled && which(op, a)))
        };
        if !hit(&self.st) {
            return Ok(());
        }
        let st = state_of(&self.ctx, &mut self.st).map_err(failed("making the context current"))?;
        for (&op, a) in st.ahead.iter_mut() {
            if a.cancelled || !which(op, a) {
                continue;
            }
            if let Some(l) = st.launches.get_mut(&a.behind) {
                l.note("the kernel queued behind it cancelled");
            }
            a.cancelled = true;
            self.ahead_counts.cancelled += 1;
            tracing::trace!("CUDA device: {op}'s queued workers (behind launch {}) cancelled", a.behind);
            for w in &a.segs {
                w.retreat(&st.ctl).map_err(failed_with(|| format!("cancelling the workers of {op} queued ahead")))?;
            }
        }
        Ok(())
    }

    /// The engine launches `lid` (`live`, not yet in the table) for an
    /// operation that has workers queued: they become its workers, as they
    /// are if the engine put the launch where they run and they run all it
    /// asks for, else asked to leave so that it restarts where the engine
    /// says (as after a grow).
    pub(super) fn adopt(&mut self, lid: LaunchId, mut live: Live) -> Result<(), DeviceError> {
        let (co_locate, sm_count) = (self.co_locate, self.info.num_sms as u32);
        let st = state_of(&self.ctx, &mut self.st).map_err(failed("making the context current"))?;
        let Some(mut a) = st.ahead.remove(&live.op) else {
            st.launches.insert(lid, live);
            return self.start_workers(lid);
        };
        // The stream they are queued on is `behind`'s until it ends (and the
        // engine launches an operation only after the one before it on its
        // stream ended, so it has); the fresh one goes back.
        let mut clean = !a.cancelled;
        match a.stream.take() {
            Some(s) => {
                let fresh = std::mem::replace(&mut live.stream, s);
                st.return_stream(fresh);
            }
            None => clean = false,
        }
        let (place, corun) = place(co_locate, self.chooser.as_mut(), sm_count, st, &live);
        live.corun = corun;
        clean &= place == a.place && !live.sms.is_empty() && still_to_run(&live.requested, &a.covers) == a.covers;
        if !clean && !a.cancelled {
            for w in &a.segs {
                w.retreat(&st.ctl).map_err(failed_with(|| format!("moving the queued workers of launch {lid}")))?;
            }
        }
        live.segs = std::mem::take(&mut a.segs);
        // Their launch calls may still be on the launcher thread: made
        // before anything else touches them (a refill's cut among others).
        // Rarely so: the thread had made them in all but 162-297 of 84,200
        // commands (docs/history/benchmarks.md, runs 159-164).
        for w in live.segs.iter_mut() {
            let t = self.clock.start();
            if w.settle().map_err(failed_with(|| format!("launching the queued workers of launch {lid}")))? {
                self.clock.waited_for_launcher();
            }
            self.clock.part(Part::Settle, t);
        }
        live.place = a.place;
        live.mask = live.sms;
        live.stopping = !clean;
        live.note(if clean {
            "adopted its queued workers as they were"
        } else {
            "adopted its queued workers to restart"
        });
        st.launches.insert(lid, live);
        if clean {
            self.ahead_counts.adopted += 1;
        } else {
            self.ahead_counts.restarted += 1;
        }
        tracing::trace!(
            "CUDA device: launch {lid} adopted its queued workers ({}; queued {:?}, asked {:?})",
            if clean { "as they are" } else { "to restart" },
            a.place,
            place
        );
        if clean {
            let t = self.clock.start();
            let queued = self.try_queue_ahead(lid);
            self.clock.part(Part::QueueAhead, t);
            queued
        } else {
            Ok(())
        }
    }

    /// `op` is unbound: workers queued for it are cancelled and reaped once gone.
    pub(super) fn drop_ahead(&mut self, op: OpId) -> Result<(), DeviceError> {
        if !self.st.as_ref().is_some_and(|st| st.ahead.contains_key(&op)) {
            return Ok(());
        }
        let st = state_of(&self.ctx, &mut self.st).map_err(failed("making the context current"))?;
        let Some(mut a) = st.ahead.remove(&op) else { return Ok(()) };
        let stopped = if a.cancelled {
            Ok(())
        } else {
            self.ahead_counts.cancelled += 1;
            a.segs
                .iter()
                .try_for_each(|w| w.retreat(&st.ctl))
                .map_err(failed_with(|| format!("cancelling {op}'s queued workers")))
        };
        a.cancelled = true;
        st.orphans.push((op, a));
        stopped
    }

    /// Reaps orphaned queued workers that have left.
    pub(super) fn poll_orphans(&mut self) -> Result<(), DeviceError> {
        if self.st.as_ref().is_none_or(|st| st.orphans.is_empty()) {
            return Ok(());
        }
        let st = state_of(&self.ctx, &mut self.st).map_err(failed("making the context current"))?;
        let mut i = 0;
        while i < st.orphans.len() {
            let (op, a) = &st.orphans[i];
            if !all_left(&a.segs).map_err(failed_with(|| format!("polling {op}'s queued workers")))? {
                i += 1;
                continue;
            }
            let (op, mut a) = st.orphans.swap_remove(i);
            for w in a.segs.iter_mut() {
                w.finish().map_err(failed_with(|| format!("reading where {op}'s queued workers stopped")))?;
            }
            if let Some(s) = a.stream.take() {
                st.return_stream(s);
            }
            if let Some(o) = st.ops.get_mut(&op) {
                o.pool.append(&mut a.segs);
            }
            st.retire(op);
        }
        Ok(())
    }
}
