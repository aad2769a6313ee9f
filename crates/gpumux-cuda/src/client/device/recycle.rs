//! A run's ends read from host memory between polls (issue 35): held polls
//! that watch them, and launch records recycled at launch commands.
//!
//! **Why.** A run of kernels queued natively ([`super::ahead`], "Deep")
//! holds one launch record per kernel not seen ended, and only the device's
//! poll looked for their ends. In the daemon's device process a poll comes
//! when the daemon's core has used up the ends the last one reported: after
//! it turned each into an engine turn, and after the device process carried
//! out the launch command each turn sent (~4 µs each on the H200). So a run
//! went on once a cycle, as a burst of as many kernels as there were spare
//! records (15 of 16), and the GPU idled from the burst's end to the next
//! poll that saw it (60-130 µs a cycle on the H200, the whole of the chain's
//! overhead; docs/program-speed.md, "What the stage stamps showed"). More
//! records made the bursts longer but the cycle longer too: each kernel of a
//! burst costs the device process a launch command and a post of its own,
//! more than its kernel's time on the GPU.
//!
//! **How.** The ends of a run's kernels that publish theirs are words in host
//! memory (`preempt::WorkerLaunch`'s published end): reading them takes no
//! driver call. Two uses, by [`RECYCLE_VAR`]:
//! * held polls watch them ([`ClientDevice::run_end_landed`]; gpumuxd's
//!   `device_host::hold`): a held poll of the device process polls the
//!   device the moment one landed, and otherwise at its pace, instead of
//!   back to back after a command (on by default);
//! * with `1`, each launch command (the device process handles one per
//!   kernel of the chain, spread over the whole cycle) looks whether a
//!   queued kernel's published end landed in a run a poll would walk from
//!   host memory (`ahead::walkable_end_landed`), and only then walks the
//!   runs as a poll does but from host memory alone
//!   (`ClientDevice::poll_ahead_in`: in stream order, records given back,
//!   the ends kept for the next poll's report, no end event queried) and
//!   lets them go on ([`ClientDevice::deepen_tails`]): the GPU is fed
//!   through the cycle, a kernel or a few at a time, not in one burst per
//!   poll.
//!
//! **What stays.** Ends are still reported to the daemon only with a poll's
//! answer, once each and in stream order (the same walk, the same list); a
//! launch command for a kernel seen ended between polls adopts no record
//! and its launch ends at the next poll, as for a kernel seen ended at a
//! poll whose report crossed the command (`backend::ends_ahead` in gpumuxd
//! ignores such a report). Launches themselves still end only at polls
//! (the engine's device contract). A fault never publishes its end, so
//! nothing behind it is seen; retreats, grows and dropped operations find
//! the runs as before (the walk only marks kernels that ended).
//!
//! **Bound.** Between polls a run goes on only while the engine trails the
//! GPU by fewer than [`TRAIL_MAX`] kernels (run and not launched yet;
//! polls keep `ahead::ENDED_WAITING_MAX`): each kernel seen ended stays an
//! entry that the device's walks and a run's next kernel look through, and a
//! device process that looked for ends after every message let the GPU run
//! 143 kernels ahead and spent ~11 µs a look (docs/program-speed.md, "Tried
//! and removed again"). The GPU gains nothing from running further ahead of
//! an engine that trails it; [`TRAIL_MAX`] (16) covers a poll's cycle (~15
//! kernels on the H200).
//!
//! **Measured** (one H200, 2026-11-29, the programs bench's chain, the
//! switch alternating in one call). Recycling at launch commands lost: at
//! da5563d (before the bound; the GPU ran up to 139 kernels ahead of the
//! engine) 3.26x and 3.14x native against 2.61x and 2.96x without; the GPU
//! was fed without gaps but at one kernel per ~8.7 µs, since each post of a
//! run's next kernel looks through every kernel queued or seen ended (its
//! peers, its stream): with ~140 of them a post took 6-8 µs instead of ~4,
//! the launch commands doing the posting ~70 µs each, so the engine
//! trailed further and the core waited for the device process's answers.
//! At f6558f5 (with the bound) 2.85x and 2.81x, against 2.53x and 2.70x
//! without; its answered launch commands cost the device process 4.1-4.5
//! µs against 2.6-2.7. The held polls' watch alone won both rounds: 2.22x
//! and 2.03x (5.84 and 5.48 ms against 6.65 and 7.38 without either), its
//! answered launch commands 2.1 µs. So `hold` is the default.

use super::ClientDevice;
use gpumux_engine::device::DeviceError;

/// The daemon's environment (its device process inherits it): unset or
/// `hold`, held polls watch a run's published ends (gpumuxd's
/// `device_host`), and the runs go on at polls; `1`, launch commands also
/// recycle a run's records; `0`, neither (the behaviour before both). The
/// default is what measured fastest on the H200 (module doc, "Measured").
pub const RECYCLE_VAR: &str = "GPUMUX_RECYCLE_AHEAD";

/// Kernels seen ended and not launched by the engine yet, beyond which a
/// run goes on at polls only (module doc, "Bound").
pub const TRAIL_MAX: usize = super::ahead::DEEP_MAX / 2;

/// What [`RECYCLE_VAR`] asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recycle {
    /// Ends looked for at polls only, held polls as before.
    Off,
    /// A held poll watches the published ends; runs go on at polls only
    /// (the default).
    Hold,
    /// Both: a held poll watches, and launch commands recycle.
    On,
}

impl Recycle {
    /// From [`RECYCLE_VAR`]'s value (`None`: unset); an unknown value is
    /// the default, with a warning.
    pub fn parse(v: Option<&str>) -> Recycle {
        match v.map(str::trim) {
            None | Some("hold") | Some("") => Recycle::Hold,
            Some("0") => Recycle::Off,
            Some("1") => Recycle::On,
            Some(other) => {
                tracing::warn!("{RECYCLE_VAR}={other:?} is not 0, 1 or hold: hold");
                Recycle::Hold
            }
        }
    }

    /// From the environment.
    pub fn from_env() -> Recycle {
        Recycle::parse(std::env::var(RECYCLE_VAR).ok().as_deref())
    }

    /// Launch commands look for a run's ends.
    pub fn at_commands(self) -> bool {
        self == Recycle::On
    }

    /// A held poll watches the published ends instead of polling back to back.
    pub fn in_holds(self) -> bool {
        self != Recycle::Off
    }
}

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

    /// How a held poll may use [`ClientDevice::run_end_landed`] ([`RECYCLE_VAR`]).
    pub fn recycle_mode(&self) -> Recycle {
        self.recycle
    }

    /// Sets [`ClientDevice::recycle_mode`] (tests; the device reads [`RECYCLE_VAR`] when it opens).
    pub fn set_recycle(&mut self, how: Recycle) {
        self.recycle = how;
    }

    /// Between polls (after a launch command): if a queued kernel's end
    /// landed, the runs are walked as at a poll and go on (module doc).
    pub(super) fn recycle_between_polls(&mut self) -> Result<(), DeviceError> {
        if !self.recycle.at_commands() || !self.st.as_ref().is_some_and(super::ahead::walkable_end_landed) {
            return Ok(());
        }
        let before = self.ahead_counts.ended_ahead;
        if self.poll_ahead_in(true)? {
            self.ahead_counts.recycled += self.ahead_counts.ended_ahead - before;
            // Not past TRAIL_MAX kernels run and not launched by the engine:
            // beyond, the runs go on at polls (module doc, "Bound").
            if self.st.as_ref().is_some_and(|st| st.ended_waiting < TRAIL_MAX) {
                self.deepen_tails()?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_reads_0_hold_and_1_and_defaults_to_the_held_polls_watch() {
        assert_eq!(Recycle::parse(None), Recycle::Hold);
        assert_eq!(Recycle::parse(Some("1")), Recycle::On);
        assert_eq!(Recycle::parse(Some(" 0 ")), Recycle::Off);
        assert_eq!(Recycle::parse(Some("hold")), Recycle::Hold);
        assert_eq!(Recycle::parse(Some("yes please")), Recycle::Hold);
        assert!(Recycle::On.at_commands() && Recycle::On.in_holds());
        assert!(!Recycle::Hold.at_commands() && Recycle::Hold.in_holds());
        assert!(!Recycle::Off.at_commands() && !Recycle::Off.in_holds());
    }
}
