use super::*;
use std::time::Duration;

/// A deterministic job whose run time varies, so workers finish out of order.
fn slow_square(x: &u64) -> Result<u64, String> {
    std::thread::sleep(Duration::from_micros((x * 7919) % 13 * 100));
    Ok(x * x)
}

#[test]
fn results_come_in_job_order() {
    let jobs: Vec<u64> = (0..200).collect();
    let out = JobPool::new(8).map(&jobs, slow_square).expect("no job fails");
    assert_eq!(out, jobs.iter().map(|x| x * x).collect::<Vec<_>>());
}

#[test]
fn one_thread_and_many_give_the_same_results() {
    let jobs: Vec<u64> = (0..100).collect();
    let one = JobPool::new(1).map(&jobs, slow_square);
    for threads in [2, 3, 16, 1000] {
        assert_eq!(JobPool::new(threads).map(&jobs, slow_square), one, "{threads} threads");
    }
}

#[test]
fn no_jobs_give_no_results() {
    let jobs: Vec<u64> = Vec::new();
    assert_eq!(JobPool::new(4).map(&jobs, slow_square), Ok(Vec::new()));
}

#[test]
fn the_first_error_in_job_order_wins_even_when_a_later_one_fails_sooner() {
    let jobs: Vec<u64> = (0..50).collect();
    let run = |&x: &u64| -> Result<u64, String> {
        match x {
            // Fails last in time, first in job order.
            3 => {
                std::thread::sleep(Duration::from_millis(50));
                Err("job 3".to_string())
            }
            7 | 20 => Err(format!("job {x}")),
            _ => Ok(x),
        }
    };
    for threads in [1, 4, 16] {
        assert_eq!(JobPool::new(threads).map(&jobs, run), Err("job 3".to_string()), "{threads} threads");
    }
}

#[test]
fn jobs_after_a_failure_are_not_started_on_one_thread() {
    let jobs: Vec<u64> = (0..50).collect();
    let started = AtomicUsize::new(0);
    let r = JobPool::new(1).map(&jobs, |&x| {
        started.fetch_add(1, Ordering::Relaxed);
        if x == 9 {
            Err(x)
        } else {
            Ok(x)
        }
    });
    assert_eq!(r, Err(9));
    assert_eq!(started.into_inner(), 10);
}

#[test]
fn the_callback_hears_of_every_job() {
    let jobs: Vec<u64> = (0..64).collect();
    let done = AtomicUsize::new(0);
    let count = || {
        done.fetch_add(1, Ordering::Relaxed);
    };
    JobPool::new(4).on_job_done(&count).map(&jobs, slow_square).expect("no job fails");
    assert_eq!(done.into_inner(), jobs.len());
}

#[test]
fn each_worker_keeps_its_own_state() {
    let jobs: Vec<u64> = (0..64).collect();
    let (out, states) = JobPool::new(4)
        .map_with(
            &jobs,
            || 0u64,
            |ran: &mut u64, x| {
                *ran += 1;
                slow_square(x)
            },
        )
        .expect("no job fails");
    assert_eq!(out.len(), jobs.len());
    assert_eq!(states.len(), 4);
    assert_eq!(states.iter().sum::<u64>(), jobs.len() as u64);
}

#[test]
fn workers_are_no_more_than_jobs() {
    let pool = JobPool::new(8);
    assert_eq!(pool.workers(3), 3);
    assert_eq!(pool.workers(100), 8);
    assert_eq!(pool.workers(0), 1);
    assert_eq!(JobPool::new(0).workers(5), 1);
}

#[test]
fn a_panic_in_a_job_reaches_the_caller() {
    let jobs: Vec<u64> = (0..32).collect();
    for threads in [1, 4] {
        let caught = std::panic::catch_unwind(|| {
            JobPool::new(threads).map(&jobs, |&x| {
                if x == 5 {
                    panic!("job 5 panicked");
                }
                Ok::<u64, String>(x)
            })
        });
        let payload = caught.expect_err("the panic is resumed");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"job 5 panicked"), "{threads} threads");
    }
}
