//! The non-preemptive resources of the model (the PCI bus, the GPUs), granted in priority
//! order: GPU-SPARC's dispatcher, in the runner.
//!
//! The analysis (docs/rt.md) treats the bus and each GPU as units held without preemption
//! for one section (a whole subtask, or one `chunk` of it), dispatched globally: a waiting
//! section of higher priority goes first, and a single-GPU kernel takes whichever GPU is free.
//! gpumuxd would let two of our kernels share one GPU's SMs; the runner asks it for a GPU
//! only once this arbiter has granted it, so a kernel has its GPU to itself as the model says.
//!
//! **Strict priority.** Waiters are served highest priority first; one that cannot be served
//! yet keeps what it is waiting for from lower ones: the unit it names, or, when it waits for
//! any units (a two-GPU kernel with one GPU free), every free unit. Without that, lower
//! kernels slipping onto the one free GPU could hold a two-GPU kernel off without end.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What a section needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// Any `n` units at once (single mode: 1 GPU; multi mode: 2; the bus: 1).
    Any(usize),
    /// This unit (a task pinned to its GPU: `--dispatch partitioned`).
    Unit(usize),
}

#[derive(Debug)]
struct Waiter {
    want: Want,
    granted: Option<Vec<usize>>,
}

#[derive(Debug)]
struct State {
    free: Vec<bool>,
    /// By (rank, arrival): rank 0 is the highest priority.
    waiters: BTreeMap<(usize, u64), Waiter>,
    arrivals: u64,
}

/// `units` identical units, granted in priority order (module doc).
#[derive(Debug)]
pub struct Arbiter {
    state: Mutex<State>,
    changed: Condvar,
}

impl Arbiter {
    /// An arbiter of `units` units, all free.
    pub fn new(units: usize) -> Arbiter {
        Arbiter {
            state: Mutex::new(State { free: vec![true; units], waiters: BTreeMap::new(), arrivals: 0 }),
            changed: Condvar::new(),
        }
    }

    /// How many units it has.
    #[cfg(test)]
    pub fn units(&self) -> usize {
        self.lock().free.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until the units are granted to a section of priority `rank` (0 highest) and
    /// returns them (lowest indices first). Give them back with [`Arbiter::release`].
    /// A want that can never be met (more units than there are, a unit not there) panics in
    /// debug builds and is clamped otherwise: callers check the platform first.
    pub fn acquire(&self, rank: usize, want: Want) -> Vec<usize> {
        let mut s = self.lock();
        let n = s.free.len();
        let want = match want {
            Want::Any(k) => Want::Any(k.clamp(1, n.max(1))),
            Want::Unit(u) => Want::Unit(u.min(n.saturating_sub(1))),
        };
        let key = (rank, s.arrivals);
        s.arrivals += 1;
        s.waiters.insert(key, Waiter { want, granted: None });
        grant(&mut s);
        loop {
            if let Some(units) = s.waiters.get_mut(&key).and_then(|w| w.granted.take()) {
                // A granted waiter keeps nothing from the others (`grant` skips it, and its
                // units are no longer free), so taking it out changes no one's grant.
                s.waiters.remove(&key);
                return units;
            }
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// [`Arbiter::acquire`], the units given back when the [`Held`] is dropped or released.
    pub fn hold(&self, rank: usize, want: Want) -> Held<'_> {
        let units = self.acquire(rank, want);
        Held { arbiter: self, units, since: Instant::now() }
    }

    /// Gives units back and serves the waiters they now satisfy.
    pub fn release(&self, units: &[usize]) {
        let mut s = self.lock();
        for &u in units {
            if let Some(f) = s.free.get_mut(u) {
                *f = true;
            }
        }
        grant(&mut s);
        self.changed.notify_all();
    }
}

/// Units held from an [`Arbiter`] ([`Arbiter::hold`]), given back when dropped: a section
/// that fails (a device error, a panic) must not leave the tasks waiting for them waiting
/// forever, and the run with them.
#[derive(Debug)]
pub struct Held<'a> {
    arbiter: &'a Arbiter,
    /// The units, lowest first.
    pub units: Vec<usize>,
    since: Instant,
}

impl Held<'_> {
    /// Gives the units back; how long they were held.
    pub fn release(self) -> Duration {
        let held = self.since.elapsed();
        drop(self);
        held
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.arbiter.release(&self.units);
    }
}

/// One pass over the waiters in priority order (module doc: strict priority).
fn grant(s: &mut State) {
    let mut open: Vec<bool> = s.free.clone();
    let State { free, waiters, .. } = s;
    for w in waiters.values_mut().filter(|w| w.granted.is_none()) {
        let fit: Option<Vec<usize>> = match w.want {
            Want::Any(k) => {
                let units: Vec<usize> = (0..open.len()).filter(|&u| open[u]).take(k).collect();
                (units.len() == k).then_some(units)
            }
            Want::Unit(u) => open.get(u).copied().unwrap_or(false).then(|| vec![u]),
        };
        match fit {
            Some(units) => {
                for &u in &units {
                    open[u] = false;
                    free[u] = false;
                }
                w.granted = Some(units);
            }
            None => match w.want {
                Want::Any(_) => open.iter_mut().for_each(|o| *o = false),
                Want::Unit(u) => {
                    if let Some(o) = open.get_mut(u) {
                        *o = false;
                    }
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    /// Starts a thread that acquires `want` at `rank`, records its rank, holds for `hold`.
    fn contender(
        a: &Arc<Arbiter>,
        order: &Arc<Mutex<Vec<usize>>>,
        rank: usize,
        want: Want,
        hold: Duration,
    ) -> std::thread::JoinHandle<Vec<usize>> {
        let (a, order) = (Arc::clone(a), Arc::clone(order));
        std::thread::spawn(move || {
            let units = a.acquire(rank, want);
            order.lock().unwrap().push(rank);
            std::thread::sleep(hold);
            a.release(&units);
            units
        })
    }

    /// Waits until `n` sections wait on `a`.
    fn until_waiting(a: &Arbiter, n: usize) {
        for _ in 0..2000 {
            if a.lock().waiters.values().filter(|w| w.granted.is_none()).count() >= n {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("{n} waiters never arrived");
    }

    #[test]
    fn waiters_are_served_highest_priority_first_not_in_arrival_order() {
        let a = Arc::new(Arbiter::new(1));
        let order = Arc::new(Mutex::new(Vec::new()));
        let held = a.acquire(9, Want::Any(1));
        let mut threads = Vec::new();
        for rank in [5, 3, 7, 1] {
            threads.push(contender(&a, &order, rank, Want::Any(1), Duration::from_millis(2)));
            until_waiting(&a, threads.len());
        }
        a.release(&held);
        for t in threads {
            assert_eq!(t.join().unwrap(), vec![0]);
        }
        assert_eq!(*order.lock().unwrap(), vec![1, 3, 5, 7]);
    }

    #[test]
    fn a_two_gpu_section_waiting_keeps_the_free_gpu_from_lower_priorities() {
        let a = Arc::new(Arbiter::new(2));
        let order = Arc::new(Mutex::new(Vec::new()));
        let low = a.acquire(5, Want::Any(1));
        assert_eq!(low, vec![0]);
        // GPU 1 is free, but the two-GPU section of rank 1 waits for GPU 0 too ...
        let gang = contender(&a, &order, 1, Want::Any(2), Duration::from_millis(2));
        until_waiting(&a, 1);
        // ... so a lower single-GPU section must not take GPU 1 in the meantime.
        let lower = contender(&a, &order, 3, Want::Any(1), Duration::from_millis(1));
        until_waiting(&a, 2);
        std::thread::sleep(Duration::from_millis(20));
        assert!(order.lock().unwrap().is_empty(), "nobody passes the waiting gang: {:?}", order.lock().unwrap());
        a.release(&low);
        assert_eq!(gang.join().unwrap(), vec![0, 1]);
        assert_eq!(lower.join().unwrap().len(), 1);
        assert_eq!(*order.lock().unwrap(), vec![1, 3]);
    }

    #[test]
    fn units_held_come_back_when_the_section_fails() {
        let a = Arbiter::new(2);
        let section = || -> Result<(), String> {
            let _held = a.hold(0, Want::Any(2));
            Err("a device error".into())
        };
        assert!(section().is_err());
        assert_eq!(a.lock().free, vec![true, true], "the error gave both units back");
        let h = a.hold(1, Want::Unit(1));
        assert_eq!(h.units, vec![1]);
        let _ = h.release();
        assert_eq!(a.lock().free, vec![true, true]);
    }

    #[test]
    fn a_pinned_waiter_keeps_only_its_own_unit() {
        let a = Arc::new(Arbiter::new(2));
        let order = Arc::new(Mutex::new(Vec::new()));
        let on0 = a.acquire(5, Want::Unit(0));
        let pinned = contender(&a, &order, 1, Want::Unit(0), Duration::from_millis(1));
        until_waiting(&a, 1);
        // A lower section pinned to GPU 1 is not held up by the wait for GPU 0.
        let other = a.acquire(4, Want::Unit(1));
        assert_eq!(other, vec![1]);
        a.release(&other);
        a.release(&on0);
        assert_eq!(pinned.join().unwrap(), vec![0]);
        assert_eq!(a.units(), 2);
    }
}
