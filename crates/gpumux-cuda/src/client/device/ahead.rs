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
//!
//! **Deep, behind a native launch.** A native launch cannot be called back,
//! and neither can a native kernel queued behind it: so the kernels after
//! it on its stream, bound and run natively as a launch command would run
//! them (`hw_native`: alone at their priority), are queued natively too, a
//! run of them on the same CUDA stream ([`ClientDevice::queue_deeper`]), not
//! just one. The engine then trails the GPU instead of pacing it: with one
//! kernel ahead, the chain of the programs bench (511 dependent launches of
//! 5.5 µs) moved at the pace of one engine round per kernel, ~20 µs through
//! the device process. A peer of the same priority that comes meanwhile
//! waits for what is queued (hardware priority lets an urgent one's blocks
//! take slots first), so the run is bounded: at most [`DEEP_MAX`] kernels
//! not yet seen ended, and at most [`DEEP_HOLD_NS`] of expected GPU time
//! ([`crate::preempt::WholeGrid::expected_ns`]: a timed kernel's waves times its block time,
//! an untimed one's waves at [`UNTIMED_WAVE_NS`]); a stream whose priority
//! has peers, [`super::peers::PEER_HOLD_NS`] (its short kernels run natively
//! there: [`super::peers`]). A kernel that would not run natively (a peer
//! of its priority came and it is not known short, another priority's workers
//! run beside a short one, a launch that may hold the GPU too long) ends the
//! run: it waits for the engine's launch command, as without queueing.
//! Each kernel of a run needs a launch record at hand (its operation's or a
//! spare): making one costs 0.8-2.1 ms of the device's thread, which the run
//! does not wait for; the run goes on when records come back.
//!
//! **Ends seen ahead.** A natively queued kernel may end on the GPU before
//! the engine has launched it. The device looks for such ends at each poll,
//! in stream order (a kernel queued behind one not seen ended cannot have
//! ended), and, where asked ([`ClientDevice::set_report_ends_ahead`]: the
//! daemon's device process), reports them by operation
//! ([`ClientDevice::take_ends_ahead`]), so that the daemon answers the
//! engine's launch command for such an operation with its end at once,
//! without a round trip to the device process. The launch command still
//! comes: the device adopts the record and ends the launch as for any other
//! (every block ran), and the daemon's side drops those events. Such a
//! daemon may send a kernel's launch command before the device has polled
//! the launch before it (its kernel ended, its end answered): the adoption
//! ends that launch first, it alone, so that its stream passes to the
//! kernels queued on it in order; a run extends only on the CUDA stream its
//! last kernel is on ([`Ahead::on_stream`]), and an adoption handed another
//! stream queues nothing behind it.
//!
//! **Records back at the end.** A kernel queued natively and seen ended
//! gives its launch records back to the spares at once (its blocks marked
//! done), instead of when the engine's launch command for it and its unbind
//! come. Before, a run could hold only as many kernels as there were spare
//! records (16 made with the context), and they came back at the pace of
//! the device process's launch commands: the GPU was fed one kernel per
//! launch command (on the H200 every kernel of the programs bench's chain
//! had ended before its launch command came, 3.18x native). Now a run goes
//! on at each poll that sees ends ([`ClientDevice::deepen_tails`]), at each
//! bind ([`ClientDevice::follow`]), and at the poll after a launch command
//! or an unbind; a launch command for a kernel seen ended adopts no record
//! (the launch ends at the next poll, every block done: `Live::done_ahead`),
//! with no driver call and no walk of the run; a daemon that retires it
//! instead ([`ClientDevice::retire_answered`]: the launch and the unbind at
//! once) makes no launch at all. The kernels seen ended that
//! the engine has not launched yet are bounded ([`ENDED_WAITING_MAX`], over
//! all streams), so that the device's looks through them stay short: the
//! GPU gains nothing from running further
//! ahead of an engine that trails it. The kernels of a run record no end
//! event (`WorkerLaunch::lazy_end`): the launcher thread's job per kernel is
//! `cuLaunchKernel` alone (and an end write one time in [`PUBLISH_EVERY`]);
//! a poll that needs an end event (a run that stopped on a kernel that does
//! not publish; a kernel not seen ended 100 µs after its launch, which is
//! how a fault shows) records it then, behind the kernel on its stream.

mod behind;
mod holders;
mod tails;
#[cfg(test)]
pub(super) mod test_support;
mod uncancelled;

use super::clock::Part;
use super::{
    all_left, all_requested, failed, failed_with, op_is_short, place, start_segs, state_of, ClientDevice, InContext,
    KernelOp, Live, Neighbours, Placement, SegPlan, MAX_SPARE,
};
use crate::launch_plan::{Plan, SHORT_LAUNCH_NS};
use crate::preempt::WorkerLaunch;
use crate::runtime::Stream;
pub(super) use behind::BehindIndex;
use gpumux_engine::device::DeviceError;
use gpumux_engine::id_map::IdMap;
use gpumux_engine::ids::{LaunchId, OpId};
use gpumux_engine::ranges::BlockRanges;
use gpumux_engine::smset::SmSet;
pub(super) use holders::StreamHolders;
use std::time::Instant;
pub(super) use tails::Tails;
pub(super) use uncancelled::Uncancelled;

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
    /// Of `queued`, kernels queued natively behind a kernel that was itself
    /// queued (deep queue ahead, module doc).
    pub deep: u64,
    /// Kernels queued natively that were seen ended on the GPU before the
    /// engine launched them.
    pub ended_ahead: u64,
    /// Looks for a run's next kernel, bound and native, that found no launch
    /// record at hand (issue 35: what bounds how far the GPU runs ahead of
    /// the engine; counted per look, not per stop).
    pub held_no_record: u64,
    /// The same, held by [`ENDED_WAITING_MAX`] (the engine trails that far).
    pub held_ended_waiting: u64,
    /// The same, held by [`DEEP_MAX`] or [`DEEP_HOLD_NS`].
    pub held_deep: u64,
    /// Of `ended_ahead`, kernels seen ended by a look between polls
    /// (`between`).
    pub ended_between: u64,
    /// Of `deep`, kernels queued by a look between polls (`between`).
    pub queued_between: u64,
    /// Looks between polls that saw an end or queued a kernel (`between`).
    pub looks_between: u64,
    /// Of `ended_ahead`, kernels retired with no launch made
    /// ([`ClientDevice::retire_answered`]).
    pub retired: u64,
}

/// Kernels queued natively ahead on one stream and not yet seen ended, at
/// most (module doc, "Deep"). Enough to cover an engine round through the
/// device process (~20 µs) many times over with 5 µs kernels (32 of them are
/// ~180 µs of GPU work), while each holds a launch record.
pub const DEEP_MAX: usize = 32;
/// Expected GPU time of the kernels queued natively ahead on one stream and
/// not yet seen ended, at most (ns): what a peer of the same priority that
/// comes may wait for beyond the launch running. A tenth of
/// [`crate::launch_plan::NATIVE_HOLD_MAX_NS`] (the most one native launch
/// may hold the GPU), and about one ordinary kernel of a busy client.
pub const DEEP_HOLD_NS: f64 = 1_000_000.0;
/// A wave of an untimed kernel counts this long (ns) against
/// [`DEEP_HOLD_NS`]: a launch expected to take at most this runs natively
/// without preemption anyway (`launch_plan::SHORT_LAUNCH_NS`), and longer
/// kernels are timed ([`crate::launch_plan::TIMED_LAUNCHES`]) unless they
/// always ran natively. With [`DEEP_MAX`] the count bounds runs of untimed
/// one-wave kernels (32 × 20 µs = 640 µs counted).
pub const UNTIMED_WAVE_NS: f64 = SHORT_LAUNCH_NS;

/// Kernels queued natively, seen ended and not yet launched by the engine,
/// at most, over all streams (module doc, "Records back at the end"): past
/// it no run goes on until the engine catches up. Each is an entry the
/// device's polls and commands look through; the GPU gains nothing from
/// running far ahead of an engine that trails it (a program ends when the
/// engine has seen its last kernel end). With the device process's looks
/// between messages (gpumuxd's `GPUMUX_DEEPEN_BETWEEN`) a run's ends are seen
/// within ~45 µs and the engine learns them at its next poll, which waits
/// behind the binds of a burst: at 128 the runs stopped for 0.4-1.1 ms at a
/// time until it caught up (the chain's stage stamps on the H200, session
/// 34). With 256 the chain took 1.44-1.62x native in six runs (128: 2.26x
/// and 1.52x; the looks off: 1.61-1.86x); 1024 lost in two runs (1.72x,
/// 1.99x; not explained). docs/program-speed.md, "Runs between the core's
/// polls".
pub const ENDED_WAITING_MAX: usize = 8 * DEEP_MAX;

/// A kernel queued natively behind a kernel itself queued publishes its end
/// in host memory one time in this many (module doc, "Fewer end writes").
pub const PUBLISH_EVERY: u64 = 4;

/// What queued workers wait for on their stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Behind {
    /// A launch the engine made (it may have ended since).
    Launch(LaunchId),
    /// A kernel queued natively ahead (deep queue ahead, module doc).
    Queued(OpId),
}

/// Workers of one kernel operation queued behind the launch before it.
pub(in crate::client) struct Ahead {
    /// What they are queued behind.
    behind: Behind,
    /// The run of kernels of one stream it belongs to ([`Live::chain`]): the
    /// kernels of its own stream are no peers of it.
    pub(super) chain: u64,
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
    /// Queued natively, and seen ended on the GPU (module doc, "Ends seen ahead").
    ended: bool,
    /// Its expected GPU time (ns), for [`DEEP_HOLD_NS`].
    expect_ns: f64,
    /// The CUDA stream its workers are queued on (its handle's value): what
    /// is queued behind it must be on the same one, and the launch that
    /// adopts it must hold that one to queue more behind it.
    on_stream: usize,
    /// Every worker launch of it was started as the native kernel (kept:
    /// once seen ended its launch records are given back, and `segs` is
    /// empty; module doc, "Records back at the end").
    native: bool,
}

/// Every worker launch of `segs` (at least one) is the native kernel.
fn all_native(segs: &[WorkerLaunch]) -> bool {
    !segs.is_empty() && segs.iter().all(|w| w.last_plan() == Some(Plan::Native))
}

impl Ahead {
    /// Its kernel was queued natively (module doc, "Deep").
    fn native(&self) -> bool {
        self.native
    }

    /// A kernel queued natively whose end is still to be seen
    /// ([`super::watch`]: what a held poll watches).
    pub(super) fn watched(&self) -> bool {
        !self.ended && !self.cancelled && self.native() && !self.segs.is_empty()
    }

    /// Its end shows in host memory: it published it, or a later kernel's
    /// published end implied it (no driver call; [`super::watch`]).
    pub(super) fn end_landed(&self) -> bool {
        !self.segs.is_empty() && self.segs.iter().all(WorkerLaunch::end_in_host_memory)
    }
}

/// The expected GPU time of kernel operation `o`'s whole grid (module doc, "Deep").
fn expected_of(o: &KernelOp, sm_count: u32) -> f64 {
    o.whole_grid(sm_count).expected_ns(UNTIMED_WAVE_NS)
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

/// Queued workers of `priority`, not cancelled and not of `chain` (its own
/// stream's), are there (running, or about to run once the launch before them ends).
pub(super) fn peer_running(live: &Uncancelled, priority: i32, chain: Option<u64>) -> bool {
    live.peer(priority, chain)
}

/// Workers (not native launches) of a priority other than `priority` are
/// queued ahead, not cancelled.
pub(super) fn workers_of_others(ahead: &IdMap<OpId, Ahead>, live: &Uncancelled, priority: i32) -> bool {
    // Most often none of another priority is queued at all: no walk.
    live.other_priority(priority)
        && ahead
            .values()
            .filter(|a| a.priority != priority && !a.cancelled)
            .any(|a| a.segs.iter().any(|w| w.running() && !w.running_native()))
}

/// The operations of `priority` whose workers are queued ahead and not
/// cancelled, but those of `chain` (a stream's own are no peers of it).
/// No walk when the counts say there are none (`live`: most often, as in
/// one client's chain, every queued kernel is the run's own).
pub(super) fn peers<'a>(
    ahead: &'a IdMap<OpId, Ahead>,
    live: &Uncancelled,
    priority: i32,
    chain: Option<u64>,
) -> impl Iterator<Item = OpId> + 'a {
    let some = live.peer(priority, chain);
    some.then(|| ahead.iter().filter(move |(_, a)| a.priority == priority && !a.cancelled && Some(a.chain) != chain))
        .into_iter()
        .flatten()
        .map(|(&op, _)| op)
}

/// Workers are queued behind launch `lid` and not cancelled.
pub(super) fn queued_behind(index: &BehindIndex, ahead: &IdMap<OpId, Ahead>, lid: LaunchId) -> bool {
    index.find(ahead, Behind::Launch(lid), |a| !a.cancelled).is_some()
}

/// `stream` of launch `lid`, which ended: handed to workers queued behind
/// the launch (their order on it must hold), else returned for reuse.
pub(super) fn take_stream(st: &mut InContext, lid: LaunchId, stream: Stream) -> Option<Stream> {
    // The queued kernels first, then the orphans, as a walk of both would.
    let queued = st.behind.find(&st.ahead, Behind::Launch(lid), |a| a.stream.is_none());
    let mut orphans = st.orphans.iter_mut().map(|o| &mut o.1);
    let waiting = match queued {
        Some(op) => st.ahead.get_mut(&op),
        None => orphans.find(|a| a.behind == Behind::Launch(lid) && a.stream.is_none()),
    };
    match waiting {
        Some(a) => {
            if let Some(op) = queued {
                st.holders.held(stream.raw as usize, op);
            }
            a.stream = Some(stream);
            None
        }
        None => Some(stream),
    }
}

/// Whether the first kernel queued after `op` on its stream that publishes
/// its end (module doc, "Fewer end writes") has ended, which says that `op`
/// has (stream order); `None`: none after it publishes. `host_only`: from
/// host memory alone, no end event queried (a look between polls,
/// `between`).
fn later_end(st: &InContext, op: OpId, host_only: bool) -> Result<Option<bool>, crate::CudaError> {
    let mut at = op;
    while let Some(n) = st.ops.get(&at).and_then(|o| o.next) {
        let Some(x) = st.ahead.get(&n) else { return Ok(None) };
        if x.ended {
            // Seen ended (its records given back): so has everything before it.
            return Ok(Some(true));
        }
        if !x.segs.is_empty() && !x.segs.iter().any(WorkerLaunch::end_unpublished) {
            if host_only {
                return Ok(Some(x.end_landed()));
            }
            return all_left(&x.segs).map(Some);
        }
        at = n;
    }
    Ok(None)
}

/// The first kernel of each run queued natively not seen ended whose
/// predecessor has (or whose launch before it is gone): where a walk of the
/// run in stream order starts ([`ClientDevice::poll_ahead`]). One behind a
/// launch still running is left to the poll after the launch ended: looking
/// at it may query an end event (the driver's lock), and it cannot have
/// ended before that launch. `host_only` (a look between polls,
/// `between`): one behind a launch that adopted a kernel seen ended
/// is a head too (that launch ended on the GPU; it leaves the table only at
/// the next poll, and the engine's launch commands keep coming meanwhile).
fn run_heads(st: &InContext, host_only: bool) -> impl Iterator<Item = OpId> + '_ {
    unended(st)
        .filter(|(_, a)| !a.ended && !a.cancelled && a.native())
        .filter(move |(_, a)| match a.behind {
            Behind::Launch(lid) => st.launches.get(&lid).is_none_or(|l| host_only && l.done_ahead),
            Behind::Queued(p) => st.ahead.get(&p).is_none_or(|b| b.ended),
        })
        .map(|(&op, _)| op)
}

/// What the run ending with kernel `prev` (queued natively) holds, for
/// [`ClientDevice::queue_one_deeper`] (module doc, "Deep").
#[derive(Debug, PartialEq)]
enum RunHeld {
    /// Its kernels not seen ended, and their expected GPU time with the
    /// next kernel's: within [`DEEP_MAX`] and the hold.
    Room {
        /// Kernels queued and not seen ended.
        queued: usize,
        /// Their expected GPU time and the next kernel's (ns).
        ns: f64,
    },
    /// At [`DEEP_MAX`], or past the hold with the next kernel.
    Full,
}

/// The run back from `prev` to its first kernel not seen ended: what it
/// holds (ends are seen in stream order, so every kernel before that one
/// ended; a walk to the run's launch cost a step per kernel the engine had
/// not launched yet, hundreds once the GPU ran ahead). `expect_ns` is the
/// next kernel's expected GPU time, `hold_ns` the run's bound.
///
/// A kernel queued behind one its client dropped is walked on through
/// `orphans` (what is still on the GPU ahead of the run counts). A kernel
/// queued behind one found in neither is the run's first, as one behind a
/// launch is: that one was seen ended and retired with its unbind
/// ([`ClientDevice::retire_answered`], which hands nothing over to a launch).
/// (Taken for a lost run before, such a run went on only once its first
/// kernel was seen ended: after each retire, no bind queued a kernel behind
/// it until then.)
fn run_held(
    ahead: &IdMap<OpId, Ahead>,
    orphans: &[(OpId, Ahead)],
    prev: OpId,
    expect_ns: f64,
    hold_ns: f64,
) -> RunHeld {
    let (mut queued, mut ns, mut at) = (0usize, expect_ns, prev);
    let entry = |op: OpId| ahead.get(&op).or_else(|| orphans.iter().find(|o| o.0 == op).map(|o| &o.1));
    // `prev` is queued (its caller's look).
    while let Some(e) = entry(at) {
        if e.ended {
            break;
        }
        queued += 1;
        ns += e.expect_ns;
        if queued >= DEEP_MAX || ns > hold_ns {
            return RunHeld::Full;
        }
        match e.behind {
            Behind::Queued(p) => at = p,
            Behind::Launch(_) => break,
        }
    }
    if ns > hold_ns {
        RunHeld::Full
    } else {
        RunHeld::Room { queued, ns }
    }
}

/// The queued kernels not seen ended (and maybe a few that were: check
/// `ended`), without a walk of those seen ended (`InContext::unended`).
pub(super) fn unended(st: &InContext) -> impl Iterator<Item = (&OpId, &Ahead)> + '_ {
    st.unended.iter().filter_map(|op| st.ahead.get_key_value(op))
}

/// Kernel `op`, queued natively, was seen ended: its blocks are done, and
/// its launch records go back to the spares at once, for the next kernels
/// of the run (module doc, "Records back at the end"); `segs` are its
/// worker launches, all ended.
fn give_back_records(st: &mut InContext, op: OpId, segs: Vec<WorkerLaunch>) -> Result<(), crate::CudaError> {
    let loaded = st.ops.get(&op).is_some_and(|o| st.kernels.contains_key(&o.handle));
    for mut w in segs {
        let from = w.next as u64;
        let out = w.finish()?;
        if let Some(k) = st.ops.get_mut(&op) {
            k.left.remove(from..out.next as u64);
        }
        if loaded && st.spare.len() < MAX_SPARE {
            st.spare.push(w);
        } else {
            st.park_or_free(w);
        }
    }
    Ok(())
}

/// Whether kernel `op`, queued as `a`, is cancelled by a launch of the
/// engine on `sms` ([`ClientDevice::cancel_ahead_on`]): queued on those SMs,
/// not `except` (the launch's own operation) nor of its run (`own`), and not
/// a native kernel of `priority`, the launch's (peers' short kernels run
/// natively: [`super::peers`]).
fn cancelled_by_launch(op: OpId, a: &Ahead, sms: SmSet, except: Option<OpId>, own: Option<u64>, priority: i32) -> bool {
    Some(op) != except
        && Some(a.chain) != own
        && !(a.native() && a.priority == priority)
        && !a.held.intersection(&sms).is_empty()
}

impl InContext {
    /// `op`'s entry taken out of the kernels queued ahead, with the indexes
    /// over them kept right (what waits behind what, the runs' stream
    /// holders and tails, the expected time not cancelled): an adoption, a
    /// retire and an unbind each take one so.
    fn take_ahead(&mut self, op: OpId) -> Option<Ahead> {
        let a = self.ahead.remove(&op)?;
        self.behind.left(op, &a);
        self.holders.left(op, &a);
        if let Behind::Queued(p) = a.behind {
            self.tails.note(p);
        }
        if !a.cancelled {
            self.uncancelled.sub(&a);
        }
        Some(a)
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
        let queued = st.ahead.contains_key(&after);
        if queued {
            // It may be a run's tail now (`tails`).
            st.tails.note(after);
        }
        if let Some(lid) = running {
            if let Err(e) = self.try_queue_ahead(lid) {
                // Not queued: the launch command starts it as usual.
                tracing::warn!("CUDA device: queueing {op} behind launch {lid}: {e}");
            }
        } else if queued {
            if let Err(e) = self.queue_deeper(after) {
                tracing::warn!("CUDA device: queueing {op} behind {after}, itself queued: {e}");
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
        let higher = &self.higher;
        let st = state_of(&self.ctx, &mut self.st).map_err(failed("making the context current"))?;
        let InContext {
            launches,
            ops,
            spare,
            ahead,
            orphans,
            launcher,
            behind: st_index,
            uncancelled,
            unended,
            tails,
            ..
        } = st;
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
        // a launch over every SM cannot miss its SMs. Nor can a native one: its
        // grid runs every block wherever slots free.
        let native_before = live.segs.iter().all(|w| w.running() && w.last_plan() == Some(Plan::Native));
        let mask = live.place.mask;
        if mask.len() < sm_count && !native_before {
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
        if !all_requested(&live.requested, &first.left)
            || launches.iter().any(|(&l, x)| l != lid && (x.op == live.op || x.op == next))
            || ahead.contains_key(&next)
        {
            return Ok(());
        }
        let Some(covers) = ops.get(&next).filter(|o| !o.unbound).map(|o| o.left.clone()) else { return Ok(()) };
        if covers.is_empty() {
            return Ok(());
        }
        if native_before && higher.active_above(live.priority, Instant::now()) {
            // Not natively behind it while a higher priority is active (`super::higher`).
            return Ok(());
        }
        let neighbours = Neighbours {
            launches,
            ahead,
            queued: uncancelled,
            priority: live.priority,
            except: Some(lid),
            chain: Some(live.chain),
        };
        let (native_anywhere, native_if_long) = neighbours.hw_native(hw_priority);
        // Beside peers, a kernel known short runs natively (`super::peers`):
        // behind a native launch it is queued natively, as alone; behind
        // workers it is not queued (as a long one alone, below), so that its
        // launch command starts it natively and its stream's run begins
        // there: queued as workers, each kernel adopted would queue the next
        // as workers again, and the stream would never leave them.
        let short = || ops.get(&next).is_some_and(|o| op_is_short(o, sm_count));
        let beside_peers = !native_if_long && neighbours.native_beside_peers(hw_priority, short());
        if beside_peers && !native_before {
            return Ok(());
        }
        let native_anywhere = native_anywhere || beside_peers;
        self.peer_counts.queued += (beside_peers && native_before) as u64;
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
                if o.whole_grid(sm_count).is_long() {
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
            publish_end: true,
            lazy_end: native_before,
        };
        let mut segs = Vec::new();
        // Made by the launcher thread: nobody waits for these workers until
        // the engine launches `next` (`adopt` waits for the calls then).
        let post = launcher.as_ref().map(|l| (l, ctx));
        let started = start_segs(ops, spare, next, &covers, &live.stream, how, lid, &mut segs, post, &mut self.clock);
        let (held, place) = (live.sms, live.place);
        let (priority, chain) = (live.priority, live.chain);
        let expect_ns = ops.get(&next).map_or(0.0, |o| expected_of(o, sm_count));
        let behind = Behind::Launch(lid);
        let (cancelled, ended) = (false, false);
        let on_stream = live.stream.raw as usize;
        let native = all_native(&segs);
        let a = Ahead {
            behind,
            chain,
            held,
            place,
            covers,
            stream: None,
            segs,
            cancelled,
            priority,
            ended,
            expect_ns,
            on_stream,
            native,
        };
        if let Some(l) = launches.get_mut(&lid) {
            l.note("the next kernel queued behind it");
        }
        st_index.queued(ahead, behind, next);
        uncancelled.add(&a);
        unended.insert(next);
        tails.note(next);
        // Even if a start failed, the ones that started are tracked (and
        // the error says the context is gone, or the daemon stops).
        tracing::trace!("CUDA device: {next} queued behind launch {lid} ({place:?})");
        self.native_launches += a.segs.iter().filter(|w| w.last_plan() == Some(Plan::Native)).count() as u64;
        let deepen = native_before && a.native();
        ahead.insert(next, a);
        self.ahead_counts.queued += 1;
        started.map_err(failed_with(|| format!("queueing {next} behind launch {lid}")))?;
        // Behind a native kernel queued natively, the kernels after it too (module doc, "Deep").
        if deepen {
            self.queue_deeper(next)?;
        }
        Ok(())
    }

    /// Queues natively, behind `prev` (a kernel queued natively ahead), the
    /// kernels after it on its stream that are bound and would run natively,
    /// within [`DEEP_MAX`] and [`DEEP_HOLD_NS`] (module doc, "Deep").
    pub(super) fn queue_deeper(&mut self, mut prev: OpId) -> Result<(), DeviceError> {
        while let Some(next) = self.queue_one_deeper(prev)? {
            prev = next;
        }
        Ok(())
    }

    /// [`ClientDevice::queue_deeper`]'s step: the kernel right after `prev`,
    /// if it was queued natively (the run may go on behind it).
    fn queue_one_deeper(&mut self, prev: OpId) -> Result<Option<OpId>, DeviceError> {
        if !self.queue_ahead || !self.hw_priority {
            return Ok(None);
        }
        let (chunk, sm_count, ctx) = (self.chunk, self.info.num_sms as u32, self.ctx.raw());
        let st = state_of(&self.ctx, &mut self.st).map_err(failed("making the context current"))?;
        let st_ended_waiting = st.ended_waiting;
        let InContext {
            launches,
            ops,
            spare,
            ahead,
            orphans,
            launcher,
            behind: index,
            uncancelled,
            unended,
            holders,
            tails,
            ..
        } = st;
        let Some(a) = ahead.get(&prev) else { return Ok(None) };
        if a.cancelled || !a.native() {
            return Ok(None);
        }
        let (chain, priority, place, held, on_stream) = (a.chain, a.priority, a.place, a.held, a.on_stream);
        // Beside peers of its priority a run holds far less (`super::peers`).
        let neighbours =
            Neighbours { launches, ahead, queued: uncancelled, priority, except: None, chain: Some(chain) };
        let hold_ns = self.peers.hold_ns(neighbours.alone());
        let Some(next) = ops.get(&prev).and_then(|o| o.next) else { return Ok(None) };
        if ahead.contains_key(&next) || launches.values().any(|l| l.op == next) {
            return Ok(None);
        }
        let Some(o) = ops.get(&next).filter(|o| !o.unbound && o.kernel.native.is_some()) else { return Ok(None) };
        // One clock read for the look and, if it is queued, its start (`higher`).
        let now = Instant::now();
        if self.higher.active_above(priority, now) {
            // A higher priority is active: no more of this run (`super::higher`).
            self.ahead_counts.held_deep += 1;
            return Ok(None);
        }
        let total: u64 = o.grid.iter().map(|&g| g as u64).product();
        // Compared in place: `BlockRanges::full` would allocate a set per look.
        if total == 0 || o.left.ranges() != std::slice::from_ref(&(0..total)) {
            // A native grid runs whole, from block 0.
            return Ok(None);
        }
        if o.pool.is_empty() && spare.is_empty() {
            // No record at hand: not worth a new one's 1-2 ms here (module doc).
            self.ahead_counts.held_no_record += 1;
            return Ok(None);
        }
        if st_ended_waiting >= ENDED_WAITING_MAX {
            // The engine trails far behind: the run waits for it (module doc, "Records back at the end").
            self.ahead_counts.held_ended_waiting += 1;
            return Ok(None);
        }
        // What the run holds back to its first kernel not seen ended (`run_held`).
        // Its whole grid, weighed once: each weighing asks the profile cache
        // (a lock and a hash of the kernel's name), and this one was asked three times.
        let whole = o.whole_grid(sm_count);
        let expect_ns = whole.expected_ns(UNTIMED_WAVE_NS);
        let (queued, ns) = match run_held(ahead, orphans, prev, expect_ns, hold_ns) {
            RunHeld::Room { queued, ns } => (queued, ns),
            RunHeld::Full => {
                self.ahead_counts.held_deep += 1;
                return Ok(None);
            }
        };
        // Only on the stream the kernel before it is queued on (stream
        // order), held by the run (its launch, or its first kernel once
        // that launch ended).
        // The queued kernel that holds it found by one look (`holders`).
        let own = |s: &&Stream| s.raw as usize == on_stream;
        let mut held_by_launch = launches.values().filter(|l| l.chain == chain).map(|l| &l.stream);
        let holder = held_by_launch.find(own).or_else(|| holders.find(ahead, on_stream, chain));
        let Some(stream) = holder else { return Ok(None) };
        let root = LaunchId(chain);
        // Natively as a launch command would run it alone at its priority
        // (`hw_native`; its own stream's kernels are no peers), and only so.
        let (native_anywhere, native_if_long) = neighbours.hw_native(true);
        // Beside peers, natively if known short (`super::peers`).
        let short = o.kernel.native.is_some() && whole.is_short();
        let beside_peers = !native_if_long && neighbours.native_beside_peers(true, short);
        let native_anywhere = native_anywhere || beside_peers;
        if whole.holds_too_long() || !(native_anywhere || (native_if_long && whole.is_long())) {
            return Ok(None);
        }
        self.peer_counts.queued += beside_peers as u64;
        // Its priority's work goes on the GPU now, ahead of the engine.
        self.higher.started(priority, now);
        let covers = o.left.clone();
        // One kernel's end in PUBLISH_EVERY is published, and that of the
        // last one the run can hold as far as can be told now (module doc,
        // "Fewer end writes"); the ends before it are known from it.
        let after = o.next.and_then(|n| ops.get(&n)).filter(|x| !x.unbound);
        let last = after.is_none_or(|x| {
            queued + 1 >= DEEP_MAX || ns + expected_of(x, sm_count) > hold_ns || spare.len() + o.pool.len() <= 1
        });
        let publish_end = last || (self.ahead_counts.deep + 1).is_multiple_of(PUBLISH_EVERY);
        let lazy_end = true;
        let how = SegPlan {
            place,
            never_native: false,
            native_anywhere,
            native_if_long,
            chunk,
            sm_count,
            publish_end,
            lazy_end,
        };
        let mut segs = Vec::new();
        let post = launcher.as_ref().map(|l| (l, ctx));
        let started = start_segs(ops, spare, next, &covers, stream, how, root, &mut segs, post, &mut self.clock);
        let behind = Behind::Queued(prev);
        let (cancelled, ended) = (false, false);
        let native = all_native(&segs);
        let a = Ahead {
            behind,
            chain,
            held,
            place,
            covers,
            stream: None,
            segs,
            cancelled,
            priority,
            ended,
            expect_ns,
            on_stream,
            native,
        };
        tracing::trace!("CUDA device: {next} queued natively behind {prev} (run behind launch {root})");
        let native = a.native();
        self.native_launches += a.segs.iter().filter(|w| w.last_plan() == Some(Plan::Native)).count() as u64;
        index.queued(ahead, Behind::Queued(prev), next);
        uncancelled.add(&a);
        unended.insert(next);
        tails.note(next);
        ahead.insert(next, a);
        self.ahead_counts.queued += 1;
        self.ahead_counts.deep += 1;
        started.map_err(failed_with(|| format!("queueing {next} behind {prev}")))?;
        Ok(native.then_some(next))
    }

    /// Marks the kernels queued natively that ended on the GPU, in stream
    /// order (module doc, "Ends seen ahead"): one behind a kernel not seen
    /// ended is not looked at (it cannot have ended, and a look may query
    /// its end event, which takes the driver's lock). Reports them where
    /// asked ([`ClientDevice::set_report_ends_ahead`]). A fault shows here as
    /// in any poll: the error of the end event's query.
    pub(super) fn poll_ahead(&mut self) -> Result<bool, DeviceError> {
        self.poll_ahead_in(false)
    }

    /// [`ClientDevice::poll_ahead`]; `host_only`: from the ends in host
    /// memory alone, no driver call (a look between polls, `between`):
    /// a run's walk stops at its first kernel whose end does not show there.
    pub(super) fn poll_ahead_in(&mut self, host_only: bool) -> Result<bool, DeviceError> {
        if self.st.as_ref().is_none_or(|st| st.ahead.is_empty()) {
            return Ok(false);
        }
        let report = self.report_ends;
        let st = state_of(&self.ctx, &mut self.st).map_err(failed("making the context current"))?;
        // The first kernel of each run not seen ended whose predecessor has
        // (or whose launch before it is gone); each run is then walked in
        // stream order, once (a pass per end cost a run of 32 ends ~1,000 looks).
        let ahead = &st.ahead;
        st.unended.retain(|op| ahead.get(op).is_some_and(|a| !a.ended));
        // Into a list kept between polls (one vector allocated per poll before).
        let mut heads = std::mem::take(&mut self.heads);
        heads.clear();
        heads.extend(run_heads(st, host_only));
        let walked = self.walk_runs(&heads, report, host_only);
        self.heads = heads;
        walked
    }

    /// [`ClientDevice::poll_ahead`]'s walk of each run from its head
    /// (`heads`): whether it saw a kernel end; `host_only` as there.
    fn walk_runs(&mut self, heads: &[OpId], report: bool, host_only: bool) -> Result<bool, DeviceError> {
        let mut any = false;
        let st = state_of(&self.ctx, &mut self.st).map_err(failed("making the context current"))?;
        for &head in heads {
            let mut op = head;
            loop {
                let polling = || format!("polling {op}'s kernel queued ahead");
                let Some(a) = st.ahead.get(&op) else { break };
                if !a.ended {
                    if a.cancelled || !a.native() {
                        break;
                    }
                    if a.segs.iter().any(WorkerLaunch::end_unpublished) {
                        // Its end is known from a later kernel's, if one publishes (module doc).
                        match later_end(st, op, host_only).map_err(failed_with(polling))? {
                            Some(false) => break,
                            Some(true) => st
                                .ahead
                                .get_mut(&op)
                                .into_iter()
                                .flat_map(|a| a.segs.iter_mut())
                                .for_each(|w| w.ended_before()),
                            None => {}
                        }
                    }
                    let Some(a) = st.ahead.get_mut(&op) else { break };
                    let left =
                        if host_only { a.end_landed() } else { all_left(&a.segs).map_err(failed_with(polling))? };
                    if !left {
                        break;
                    }
                    a.ended = true;
                    st.ended_waiting += 1;
                    any = true;
                    self.ahead_counts.ended_ahead += 1;
                    tracing::trace!("CUDA device: {op}, queued natively, seen ended ahead");
                    if report {
                        let blocks = a.covers.len();
                        self.ends_ahead.push((op, blocks));
                    }
                    if host_only {
                        // Seen by a look between polls: stamped now (issue 35's
                        // stage stamps; the poll that reports it stamps it again,
                        // and the report keeps a stage's first time).
                        gpumux_stamps::stamp(gpumux_stamps::Stage::EndSeenAhead, op.0, 0);
                    }
                    let segs = std::mem::take(&mut a.segs);
                    give_back_records(st, op, segs).map_err(failed_with(polling))?;
                }
                match st.ops.get(&op).and_then(|o| o.next) {
                    Some(n) => op = n,
                    None => break,
                }
            }
        }
        Ok(any)
    }

    /// After a poll saw kernels queued natively end: each run of them goes
    /// on from its last kernel, within its bounds again (module doc, "Deep").
    pub(super) fn deepen_tails(&mut self) -> Result<(), DeviceError> {
        let Some(st) = self.st.as_mut() else { return Ok(()) };
        // From the candidates, not a walk of every queued kernel (`tails`).
        let mut tails = std::mem::take(&mut self.tails);
        let ops = &st.ops;
        st.tails.list(&st.ahead, |op| ops.get(&op).and_then(|o| o.next), &mut tails);
        let went = tails.iter().try_for_each(|&op| self.queue_deeper(op));
        self.tails = tails;
        went
    }

    /// [`ClientDevice::deepen_tails`] by at most `posts` kernels queued (a
    /// look between polls, `between`): whether it stopped there
    /// with a run that might go on.
    pub(super) fn deepen_tails_upto(&mut self, posts: usize) -> Result<bool, DeviceError> {
        let Some(st) = self.st.as_mut() else { return Ok(false) };
        let mut tails = std::mem::take(&mut self.tails);
        let ops = &st.ops;
        st.tails.list(&st.ahead, |op| ops.get(&op).and_then(|o| o.next), &mut tails);
        let mut left = posts;
        let mut went = Ok(false);
        'runs: for &tail in &tails {
            let mut prev = tail;
            loop {
                if left == 0 {
                    went = Ok(true);
                    break 'runs;
                }
                match self.queue_one_deeper(prev) {
                    Ok(Some(next)) => {
                        left -= 1;
                        prev = next;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        went = Err(e);
                        break 'runs;
                    }
                }
            }
        }
        self.tails = tails;
        went
    }

    /// Running native launches whose end is not published (module doc,
    /// "Fewer end writes") are marked ended once a kernel queued after them
    /// on their stream published its end: their poll then needs no query of
    /// their end event (which takes the driver's lock the launcher thread's
    /// calls wait for).
    pub(super) fn mark_implied_ends(&mut self) -> Result<(), DeviceError> {
        let Some(st) = self.st.as_mut() else { return Ok(()) };
        if st.ahead.is_empty() {
            return Ok(());
        }
        // Into a list kept between polls (one vector allocated per poll before).
        let mut waiting = std::mem::take(&mut self.implied);
        waiting.clear();
        let unpublished = st.launches.iter().filter(|(_, l)| l.segs.iter().any(WorkerLaunch::end_unpublished));
        waiting.extend(unpublished.map(|(&lid, l)| (lid, l.op)));
        let mut marked = Ok(());
        for &(lid, op) in &waiting {
            let known = match later_end(st, op, false) {
                Ok(known) => known,
                Err(e) => {
                    marked = Err(failed_with(|| format!("polling what follows launch {lid}"))(e));
                    break;
                }
            };
            if known == Some(true) {
                if let Some(l) = st.launches.get_mut(&lid) {
                    l.segs.iter_mut().for_each(WorkerLaunch::ended_before);
                }
            }
        }
        self.implied = waiting;
        marked
    }

    /// Notes the GPU's lead over the engine at a poll that finds kernels
    /// queued natively ([`super::lead`]).
    pub(super) fn note_lead(&mut self) {
        let Some(st) = self.st.as_ref() else { return };
        let queued = unended(st).filter(|(_, a)| a.native() && !a.cancelled && !a.ended).count();
        if queued > 0 || st.ended_waiting > 0 {
            self.lead.note(queued, st.ended_waiting);
        }
    }

    /// Whether kernels queued natively that end before the engine launches
    /// them are kept for [`ClientDevice::take_ends_ahead`] (the daemon's
    /// device process asks; off by default, where nobody would take them).
    pub fn set_report_ends_ahead(&mut self, on: bool) {
        self.report_ends = on;
        if !on {
            self.ends_ahead.clear();
        }
    }

    /// Kernel operations queued natively ahead that ran every block (the
    /// second: their blocks from 0, the whole grid) before the engine
    /// launched them, seen since the last call
    /// ([`ClientDevice::set_report_ends_ahead`]). The engine's launch command
    /// for such an operation is still to come; the device ends that launch
    /// as soon as it comes (a poll after), every block done.
    /// Drained, so that the list keeps its room for the next poll's (a
    /// poll's ends were pushed into a new vector, growing it a few times).
    pub fn take_ends_ahead(&mut self) -> impl Iterator<Item = (OpId, u64)> + '_ {
        self.ends_ahead.drain(..)
    }

    /// Cancels the workers queued behind launch `lid` (before it is asked
    /// to leave any SM: see the module doc).
    pub(super) fn cancel_ahead_behind(&mut self, lid: LaunchId) -> Result<(), DeviceError> {
        // Found by the index, not a walk, when nothing is (`behind`).
        let queued = |st: &InContext| st.behind.find(&st.ahead, Behind::Launch(lid), |a| !a.cancelled).is_some();
        if !self.st.as_ref().is_some_and(queued) {
            return Ok(());
        }
        self.cancel_where(|_, a| a.behind == Behind::Launch(lid))
    }

    /// Cancels queued workers on SMs the engine gives to a launch of
    /// another operation than `except` (`sms`), but not the kernels queued
    /// natively behind `except` on its own stream (they follow it), nor,
    /// since peers' short kernels run natively ([`super::peers`]), kernels
    /// queued natively of `priority`, the launch's: a native grid does not
    /// hold the SMs it was queued on (it takes free slots anywhere) and
    /// cannot be called back, so a cancel would only end its stream's run,
    /// which [`super::peers::PEER_HOLD_NS`] bounds already.
    pub(super) fn cancel_ahead_on(
        &mut self,
        sms: SmSet,
        except: Option<OpId>,
        priority: i32,
    ) -> Result<(), DeviceError> {
        let own = except.and_then(|op| self.st.as_ref()?.ahead.get(&op).map(|a| a.chain));
        // Only another run's kernels can be hit: when none is queued (one
        // client's chain), no walk (`uncancelled`).
        let others = |st: &InContext| own.map_or(st.uncancelled.any(), |c| st.uncancelled.other_chain(c));
        if !self.st.as_ref().is_some_and(others) {
            return Ok(());
        }
        self.cancel_where(|op, a| cancelled_by_launch(op, a, sms, except, own, priority))
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
            if let Behind::Launch(lid) = a.behind {
                if let Some(l) = st.launches.get_mut(&lid) {
                    l.note("the kernel queued behind it cancelled");
                }
            }
            a.cancelled = true;
            st.uncancelled.sub(a);
            self.ahead_counts.cancelled += 1;
            tracing::trace!("CUDA device: {op}'s queued workers (behind {:?}) cancelled", a.behind);
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
        // The launch before it may still be in the table, its kernel ended: a
        // daemon that answered that launch from its end seen ahead sends this
        // one before the device has polled (`set_report_ends_ahead`). It ends
        // first (its events go out before this launch's), so that its stream
        // passes to these workers: what is queued behind them is on it, and a
        // fresh stream would let the next kernels run before those.
        let before = self.st.as_ref().and_then(|st| {
            let a = st.ahead.get(&live.op).filter(|a| a.stream.is_none())?;
            match a.behind {
                Behind::Launch(prev) if st.launches.contains_key(&prev) => Some(prev),
                _ => None,
            }
        });
        if let Some(prev) = before {
            // That launch alone: the engine already has its end (another's
            // end between two commands would cross a command for it).
            self.poll_launches_of(Some(prev))?;
            if self.st.as_ref().is_some_and(|st| st.launches.contains_key(&prev)) {
                tracing::debug!("CUDA device: launch {lid} adopts its queued kernel before launch {prev} ended");
            }
        }
        let st = state_of(&self.ctx, &mut self.st).map_err(failed("making the context current"))?;
        let Some(mut a) = st.take_ahead(live.op) else {
            st.launches.insert(lid, live);
            return self.start_workers(lid);
        };
        if a.ended {
            st.ended_waiting = st.ended_waiting.saturating_sub(1);
            // Seen ended by a look between polls and not reported yet
            // (`between`): the launch command came first, and the
            // device ends the launch itself, so the end goes to the engine
            // once, as this launch's. (A poll's ends are taken with its
            // answer: none is left here then.)
            if !self.ends_ahead.is_empty() {
                self.ends_ahead.retain(|&(o, _)| o != live.op);
            }
        }
        // What is queued natively behind it waits for this launch now
        // (found by the index, not a walk of every queued kernel: `behind`).
        st.behind.hand_over(&mut st.ahead, &mut st.orphans, live.op, lid);
        live.chain = a.chain;
        // The stream they are queued on is `behind`'s until it ends (and the
        // engine launches an operation only after the one before it on its
        // stream ended, so it has); the fresh one goes back.
        let mut clean = !a.cancelled;
        match a.stream.take() {
            Some(s) => {
                // Not the stream they are on (a launch before them that did
                // not end first, above): nothing may be queued behind them.
                clean &= s.raw as usize == a.on_stream;
                let fresh = std::mem::replace(&mut live.stream, s);
                st.return_stream(fresh);
            }
            None => clean = false,
        }
        // A native kernel runs its whole grid wherever slots free: the SMs the
        // engine gives its launch (a chain of small grids gets a few, other
        // ones each time) are its account, not where it runs, so it is taken
        // as it is wherever the engine puts it. Workers must run where the
        // engine says.
        let native = a.native();
        let place = if native {
            a.place
        } else {
            let (place, corun) = place(co_locate, self.chooser.as_mut(), sm_count, st, &live);
            live.corun = corun;
            place
        };
        clean &= place == a.place && !live.sms.is_empty() && all_requested(&live.requested, &a.covers);
        if !clean && !a.cancelled {
            for w in &a.segs {
                w.retreat(&st.ctl).map_err(failed_with(|| format!("moving the queued workers of launch {lid}")))?;
            }
        }
        live.segs = std::mem::take(&mut a.segs);
        // Seen ended ahead: no worker launch left, every block done; it ends
        // at the next poll (`Live::done_ahead`).
        live.done_ahead = live.segs.is_empty() && a.ended;
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
            // Behind it, if nothing is queued yet; the run already queued
            // behind it is extended at the next poll ([`ClientDevice::deepen_tails`]),
            // not here: the command stays off the driver and its lock.
            let t = self.clock.start();
            let queued = self.try_queue_ahead(lid);
            self.clock.part(Part::QueueAhead, t);
            self.refill_ahead = true;
            queued
        } else {
            Ok(())
        }
    }

    /// The daemon answered launch `launch` of `op` from its end seen ahead
    /// and unbinds `op` right after, in one message (the daemon's default;
    /// `GPUMUX_RETIRE_ANSWERED=0` turns it off): what [`ClientDevice::submit_answered`]
    /// and [`ClientDevice::unbind`] do for such a kernel, less what only
    /// the launch made (a `Live` launch, ended at the next poll with an end
    /// the daemon dropped). The kernel was seen ended and its records went
    /// back then; here its queued entry goes, its stream passes to the
    /// kernel queued behind it on it (its place in the stream's order), and
    /// the operation is forgotten. No event, and no walk of the run.
    /// What is queued behind it is handed over to no launch (none is made):
    /// it still waits for `op`, no longer queued, and so is its run's first,
    /// as one queued behind a launch is (`run_held`, `run_heads`).
    /// A run that ended with it goes on behind it by one kernel first, while
    /// it still holds the stream (the only driver work here, on the launcher
    /// thread; an adoption of such a kernel queued none: its launch had no
    /// worker to queue behind), and a launch before it that the daemon
    /// answered the old way (still on the device, ended) ends first, as at
    /// an adoption.
    ///
    /// An operation not seen ended ahead here contradicts what the engine was
    /// told (the daemon answers only the ends this device reported): an error.
    pub fn retire_answered(&mut self, launch: LaunchId, op: OpId) -> Result<(), DeviceError> {
        let seen = self.st.as_ref().and_then(|st| st.ahead.get(&op)).map(|a| (a.ended, a.behind));
        let behind = match seen {
            Some((true, behind)) => behind,
            _ => {
                let state = if seen.is_some() { "queued and not seen ended" } else { "not queued ahead" };
                let why = crate::CudaError::Invalid(format!("{op} was retired as seen ended ahead, but it is {state}"));
                return Err(DeviceError::backend(format!("launch {launch}"), why));
            }
        };
        // That launch alone, as an adoption would (`adopt`): its stream then
        // passes to this kernel, and below to the one behind it.
        if let Behind::Launch(prev) = behind {
            if self.st.as_ref().is_some_and(|st| st.launches.contains_key(&prev)) {
                self.poll_launches_of(Some(prev))?;
            }
        }
        let Some(st) = self.st.as_mut() else { return Ok(()) };
        st.ended_waiting = st.ended_waiting.saturating_sub(1);
        // Seen by a look between polls and not reported yet: the daemon
        // answered it from an earlier report, so none is left; as `adopt`.
        if !self.ends_ahead.is_empty() {
            self.ends_ahead.retain(|&(o, _)| o != op);
        }
        // The run ends with it: one more behind it while it still holds the
        // stream (the rest at the next poll: `refill_ahead`, set by the
        // unbind below; `run_held` walks back to that one, its first).
        let last = st.behind.find(&st.ahead, Behind::Queued(op), |_| true).is_none();
        if last {
            if let Err(e) = self.queue_one_deeper(op) {
                // Not queued: its launch command starts it as usual.
                tracing::warn!("CUDA device: queueing the kernel after {op}, retired: {e}");
            }
        }
        let now = Instant::now();
        let Some(st) = self.st.as_mut() else { return Ok(()) };
        let Some(mut a) = st.take_ahead(op) else { return Ok(()) };
        // A launch command for it would have counted (`higher`).
        self.higher.started(a.priority, now);
        if let Some(stream) = a.stream.take() {
            // The kernel behind it on that stream keeps their order on it,
            // else an orphan there until it is reaped; with none, the stream
            // goes back (as `take_stream` at a launch's end).
            let raw = stream.raw as usize;
            let waits = |b: &Ahead| b.behind == Behind::Queued(op) && b.stream.is_none() && b.on_stream == raw;
            let next = st.behind.find(&st.ahead, Behind::Queued(op), |b| waits(b));
            match next.and_then(|n| st.ahead.get_mut(&n).map(|b| (n, b))) {
                Some((n, b)) => {
                    b.stream = Some(stream);
                    st.holders.held(raw, n);
                }
                None => match st.orphans.iter_mut().map(|o| &mut o.1).find(|b| waits(b)) {
                    Some(b) => b.stream = Some(stream),
                    None => st.return_stream(stream),
                },
            }
        }
        self.ahead_counts.retired += 1;
        // The operation goes as at its unbind (the run goes on at the next poll).
        self.unbind(op);
        Ok(())
    }

    /// `op` is unbound: workers queued for it are cancelled and reaped once gone.
    pub(super) fn drop_ahead(&mut self, op: OpId) -> Result<(), DeviceError> {
        if !self.st.as_ref().is_some_and(|st| st.ahead.contains_key(&op)) {
            return Ok(());
        }
        let st = state_of(&self.ctx, &mut self.st).map_err(failed("making the context current"))?;
        let Some(mut a) = st.take_ahead(op) else { return Ok(()) };
        if a.ended {
            st.ended_waiting = st.ended_waiting.saturating_sub(1);
            // Seen ended by a look between polls, not reported yet
            // (`between`): the operation is gone (its client
            // died), and the daemon forgot it; nothing to report.
            if !self.ends_ahead.is_empty() {
                self.ends_ahead.retain(|&(o, _)| o != op);
            }
        }
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

#[cfg(test)]
mod peer_tests {
    use super::super::{Live, Neighbours};
    use super::test_support::entry;
    use super::*;
    use gpumux_engine::ids::SmId;

    fn sms(ids: &[u16]) -> SmSet {
        let mut s = SmSet::EMPTY;
        for &i in ids {
            s.insert(SmId(i));
        }
        s
    }

    /// Kernels queued natively ahead at `(priority, chain)` each, none launched.
    fn queued(at: &[(i32, u64)]) -> (IdMap<OpId, Ahead>, Uncancelled) {
        let (mut map, mut counts) = (IdMap::<OpId, Ahead>::default(), Uncancelled::default());
        for (i, &(priority, chain)) in at.iter().enumerate() {
            let a = Ahead { priority, chain, ..entry() };
            counts.add(&a);
            map.insert(OpId(i as u64), a);
        }
        (map, counts)
    }

    #[test]
    fn a_short_kernel_runs_natively_beside_a_peers_queued_kernel_and_only_then() {
        let launches = IdMap::<LaunchId, Live>::default();
        // A peer (chain 1) of priority 0 has a kernel queued natively.
        let (ahead, counts) = queued(&[(0, 1)]);
        let neighbours = |priority, chain| Neighbours {
            launches: &launches,
            ahead: &ahead,
            queued: &counts,
            priority,
            except: None,
            chain: Some(chain),
        };
        let beside = |short, priority, chain| neighbours(priority, chain).native_beside_peers(true, short);
        assert!(beside(true, 0, 0));
        assert!(!beside(false, 0, 0), "not known short: workers");
        // Its own stream's kernel is no peer: alone, `hw_native` decides
        // (natively, whatever its length: nothing of another priority runs).
        assert!(!beside(true, 0, 1));
        assert_eq!(neighbours(0, 1).hw_native(true), (true, true));
        // Another priority's kernel is no peer either.
        assert!(!beside(true, 1, 0));
        // With peers, `hw_native` runs nothing natively: only this rule does.
        assert_eq!(neighbours(0, 0).hw_native(true), (false, false));
        // No hardware priority: never.
        assert!(!neighbours(0, 0).native_beside_peers(false, true));
    }

    #[test]
    fn a_launch_cancels_what_is_queued_on_its_sms_but_a_peers_native_kernels_when_spared() {
        let a = Ahead { held: sms(&[0, 1]), priority: 0, chain: 7, ..entry() };
        let on = sms(&[1, 2]);
        let (op, except) = (OpId(3), Some(OpId(9)));
        // Another priority's launch: cancelled.
        assert!(cancelled_by_launch(op, &a, on, except, None, 1));
        // A launch of its priority spares a native kernel: a native grid holds no SMs.
        assert!(!cancelled_by_launch(op, &a, on, except, None, 0));
        // Workers are cancelled whatever the priority: they hold their SMs.
        let workers = Ahead { native: false, ..a };
        assert!(cancelled_by_launch(op, &workers, on, except, None, 0));
        // Never the launch's own operation, nor its run, nor off its SMs.
        assert!(!cancelled_by_launch(op, &workers, on, Some(op), None, 1));
        assert!(!cancelled_by_launch(op, &workers, on, except, Some(7), 1));
        assert!(!cancelled_by_launch(op, &workers, sms(&[5]), except, None, 1));
    }
}

#[cfg(test)]
mod run_tests {
    use super::test_support::entry;
    use super::*;

    /// A run's kernels, queued natively one behind the other: `(op, behind, ended)`, each 100 µs.
    fn run_of(kernels: &[(u64, Behind, bool)]) -> IdMap<OpId, Ahead> {
        let mut map = IdMap::<OpId, Ahead>::default();
        for &(op, behind, ended) in kernels {
            map.insert(OpId(op), Ahead { behind, ended, expect_ns: 100_000.0, ..entry() });
        }
        map
    }

    #[test]
    fn a_run_holds_its_kernels_back_to_the_first_not_seen_ended() {
        let (next, hold) = (100_000.0, DEEP_HOLD_NS);
        // 3 ended, 4 and 5 not: two held, with the next kernel 300 µs.
        let run = run_of(&[
            (3, Behind::Launch(LaunchId(1)), true),
            (4, Behind::Queued(OpId(3)), false),
            (5, Behind::Queued(OpId(4)), false),
        ]);
        assert_eq!(run_held(&run, &[], OpId(5), next, hold), RunHeld::Room { queued: 2, ns: 300_000.0 });
        // Back to the launch it was queued behind.
        let run = run_of(&[(4, Behind::Launch(LaunchId(1)), false), (5, Behind::Queued(OpId(4)), false)]);
        assert_eq!(run_held(&run, &[], OpId(5), next, hold), RunHeld::Room { queued: 2, ns: 300_000.0 });
        // Past the hold with the next kernel.
        assert_eq!(run_held(&run, &[], OpId(5), next, 250_000.0), RunHeld::Full);
        // At DEEP_MAX.
        let long: Vec<(u64, Behind, bool)> = (1..=DEEP_MAX as u64)
            .map(|op| (op, if op == 1 { Behind::Launch(LaunchId(0)) } else { Behind::Queued(OpId(op - 1)) }, false))
            .collect();
        let mut run = run_of(&long);
        run.values_mut().for_each(|a| a.expect_ns = 0.0);
        assert_eq!(run_held(&run, &[], OpId(DEEP_MAX as u64), 0.0, hold), RunHeld::Full);
    }

    #[test]
    fn a_run_whose_first_kernel_was_queued_behind_one_retired_can_go_on() {
        // Kernel 3 was seen ended and retired with its unbind
        // (`ClientDevice::retire_answered`: it left the queued map, no launch
        // made); 4, queued behind it and running now, holds the stream, 5 is
        // behind 4. The run holds 4 and 5, and may go on behind 5, as it
        // would had 3 been adopted by a launch (4 then behind that launch).
        let run = run_of(&[(4, Behind::Queued(OpId(3)), false), (5, Behind::Queued(OpId(4)), false)]);
        assert_eq!(run_held(&run, &[], OpId(5), 100_000.0, DEEP_HOLD_NS), RunHeld::Room { queued: 2, ns: 300_000.0 });
        // Kernel 3 dropped to the orphans instead (its client went) and still
        // on the GPU: it counts, as it did queued.
        let orphan = [(OpId(3), Ahead { behind: Behind::Launch(LaunchId(1)), expect_ns: 100_000.0, ..entry() })];
        assert_eq!(
            run_held(&run, &orphan, OpId(5), 100_000.0, DEEP_HOLD_NS),
            RunHeld::Room { queued: 3, ns: 400_000.0 }
        );
    }
}
