//! The ring's logic with plain jobs (numbers), no GPU.

use super::*;
use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;

#[derive(Clone, Debug, PartialEq)]
struct Failed(String);

fn unmade() -> Failed {
    Failed("unmade".into())
}

/// A taker on a thread of its own that sets each job `n`'s value to
/// `n * 3`, or fails it when `n % 7 == 0`; the jobs in the order taken.
fn spawn_taker(mut taker: Taker<u64, Failed>, spin: Duration) -> std::thread::JoinHandle<Vec<u64>> {
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        while let Some(mut done) = taker.next(spin) {
            let n = *done.job();
            seen.push(n);
            if n.is_multiple_of(7) {
                done.set(0, Some(Failed(format!("job {n}"))));
            } else {
                done.set(n * 3, None);
            }
        }
        seen
    })
}

/// `n` jobs, or a hundredth of them under Miri (which interprets every
/// step: docs/daemon-cuda.md, "The launcher thread", has the command).
fn scaled(n: u64) -> u64 {
    if cfg!(miri) {
        n / 100
    } else {
        n
    }
}

/// The next of a xorshift sequence (deterministic "random" depths and pauses).
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn check(n: u64, r: Result<u64, Failed>) {
    if n.is_multiple_of(7) {
        assert_eq!(r, Err(Failed(format!("job {n}"))), "job {n}");
    } else {
        assert_eq!(r, Ok(n * 3), "job {n}");
    }
}

#[test]
fn jobs_are_taken_in_the_order_posted_through_many_wraps_of_a_small_ring() {
    let (poster, taker) = ring::<u64, Failed>(4, unmade);
    let t = spawn_taker(taker, Duration::from_micros(50));
    let tickets: Vec<_> = (0..1_000u64).map(|n| poster.post(n).expect("taker alive")).collect();
    for (n, t) in tickets.iter().enumerate() {
        check(n as u64, t.wait());
    }
    drop(poster);
    let seen = t.join().expect("taker ran");
    assert_eq!(seen, (0..1_000).collect::<Vec<_>>());
}

#[test]
fn a_ticket_kept_while_its_slot_and_many_outcomes_are_reused_keeps_its_own_answer() {
    let (poster, mut taker) = ring::<u64, Failed>(2, unmade);
    let kept_ok = poster.post(5).expect("posted");
    let mut done = taker.try_next().expect("one job");
    let n = *done.job();
    done.set(n * 3, None);
    let kept_err = poster.post(7).expect("posted");
    let mut done = taker.try_next().expect("one job");
    let n = *done.job();
    done.set(0, Some(Failed(format!("job {n}"))));
    // 100 times the ring's slots and the pool's chunk, every ticket dropped at once.
    for n in 100..100 + 100 * CHUNK as u64 {
        let t = poster.post(n).expect("posted");
        let mut done = taker.try_next().expect("one job");
        let m = *done.job();
        assert_eq!(m, n);
        done.set(m * 3, None);
        assert_eq!(t.wait(), Ok(n * 3));
    }
    assert!(kept_ok.done() && kept_err.done());
    assert_eq!(kept_ok.wait(), Ok(15), "its outcome was not reused under it");
    check(7, kept_err.wait());
    let chunks = poster.shared.chunks.lock().expect("lock").len();
    assert_eq!(chunks, 1, "outcomes were reused, not allocated per job");
}

#[test]
fn outcomes_held_by_many_tickets_grow_the_pool_and_come_back_when_dropped() {
    let (poster, mut taker) = ring::<u64, Failed>(8, unmade);
    let mut held = Vec::new();
    for n in 0..3 * CHUNK as u64 {
        held.push(poster.post(n).expect("posted"));
        let mut done = taker.try_next().expect("one job");
        let m = *done.job();
        done.set(m * 3, None);
    }
    assert_eq!(poster.shared.chunks.lock().expect("lock").len(), 3, "every outcome held: the pool grew");
    for (n, t) in held.iter().enumerate() {
        assert_eq!(t.wait(), Ok(n as u64 * 3));
    }
    held.clear();
    for n in 0..10 * CHUNK as u64 {
        let t = poster.post(n).expect("posted");
        let mut done = taker.try_next().expect("one job");
        let m = *done.job();
        done.set(m * 3, None);
        assert_eq!(t.wait(), Ok(n * 3));
    }
    assert_eq!(poster.shared.chunks.lock().expect("lock").len(), 3, "the dropped tickets' outcomes were reused");
}

#[test]
fn a_full_ring_refuses_a_try_and_a_post_waits_until_the_taker_takes_one() {
    let (poster, mut taker) = ring::<u64, Failed>(2, unmade);
    let a = poster.post(1).expect("room");
    let _b = poster.post(2).expect("room");
    let Err(Full(back)) = poster.try_post(3) else { panic!("two slots, two jobs: full") };
    assert_eq!(back, 3, "the job comes back");
    let taken = Arc::new(AtomicBool::new(false));
    let seen = taken.clone();
    // The poster moves to the waiting thread (one thread posts at a time).
    let waiter = std::thread::spawn(move || {
        let t = poster.post(3).expect("room once one is taken");
        assert!(seen.load(Ordering::Acquire), "posted only after the taker took one");
        (poster, t)
    });
    std::thread::sleep(Duration::from_millis(20));
    assert!(!waiter.is_finished(), "the post waits while the ring is full");
    taken.store(true, Ordering::Release);
    let mut done = taker.try_next().expect("a job");
    let n = *done.job();
    assert_eq!(n, 1);
    done.set(10, None);
    let (_poster, c) = waiter.join().expect("the post returned");
    assert!(!c.done());
    assert_eq!(a.wait(), Ok(10));
    assert_eq!(taker.try_next().map(|mut t| *t.job()), Some(2));
}

#[test]
fn a_sleeping_taker_is_woken_by_every_post() {
    let (poster, taker) = ring::<u64, Failed>(4, unmade);
    // No spin: the taker sleeps whenever the ring is empty.
    let t = spawn_taker(taker, Duration::ZERO);
    let jobs = scaled(2_000);
    for n in 1..=jobs {
        if n % 2 == 0 {
            // Let it fall asleep first on every other job.
            while !poster.shared.sleeping.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
        }
        check(n, poster.post(n).expect("taker alive").wait());
    }
    drop(poster);
    assert_eq!(t.join().expect("taker ran").len(), jobs as usize, "the close woke it too");
}

#[test]
fn closing_the_ring_lets_the_taker_take_every_job_posted_before_it_stops() {
    let (poster, taker) = ring::<u64, Failed>(64, unmade);
    let made = Arc::new(AtomicUsize::new(0));
    let counted = made.clone();
    let mut taker = taker;
    let t = std::thread::spawn(move || {
        while let Some(mut done) = taker.next(Duration::from_micros(10)) {
            let n = *done.job();
            std::thread::sleep(Duration::from_micros(200));
            counted.fetch_add(1, Ordering::Relaxed);
            done.set(n, None);
        }
    });
    let tickets: Vec<_> = (0..50u64).map(|n| poster.post(n).expect("alive")).collect();
    drop(poster);
    t.join().expect("taker ran");
    assert_eq!(made.load(Ordering::Relaxed), 50);
    assert!(tickets.iter().enumerate().all(|(n, t)| t.wait() == Ok(n as u64)));
}

#[test]
fn a_job_dropped_unmade_and_jobs_left_when_the_taker_stops_end_with_the_unmade_error() {
    let (poster, mut taker) = ring::<u64, Failed>(8, unmade);
    let dropped = poster.post(1).expect("posted");
    let left = poster.post(2).expect("posted");
    assert!(!dropped.done() && dropped.outcome_now().is_none(), "not made yet");
    let done = taker.try_next().expect("a job");
    drop(done);
    assert_eq!(dropped.wait(), Err(unmade()), "dropped unset: the unmade error");
    assert!(!left.done());
    drop(taker);
    assert!(left.done(), "its taker is gone: it never will be made");
    assert_eq!(left.wait(), Err(unmade()));
    assert!(poster.shared.gone.load(Ordering::Acquire));
    assert!(matches!(poster.post(3), Err(Gone(3))), "a full wait would be for ever: refused");
}

#[test]
fn a_ticket_kept_after_both_sides_are_dropped_still_reads_its_answer() {
    // The launcher dropped while a `Pending` is held.
    let (poster, mut taker) = ring::<u64, Failed>(4, unmade);
    let made = poster.post(3).expect("posted");
    let left = poster.post(4).expect("posted");
    taker.try_next().expect("a job").set(9, None);
    drop((poster, taker));
    // The tickets keep the ring's memory: their outcomes are read from it,
    // and it is freed with the last of them (Miri checks both).
    assert_eq!(made.wait(), Ok(9));
    assert_eq!(left.wait(), Err(unmade()), "never made: its taker went first");
}

#[test]
fn a_taker_that_panics_while_making_a_job_leaves_no_ticket_waiting() {
    let (poster, mut taker) = ring::<u64, Failed>(8, unmade);
    let tickets: Vec<_> = (0..5u64).map(|n| poster.post(n).expect("posted")).collect();
    let t = std::thread::spawn(move || {
        while let Some(mut done) = taker.next(Duration::ZERO) {
            let n = *done.job();
            assert!(n < 2, "job {n}: a panic while making it");
            done.set(n, None);
        }
    });
    assert!(t.join().is_err(), "it panicked");
    let got: Vec<_> = tickets.iter().map(Ticket::wait).collect();
    assert_eq!(got, vec![Ok(0), Ok(1), Err(unmade()), Err(unmade()), Err(unmade())]);
}

#[test]
fn two_threads_hand_over_100k_jobs_with_tickets_kept_past_many_reuses() {
    let (poster, taker) = ring::<u64, Failed>(16, unmade);
    let t = spawn_taker(taker, Duration::from_micros(20));
    // Tickets kept for a varying depth (up to 300, beyond the ring's slots
    // and the pool's first chunk), checked when dropped.
    let mut kept: VecDeque<(u64, Ticket<u64, Failed>)> = VecDeque::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let jobs = scaled(100_000);
    for n in 0..jobs {
        kept.push_back((n, poster.post(n).expect("taker alive")));
        let depth = (xorshift(&mut x) % 300) as usize;
        while kept.len() > depth {
            let (m, t) = kept.pop_front().expect("non-empty");
            check(m, t.wait());
        }
    }
    for (m, t) in kept {
        check(m, t.wait());
    }
    drop(poster);
    assert_eq!(t.join().expect("taker ran").len(), jobs as usize);
}

#[test]
fn a_taker_that_sleeps_whenever_it_can_and_tickets_dropped_on_a_third_thread_hand_over_every_job() {
    let (poster, taker) = ring::<u64, Failed>(8, unmade);
    // No spin: it sleeps whenever it finds the ring empty, so posts race its decision to sleep.
    let t = spawn_taker(taker, Duration::ZERO);
    // Tickets checked and dropped on a thread of their own: outcomes come
    // back to the pool from the taker and from that thread, while the
    // poster takes them.
    let (tx, rx) = std::sync::mpsc::sync_channel::<(u64, Ticket<u64, Failed>)>(64);
    let checker = std::thread::spawn(move || {
        let mut checked = 0u64;
        for (n, t) in rx {
            check(n, t.wait());
            checked += 1;
        }
        checked
    });
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let jobs = scaled(50_000);
    for n in 0..jobs {
        tx.send((n, poster.post(n).expect("taker alive"))).expect("checker alive");
        // Bursts of varying length, with pauses that let the taker fall asleep.
        if xorshift(&mut x).is_multiple_of(16) {
            std::thread::yield_now();
        }
    }
    drop(tx);
    assert_eq!(checker.join().expect("checker ran"), jobs);
    drop(poster);
    assert_eq!(t.join().expect("taker ran"), (0..jobs).collect::<Vec<_>>(), "every job, in order");
}

/// A job that counts its drops in `.1`, and panics in the first of them
/// when `.2` (a job's drop is its owner's code, and may).
#[derive(Debug)]
struct Counted(u64, &'static AtomicUsize, bool);

impl Drop for Counted {
    fn drop(&mut self) {
        if self.1.fetch_add(1, Ordering::SeqCst) == 0 && self.2 {
            panic!("job {}: its drop panics", self.0);
        }
    }
}

#[test]
fn a_taker_that_slept_on_one_thread_and_moved_to_another_is_woken_there() {
    let (poster, mut taker) = ring::<u64, Failed>(4, unmade);
    // It sleeps once here, woken by a post from another thread.
    let waker = std::thread::spawn(move || {
        while !poster.shared.sleeping.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        let t = poster.post(1).expect("taker alive");
        (poster, t)
    });
    let done = taker.next(Duration::ZERO).expect("job 1");
    done.set(1, None);
    let (poster, first) = waker.join().expect("it posted");
    assert_eq!(first.wait(), Ok(1));
    // Then it moves to a thread of its own and sleeps there.
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        while let Some(mut done) = taker.next(Duration::ZERO) {
            let n = *done.job();
            done.set(n, None);
            let _ = tx.send(n);
        }
    });
    while !poster.shared.sleeping.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    // Long enough for it to be parked, not only about to be.
    std::thread::sleep(Duration::from_millis(20));
    let second = poster.post(2).expect("taker alive");
    let got = rx.recv_timeout(Duration::from_secs(20));
    assert_eq!(got, Ok(2), "the post woke the thread the taker sleeps on now");
    assert_eq!(second.wait(), Ok(2));
    drop(poster);
    t.join().expect("the close woke it");
}

#[test]
fn a_job_whose_drop_panics_is_dropped_once_and_its_slot_passed() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    let (poster, mut taker) = ring::<Counted, Failed>(2, unmade);
    let first = poster.post(Counted(1, &DROPS, true)).expect("posted");
    let taken = taker.try_next().expect("a job");
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| taken.set(5, None)));
    assert!(r.is_err(), "its drop panicked");
    assert_eq!(DROPS.load(Ordering::SeqCst), 1);
    assert_eq!(first.wait(), Ok(5), "set before the job was dropped");
    assert_eq!(taker.head, 1, "the taker is past the dropped job: it is not taken (or dropped) again");
    let second = poster.post(Counted(2, &DROPS, true)).expect("posted");
    assert_eq!(taker.try_next().map(|mut t| t.job().0), Some(2), "the next job is the next posted");
    assert_eq!(second.wait(), Err(unmade()));
    drop((poster, taker, first, second));
    assert_eq!(DROPS.load(Ordering::SeqCst), 2, "each job dropped once");
}

#[test]
fn jobs_pass_through_the_counters_wrap_around_in_order() {
    let (poster, taker) = ring_from::<u64, Failed>(4, unmade, usize::MAX - 37);
    let t = spawn_taker(taker, Duration::from_micros(20));
    let tickets: Vec<_> = (0..100u64).map(|n| poster.post(n).expect("taker alive")).collect();
    for (n, t) in tickets.iter().enumerate() {
        check(n as u64, t.wait());
    }
    drop(poster);
    assert_eq!(t.join().expect("taker ran"), (0..100).collect::<Vec<_>>());
}

#[test]
fn jobs_left_in_the_ring_are_dropped_with_it_across_the_wrap_around() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    let (poster, mut taker) = ring_from::<Counted, Failed>(4, unmade, usize::MAX - 1);
    let tickets: Vec<_> = (0..4u64).map(|n| poster.post(Counted(n, &DROPS, false)).expect("posted")).collect();
    taker.try_next().expect("a job").set(0, None);
    assert_eq!(DROPS.load(Ordering::SeqCst), 1);
    drop(taker);
    assert_eq!(tickets[0].wait(), Ok(0));
    assert!(tickets[1..].iter().all(|t| t.wait() == Err(unmade())), "the taker went first");
    drop((poster, tickets));
    assert_eq!(DROPS.load(Ordering::SeqCst), 4, "the three never taken were dropped with the ring");
}

#[test]
fn a_take_counts_the_jobs_in_the_ring_as_of_the_tail_last_read() {
    let (poster, mut taker) = ring::<u64, Failed>(8, unmade);
    let _kept: Vec<_> = (0..3).map(|n| poster.post(n).expect("posted")).collect();
    let t = taker.try_next().expect("a job");
    assert_eq!(t.queued(), 3, "the tail read at the first take, this job included");
    drop(t);
    let _more = poster.post(3).expect("posted");
    // The tail is read again only once the ring looks empty: the job just posted is not counted yet.
    assert_eq!(taker.try_next().expect("a job").queued(), 2);
    assert_eq!(taker.try_next().expect("a job").queued(), 1);
    assert_eq!(taker.try_next().expect("a job").queued(), 1, "the tail read again: the last job");
    assert!(taker.try_next().is_none());
}

#[test]
fn a_taker_counts_its_sleeps_and_their_time() {
    let (poster, taker) = ring::<u64, Failed>(4, unmade);
    assert_eq!(taker.slept(), (0, Duration::ZERO));
    let t = std::thread::spawn(move || {
        let mut taker = taker;
        // No spin: it sleeps as soon as it finds the ring empty.
        while taker.next(Duration::ZERO).is_some() {}
        taker.slept()
    });
    while !poster.shared.sleeping.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    drop(poster.post(1).expect("posted"));
    drop(poster);
    let (sleeps, slept) = t.join().expect("taker ran");
    assert!(sleeps >= 1, "it was asleep before the post: {sleeps}");
    assert!(slept > Duration::ZERO);
}
