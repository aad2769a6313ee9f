//! Where a client's kernels spend their time inside the daemon, stage by
//! stage, logged when the client leaves: the answer to "the daemon adds
//! N µs to my launch + sync; where?" without a tracer.
//!
//! Stages of one kernel (times in the core's clock, `Backend::now`):
//!
//! * `wait`: its request decoded by the client's reader thread → the core
//!   took it (the core was busy, or asleep);
//! * `behind`: the core took it → the operation before it on its stream
//!   completed (zero if none was pending): stream order, not the daemon's
//!   cost (a client that queues 100 kernels at once has its 100th wait for
//!   99);
//! * `decide`: the later of those → the engine's first launch command for it
//!   (the policy's turn; for an urgent kernel, the retreat of other work from
//!   the SMs it gets and their release, which is a device exchange);
//! * `launch`: that command → the device call returned (the CUDA launch
//!   calls; in a device process, the command sent);
//! * `run`: that launch returned → the core saw the launch's end (the GPU,
//!   plus how late the device was polled);
//! * `finish`: the end seen → the engine completed the kernel;
//! * `sync`: the client's kernel completed → its `SyncStream` answered,
//!   for a sync waiting on it (the reply then goes to the writer thread).
//!
//! Each stage keeps its last `KEEP` samples, and its longest over all the
//! client's kernels: a stall early in a long run (issue 36's soak: one
//! launch + sync of 224 ms among ~500,000) is gone from the recent samples
//! when the client leaves, and its stage is what says where it was. Memory
//! per client is fixed.

use gpumux_engine::time::Nanos;
use std::fmt::Write as _;

/// Samples kept per stage (the most recent).
const KEEP: usize = 4096;
/// A client with fewer kernels than this leaves without a summary.
pub const SUMMARY_AFTER: u64 = 100;

/// One stage's recent samples, ns.
#[derive(Debug, Default)]
struct Ring {
    samples: Vec<u32>,
    next: usize,
    /// The longest sample ever pushed, ns (not clamped to the samples' u32:
    /// a stall of over 4.29 s must say how long it was).
    longest: Nanos,
}

impl Ring {
    fn push(&mut self, ns: Nanos) {
        self.longest = self.longest.max(ns);
        let ns = ns.min(u32::MAX as Nanos) as u32;
        if self.samples.len() < KEEP {
            self.samples.push(ns);
        } else {
            self.samples[self.next] = ns;
            self.next = (self.next + 1) % KEEP;
        }
    }

    /// p50, p99 and max in µs, or `None` without samples.
    fn percentiles(&self) -> Option<(f64, f64, f64)> {
        if self.samples.is_empty() {
            return None;
        }
        let mut v = self.samples.clone();
        v.sort_unstable();
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize] as f64 / 1e3;
        Some((at(0.5), at(0.99), at(1.0)))
    }
}

/// The stages of one client's kernels (module doc).
#[derive(Debug, Default)]
pub struct StageTimes {
    wait: Ring,
    behind: Ring,
    decide: Ring,
    launch: Ring,
    run: Ring,
    finish: Ring,
    sync: Ring,
    /// When its last kernel completed (for the `sync` stage).
    pub last_kernel_done: Option<Nanos>,
}

/// One kernel's stamps, as the core took them.
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelStamps {
    /// Reader → core, ns.
    pub waited: Nanos,
    /// The core took the request.
    pub queued: Nanos,
    /// It could run: the later of `queued` and the completion of the
    /// operation before it on its stream (taken with `commanded`).
    pub ready: Option<Nanos>,
    /// The engine's first launch command for it.
    pub commanded: Option<Nanos>,
    /// Its first launch's device call returned.
    pub launched: Option<Nanos>,
    /// The core saw its last launch end.
    pub ended: Option<Nanos>,
}

impl StageTimes {
    /// A kernel completed at `done` with `stamps`.
    pub fn kernel(&mut self, stamps: &KernelStamps, done: Nanos) {
        self.wait.push(stamps.waited);
        if let (Some(c), Some(l), Some(e)) = (stamps.commanded, stamps.launched, stamps.ended) {
            let ready = stamps.ready.unwrap_or(stamps.queued).max(stamps.queued);
            self.behind.push(ready - stamps.queued);
            self.decide.push(c.saturating_sub(ready));
            self.launch.push(l.saturating_sub(c));
            self.run.push(e.saturating_sub(l));
            self.finish.push(done.saturating_sub(e));
        }
        self.last_kernel_done = Some(done);
    }

    /// A sync queued at `queued` was answered at `now`: the time since the
    /// later of its request and the client's last kernel's completion.
    pub fn sync(&mut self, queued: Nanos, now: Nanos) {
        let from = self.last_kernel_done.map_or(queued, |k| k.max(queued));
        self.sync.push(now.saturating_sub(from));
    }

    fn stages(&self) -> [(&'static str, &Ring); 7] {
        [
            ("wait", &self.wait),
            ("behind", &self.behind),
            ("decide", &self.decide),
            ("launch", &self.launch),
            ("run", &self.run),
            ("finish", &self.finish),
            ("sync", &self.sync),
        ]
    }

    /// One line: each stage's p50 / p99 / max in µs over the recent
    /// kernels, then each stage's longest over all of them.
    pub fn summary(&self) -> String {
        let mut line = String::new();
        for (name, ring) in self.stages() {
            if let Some((p50, p99, max)) = ring.percentiles() {
                let _ =
                    write!(line, "{}{name} {p50:.1} / {p99:.1} / {max:.1}", if line.is_empty() { "" } else { "; " });
            }
        }
        let mut first = true;
        for (name, ring) in self.stages().into_iter().filter(|(_, r)| !r.samples.is_empty()) {
            let _ = write!(
                line,
                "{}{name} {:.1}",
                if first { "; the longest of all its kernels: " } else { ", " },
                ring.longest as f64 / 1e3
            );
            first = false;
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_are_the_differences_of_the_stamps() {
        let mut t = StageTimes::default();
        for i in 0..100u64 {
            let q = i * 1_000_000;
            // Every 10th waited 50 µs for the kernel before it on its stream.
            let ready = if i % 10 == 0 { Some(q + 50_000) } else { None };
            let commanded = ready.unwrap_or(q) + 6_000;
            let s = KernelStamps {
                waited: 2_000,
                queued: q,
                ready,
                commanded: Some(commanded),
                launched: Some(commanded + 4_000),
                ended: Some(commanded + 24_000),
            };
            t.kernel(&s, commanded + 25_000);
            t.sync(q + 1_000, commanded + 29_000);
        }
        // Stream order is `behind`, not the policy's turn.
        assert_eq!(t.behind.percentiles(), Some((0.0, 50.0, 50.0)));
        assert_eq!(t.decide.percentiles(), Some((6.0, 6.0, 6.0)));
        assert_eq!(t.launch.percentiles(), Some((4.0, 4.0, 4.0)));
        assert_eq!(t.run.percentiles(), Some((20.0, 20.0, 20.0)));
        assert_eq!(t.finish.percentiles(), Some((1.0, 1.0, 1.0)));
        // The sync was asked before the kernel ended: counted from the end.
        assert_eq!(t.sync.percentiles(), Some((4.0, 4.0, 4.0)));
        assert_eq!(
            t.summary(),
            "wait 2.0 / 2.0 / 2.0; behind 0.0 / 50.0 / 50.0; decide 6.0 / 6.0 / 6.0; launch 4.0 / 4.0 / 4.0; \
             run 20.0 / 20.0 / 20.0; finish 1.0 / 1.0 / 1.0; sync 4.0 / 4.0 / 4.0; the longest of all its kernels: \
             wait 2.0, behind 50.0, decide 6.0, launch 4.0, run 20.0, finish 1.0, sync 4.0"
        );
    }

    #[test]
    fn a_ring_keeps_the_most_recent_samples() {
        let mut r = Ring::default();
        for i in 0..(KEEP as u64 + 10) {
            r.push(if i < 10 { 1_000_000 } else { 1_000 });
        }
        assert_eq!(r.samples.len(), KEEP);
        assert_eq!(r.percentiles(), Some((1.0, 1.0, 1.0)));
        assert_eq!(r.longest, 1_000_000, "the early stall is still the longest of all");
        r.push(5_000_000_000);
        assert_eq!(r.longest, 5_000_000_000, "5 s, over a u32 of ns, kept whole");
    }
}
