//! The launcher's earlier hand-over, kept only to compare it with the ring
//! on a GPU (`GPUMUX_LAUNCHER_QUEUE=channel`): a `std::sync::mpsc` channel,
//! and per job an `Arc` holding its outcome (allocated by the poster,
//! freed by whichever of the two threads lets go last) with its error
//! behind a mutex. Same guarantees as the ring (the launcher's module doc).

use crate::error::DriverError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a job came to: set once by the thread.
#[derive(Default)]
struct Slot {
    done: AtomicBool,
    /// The job's value (the launch's and the record's time).
    value: AtomicU64,
    error: Mutex<Option<DriverError>>,
}

/// A new channel: its poster and its taker. `unmade` makes the error of a
/// job that was never made.
pub fn channel<J>(unmade: fn() -> DriverError) -> (Poster<J>, Taker<J>) {
    let (tx, rx) = mpsc::channel();
    (Poster { tx, unmade }, Taker { rx })
}

/// The posting side.
pub struct Poster<J> {
    tx: Sender<(J, Done)>,
    unmade: fn() -> DriverError,
}

impl<J> Poster<J> {
    /// Posts `job`; refused (the job comes back) once the thread is gone.
    pub fn post(&self, job: J) -> Result<Ticket, J> {
        let slot = Arc::new(Slot::default());
        let done = Done { slot: slot.clone(), unmade: self.unmade, set: false };
        match self.tx.send((job, done)) {
            Ok(()) => Ok(Ticket(slot)),
            Err(mpsc::SendError((job, mut done))) => {
                // Not waited for: no error to leave.
                done.set = true;
                Err(job)
            }
        }
    }
}

/// The thread's side.
pub struct Taker<J> {
    rx: Receiver<(J, Done)>,
}

impl<J> Taker<J> {
    /// The next job, looked for during `spin` and then waited for; `None`
    /// once the channel is closed and empty.
    pub fn next(&mut self, spin: Duration) -> Option<(J, Done)> {
        let start = Instant::now();
        let mut looks = 0u32;
        loop {
            match self.rx.try_recv() {
                Ok(job) => return Some(job),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) => {}
            }
            looks += 1;
            if looks.is_multiple_of(64) && start.elapsed() >= spin {
                return self.rx.recv().ok();
            }
            std::hint::spin_loop();
        }
    }
}

/// A taken job's outcome, to set once made; dropped unset (its thread
/// stopped, by a panic, or the job was never taken), it sets the unmade error.
pub struct Done {
    slot: Arc<Slot>,
    unmade: fn() -> DriverError,
    set: bool,
}

impl Done {
    /// Sets the job's outcome: `value`, or `error`.
    pub fn set(mut self, value: u64, error: Option<DriverError>) {
        self.put(value, error);
    }

    fn put(&mut self, value: u64, error: Option<DriverError>) {
        self.set = true;
        self.slot.value.store(value, Ordering::Relaxed);
        if let Some(e) = error {
            if let Ok(mut slot) = self.slot.error.lock() {
                *slot = Some(e);
            }
        }
        self.slot.done.store(true, Ordering::Release);
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        if !self.set {
            let e = (self.unmade)();
            self.put(0, Some(e));
        }
    }
}

/// The poster's handle on a job's outcome.
pub struct Ticket(Arc<Slot>);

impl Ticket {
    /// The job was made (successfully or not), or dropped unmade.
    pub fn done(&self) -> bool {
        self.0.done.load(Ordering::Acquire)
    }

    /// Its value, or its error; `None` while not done.
    pub fn outcome_now(&self) -> Option<Result<u64, DriverError>> {
        if !self.done() {
            return None;
        }
        match self.0.error.lock().ok().and_then(|e| e.clone()) {
            Some(e) => Some(Err(e)),
            None => Some(Ok(self.0.value.load(Ordering::Relaxed))),
        }
    }

    /// Waits until done; its value, or its error.
    pub fn wait(&self) -> Result<u64, DriverError> {
        let mut spins = 0u32;
        loop {
            if let Some(r) = self.outcome_now() {
                return r;
            }
            spins += 1;
            if spins < 1_000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unmade() -> DriverError {
        DriverError { call: "test", code: -1, msg: "unmade".into() }
    }

    #[test]
    fn a_job_dropped_unmade_or_left_in_a_closed_channel_ends_with_the_unmade_error() {
        let (poster, mut taker) = channel::<u32>(unmade);
        let (a, b) = (poster.post(1).expect("open"), poster.post(2).expect("open"));
        let (_, done) = taker.next(Duration::ZERO).expect("a job");
        assert!(!a.done());
        drop(done);
        assert_eq!(a.wait().expect_err("unmade").msg, "unmade");
        drop(taker);
        assert_eq!(b.wait().expect_err("left in the channel").msg, "unmade");
        assert!(poster.post(3).is_err(), "the thread is gone");
    }
}
