//! The hand-over of jobs from one posting thread to one taking thread with
//! nothing allocated per job (issue 35): a fixed ring of job slots, and a
//! pool of outcomes that the two threads reuse.
//!
//! **Why two parts.** A job and what it came to live for different times.
//! The job is needed until the taker has made it; its outcome until the
//! taker has set it *and* the poster's [`Ticket`] for it is dropped, and a
//! ticket may be kept long after (a launch queued ahead is waited for when
//! the engine launches it, maybe hundreds of jobs later). So a ticket owns
//! its outcome, which is never reused under it: its answer stays right
//! however many jobs the ring carries meanwhile.
//!
//! **The ring** is Lamport's single-producer single-consumer queue of `CAP`
//! slots (a power of two: [`ring`] rounds up): the poster writes slot
//! `tail % CAP` and then publishes `tail + 1` (Release); the taker reads
//! `tail` (Acquire), so it sees the slot written, lends the job in place
//! ([`Taken`]), drops it and only then publishes `head + 1` (Release); the
//! poster reads `head` (Acquire) before it writes that slot again. So the
//! slots from `head` to `tail` hold the jobs posted and not yet dropped, and
//! no other slot holds one: [`Poster::write`], [`Taker::try_next`] and the
//! ring's drop rely on it. Each side keeps the other's index as last seen and
//! reads the shared one only when that says full (poster) or empty (taker).
//! When the ring is full the poster waits (spinning, then yielding): the
//! taker empties it on its own, a full ring is a backlog of `CAP` jobs it is
//! already working through, and a job posted out of turn would break the
//! order jobs run in.
//!
//! **An outcome** is held by the taker until it sets it and by its ticket
//! until that is dropped (two bits of one word, cleared with AcqRel). The
//! one of the two that lets go last pushes it on a free stack (a Treiber
//! stack whose only pop is the poster's take-all `swap`, so no ABA); the
//! poster takes outcomes from there. The pool grows by a chunk only when
//! every outcome is held: its size is the most held at once (in whole
//! chunks), not the number of jobs.
//!
//! **Sleep.** A taker that found nothing for its spin time parks. It names
//! its thread and sets `sleeping`, then (after a SeqCst fence) looks at
//! `tail` once more; the poster publishes `tail`, then (after a SeqCst
//! fence) looks at `sleeping` and unparks the thread named if set. Of the
//! two fences one comes first, so either the taker sees the job or the
//! poster sees it asleep; `unpark` before `park` leaves a token, so no
//! wake-up is lost (the proof, with spurious wake-ups and the close, is at
//! [`Taker::sleep`]).
//!
//! **Counters** (`head`, `tail`) count jobs for ever and wrap around at
//! `usize::MAX`: they are only compared, subtracted and added to with
//! wrapping arithmetic, and a slot is a counter's low bits (`CAP` is a
//! power of two, so a slot's jobs stay in turn across the wrap).
//!
//! **A taker that stops** (its thread ends, by a panic or after the poster
//! closed) marks the ring gone: a ticket whose job was not done by then
//! reads as done with the "unmade" error, and later posts are refused. A
//! [`Taken`] dropped unset (a panic while making the job) sets that error.
//!
//! **Checked** by the tests in `ring/tests.rs`, which also run under Miri
//! (data races, aliasing, weak-memory outcomes; the command is in
//! docs/daemon-cuda.md, "The launcher thread").

use std::cell::{Cell, UnsafeCell};
use std::mem::MaybeUninit;
use std::ptr::null_mut;
use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
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

/// The pool's outcomes, in chunks allocated by [`Poster::grow`] and freed
/// when this is dropped (with the ring: whoever holds a pointer to an
/// outcome holds an `Arc` on the ring). Kept raw (`Box::into_raw`), not as
/// `Box`es: moving a `Box` asserts that it is the only way to its memory,
/// which the outcomes' pointers into it are not (Miri's Stacked Borrows
/// found that at `Vec::push`).
struct Chunks<E>(Vec<*mut [Outcome<E>]>);

impl<E> Chunks<E> {
    /// How many were allocated (the tests' look at the pool's growth).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.len()
    }
}

impl<E> Drop for Chunks<E> {
    fn drop(&mut self) {
        for &c in &self.0 {
            // SAFETY: from `Box::into_raw` in `grow`, freed only here, once;
            // nothing uses a pointer into it after (the ring is being dropped).
            drop(unsafe { Box::from_raw(c) });
        }
    }
}

/// One slot of the ring: a job and where its outcome goes.
type Slot<J, E> = UnsafeCell<MaybeUninit<(J, *const Outcome<E>)>>;

struct Shared<J, E> {
    slots: Box<[Slot<J, E>]>,
    /// Jobs posted (the poster's; slot `tail % CAP` is the next written).
    tail: Padded<AtomicUsize>,
    /// Jobs taken and dropped (the taker's; it passes a slot only once the
    /// job in it was dropped: [`Pass`]).
    head: Padded<AtomicUsize>,
    /// The taker is parked or about to be ([`Taker::sleep`]).
    sleeping: AtomicBool,
    /// The thread the taker last slept on, named before each sleep: a
    /// taker may move to another thread between two (it is `Send`).
    sleeper: Mutex<Option<Thread>>,
    /// The poster will post nothing more.
    closed: AtomicBool,
    /// The taker will take nothing more.
    gone: AtomicBool,
    /// Outcomes neither side holds.
    free: AtomicPtr<Outcome<E>>,
    /// Every outcome, freed with the last handle on the ring.
    chunks: Mutex<Chunks<E>>,
    /// The error of a job that was never made.
    unmade: fn() -> E,
}

// SAFETY: the fields not `Sync` by themselves are the slots (`UnsafeCell`),
// the outcomes' errors (`UnsafeCell`) and the raw pointers to outcomes
// (the free stack's atomics, and `chunks`, touched under its lock and
// freed only by the drop).
// Each slot and each error is accessed by one side at a time, handed over
// by the Release/Acquire pairs noted at each access (a slot: `tail`, then
// `head`; an error: `holds`, then the free stack), so no two threads touch
// one at once. A job is made on another thread than it was posted on and
// may be dropped on any thread holding the last `Arc` (`Shared`'s drop):
// `J: Send`; an error is set on the taker's thread, read through `&Ticket`
// from any thread at once and dropped on any: `E: Send + Sync`. Nothing
// lends a `&J` to two threads, so `J` need not be `Sync`.
unsafe impl<J: Send, E: Send + Sync> Sync for Shared<J, E> {}
// SAFETY: as for `Sync`: what it owns (jobs, errors) is `Send`.
unsafe impl<J: Send, E: Send + Sync> Send for Shared<J, E> {}

/// `m` locked; a poisoned lock only means another holder panicked, and
/// what it guards (a handle, a list) is whole at every point.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<J, E> Shared<J, E> {
    fn cap(&self) -> usize {
        self.slots.len()
    }

    /// The poster's side of the sleep ([`Taker::sleep`]), after it
    /// published a job (`tail`) or the close (`closed`): wakes the taker if
    /// it sleeps or is about to.
    fn wake(&self) {
        fence(Ordering::SeqCst);
        // Acquire: the taker named its thread before it set the flag.
        if self.sleeping.load(Ordering::Acquire) {
            // Cloned out of the lock: a taker naming itself does not wait for the unpark's syscall.
            let sleeper = lock(&self.sleeper).clone();
            if let Some(t) = sleeper {
                t.unpark();
            }
        }
    }

    /// Puts an outcome neither side holds any more on the free stack.
    fn release(&self, o: *const Outcome<E>) {
        // SAFETY: an outcome of the pool: alive as long as `self` (its
        // chunk is in `chunks`); only atomics are touched through it here.
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
        let (mut i, tail) = (*self.head.0.get_mut(), *self.tail.0.get_mut());
        let cap = self.cap();
        while i != tail {
            // SAFETY: `&mut self`: no poster, taker or `Taken` is left, and
            // the slots from the head to the tail hold jobs written,
            // published and not dropped (the module doc's ring invariant; the
            // head passes a slot even when the job's drop unwound: `Pass`).
            unsafe { self.slots[i & (cap - 1)].get_mut().assume_init_drop() };
            i = i.wrapping_add(1);
        }
    }
}

/// A new ring of `cap` slots, rounded up to a power of two (at least 1):
/// its poster and its taker. `unmade` makes the error of a job that was never made.
pub fn ring<J: Send, E: Send + Sync>(cap: usize, unmade: fn() -> E) -> (Poster<J, E>, Taker<J, E>) {
    ring_from(cap, unmade, 0)
}

/// [`ring`] with its counters starting at `start` (the tests' look at their wrap-around).
fn ring_from<J: Send, E: Send + Sync>(cap: usize, unmade: fn() -> E, start: usize) -> (Poster<J, E>, Taker<J, E>) {
    let cap = cap.max(1).next_power_of_two();
    let slots = (0..cap).map(|_| UnsafeCell::new(MaybeUninit::uninit())).collect();
    let shared = Arc::new(Shared {
        slots,
        tail: Padded(AtomicUsize::new(start)),
        head: Padded(AtomicUsize::new(start)),
        sleeping: AtomicBool::new(false),
        sleeper: Mutex::new(None),
        closed: AtomicBool::new(false),
        gone: AtomicBool::new(false),
        free: AtomicPtr::new(null_mut()),
        chunks: Mutex::new(Chunks(Vec::new())),
        unmade,
    });
    let poster = Poster {
        shared: shared.clone(),
        tail: Cell::new(start),
        head_seen: Cell::new(start),
        spare: Cell::new(null_mut()),
    };
    let taker = Taker { shared, head: start, tail_seen: start, sleeps: 0, slept: Duration::ZERO };
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

// SAFETY: not `Send` by itself for its raw spare list, outcomes free and
// this side's alone (no other thread touches them until they are posted
// with a job, published by `tail`): moved with the poster, they stay one
// thread's. The `Cell`s keep it `!Sync`, so one thread posts at a time. It
// posts `J`s (`Send`) and drops `E`s (`outcome`'s reset), so the bounds of `Shared`.
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
            // Saturating: a wait may last long enough to count past `u32::MAX`.
            spins = spins.saturating_add(1);
            if spins < 1_000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        Ok(self.write(job))
    }

    /// Posts `job` unless the ring is full (then it comes back). Unlike
    /// [`Poster::post`] it does not look at `gone`: a job posted once the
    /// taker is gone has a ticket that reads unmade. (The tests' look at a
    /// full ring; the launcher waits: [`Poster::post`].)
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
        if tail.wrapping_sub(self.head_seen.get()) == self.shared.cap() {
            // Acquire: the taker was done with the slot before it said so.
            self.head_seen.set(self.shared.head.0.load(Ordering::Acquire));
        }
        tail.wrapping_sub(self.head_seen.get()) < self.shared.cap()
    }

    /// Writes `job` in the next slot (there is room) and publishes it.
    #[inline]
    fn write(&self, job: J) -> Ticket<J, E> {
        let sh = &*self.shared;
        let tail = self.tail.get();
        let out = self.outcome();
        // SAFETY: only this side writes slots, and nobody reads this one:
        // `room` saw the taker's head (Acquire) past the job it last held,
        // whose drop came before (`Pass`, Release), and the taker reads no
        // slot at or past the tail, which is published only below. A
        // `write` of `MaybeUninit` drops nothing (that job was dropped).
        unsafe { (*sh.slots[tail & (sh.cap() - 1)].get()).write((job, out)) };
        let tail = tail.wrapping_add(1);
        self.tail.set(tail);
        // Release: the taker sees the slot's job (and the outcome's reset) when it sees the tail.
        sh.tail.0.store(tail, Ordering::Release);
        // The sleep's poster side: the tail, then a fence and the flag.
        sh.wake();
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
        // SAFETY: an outcome of the pool (alive as long as `shared`), and a
        // free one: it came from the free stack (or a new chunk) to this
        // side alone, and the last holder's writes happened before its
        // push (Release), which the take-all saw (Acquire).
        let out = unsafe { &*o };
        self.spare.set(out.next.load(Ordering::Relaxed));
        // SAFETY: as above: neither the taker nor a ticket holds it, so
        // nothing reads the error while it is replaced (and its old one dropped).
        unsafe { *out.error.get() = None };
        out.holds.store(TAKER_HOLDS | TICKET_HOLDS, Ordering::Relaxed);
        o
    }

    /// Adds a chunk of outcomes to the pool; the first of them, the others linked after it.
    #[cold]
    fn grow(&self) -> *mut Outcome<E> {
        let chunk: Box<[Outcome<E>]> = (0..CHUNK).map(|_| Outcome::new()).collect();
        let raw = Box::into_raw(chunk);
        // SAFETY: just allocated, and freed only with the ring (`Chunks`),
        // after every pointer derived here is done with; shared access only.
        let outs: &[Outcome<E>] = unsafe { &*raw };
        for w in outs.windows(2) {
            w[0].next.store(&w[1] as *const _ as *mut _, Ordering::Relaxed);
        }
        lock(&self.shared.chunks).0.push(raw);
        &outs[0] as *const _ as *mut _
    }
}

impl<J, E> Drop for Poster<J, E> {
    /// Closes the ring: the taker takes what is in it, then stops.
    fn drop(&mut self) {
        let sh = &*self.shared;
        // Release: the taker that sees it closed sees every job posted.
        sh.closed.store(true, Ordering::Release);
        // The sleep's poster side, for the close.
        sh.wake();
        // Spare outcomes go back to the stack (they would be freed with the ring anyway).
        let mut o = self.spare.replace(null_mut());
        while !o.is_null() {
            // SAFETY: an outcome of the pool, on this side's spare list: free and this side's alone.
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
    /// Sleeps so far, and their time (for the launcher's account; this
    /// side's alone).
    sleeps: u64,
    slept: Duration,
}

impl<J, E> Taker<J, E> {
    /// The next job, looked for during `spin` and then slept for (woken by a
    /// post); `None` once the poster closed the ring and it is empty. The
    /// job stays in its slot until made (no copy out of it).
    pub fn next(&mut self, spin: Duration) -> Option<Taken<'_, J, E>> {
        // Read only once the ring was found empty: a job waiting costs no clock read.
        let mut start: Option<Instant> = None;
        // Wrapping: a long `spin` with nothing posted may count past `u32::MAX`.
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
            looks = looks.wrapping_add(1);
            if looks.is_multiple_of(64) && since.elapsed() >= spin {
                let asleep = Instant::now();
                self.sleep();
                self.sleeps += 1;
                self.slept += asleep.elapsed();
                start = None;
            }
            std::hint::spin_loop();
        }
    }

    /// Times it went to sleep for want of a job (whether or not it then
    /// parked), and the time those took.
    pub fn slept(&self) -> (u64, Duration) {
        (self.sleeps, self.slept)
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
        // SAFETY: the head is below the tail seen, so the poster wrote this
        // slot and published it (its Release store, this side's Acquire
        // load in `ready`), and writes it again only once the head is past
        // it, which is after the `Taken` is dropped (it borrows `self`).
        let out = unsafe { (*slot).assume_init_ref().1 };
        Some(Taken { taker: self, slot, out, set: false })
    }

    /// Parks until a post or the close (or spuriously: the caller looks again).
    ///
    /// **No wake-up is lost.** The taker here: (T1) names its thread in
    /// `sleeper`; (T2) stores `sleeping = true` (Release); (F_T) a SeqCst
    /// fence; (T3) loads `tail` and `closed` and parks only if it finds no
    /// job and no close; (T4) stores `sleeping = false` once awake. The
    /// poster (`Shared::wake`), after it publishes a job (P1: the `tail`
    /// store) or the close (P1: the `closed` store): (F_P) a SeqCst fence;
    /// (P2) loads `sleeping` (Acquire) and, if true, unparks the thread
    /// named in `sleeper`. SeqCst fences are in one total order:
    ///
    /// - F_P before F_T: T3 is after F_T and P1 before F_P, so T3 reads
    ///   P1's value or a later one: the taker sees the job (or the close)
    ///   and does not park.
    /// - F_T before F_P: P2 reads T2's `true` or a later store. If `true`
    ///   (T2's or a later sleep's), it read it after T1 (Release, Acquire,
    ///   then the lock): it unparks the thread that is parked or about to
    ///   park, and `unpark` before `park` leaves a token that ends that
    ///   park at once. If it reads a `false`, that is a T4, after a park
    ///   that ended: the taker is awake; it looks at the ring before it
    ///   sleeps again, and in that next sleep F_T comes after F_P (were it
    ///   before, P2 would read that sleep's T2 or later, not an older T4),
    ///   so its T3 sees the job.
    ///
    /// A spurious return of `park` (or a token left by an earlier unpark)
    /// only ends this sleep: [`Taker::next`] looks at the ring and the close
    /// again and sleeps anew, a new round of the same argument. Naming the
    /// thread at each sleep keeps the unpark right for a taker moved to
    /// another thread since it last slept. The taker's own stop needs no
    /// wake-up: nobody parks on it (a poster waiting for room and a ticket
    /// waiting for its outcome look at `gone` each turn).
    fn sleep(&self) {
        let sh = &*self.shared;
        *lock(&sh.sleeper) = Some(std::thread::current());
        sh.sleeping.store(true, Ordering::Release);
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
    /// Jobs in the ring, this one included, as of the taker's last read of
    /// the tail (which it reads only once it finds the ring empty: a floor).
    pub fn queued(&self) -> usize {
        self.taker.tail_seen.wrapping_sub(self.taker.head)
    }

    /// The job.
    pub fn job(&mut self) -> &mut J {
        // SAFETY: the slot holds the job until this is dropped (the head is
        // not past it, so the poster does not write it), and `&mut self`
        // lends it to one borrower at a time.
        unsafe { &mut (*self.slot).assume_init_mut().0 }
    }

    /// Sets the job's outcome: `value`, or `error`.
    pub fn set(mut self, value: u64, error: Option<E>) {
        self.put(value, error);
    }

    fn put(&mut self, value: u64, error: Option<E>) {
        self.set = true;
        // SAFETY: an outcome of the pool (alive as long as `shared`), held
        // by this side (its bit is set until the `fetch_and` below), so not reused.
        let out = unsafe { &*self.out };
        out.value.store(value, Ordering::Relaxed);
        if error.is_some() {
            // SAFETY: nobody reads the error now: the ticket reads it only
            // once this side let go (its Acquire load sees the bit clear),
            // and the poster resets it only once both let go. (It was reset
            // to `None` before the job was published: nothing is dropped here.)
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
        // The head moves past the slot once the job is dropped, and also if
        // its drop panics: a value whose drop unwound counts as dropped
        // (its fields were), and the ring's own drop must not drop it again.
        let pass = Pass(&mut *self.taker);
        // SAFETY: the slot holds the job, written and published (`try_next`)
        // and not moved out (`job` lends it); it is dropped here once, and
        // `pass` then moves the head past it, whatever the drop did, so no
        // `Taken` or ring drop reaches it again.
        unsafe { (*self.slot).assume_init_drop() };
        drop(pass);
    }
}

/// Moves its taker's head past the slot of the job just dropped, when
/// dropped itself (after the job's drop returned or unwound).
struct Pass<'t, J, E>(&'t mut Taker<J, E>);

impl<J, E> Drop for Pass<'_, J, E> {
    fn drop(&mut self) {
        self.0.head = self.0.head.wrapping_add(1);
        // Release: the slot is done with before the poster may write it again.
        self.0.shared.head.0.store(self.0.head, Ordering::Release);
    }
}

/// The poster's handle on a job's outcome; keeps it until dropped.
pub struct Ticket<J, E> {
    shared: Arc<Shared<J, E>>,
    out: *const Outcome<E>,
}

// SAFETY: not `Send`/`Sync` by itself for its pointer to its outcome,
// which it holds (its bit), so the outcome is not reused under it, on any
// thread. Through it, any thread reads atomics and, once the taker let go
// of it (an Acquire load of `holds`), the error by `&` only (`E: Sync`),
// which nobody writes until this ticket let go too (its drop's
// Release, then the free stack's). Its `Arc` needs `Shared: Send + Sync`.
unsafe impl<J: Send, E: Send + Sync> Send for Ticket<J, E> {}
// SAFETY: as for `Send`: every access through `&Ticket` is a read.
unsafe impl<J: Send, E: Send + Sync> Sync for Ticket<J, E> {}

impl<J, E> Ticket<J, E> {
    fn outcome(&self) -> &Outcome<E> {
        // SAFETY: an outcome of the pool, alive as long as `shared` (this
        // ticket's `Arc`); its bit is set until this ticket's drop, so it is not reused.
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
            // SAFETY: the taker let go of it (Acquire above: its writes are
            // seen, and it writes no more), and this ticket still holds it,
            // so the poster does not reset it: shared reads only.
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
            spins = spins.saturating_add(1);
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
