//! Where the device's time per launch command goes: the command as a whole,
//! its stream, and the CUDA calls of its workers' launch (the kernel launch
//! and the end event's record; for workers queued ahead, made by the
//! launcher thread outside any command, counted when a command adopts
//! them). Logged when the device closes, so a run of the daemon says what a
//! launch costs on its GPU without a profiler (the `launch` stage of
//! docs/daemon.md's stage log is all of it, one number).

use std::time::Duration;

/// Sums over the launch commands that started workers.
#[derive(Debug, Default)]
pub(super) struct LaunchClock {
    commands: u64,
    submit: Duration,
    stream: Duration,
    worker_launches: u64,
    launch_calls_ns: u64,
    record_calls_ns: u64,
}

impl LaunchClock {
    /// One launch command: all of it, and the part that got its stream.
    pub(super) fn command(&mut self, submit: Duration, stream: Duration) {
        self.commands += 1;
        self.submit += submit;
        self.stream += stream;
    }

    /// One worker launch's CUDA calls, ns (`WorkerLaunch::last_start_calls`).
    pub(super) fn calls(&mut self, (launch, record): (u32, u32)) {
        self.worker_launches += 1;
        self.launch_calls_ns += launch as u64;
        self.record_calls_ns += record as u64;
    }

    /// The means, in words; `None` before 100 commands (too few to mean much).
    pub(super) fn summary(&self) -> Option<String> {
        if self.commands < 100 {
            return None;
        }
        let per = |d: f64, n: u64| d / n.max(1) as f64;
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        Some(format!(
            "{} launch commands, mean µs each: {:.1} in all, {:.2} getting a stream; per worker launch \
             ({}): cuLaunchKernel {:.2}, the end event's record {:.2}",
            self.commands,
            per(us(self.submit), self.commands),
            per(us(self.stream), self.commands),
            self.worker_launches,
            per(self.launch_calls_ns as f64 / 1e3, self.worker_launches),
            per(self.record_calls_ns as f64 / 1e3, self.worker_launches),
        ))
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
        assert!(c.summary().is_none(), "99 commands say little");
        c.command(Duration::from_micros(10), Duration::from_micros(1));
        c.calls((3_000, 1_000));
        let s = c.summary().expect("100 commands");
        assert!(s.starts_with("100 launch commands, mean µs each: 10.0 in all, 1.00 getting a stream"), "{s}");
        assert!(s.contains("(100): cuLaunchKernel 3.00, the end event's record 1.00"), "{s}");
    }
}
