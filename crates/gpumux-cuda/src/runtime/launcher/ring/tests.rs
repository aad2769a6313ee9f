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
    for n in 1..=2_000u64 {
        if n % 2 == 0 {
            // Let it fall asleep first on every other job.
            while !poster.shared.sleeping.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
        }
        check(n, poster.post(n).expect("taker alive").wait());
    }
    drop(poster);
    assert_eq!(t.join().expect("taker ran").len(), 2_000, "the close woke it too");
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
    for n in 0..100_000u64 {
        kept.push_back((n, poster.post(n).expect("taker alive")));
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let depth = (x % 300) as usize;
        while kept.len() > depth {
            let (m, t) = kept.pop_front().expect("non-empty");
            check(m, t.wait());
        }
    }
    for (m, t) in kept {
        check(m, t.wait());
    }
    drop(poster);
    assert_eq!(t.join().expect("taker ran").len(), 100_000);
}
