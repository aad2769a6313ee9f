//! The `ppq-even` policy decides exactly as it did before its round kept
//! its vectors from one run to the next (issue 35: allocations were a third
//! of its instructions per launch): its implementation of 2026-11-28
//! (daea232) is kept here as the reference, and both run the same seeded
//! workloads (processes of three priorities coming, submitting kernels of
//! every size and leaving) on the scripted device; every command and every
//! completion must be the same, at the same time.

mod common;

use common::{seeded_run as run, Bench};
use gpumux_engine::device::Mechanism;
use gpumux_engine::ids::{KernelId, Slot, SmId};
use gpumux_engine::policies::ppq_even::{PpqEven, DEFAULT_LINGER};
use gpumux_engine::policy::{ActiveKernel, Decision, Policy, SchedView, SmState};
use gpumux_engine::time::Nanos;

/// `partition::even` as it was.
fn even(n: usize, sms: u32) -> Vec<u32> {
    if n == 0 {
        return vec![];
    }
    let (q, r) = (sms / n as u32, sms as usize % n);
    (0..n).map(|i| q + u32::from(i < r)).collect()
}

/// `partition::even_capped` as it was.
fn even_capped(caps: &[u32], sms: u32) -> Vec<u32> {
    let n = caps.len();
    let mut out = vec![0u32; n];
    let mut left = sms;
    let mut open: Vec<usize> = (0..n).collect();
    while left > 0 && !open.is_empty() {
        let share = even(open.len(), left);
        let mut next = Vec::new();
        let mut given = 0;
        for (slot, &i) in open.iter().enumerate() {
            let g = share[slot].min(caps[i] - out[i]);
            out[i] += g;
            given += g;
            if out[i] < caps[i] {
                next.push(i);
            }
        }
        left -= given;
        if given == 0 {
            break;
        }
        open = next;
    }
    out
}

/// The policy as it was (daea232), allocating its vectors each round.
struct Reference {
    mechanism: Mechanism,
    linger: Nanos,
    active_before: Vec<(Slot, i32, u32)>,
    lingering: Vec<(Slot, i32, u32, Nanos)>,
}

/// One process with active kernels, as this round sees it.
struct Proc<'v> {
    slot: Slot,
    priority: i32,
    /// Its active kernels, in arrival order.
    kernels: Vec<ActiveKernel<'v>>,
    /// SMs its kernels could keep busy (at most the device's).
    demand: u32,
    /// SMs it holds or has on their way.
    committed: u32,
    /// Its share.
    target: u32,
    /// Idle SMs it leaves alone beyond its share: its lingering peers' shares.
    keep: u32,
    /// SMs it runs on (not being preempted), highest last.
    running: Vec<SmId>,
}

impl Policy for Reference {
    fn name(&self) -> String {
        format!("ppq-even-{}", self.mechanism.short())
    }

    fn wake_at(&self) -> Option<Nanos> {
        self.lingering.iter().map(|&(_, _, _, until)| until).min()
    }

    fn process_removed(&mut self, slot: Slot) {
        self.active_before.retain(|e| e.0 != slot);
        self.lingering.retain(|e| e.0 != slot);
    }

    fn schedule(&mut self, view: &SchedView<'_>, out: &mut Vec<Decision>) {
        let n = view.device.num_sms as u32;
        // Processes in the order of their oldest active kernel. A round runs
        // at every event batch (an urgent kernel's path has three), so its
        // lookups are linear scans of the few processes and kernels, not
        // hashes: this function was half of the engine's time on that path.
        let mut procs: Vec<Proc> = Vec::new();
        // Each active kernel's process, by the kernel's arrival index.
        let mut proc_of_kernel: Vec<usize> = Vec::with_capacity(view.kernel_count());
        for k in view.kernels() {
            let i = match procs.iter().position(|p| p.slot == k.process()) {
                Some(i) => i,
                None => {
                    procs.push(Proc {
                        slot: k.process(),
                        priority: k.priority(),
                        kernels: Vec::new(),
                        demand: 0,
                        committed: 0,
                        target: 0,
                        keep: 0,
                        // Room for every SM: one allocation, where growing
                        // push by push reallocated up to eight times a round.
                        running: Vec::with_capacity(n as usize),
                    });
                    procs.len() - 1
                }
            };
            proc_of_kernel.push(i);
            let p = &mut procs[i];
            p.demand = p.demand.saturating_add(k.useful_sms()).min(n);
            p.committed += k.sms_committed();
            p.kernels.push(k);
        }
        // Neighbouring SMs mostly run the same kernel: remember the last one.
        let mut last: Option<(KernelId, Option<usize>)> = None;
        for (i, s) in view.sms.iter().enumerate() {
            if let SmState::Running { kernel, .. } = s {
                let p = match last {
                    Some((k, p)) if k == *kernel => p,
                    _ => {
                        let p = view.position(*kernel).map(|at| proc_of_kernel[at]);
                        last = Some((*kernel, p));
                        p
                    }
                };
                if let Some(p) = p {
                    procs[p].running.push(SmId(i as u16));
                }
            }
        }

        // Who lingers: active at the last round, not now, for `linger` after.
        let now = view.now;
        let is_active = |slot: Slot| procs.iter().any(|p| p.slot == slot);
        for &(slot, prio, demand) in &self.active_before {
            if !is_active(slot) {
                let entry = (slot, prio, demand, now.saturating_add(self.linger));
                match self.lingering.binary_search_by_key(&slot, |e| e.0) {
                    Ok(i) => self.lingering[i] = entry,
                    Err(i) => self.lingering.insert(i, entry),
                }
            }
        }
        self.lingering.retain(|&(slot, _, _, until)| until > now && !is_active(slot));
        self.active_before.clear();
        self.active_before.extend(procs.iter().map(|p| (p.slot, p.priority, p.demand)));

        // Shares, level by level from the top: a level splits what the
        // levels above it use none of; lingering peers take part in the
        // split (their share is kept from the level, `keep`), but the
        // levels below may use it.
        let mut levels: Vec<i32> = procs.iter().map(|p| p.priority).collect();
        levels.sort_unstable_by(|a, b| b.cmp(a));
        levels.dedup();
        let mut budget = n;
        for &level in &levels {
            let members: Vec<usize> = (0..procs.len()).filter(|&i| procs[i].priority == level).collect();
            // In slot order (`lingering` is kept so): the water filling gives
            // remainders by position, and a map's order made the shares
            // differ from run to run.
            let idle_peers = self.lingering.iter().filter(|e| e.1 == level).map(|e| e.2.min(n));
            let caps: Vec<u32> = members.iter().map(|&i| procs[i].demand).chain(idle_peers).collect();
            let shares = even_capped(&caps, budget);
            for (&i, &s) in members.iter().zip(&shares) {
                procs[i].target = s;
                budget -= s;
            }
            let keep = shares[members.len()..].iter().sum();
            for &i in &members {
                procs[i].keep = keep;
            }
        }

        // Each process, by priority then arrival, takes what its share is owed.
        let mut order: Vec<usize> = (0..procs.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(procs[i].priority)); // stable: arrival order within a level
        let mut idle: Vec<SmId> = Vec::with_capacity(n as usize);
        idle.extend(view.idle_sms());
        // pop() hands out SM 0 first.
        idle.reverse();
        // SMs each kernel could still use, kept up to date through the round.
        let mut wants: Vec<Vec<u32>> = procs
            .iter()
            .map(|p| p.kernels.iter().map(|k| k.useful_sms().saturating_sub(k.sms_committed())).collect())
            .collect();
        for &i in &order {
            let mut need = procs[i].target.saturating_sub(procs[i].committed);
            for (k, want) in wants[i].iter_mut().enumerate() {
                let kernel = procs[i].kernels[k].id();
                while need > 0 && *want > 0 {
                    if let Some(sm) = idle.pop() {
                        out.push(Decision::Assign { sm, kernel, slice: None });
                    } else if let Some(sm) = take_from_others(&mut procs, i) {
                        out.push(Decision::Preempt { sm, mechanism: self.mechanism, next: Some(kernel) });
                    } else {
                        break;
                    }
                    *want -= 1;
                    need -= 1;
                    procs[i].committed += 1;
                }
            }
        }

        // SMs no share covers go to whoever can use them, by priority; a
        // level leaves its lingering peers' shares alone.
        for &i in &order {
            let keep = procs[i].keep as usize;
            for (k, kernel) in procs[i].kernels.iter().enumerate() {
                while wants[i][k] > 0 && idle.len() > keep {
                    let Some(sm) = idle.pop() else { break };
                    out.push(Decision::Assign { sm, kernel: kernel.id(), slice: None });
                    wants[i][k] -= 1;
                }
            }
        }
    }
}

/// An SM for process `i`, preempted from a lower level (lowest priority,
/// then the youngest process, first) or else from a peer holding more than
/// its share (the one most over it first); highest SM first.
fn take_from_others(procs: &mut [Proc], i: usize) -> Option<SmId> {
    let me = procs[i].priority;
    let lower = (0..procs.len())
        .filter(|&j| procs[j].priority < me && !procs[j].running.is_empty())
        .min_by_key(|&j| (procs[j].priority, std::cmp::Reverse(j)));
    let from = lower.or_else(|| {
        (0..procs.len())
            .filter(|&j| j != i && procs[j].priority == me && procs[j].committed > procs[j].target)
            .filter(|&j| !procs[j].running.is_empty())
            .max_by_key(|&j| (procs[j].committed - procs[j].target, std::cmp::Reverse(j)))
    })?;
    let sm = procs[from].running.pop()?;
    procs[from].committed = procs[from].committed.saturating_sub(1);
    Some(sm)
}

fn same_as_the_reference(mechanism: Mechanism, freeing_at_once: bool) {
    for seed in 1..=12u64 {
        let bench = |policy: Box<dyn Policy>| {
            if freeing_at_once {
                Bench::freeing_at_once_with(policy)
            } else {
                Bench::with_policy(policy)
            }
        };
        let reference =
            Reference { mechanism, linger: DEFAULT_LINGER, active_before: Vec::new(), lingering: Vec::new() };
        let (want_cmds, want_done) = run(bench(Box::new(reference)), seed);
        // The reference predates reserves (`policies::reserve`): compared with them off.
        let (got_cmds, got_done) = run(bench(Box::new(PpqEven::without_reserve(mechanism))), seed);
        assert!(want_cmds.len() > 20, "seed {seed}: a workload that does something ({} commands)", want_cmds.len());
        assert_eq!(got_cmds, want_cmds, "seed {seed}, {mechanism:?}: the commands differ");
        assert_eq!(got_done, want_done, "seed {seed}, {mechanism:?}: the completions differ");
    }
}

#[test]
fn draining_decides_as_the_reference() {
    same_as_the_reference(Mechanism::Drain, false);
    same_as_the_reference(Mechanism::Drain, true);
}

#[test]
fn context_switching_decides_as_the_reference() {
    same_as_the_reference(Mechanism::ContextSwitch, false);
}
