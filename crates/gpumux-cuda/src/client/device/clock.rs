//! Where the device's time per launch command goes: the command as a whole,
//! its stream, its parts ([`Part`], timed in every [`SAMPLE`]th command),
//! and the CUDA calls of its workers' launch (the kernel launch and the end
//! event's record; for workers queued ahead, made by the launcher thread
//! outside any command, the thread's own sums). Logged when the device
//! closes, so a run of the daemon says what a launch costs on its GPU
//! without a profiler (the `launch` stage of docs/daemon.md's stage log is
//! all of it, one number).

use crate::runtime::launcher::Made;
use std::time::{Duration, Instant};

/// Every `SAMPLE`th launch command has its parts timed: a clock read costs
/// 38 ns on the H100 machine (`scripts/investigations/clock-cost`), and timing every part
/// of every command added ~0.3 µs to its ~5 (docs/history/benchmarks.md, session 17).
pub(super) const SAMPLE: u64 = 16;

/// Parts of a launch command, timed apart ([`LaunchClock::part`]).
#[derive(Clone, Copy, Debug)]
pub(super) enum Part {
    /// Cancelling other kernels' workers queued on the launch's SMs.
    Cancel,
    /// Adopting the operation's queued workers (with what it calls).
    Adopt,
    /// Waiting for the launcher thread's calls of the adopted workers.
    Settle,
    /// Starting workers in the command (with what it calls).
    Start,
    /// Queueing the stream's next kernel behind the launch (within
    /// adopting or starting).
    QueueAhead,
    /// Readying launch records for workers (`WorkerLaunch::reuse`, or a
    /// new record), within starting or queueing ahead.
    Record,
    /// Starting workers on a ready record (`WorkerLaunch::start`, with
    /// its CUDA calls, or `start_posted`), within starting or queueing ahead.
    StartCall,
    /// Within a start on a record: its plan (the profile lookup).
    Plan,
    /// Within a start on a record: the parameters and launch description.
    Params,
    /// Within a start on a record: the launch calls, or their post to the
    /// launcher thread.
    Calls,
}

const PARTS: usize = 10;

/// Sums over the launch commands that started workers.
#[derive(Debug, Default)]
pub(super) struct LaunchClock {
    commands: u64,
    submit: Duration,
    stream: Duration,
    /// [`Part`]s' sums over the sampled commands.
    parts: [Duration; PARTS],
    sampled: u64,
    /// In a sampled command: its parts are timed.
    timing: bool,
    worker_launches: u64,
    launch_calls_ns: u64,
    record_calls_ns: u64,
    /// Launches that adopted queued workers whose calls the launcher
    /// thread had not made yet, and waited for them.
    waited_for_launcher: u64,
}

impl LaunchClock {
    /// A launch command begins: if it is sampled, its parts are timed until
    /// it ends ([`LaunchClock::command`]).
    pub(super) fn begin(&mut self) {
        self.timing = self.commands.is_multiple_of(SAMPLE);
        self.sampled += self.timing as u64;
    }

    /// One launch command: all of it, and the part that got its stream.
    pub(super) fn command(&mut self, submit: Duration, stream: Duration) {
        self.timing = false;
        self.commands += 1;
        self.submit += submit;
        self.stream += stream;
    }

    /// Whether the command under way is timed.
    pub(super) fn timing(&self) -> bool {
        self.timing
    }

    /// Now, if the command under way is timed: what [`LaunchClock::part`]
    /// takes (no clock read otherwise).
    pub(super) fn start(&self) -> Option<Instant> {
        self.timing.then(Instant::now)
    }

    /// The time since `since` ([`LaunchClock::start`]) spent on `part`;
    /// only within a sampled launch command (the same calls made by a
    /// poll, a restart for one, are not a command's).
    pub(super) fn part(&mut self, part: Part, since: Option<Instant>) {
        if let (true, Some(t)) = (self.timing, since) {
            self.parts[part as usize] += t.elapsed();
        }
    }

    /// A timed start's parts, ns (`WorkerLaunch::last_start_parts`: the
    /// plan, the parameters, the calls or their post).
    pub(super) fn start_parts(&mut self, [plan, params, calls]: [u32; 3]) {
        if self.timing {
            for (part, ns) in [(Part::Plan, plan), (Part::Params, params), (Part::Calls, calls)] {
                self.parts[part as usize] += Duration::from_nanos(ns as u64);
            }
        }
    }

    /// One worker launch's CUDA calls, ns (`WorkerLaunch::last_start_calls`).
    pub(super) fn calls(&mut self, (launch, record): (u32, u32)) {
        self.made(Made { launches: 1, launch_ns: launch as u64, record_ns: record as u64 });
    }

    /// Calls made elsewhere: a launcher thread's sums, when it goes away.
    pub(super) fn made(&mut self, m: Made) {
        self.worker_launches += m.launches;
        self.launch_calls_ns += m.launch_ns;
        self.record_calls_ns += m.record_ns;
    }

    /// A launch adopted queued workers whose calls were not made yet.
    pub(super) fn waited_for_launcher(&mut self) {
        self.waited_for_launcher += 1;
    }

    /// The means, in words, with the calls of the launcher thread still
    /// running (`launcher`); `None` before 100 commands (too few to mean much).
    pub(super) fn summary(&self, launcher: Made) -> Option<String> {
        if self.commands < 100 {
            return None;
        }
        let per = |d: f64, n: u64| d / n.max(1) as f64;
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let launches = self.worker_launches + launcher.launches;
        let part = |p: Part| per(us(self.parts[p as usize]), self.sampled);
        Some(format!(
            "{} launch commands, mean µs each: {:.1} in all, {:.2} getting a stream; of every {SAMPLE}th: \
             {:.2} cancelling other kernels' queued workers, {:.2} adopting queued workers ({:.2} of it \
             waiting for the launcher thread), {:.2} starting workers, {:.2} queueing the next kernel \
             ahead (within adopting and starting), {:.2} readying launch records and {:.2} starting \
             workers on them (within both: {:.2} planning, {:.2} the parameters and description, {:.2} \
             the launch calls or their post); per worker launch \
             ({}, {} by the launcher thread): cuLaunchKernel {:.2}, the end event's record {:.2}; {} \
             launches waited for the launcher thread to launch the queued workers they adopted",
            self.commands,
            per(us(self.submit), self.commands),
            per(us(self.stream), self.commands),
            part(Part::Cancel),
            part(Part::Adopt),
            part(Part::Settle),
            part(Part::Start),
            part(Part::QueueAhead),
            part(Part::Record),
            part(Part::StartCall),
            part(Part::Plan),
            part(Part::Params),
            part(Part::Calls),
            launches,
            launcher.launches,
            per((self.launch_calls_ns + launcher.launch_ns) as f64 / 1e3, launches),
            per((self.record_calls_ns + launcher.record_ns) as f64 / 1e3, launches),
            self.waited_for_launcher,
        ))
    }
}

/// The parts of a poll of the device ([`PollClock`]), in their order.
pub(super) const POLL_PARTS: [&str; 7] =
    ["cuts", "implied ends", "launches", "ends ahead", "runs deepened", "copies", "orphans"];

/// Every `POLL_SAMPLE`th poll has its parts timed (a daemon polls a busy
/// device every few µs).
const POLL_SAMPLE: u64 = 8;

/// Where a poll's time goes (issue 35: through the device process the poll
/// was 10.8 µs of each 21.6 µs exchange of the programs bench's chain on the
/// H200, f985c06), in the sampled polls; logged when the device closes.
///
/// The polls that saw a run's kernels end ahead are timed too, every one
/// ([`PollClock::saw_ends`]): few (one per burst of a chain's kernels), and
/// on the chain's critical path (issue 35: ~22 µs from a held poll's receipt
/// to its first post on the H200, 687b320, with no stamp to say where).
#[derive(Debug, Default)]
pub(super) struct PollClock {
    polls: u64,
    sampled: u64,
    parts: [Duration; 7],
    /// The poll's last lap, while one is timed.
    lap: Option<Instant>,
    /// The poll under way is a sampled one.
    sampling: bool,
    /// The poll under way's parts so far.
    now_parts: [Duration; 7],
    /// Polls that saw ends ahead, and their parts.
    with_ends: u64,
    ends_parts: [Duration; 7],
}

impl PollClock {
    /// A poll begins: its parts are timed (kept for the summary if it is
    /// a sampled one, or one that sees ends ahead).
    pub(super) fn begin(&mut self) {
        self.sampling = self.polls.is_multiple_of(POLL_SAMPLE);
        self.lap = Some(Instant::now());
        self.now_parts = [Duration::ZERO; 7];
        self.polls += 1;
        self.sampled += self.sampling as u64;
    }

    /// Part `part` ([`POLL_PARTS`]) of the poll ended now.
    pub(super) fn part(&mut self, part: usize) {
        let Some(t) = self.lap else { return };
        let now = Instant::now();
        if let Some(p) = self.now_parts.get_mut(part) {
            *p += now - t;
        }
        if let Some(p) = self.parts.get_mut(part).filter(|_| self.sampling) {
            *p += now - t;
        }
        self.lap = Some(now);
    }

    /// The poll under way saw kernels end ahead: its parts so far count
    /// among those polls' (call it at the poll's end).
    pub(super) fn saw_ends(&mut self) {
        self.with_ends += 1;
        for (sum, d) in self.ends_parts.iter_mut().zip(self.now_parts) {
            *sum += d;
        }
    }

    /// The polls that saw ends ahead, in words (`None`: none).
    pub(super) fn ends_summary(&self) -> Option<String> {
        if self.with_ends == 0 {
            return None;
        }
        let n = self.with_ends as f64;
        let total: Duration = self.ends_parts.iter().sum();
        let mut s = format!("{} polls saw ends ahead: {:.2} µs each", self.with_ends, total.as_secs_f64() * 1e6 / n);
        for (name, d) in POLL_PARTS.iter().zip(self.ends_parts) {
            s.push_str(&format!(", {name} {:.2}", d.as_secs_f64() * 1e6 / n));
        }
        Some(s)
    }

    /// The sampled polls' parts, mean µs each, in words.
    pub(super) fn summary(&self) -> Option<String> {
        if self.sampled == 0 {
            return None;
        }
        let n = self.sampled as f64;
        let total: Duration = self.parts.iter().sum();
        let mut s =
            format!("{} polls, {} timed: {:.2} µs each", self.polls, self.sampled, total.as_secs_f64() * 1e6 / n);
        for (name, d) in POLL_PARTS.iter().zip(self.parts) {
            s.push_str(&format!(", {name} {:.2}", d.as_secs_f64() * 1e6 / n));
        }
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn means_per_command_and_per_worker_launch_once_there_are_enough() {
        let mut c = LaunchClock::default();
        for _ in 0..99 {
            c.command(Duration::from_micros(10), Duration::from_micros(1));
            c.calls((3_000, 1_000));
        }
        let none = Made::default();
        assert!(c.summary(none).is_none(), "99 commands say little");
        c.command(Duration::from_micros(10), Duration::from_micros(1));
        c.calls((3_000, 1_000));
        let s = c.summary(none).expect("100 commands");
        assert!(
            s.starts_with("100 launch commands, mean µs each: 10.0 in all, 1.00 getting a stream; of every 16th: 0.00"),
            "{s}"
        );
        assert!(s.contains("(100, 0 by the launcher thread): cuLaunchKernel 3.00, the end event's record 1.00"), "{s}");
        assert!(
            s.ends_with("; 0 launches waited for the launcher thread to launch the queued workers they adopted"),
            "{s}"
        );
    }

    #[test]
    fn parts_are_timed_in_every_sampled_command_and_only_inside_it() {
        let mut c = LaunchClock::default();
        let mut timed = 0;
        for _ in 0..(10 * SAMPLE) {
            c.begin();
            let t = c.start();
            timed += t.is_some() as u64;
            // A part of known length: an instant that far back.
            let back = |d: u64| t.map(|t| t - Duration::from_micros(d));
            c.part(Part::Adopt, back(3));
            c.part(Part::QueueAhead, back(2));
            // A start's own parts, taken by the launch record when it is timed.
            c.start_parts([250, 500, 1_000]);
            c.command(Duration::from_micros(4), Duration::ZERO);
            // A restart after a poll: not a command's.
            c.part(Part::Start, Some(Instant::now() - Duration::from_micros(50)));
        }
        assert_eq!(timed, 10, "one command in {SAMPLE} is timed");
        let s = c.summary(Made::default()).expect("160 commands");
        // Each timed part took its length plus the time between the clock
        // reads (ns, unless the test thread is descheduled: the bound is loose).
        let mean = |after: &str| -> f64 {
            let rest = &s[s.find(after).expect(after) + after.len()..];
            rest.split_whitespace().next().and_then(|w| w.parse().ok()).expect("a mean")
        };
        assert!((3.0..40.0).contains(&mean("kernels' queued workers, ")), "{s}");
        assert!((2.0..40.0).contains(&mean("starting workers, ")), "{s}");
        assert!(s.contains("0.00 starting workers,"), "the restart outside a command is not counted: {s}");
        assert!(
            s.contains("0.25 planning, 0.50 the parameters and description, 1.00 the launch calls or their post"),
            "a start's parts count in the sampled commands only: {s}"
        );
    }

    #[test]
    fn the_launcher_threads_calls_count_with_the_commands_own() {
        let mut c = LaunchClock::default();
        for _ in 0..100 {
            c.command(Duration::from_micros(2), Duration::ZERO);
            c.calls((4_000, 1_000));
        }
        // A thread gone (turned off) and the one running now: 300 calls of 2 µs + 100 ns.
        c.made(Made { launches: 100, launch_ns: 200_000, record_ns: 10_000 });
        c.waited_for_launcher();
        let s = c.summary(Made { launches: 200, launch_ns: 400_000, record_ns: 20_000 }).expect("100 commands");
        // (100 x 4 µs + 300 x 2 µs) / 400 = 2.5; (100 x 1 µs + 300 x 0.1 µs) / 400 = 0.325.
        assert!(
            s.contains("(400, 200 by the launcher thread): cuLaunchKernel 2.50, the end event's record 0.33"),
            "{s}"
        );
        assert!(
            s.ends_with("; 1 launches waited for the launcher thread to launch the queued workers they adopted"),
            "{s}"
        );
    }

    #[test]
    fn a_polls_parts_are_timed_in_the_sampled_polls_only() {
        let mut c = PollClock::default();
        assert!(c.summary().is_none());
        for _ in 0..POLL_SAMPLE + 1 {
            c.begin();
            std::thread::sleep(Duration::from_millis(1));
            c.part(2);
        }
        let s = c.summary().expect("two polls were timed");
        assert!(s.starts_with(&format!("{} polls, 2 timed", POLL_SAMPLE + 1)), "{s}");
        assert!(c.parts[2] >= Duration::from_millis(2), "each timed poll's part counted: {:?}", c.parts);
        assert_eq!(c.parts[0], Duration::ZERO);
    }

    #[test]
    fn every_poll_that_saw_ends_is_timed() {
        let mut c = PollClock::default();
        for i in 0..POLL_SAMPLE + 1 {
            c.begin();
            if i == 1 {
                // Not a sampled poll: counted among those that saw ends all the same.
                std::thread::sleep(Duration::from_millis(2));
                c.part(3);
                c.saw_ends();
            } else {
                c.part(2);
            }
        }
        let s = c.ends_summary().expect("a poll saw ends");
        assert!(s.starts_with("1 polls saw ends ahead: "), "{s}");
        assert!(c.ends_parts[3] >= Duration::from_millis(2), "{:?}", c.ends_parts);
        assert!(c.parts[3] < Duration::from_millis(2), "not a sampled poll: {:?}", c.parts);
        assert_eq!(PollClock::default().ends_summary(), None);
    }
}
