//! The hand-over of jobs from one posting thread to one taking thread with
//! nothing allocated per job (issue 35): a fixed ring of job slots, and a
//! pool of outcomes that the two threads reuse.
//!
//! **Why two parts.** A job and what it came to live for different times.
//! The job is needed until the taker takes it; its outcome until the
//! taker has set it *and* the poster's [`Ticket`] for it is dropped, and a
//! ticket may be kept long after (a launch queued ahead is waited for when
//! the engine launches it, maybe hundreds of jobs later). So a ticket owns
//! its outcome, which is never reused under it: its answer stays right
//! however many jobs the ring carries meanwhile.
//!
//! **The ring** is Lamport's single-producer single-consumer queue: the
//! poster writes slot `tail % CAP` and then publishes `tail + 1` (Release);
//! the taker reads `tail` (Acquire), so it sees the slot written, makes the
//! job in place and then publishes `head + 1` (Release); the poster reads `head`
//! (Acquire) before it writes that slot again. Each side keeps the other's
//! index as last seen and reads the shared one only when that says full
//! (poster) or empty (taker). When the ring is full the poster waits
//! (spinning, then yielding): the taker empties it on its own, a full ring
//! is a backlog of `CAP` jobs it is already working through, and a job
//! posted out of turn would break the order jobs run in.
//!
//! **An outcome** is held by the taker until it sets it and by its ticket
//! until that is dropped (two bits of one word, cleared with AcqRel). The
//! one of the two that lets go last pushes it on a free stack (a Treiber
//! stack whose only pop is the poster's take-all `swap`, so no ABA); the
//! poster takes outcomes from there. The pool grows by a chunk only when
//! every outcome is held: its size is the most held at once, not the
//! number of jobs.
//!
//! **Sleep.** A taker that found nothing for its spin time parks. It sets
//! `sleeping`, then (after a SeqCst fence) looks at `tail` once more; the
//! poster publishes `tail`, then (after a SeqCst fence) looks at
//! `sleeping` and unparks the taker if set. Of the two fences one comes
//! first, so either the taker sees the job or the poster sees it asleep;
//! `unpark` before `park` leaves a token, so no wake-up is lost.
//!
//! **A taker that stops** (its thread ends, by a panic or after the poster
//! closed) marks the ring gone: a ticket whose job was not done by then
//! reads as done with the "unmade" error, and later posts are refused. A
//! [`Taken`] dropped unset (a panic while making the job) sets that error.

use std::cell::{Cell, UnsafeCell};
use std::mem::MaybeUninit;
use std::ptr::null_mut;
use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// The taker has not set the outcome yet.
const TAKER_HOLDS: u32 = 1;
/// Its ticket is not dropped yet.
const TICKET_HOLDS: u32 = 2;
/// Outcomes added to the pool when every one is held.
const CHUNK: usize = 64;

/// Keeps what one thread writes often off the other's cache line.
#[repr(align(128))]
struct Padded<T>(T);

/// What one job came to: a value, or an error.
#[repr(align(64))]
struct Outcome<E> {
    /// [`TAKER_HOLDS`] | [`TICKET_HOLDS`] while each holds it.
    holds: AtomicU32,
    /// Written by the taker before it lets go (Release), read after.
    value: AtomicU64,
    /// The same; read only while the ticket holds the outcome.
    error: UnsafeCell<Option<E>>,
    /// The free stack's link.
    next: AtomicPtr<Outcome<E>>,
}

impl<E> Outcome<E> {
    fn new() -> Self {
        Outcome {
            holds: AtomicU32::new(0),
            value: AtomicU64::new(0),
            error: UnsafeCell::new(None),
            next: AtomicPtr::new(null_mut()),
        }
    }
}

/// One slot of the ring: a job and where its outcome goes.
type Slot<J, E> = UnsafeCell<MaybeUninit<(J, *const Outcome<E>)>>;

struct Shared<J, E> {
    slots: Box<[Slot<J, E>]>,
    /// Jobs posted (the poster's; slot `tail % CAP` is the next written).
    tail: Padded<AtomicUsize>,
    /// Jobs taken (the taker's).
    head: Padded<AtomicUsize>,
    /// The taker is parked or about to be ([`Taker::sleep`]).
    sleeping: AtomicBool,
    taker: OnceLock<Thread>,
    /// The poster will post nothing more.
    closed: AtomicBool,
    /// The taker will take nothing more.
    gone: AtomicBool,
    /// Outcomes neither side holds.
    free: AtomicPtr<Outcome<E>>,
    /// Every outcome, freed with the last handle on the ring.
    chunks: Mutex<Vec<Box<[Outcome<E>]>>>,
    /// The error of a job that was never made.
    unmade: fn() -> E,
}

// SAFETY: the slots and the outcomes' errors are handed between the two
// threads by the Release/Acquire pairs the module doc names; jobs and
// errors cross threads, so they must be `Send` (and errors are read through
// `&Ticket` on any thread, so `Sync`).
unsafe impl<J: Send, E: Send + Sync> Sync for Shared<J, E> {}
unsafe impl<J: Send, E: Send + Sync> Send for Shared<J, E> {}

impl<J, E> Shared<J, E> {
    fn cap(&self) -> usize {
        self.slots.len()
    }

    /// Puts an outcome neither side holds any more on the free stack.
    fn release(&self, o: *const Outcome<E>) {
        // SAFETY: outcomes live as long as `self` (in `chunks`).
        let out = unsafe { &*o };
        let mut top = self.free.load(Ordering::Relaxed);
        loop {
            out.next.store(top, Ordering::Relaxed);
            // Release: the poster's take-all (Acquire) then sees the outcome's last writes.
            match self.free.compare_exchange_weak(top, o as *mut _, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => top = now,
            }
        }
    }
}

impl<J, E> Drop for Shared<J, E> {
    fn drop(&mut self) {
        // Jobs posted and never taken (the taker stopped first).
        let (head, tail) = (*self.head.0.get_mut(), *self.tail.0.get_mut());
        let cap = self.cap();
        for i in head..tail {
            // SAFETY: the slots between head and tail hold posted jobs not moved out.
            unsafe { self.slots[i % cap].get_mut().assume_init_drop() };
        }
    }
}

/// A new ring of `cap` slots (a power of two, at least 1): its poster and
/// its taker. `unmade` makes the error of a job that was never made.
pub fn ring<J: Send, E: Send + Sync>(cap: usize, unmade: fn() -> E) -> (Poster<J, E>, Taker<J, E>) {
    let cap = cap.max(1).next_power_of_two();
    let slots = (0..cap).map(|_| UnsafeCell::new(MaybeUninit::uninit())).collect();
    let shared = Arc::new(Shared {
        slots,
        tail: Padded(AtomicUsize::new(0)),
        head: Padded(AtomicUsize::new(0)),
        sleeping: AtomicBool::new(false),
        taker: OnceLock::new(),
        closed: AtomicBool::new(false),
        gone: AtomicBool::new(false),
        free: AtomicPtr::new(null_mut()),
        chunks: Mutex::new(Vec::new()),
        unmade,
    });
    let poster =
        Poster { shared: shared.clone(), tail: Cell::new(0), head_seen: Cell::new(0), spare: Cell::new(null_mut()) };
    let taker = Taker { shared, head: 0, tail_seen: 0 };
    (poster, taker)
}

/// The posting side. Not `Sync`: one thread posts.
pub struct Poster<J, E> {
    shared: Arc<Shared<J, E>>,
    /// `shared.tail`, which only this side writes.
    tail: Cell<usize>,
    /// `shared.head` as last read.
    head_seen: Cell<usize>,
    /// Free outcomes taken from the free stack, linked by `next`.
    spare: Cell<*mut Outcome<E>>,
}

// SAFETY: the poster may move to another thread; `Cell`s keep it on one at a time.
unsafe impl<J: Send, E: Send + Sync> Send for Poster<J, E> {}

/// Why a post was refused: the taker is gone. The job comes back.
#[derive(Debug)]
pub struct Gone<J>(pub J);

impl<J, E> Poster<J, E> {
    /// Posts `job`; waits while the ring is full. Refused once the taker is
    /// gone (one that goes during the post leaves the ticket unmade).
    #[inline]
    pub fn post(&self, job: J) -> Result<Ticket<J, E>, Gone<J>> {
        let mut spins = 0u32;
        // Waits for room with the job left where it is (it is copied once, into the slot).
        loop {
            if self.shared.gone.load(Ordering::Acquire) {
                return Err(Gone(job));
            }
            if self.room() {
                break;
            }
            spins += 1;
            if spins < 1_000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        Ok(self.write(job))
    }

    /// Posts `job` unless the ring is full (then it comes back). Made or
    /// not: a job posted once the taker is gone has a ticket that reads unmade.
    /// (The tests' look at a full ring; the launcher waits: [`Poster::post`].)
    #[cfg(test)]
    pub fn try_post(&self, job: J) -> Result<Ticket<J, E>, Full<J>> {
        if !self.room() {
            return Err(Full(job));
        }
        Ok(self.write(job))
    }

    /// The ring has a free slot.
    fn room(&self) -> bool {
        let tail = self.tail.get();
        if tail - self.head_seen.get() == self.shared.cap() {
            // Acquire: the taker was done with the slot before it said so.
            self.head_seen.set(self.shared.head.0.load(Ordering::Acquire));
        }
        tail - self.head_seen.get() < self.shared.cap()
    }

    /// Writes `job` in the next slot (there is room) and publishes it.
    #[inline]
    fn write(&self, job: J) -> Ticket<J, E> {
        let sh = &*self.shared;
        let tail = self.tail.get();
        let out = self.outcome();
        // SAFETY: the slot is free (`room`: the taker's head is past it) and only this side writes slots.
        unsafe { (*sh.slots[tail & (sh.cap() - 1)].get()).write((job, out)) };
        self.tail.set(tail + 1);
        // Release: the taker sees the slot's job (and the outcome's reset) when it sees the tail.
        sh.tail.0.store(tail + 1, Ordering::Release);
        // The module doc's sleep: the tail, a fence, then the taker's flag.
        fence(Ordering::SeqCst);
        if sh.sleeping.load(Ordering::Acquire) {
            if let Some(t) = sh.taker.get() {
                t.unpark();
            }
        }
        Ticket { shared: self.shared.clone(), out }
    }

    /// An outcome neither side holds, reset and held by both.
    fn outcome(&self) -> *const Outcome<E> {
        let mut o = self.spare.get();
        if o.is_null() {
            // Acquire: the last holder's writes (its Release push) are seen.
            o = self.shared.free.swap(null_mut(), Ordering::Acquire);
        }
        if o.is_null() {
            o = self.grow();
        }
        // SAFETY: a free outcome of the pool; nobody else touches it now.
        let out = unsafe { &*o };
        self.spare.set(out.next.load(Ordering::Relaxed));
        // SAFETY: as above: neither the taker nor a ticket holds it.
        unsafe { *out.error.get() = None };
        out.holds.store(TAKER_HOLDS | TICKET_HOLDS, Ordering::Relaxed);
        o
    }

    /// Adds a chunk of outcomes to the pool; the first of them, the others linked after it.
    #[cold]
    fn grow(&self) -> *mut Outcome<E> {
        let chunk: Box<[Outcome<E>]> = (0..CHUNK).map(|_| Outcome::new()).collect();
        for w in chunk.windows(2) {
            w[0].next.store(&w[1] as *const _ as *mut _, Ordering::Relaxed);
        }
        let first = &chunk[0] as *const _ as *mut _;
        // A poisoned lock only means another holder panicked; the list is still whole.
        let mut chunks = self.shared.chunks.lock().unwrap_or_else(|e| e.into_inner());
        chunks.push(chunk);
        first
    }
}

impl<J, E> Drop for Poster<J, E> {
    /// Closes the ring: the taker takes what is in it, then stops.
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.closed.store(true, Ordering::Release);
        fence(Ordering::SeqCst);
        if sh.sleeping.load(Ordering::Acquire) {
            if let Some(t) = sh.taker.get() {
                t.unpark();
            }
        }
        // Spare outcomes go back to the stack (they would be freed with the ring anyway).
        let mut o = self.spare.replace(null_mut());
        while !o.is_null() {
            // SAFETY: a free outcome of the pool.
            let next = unsafe { (*o).next.load(Ordering::Relaxed) };
            sh.release(o);
            o = next;
        }
    }
}

/// Why [`Poster::try_post`] gave the job back: the ring is full.
#[cfg(test)]
#[derive(Debug)]
pub struct Full<J>(pub J);

/// The taking side; its drop marks the ring gone.
pub struct Taker<J, E> {
    shared: Arc<Shared<J, E>>,
    /// `shared.head`, which only this side writes.
    head: usize,
    /// `shared.tail` as last read.
    tail_seen: usize,
}

// SAFETY: as for `Poster`.
unsafe impl<J: Send, E: Send + Sync> Send for Taker<J, E> {}

impl<J, E> Taker<J, E> {
    /// The next job, looked for during `spin` and then slept for (woken by a
    /// post); `None` once the poster closed the ring and it is empty. The
    /// job stays in its slot until made (no copy out of it).
    pub fn next(&mut self, spin: Duration) -> Option<Taken<'_, J, E>> {
        // Read only once the ring was found empty: a job waiting costs no clock read.
        let mut start: Option<Instant> = None;
        let mut looks = 0u32;
        loop {
            if self.ready() {
                return self.try_next();
            }
            if self.shared.closed.load(Ordering::Acquire) {
                // Acquire: every post happened before the close; look once more.
                return self.try_next();
            }
            let since = *start.get_or_insert_with(Instant::now);
            looks += 1;
            if looks.is_multiple_of(64) && since.elapsed() >= spin {
                self.sleep();
                start = None;
            }
            std::hint::spin_loop();
        }
    }

    /// A job is in the ring.
    fn ready(&mut self) -> bool {
        if self.head == self.tail_seen {
            // Acquire: the slots up to the tail are written.
            self.tail_seen = self.shared.tail.0.load(Ordering::Acquire);
        }
        self.head != self.tail_seen
    }

    /// The next job if one is in the ring.
    pub fn try_next(&mut self) -> Option<Taken<'_, J, E>> {
        if !self.ready() {
            return None;
        }
        let sh = &*self.shared;
        let slot = sh.slots[self.head & (sh.cap() - 1)].get();
        // SAFETY: the slot below the tail seen was written and published (Acquire above).
        let out = unsafe { (*slot).assume_init_ref().1 };
        Some(Taken { taker: self, slot, out, set: false })
    }

    /// Parks until a post or the close (or spuriously: the caller looks again).
    fn sleep(&self) {
        let sh = &*self.shared;
        sh.taker.get_or_init(std::thread::current);
        sh.sleeping.store(true, Ordering::Release);
        // The module doc's sleep: the flag, a fence, then the tail.
        fence(Ordering::SeqCst);
        if sh.tail.0.load(Ordering::Relaxed) == self.head && !sh.closed.load(Ordering::Relaxed) {
            std::thread::park();
        }
        sh.sleeping.store(false, Ordering::Relaxed);
    }
}

impl<J, E> Drop for Taker<J, E> {
    fn drop(&mut self) {
        // Release: the outcomes set before are seen by whoever sees this.
        self.shared.gone.store(true, Ordering::Release);
    }
}

/// A taken job, in its slot until this is dropped, and its outcome to set
/// once it was made. Dropped unset (a panic while making it), it sets the
/// unmade error.
pub struct Taken<'a, J, E> {
    taker: &'a mut Taker<J, E>,
    slot: *mut MaybeUninit<(J, *const Outcome<E>)>,
    out: *const Outcome<E>,
    set: bool,
}

impl<J, E> Taken<'_, J, E> {
    /// The job.
    pub fn job(&mut self) -> &mut J {
        // SAFETY: the slot holds the job until this is dropped (the head is not past it).
        unsafe { &mut (*self.slot).assume_init_mut().0 }
    }

    /// Sets the job's outcome: `value`, or `error`.
    pub fn set(mut self, value: u64, error: Option<E>) {
        self.put(value, error);
    }

    fn put(&mut self, value: u64, error: Option<E>) {
        self.set = true;
        // SAFETY: the pool's outcome, held by this side until the release below.
        let out = unsafe { &*self.out };
        out.value.store(value, Ordering::Relaxed);
        if error.is_some() {
            // SAFETY: the ticket reads the error only once this side let go (Acquire).
            unsafe { *out.error.get() = error };
        }
        // AcqRel: Release publishes the value and error; Acquire, if the
        // ticket is gone, orders its reads before the outcome's reuse.
        if out.holds.fetch_and(!TAKER_HOLDS, Ordering::AcqRel) == TAKER_HOLDS {
            self.taker.shared.release(self.out);
        }
    }
}

impl<J, E> Drop for Taken<'_, J, E> {
    fn drop(&mut self) {
        if !self.set {
            let e = (self.taker.shared.unmade)();
            self.put(0, Some(e));
        }
        // SAFETY: the job is in the slot, dropped once; the head moves past it next.
        unsafe { (*self.slot).assume_init_drop() };
        self.taker.head += 1;
        // Release: the slot is done with before the poster may write it again.
        self.taker.shared.head.0.store(self.taker.head, Ordering::Release);
    }
}

/// The poster's handle on a job's outcome; keeps it until dropped.
pub struct Ticket<J, E> {
    shared: Arc<Shared<J, E>>,
    out: *const Outcome<E>,
}

// SAFETY: the outcome is read through Acquire loads (and its error only
// once the taker let go of it), from any thread.
unsafe impl<J: Send, E: Send + Sync> Send for Ticket<J, E> {}
unsafe impl<J: Send, E: Send + Sync> Sync for Ticket<J, E> {}

impl<J, E> Ticket<J, E> {
    fn outcome(&self) -> &Outcome<E> {
        // SAFETY: held by this ticket, so not reused; alive as long as `shared`.
        unsafe { &*self.out }
    }

    /// The taker set the outcome.
    fn set(&self) -> bool {
        self.outcome().holds.load(Ordering::Acquire) & TAKER_HOLDS == 0
    }

    /// The job was made (successfully or not), or never will be (the taker is gone).
    pub fn done(&self) -> bool {
        self.set() || self.shared.gone.load(Ordering::Acquire)
    }

    /// Its value, or its error; `None` while not [`Ticket::done`].
    pub fn outcome_now(&self) -> Option<Result<u64, E>>
    where
        E: Clone,
    {
        if self.set() {
            let out = self.outcome();
            // SAFETY: the taker let go of it (Acquire above) and this ticket still holds it.
            return Some(match unsafe { &*out.error.get() } {
                Some(e) => Err(e.clone()),
                None => Ok(out.value.load(Ordering::Relaxed)),
            });
        }
        if self.shared.gone.load(Ordering::Acquire) {
            // The taker may have set it just before it went (gone is stored after).
            if self.set() {
                return self.outcome_now();
            }
            return Some(Err((self.shared.unmade)()));
        }
        None
    }

    /// Waits until [`Ticket::done`]; its value, or its error.
    pub fn wait(&self) -> Result<u64, E>
    where
        E: Clone,
    {
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

impl<J, E> Drop for Ticket<J, E> {
    fn drop(&mut self) {
        // AcqRel: as in `Taken::put`, from this side.
        if self.outcome().holds.fetch_and(!TICKET_HOLDS, Ordering::AcqRel) == TICKET_HOLDS {
            self.shared.release(self.out);
        }
    }
}

#[cfg(test)]
mod tests;
