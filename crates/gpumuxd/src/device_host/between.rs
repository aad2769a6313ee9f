//! Looks between the daemon's messages (issue 35; [`DEEPEN_BETWEEN_VAR`]):
//! the device process lets the runs of kernels its device queued natively
//! go on while it waits for the core's next message, instead of only at
//! the core's polls.
//!
//! **Why.** A run holds a launch record per kernel not seen ended, and the
//! core polls only once it has used up the ends the last poll reported (an
//! engine turn and an answered launch command per kernel): the runs went on
//! once a cycle, and the GPU's launcher ran dry from its last launch to the
//! next poll (the programs bench's chain ~8.2 µs a kernel through the
//! daemon against ~5.6 for the launcher and ~5.3 for the GPU, H200 at
//! 653c7f0; docs/program-speed.md, "What bounds the chain next").
//!
//! **How.** A look is due only if an end landed in host memory
//! ([`Backend::run_end_landed`], a read of words, no driver call) or the
//! last look stopped at its bound of posts with more to do. It is tried
//! each time the link's ring has no message ([`Link::recv_spin_between`]),
//! and, unless [`DEEPEN_BETWEEN_VAR`] says `idle`, after each message too
//! (at most every [`CHECK_GAP_NS`] for the landed words): while the core
//! turns a poll's ends into answered launch commands, one every ~2 µs, the
//! device process carries each out in ~2 µs (the stage stamps of 653c7f0 on
//! the H200), so its ring is seldom empty then, and a look only while idle
//! would wait for the burst's end, as the runs do now. The look
//! ([`Backend::look_between`]) walks the runs from host memory alone and
//! queues at most [`LOOK_POSTS`] kernels, so that a message from the core
//! waits ~10 µs at most (an answered launch command is bookkeeping the GPU
//! does not wait for; a kernel posted is what it waits for). A look that
//! found nothing to take (an end landed behind a launch only a poll may
//! end) is not tried again for [`QUIET_NS`].
//!
//! **What stays.** A look makes no event: launches end at polls, and the
//! ends a look saw go with the next poll's answer, once each and in stream
//! order (the device's own list; gpumux-cuda's `client::device::between`).
//! A failure of a look is kept for the next poll's answer, as a command's.
//!
//! **Earlier tries** (docs/program-speed.md, "Measured and not taken"):
//! looks every 4 µs while idle on the link (158875a) and after each
//! message (88141cc) lost, looking whether or not an end had landed, with
//! driver calls in the walk, and a run's whole burst queued at 3.8 µs a
//! post; at 8f5ae0d the GPU was waiting for binds, not for records.
//!
//! [`Link::recv_spin_between`]: crate::backend::link::Link::recv_spin_between

use crate::backend::exchange_clock::{mono_ns, HostClock, HOST_LOOKS};
use crate::backend::{Backend, Failure};
use crate::load::LoadClock;
use std::time::Duration;

/// In the daemon's environment (its device processes inherit it): unset or
/// `1`, the device process looks after each message and while its link is
/// idle (module doc; the default since session 34's A/B on the H200,
/// docs/program-speed.md, "Runs between the core's polls"); `idle`, only
/// while its link is idle; `0`, never (as before, for an A/B).
pub const DEEPEN_BETWEEN_VAR: &str = "GPUMUX_DEEPEN_BETWEEN";

/// Kernels a look queues at most before the link is read again: a post
/// costs 1.6-2.5 µs of the device process's thread on the H200 (94e735d,
/// 653c7f0), so a message waits ~10 µs at most; ends land four at a time in
/// a run (one kernel in four publishes its end, gpumux-cuda's
/// `PUBLISH_EVERY`), and each gives a record back for one more.
pub const LOOK_POSTS: usize = 4;

/// How long after a look that found nothing to take, with an end landed,
/// the next is tried (ns): such an end waits for a poll (its run is behind
/// a launch the engine has not seen end), and a look costs a walk.
pub const QUIET_NS: u64 = 2_000;

/// After a message, the landed words are read at most this often (ns): a
/// read of each watched kernel's word (~32) per message would cost the
/// device process a few tenths of a µs per message; ends land every ~4
/// kernels of a chain (~20 µs).
pub const CHECK_GAP_NS: u64 = 2_000;

/// Where the device process looks ([`DEEPEN_BETWEEN_VAR`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Where {
    /// After each message, and while no message waits.
    Always,
    /// Only while no message waits.
    Idle,
}

/// What [`DEEPEN_BETWEEN_VAR`]'s value asks for: [`Where::Always`] when
/// unset, `None` for `0`; anything else is the default, with a warning.
pub fn where_from(value: Option<&str>) -> Option<Where> {
    let Some(value) = value else { return Some(Where::Always) };
    match value.trim() {
        "1" | "" => Some(Where::Always),
        "idle" => Some(Where::Idle),
        "0" => None,
        other => {
            tracing::warn!(
                "{DEEPEN_BETWEEN_VAR}={other:?} is not 0, 1 or idle: looks after each message (the default)"
            );
            Some(Where::Always)
        }
    }
}

/// The device process's looks between messages and what they did.
#[derive(Debug)]
pub struct Between {
    /// Where it looks.
    pub at: Where,
    /// Kernels a look queues at most ([`LOOK_POSTS`]).
    posts: usize,
    /// The last look stopped at `posts` with more to do.
    owed: bool,
    /// When the landed words were last read after a message ([`mono_ns`]).
    checked: u64,
    /// No look before this ([`mono_ns`]) unless owed ([`QUIET_NS`]).
    quiet_until: u64,
    /// Looks that saw an end or queued a kernel, their time in all (ns),
    /// kernels seen ended, kernels queued.
    looks: u64,
    ns: u64,
    ended: u64,
    queued: u64,
    /// Looks that found nothing to take though an end had landed.
    empty: u64,
}

impl Between {
    /// Looks `at` where asked, queueing at most `posts` kernels each.
    pub fn new(at: Where, posts: usize) -> Between {
        let posts = posts.max(1);
        Between { at, posts, owed: false, checked: 0, quiet_until: 0, looks: 0, ns: 0, ended: 0, queued: 0, empty: 0 }
    }

    /// After a message handled, ended at `now` ([`mono_ns`]): a look if
    /// due and asked for there ([`Where::Always`]; [`CHECK_GAP_NS`]).
    pub fn after_message(
        &mut self,
        now: u64,
        backend: &mut dyn Backend,
        clock: &mut HostClock,
        load: &mut LoadClock,
        broken: &mut bool,
        failure: &mut Option<Failure>,
    ) {
        if self.at != Where::Always || (!self.owed && now < self.checked.saturating_add(CHECK_GAP_NS)) {
            return;
        }
        self.checked = now;
        self.look(backend, clock, load, broken, failure);
    }

    /// Whether a look is due at `now`, an end having `landed` (module doc).
    pub fn due(&self, landed: Option<bool>, now: u64) -> bool {
        self.owed || (landed == Some(true) && now >= self.quiet_until)
    }

    /// One look if due, called while the link has no message: whether it did
    /// work (saw an end or queued a kernel, or owes more). A failure is kept
    /// in `failure` for the next poll, and the device is left alone after it
    /// (`broken`), as after a failed command.
    pub fn look(
        &mut self,
        backend: &mut dyn Backend,
        clock: &mut HostClock,
        load: &mut LoadClock,
        broken: &mut bool,
        failure: &mut Option<Failure>,
    ) -> bool {
        if *broken {
            return false;
        }
        // The landed word first: the clock is read only when one did.
        if !self.owed && backend.run_end_landed() != Some(true) {
            return false;
        }
        let began = mono_ns();
        if !self.due(Some(true), began) {
            return false;
        }
        match backend.look_between(self.posts) {
            Ok(l) => {
                let ended = mono_ns();
                self.owed = l.more;
                if l.ended + l.queued == 0 {
                    self.empty += 1;
                    self.quiet_until = ended.saturating_add(QUIET_NS);
                    return l.more;
                }
                let took = ended.saturating_sub(began);
                self.looks += 1;
                self.ns += took;
                self.ended += l.ended;
                self.queued += l.queued;
                clock.did(HOST_LOOKS, began, ended);
                load.add(HOST_LOOKS, 1, Duration::from_nanos(took));
                true
            }
            Err(f) => {
                self.owed = false;
                *broken = true;
                failure.get_or_insert(f);
                false
            }
        }
    }

    /// One line for the device process's log at close.
    pub fn summary(&self) -> String {
        let mean = if self.looks == 0 { 0.0 } else { self.ns as f64 / self.looks as f64 / 1e3 };
        format!(
            "between messages ({DEEPEN_BETWEEN_VAR}={}, at most {} kernels queued a look): {} looks, {mean:.2} µs \
             each, {} kernels seen ended, {} queued; {} looks found nothing to take",
            if self.at == Where::Always { "1" } else { "idle" },
            self.posts,
            self.looks,
            self.ended,
            self.queued,
            self.empty
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::exchange_clock::HOST_PARTS;
    use crate::backend::sim::SimBackend;
    use crate::backend::{Backend, OpWork};
    use gpumux_engine::ids::OpId;

    #[test]
    fn the_switch_reads_off_on_and_idle() {
        assert_eq!(where_from(None), Some(Where::Always), "on by default");
        assert_eq!(where_from(Some("0")), None);
        assert_eq!(where_from(Some("")), Some(Where::Always));
        assert_eq!(where_from(Some(" 1 ")), Some(Where::Always));
        assert_eq!(where_from(Some("idle")), Some(Where::Idle));
        assert_eq!(where_from(Some("yes")), Some(Where::Always), "anything else: the default, with a warning");
    }

    #[test]
    fn a_look_is_due_when_an_end_landed_or_one_is_owed_and_not_again_at_once_after_an_empty_one() {
        let mut b = Between::new(Where::Always, 4);
        assert!(!b.due(None, 10), "nothing watched");
        assert!(!b.due(Some(false), 10), "nothing landed");
        assert!(b.due(Some(true), 10));
        b.quiet_until = 10 + QUIET_NS;
        assert!(!b.due(Some(true), 11), "an empty look just now");
        assert!(b.due(Some(true), 10 + QUIET_NS));
        b.owed = true;
        assert!(b.due(Some(false), 11), "owed: whatever landed");
        assert_eq!(Between::new(Where::Idle, 0).posts, 1, "a look queues one kernel at least");
    }

    #[test]
    fn after_a_message_the_landed_words_are_read_at_most_every_gap_and_only_where_asked() {
        let mut sim = SimBackend::open("sim:h100").expect("the preset");
        sim.script_ends_ahead();
        let image = sim.load_module("m.cu", "__global__ void j() {}\n", &[]).expect("the module loads");
        let code = image.kernels[0].code;
        sim.bind(OpId(1), one_block(code, None));
        let (mut clock, mut load) = (HostClock::default(), LoadClock::new(&HOST_PARTS));
        let (mut broken, mut failure) = (false, None);
        let (mut always, mut idle) = (Between::new(Where::Always, 4), Between::new(Where::Idle, 4));
        let t = 1_000_000;
        always.after_message(t, &mut sim, &mut clock, &mut load, &mut broken, &mut failure);
        sim.bind(OpId(2), one_block(code, Some(OpId(1))));
        idle.after_message(t + CHECK_GAP_NS, &mut sim, &mut clock, &mut load, &mut broken, &mut failure);
        assert_eq!(idle.ended, 0, "only while idle: none after a message");
        always.after_message(t + CHECK_GAP_NS - 1, &mut sim, &mut clock, &mut load, &mut broken, &mut failure);
        assert_eq!(always.ended, 0, "read {CHECK_GAP_NS} ns after the last read, not sooner");
        always.after_message(t + CHECK_GAP_NS, &mut sim, &mut clock, &mut load, &mut broken, &mut failure);
        assert_eq!((always.looks, always.ended), (1, 1), "an end landed: one look took it");
    }

    fn one_block(code: crate::backend::KernelCode, after: Option<OpId>) -> OpWork {
        let (grid, block, params) = ([1, 1, 1], [32, 1, 1], Vec::new());
        OpWork::Kernel { code, grid, block, shared_bytes: 0, params, after, range: None }
    }

    /// The scripted simulated device (`GPUMUX_SIM_ENDS_AHEAD`): ends bound
    /// ahead are seen by a look, counted, timed in the exchange's account,
    /// and reported at the next poll once, in the order bound; a look with
    /// nothing landed does nothing.
    #[test]
    fn a_look_takes_what_landed_once_and_the_next_poll_reports_it_in_order() {
        let mut sim = SimBackend::open("sim:h100").expect("the preset");
        sim.script_ends_ahead();
        let image = sim.load_module("m.cu", "__global__ void j() {}\n", &[]).expect("the module loads");
        let code = image.kernels[0].code;
        sim.bind(OpId(1), one_block(code, None));
        let (mut clock, mut load) = (HostClock::default(), LoadClock::new(&HOST_PARTS));
        let (mut broken, mut failure) = (false, None);
        let mut b = Between::new(Where::Always, LOOK_POSTS);
        assert!(!b.look(&mut sim, &mut clock, &mut load, &mut broken, &mut failure), "nothing run ahead yet");
        sim.bind(OpId(2), one_block(code, Some(OpId(1))));
        sim.bind(OpId(3), one_block(code, Some(OpId(2))));
        assert!(b.look(&mut sim, &mut clock, &mut load, &mut broken, &mut failure));
        assert!(!b.look(&mut sim, &mut clock, &mut load, &mut broken, &mut failure), "taken already");
        sim.bind(OpId(4), one_block(code, Some(OpId(3))));
        let mut ends = Vec::new();
        sim.take_ends_ahead(&mut ends);
        let ops: Vec<OpId> = ends.iter().map(|e| e.op).collect();
        assert_eq!(ops, [OpId(2), OpId(3), OpId(4)], "the look's two, then the one no look saw, in order");
        sim.take_ends_ahead(&mut ends);
        assert_eq!(ends.len(), 3, "each reported once");
        assert!(!broken && failure.is_none());
        let line = b.summary();
        assert!(line.contains(": 1 looks,") && line.contains("2 kernels seen ended, 0 queued"), "{line}");
        let times = clock.answer(mono_ns(), 0);
        assert_eq!(times.work[HOST_LOOKS].count, 1, "the look in the exchange's account: {:?}", times.work);
    }
}
