//! Preemptive priority queues with an even split inside each level
//! (`ppq-even-<mechanism>`): PPQ between priority levels (Tanasic 4.2-4.3,
//! the shared variant), spatial sharing among the processes of one level.
//!
//! PPQ alone gives one priority level's kernels the SMs in arrival order, so
//! two equal clients take turns kernel by kernel: co-run throughput is that
//! of running them one after the other (issue 14: STP 0.80-1.04 on the H100
//! where MPS reaches 1.06-1.34). Here the SMs a level can have (those the
//! levels above it do not use) are split evenly among the level's processes,
//! each share capped by what the process can keep busy and the rest
//! water-filled to the others (`partition::even_capped`), so equal clients
//! run side by side, as under spatial-even, while an urgent client still
//! takes every SM it can use from the levels below.
//!
//! A process's share goes to its kernels in arrival order. SMs come from
//! idle ones first, then from lower levels (lowest priority, then youngest
//! process, first), then from peers of the same level holding more than
//! their share (when a new peer arrives). SMs no share covers go to whoever
//! can use them, in priority order (lower levels use what higher ones leave
//! idle, and are taken back from when the higher ones want more).
//!
//! **Linger.** A process whose kernels have all finished keeps its share
//! from its *peers* for [`DEFAULT_LINGER`]: a client that syncs between
//! launches (launch, wait, launch) would otherwise lose its SMs to a peer at
//! every sync and wait, at its next launch, for the peer's blocks on them to
//! drain. Lower levels may still use a lingering share: they accept being
//! taken back from, which is what priority means.
//!
//! **Reserves.** Lower levels may not use what a higher level leaves idle
//! when taking it back would be slow: while a lower level's blocks are
//! measured long (each runs for a fifth of a millisecond or more), a higher
//! level's process keeps the SMs it used at its peak from that level, while
//! it is active and for one of the level's block times after it goes idle
//! ([`super::reserve`]; issue 39's urgent client beside long-block
//! neighbours). [`PpqEven::reserve`] turns this off; by name,
//! `ppq-even-drain-no-reserve` (to A/B the reserves on a GPU).

use super::partition::even_capped_into;
use super::reserve::Reserves;
use crate::device::Mechanism;
use crate::ids::{KernelId, Slot, SmId};
use crate::policy::{Decision, Policy, SchedView, SmState};
use crate::smset::SmSet;
use crate::time::{Nanos, NS_PER_US};

/// How long a process that went idle keeps its share from its peers: a few
/// round trips of a client that syncs between launches through gpumuxd
/// (~50 µs each on an H100 host), short enough that a client gone idle for
/// good costs its peers half a millisecond of half the GPU, once.
pub const DEFAULT_LINGER: Nanos = 500 * NS_PER_US;

/// Preemptive priority queues, even split inside a level (see the module doc).
#[derive(Debug)]
pub struct PpqEven {
    /// How SMs are taken from lower levels and from peers over their share.
    pub mechanism: Mechanism,
    /// How long an idle process keeps its share from its peers.
    pub linger: Nanos,
    /// Keep a higher level's recent SMs from lower levels while taking them
    /// back is slow (the module doc, "Reserves"; on by default).
    pub reserve: bool,
    /// Processes with active kernels at the last round: (slot, priority, SMs
    /// they could use, SMs they used at their peak since they became
    /// active). A few processes: a vector, refilled each round.
    active_before: Vec<(Slot, i32, u32, u32)>,
    /// Drains measured and idle processes' reserves ([`super::reserve`]).
    reserves: Reserves,
    /// Processes whose kernels all finished lately, in slot order: (slot,
    /// priority, SMs they could use, until when).
    lingering: Vec<(Slot, i32, u32, Nanos)>,
    /// The round's vectors, kept from round to round: the policy runs at
    /// every launch, and allocating a dozen vectors each time was a third of
    /// its instructions (callgrind, issue 35).
    scratch: Scratch,
}

/// [`PpqEven::schedule`]'s working vectors, cleared before each use.
#[derive(Debug, Default)]
struct Scratch {
    proc_of_kernel: Vec<usize>,
    /// The processes of a round, kept with their lists (`Proc::kernels`,
    /// `Proc::running`) for the next one, which overwrites them in place:
    /// a round per kernel of a chain allocated them afresh, and moving
    /// them to a pool and back each round was a tenth of its instructions.
    procs: Vec<Proc>,
    levels: Vec<i32>,
    members: Vec<usize>,
    caps: Vec<u32>,
    shares: Vec<u32>,
    open: Vec<usize>,
    next: Vec<usize>,
    order: Vec<usize>,
    /// Each active kernel by its arrival index: its id and the SMs it could
    /// still use (kept up to date through the round). Read off the view
    /// once per round: each read of a kernel's figures looks up its process
    /// and its SMs and counts them, and the round read them four times.
    wants: Vec<(KernelId, u32)>,
    /// The round's processes by slot index ([`Slot::index`]): a process is
    /// active this round when its index holds its slot. Filled from the
    /// round's processes and emptied again at its end. The linger and
    /// reserve bookkeeping asks it of every process of the last round and
    /// every lingering one: scans of the round's processes for each were
    /// ~0.3 k instructions a round of issue 35's 8 clients (callgrind).
    active: Vec<Option<Slot>>,
}

impl PpqEven {
    /// The policy, taking SMs back with `mechanism`.
    pub fn new(mechanism: Mechanism) -> Self {
        PpqEven {
            mechanism,
            linger: DEFAULT_LINGER,
            reserve: true,
            active_before: Vec::new(),
            reserves: Reserves::default(),
            lingering: Vec::new(),
            scratch: Scratch::default(),
        }
    }

    /// The policy with no reserves (`reserve` off): lower levels use every
    /// SM a higher level leaves idle, however slowly they give it back.
    pub fn without_reserve(mechanism: Mechanism) -> Self {
        PpqEven { reserve: false, ..Self::new(mechanism) }
    }
}

/// One process with active kernels, as this round sees it.
#[derive(Debug)]
struct Proc {
    slot: Slot,
    priority: i32,
    /// Its active kernels, in arrival order, as their places in the view's.
    kernels: Vec<usize>,
    /// SMs its kernels could keep busy (at most the device's).
    demand: u32,
    /// SMs it holds or has on their way.
    committed: u32,
    /// Its share.
    target: u32,
    /// Idle SMs it leaves alone beyond its share: its lingering peers' shares.
    keep: u32,
    /// SMs it used at its peak since it became active (held plus wanted).
    peak: u32,
    /// At most this many SMs for its level and those below together: what
    /// the higher levels' reserves leave (`None`: no reserve above it).
    room: Option<u32>,
    /// SMs it runs on (not being preempted), highest last.
    running: Vec<SmId>,
}

impl Policy for PpqEven {
    fn name(&self) -> String {
        let without = if self.reserve { "" } else { "-no-reserve" };
        format!("ppq-even-{}{without}", self.mechanism.short())
    }

    fn wake_at(&self) -> Option<Nanos> {
        let linger = self.lingering.iter().map(|&(_, _, _, until)| until).min();
        match (linger, self.reserves.wake_at()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn process_removed(&mut self, slot: Slot) {
        self.active_before.retain(|e| e.0 != slot);
        self.lingering.retain(|e| e.0 != slot);
        self.reserves.removed(slot);
    }

    fn schedule(&mut self, view: &SchedView<'_>, out: &mut Vec<Decision>) {
        let n = view.device.num_sms as u32;
        let sc = &mut self.scratch;
        // Processes in the order of their oldest active kernel. A round runs
        // at every event batch (an urgent kernel's path has three), so its
        // lookups are linear scans of the few processes and kernels, not
        // hashes: this function was half of the engine's time on that path.
        // Kept from round to round with their lists (a round per kernel of a
        // chain allocated them afresh: issue 35's callgrind).
        // The round's processes are `all[..live]`.
        let mut all = std::mem::take(&mut sc.procs);
        let mut live = 0;
        // Each active kernel's process, by the kernel's arrival index.
        sc.proc_of_kernel.clear();
        sc.wants.clear();
        for (at, k) in view.kernels().enumerate() {
            let i = match all[..live].iter().position(|p| p.slot == k.process()) {
                Some(i) => i,
                None => {
                    if live == all.len() {
                        all.push(Proc {
                            slot: k.process(),
                            priority: 0,
                            kernels: Vec::new(),
                            demand: 0,
                            committed: 0,
                            target: 0,
                            keep: 0,
                            peak: 0,
                            room: None,
                            // Room for every SM: one allocation kept across
                            // rounds, where growing push by push reallocated
                            // up to eight times.
                            running: Vec::with_capacity(n as usize),
                        });
                    }
                    let p = &mut all[live];
                    p.slot = k.process();
                    p.priority = k.priority();
                    p.kernels.clear();
                    p.demand = 0;
                    p.committed = 0;
                    p.target = 0;
                    p.keep = 0;
                    p.peak = 0;
                    p.room = None;
                    p.running.clear();
                    live += 1;
                    live - 1
                }
            };
            sc.proc_of_kernel.push(i);
            let (useful, committed) = (k.useful_sms(), k.sms_committed());
            sc.wants.push((k.id(), useful.saturating_sub(committed)));
            let p = &mut all[i];
            p.demand = p.demand.saturating_add(useful).min(n);
            p.committed += committed;
            p.kernels.push(at);
        }
        let procs = &mut all[..live];
        // Neighbouring SMs mostly run the same kernel: remember the last one.
        let mut last: Option<(KernelId, Option<usize>)> = None;
        // The busy SMs only (in index order, as a scan of the table finds them).
        for sm in view.busy_sms() {
            let i = sm.0 as usize;
            if let SmState::Running { kernel, .. } = &view.sms[i] {
                let p = match last {
                    Some((k, p)) if k == *kernel => p,
                    _ => {
                        let p = view.position(*kernel).map(|at| sc.proc_of_kernel[at]);
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
        for p in procs.iter() {
            let i = p.slot.index() as usize;
            if i >= sc.active.len() {
                sc.active.resize(i + 1, None);
            }
            sc.active[i] = Some(p.slot);
        }
        let active = &sc.active;
        let is_active = |slot: Slot| active.get(slot.index() as usize) == Some(&Some(slot));
        if self.reserve {
            self.reserves.observe(view);
        }
        // No level's blocks are long lately (the usual case): no reserve is
        // taken or held this round, and asking each process is skipped.
        let reserves_hold = self.reserve && self.reserves.any_held(now);
        for &(slot, prio, demand, peak) in &self.active_before {
            if !is_active(slot) {
                let entry = (slot, prio, demand, now.saturating_add(self.linger));
                match self.lingering.binary_search_by_key(&slot, |e| e.0) {
                    Ok(i) => self.lingering[i] = entry,
                    Err(i) => self.lingering.insert(i, entry),
                }
                if reserves_hold {
                    self.reserves.went_idle(slot, prio, peak, now);
                }
            }
        }
        self.lingering.retain(|&(slot, _, _, until)| until > now && !is_active(slot));
        self.reserves.expire(now, is_active);
        // Each process's peak since it became active: SMs held or on their
        // way, plus those its kernels could still use.
        for p in procs.iter_mut() {
            let before = self.active_before.iter().find(|e| e.0 == p.slot).map_or(0, |e| e.3);
            p.peak = (p.committed + p.demand).min(n).max(before);
        }
        self.active_before.clear();
        self.active_before.extend(procs.iter().map(|p| (p.slot, p.priority, p.demand, p.peak)));
        // Reserves: the SMs the levels above each process keep from it (its
        // level and those below may hold the rest between them).
        for i in 0..procs.len() {
            procs[i].room = None;
            if reserves_hold && self.reserves.held_against(procs[i].priority, now) {
                let me = procs[i].priority;
                let above: u32 = procs.iter().filter(|p| p.priority > me).map(|p| p.peak).sum::<u32>()
                    + self.reserves.idle_above(me);
                if above > 0 {
                    procs[i].room = Some(n.saturating_sub(above));
                }
            }
        }

        // Shares, level by level from the top: a level splits what the
        // levels above it use none of; lingering peers take part in the
        // split (their share is kept from the level, `keep`), but the
        // levels below may use it.
        sc.levels.clear();
        sc.levels.extend(procs.iter().map(|p| p.priority));
        sc.levels.sort_unstable_by(|a, b| b.cmp(a));
        sc.levels.dedup();
        let mut budget = n;
        for &level in &sc.levels {
            sc.members.clear();
            sc.members.extend((0..procs.len()).filter(|&i| procs[i].priority == level));
            // In slot order (`lingering` is kept so): the water filling gives
            // remainders by position, and a map's order made the shares
            // differ from run to run.
            let idle_peers = self.lingering.iter().filter(|e| e.1 == level).map(|e| e.2.min(n));
            sc.caps.clear();
            sc.caps.extend(sc.members.iter().map(|&i| procs[i].demand).chain(idle_peers));
            // A level under a reserve splits at most what the reserve leaves.
            let room = sc.members.first().and_then(|&i| procs[i].room).unwrap_or(n);
            even_capped_into(&sc.caps, budget.min(room), &mut sc.shares, &mut sc.open, &mut sc.next);
            for (&i, &s) in sc.members.iter().zip(&sc.shares) {
                procs[i].target = s;
                budget -= s;
            }
            let keep = sc.shares[sc.members.len()..].iter().sum();
            for &i in &sc.members {
                procs[i].keep = keep;
            }
        }

        // Each process, by priority then arrival, takes what its share is owed.
        sc.order.clear();
        sc.order.extend(0..procs.len());
        // Stable: arrival order within a level (one level: that order).
        if sc.levels.len() > 1 {
            sc.order.sort_by_key(|&i| std::cmp::Reverse(procs[i].priority));
        }
        // A bit set, lowest SM handed out first: no vector of up to 132 SMs
        // filled, reversed and popped each round.
        let mut idle = IdleSms::new(SmSet::range(0, n as u16).difference(&view.busy_sms()));
        for &i in &sc.order {
            let mut need = procs[i].target.saturating_sub(procs[i].committed);
            for k in 0..procs[i].kernels.len() {
                let (kernel, want) = &mut sc.wants[procs[i].kernels[k]];
                let kernel = *kernel;
                while need > 0 && *want > 0 {
                    let idle_ok = has_room(procs, i);
                    if let Some(sm) = if idle_ok { idle.pop() } else { None } {
                        out.push(Decision::Assign { sm, kernel, slice: None });
                    } else if let Some((sm, lower)) = take_from_others(procs, i) {
                        if lower && self.reserve {
                            if let SmState::Running { kernel: from, .. } = view.sms[sm.0 as usize] {
                                let level = view.kernel(from).map_or(i32::MIN, |k| k.priority());
                                self.reserves.preempted(sm, from, level, now);
                            }
                        }
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
        for &i in &sc.order {
            let keep = procs[i].keep;
            for k in 0..procs[i].kernels.len() {
                let (kernel, want) = &mut sc.wants[procs[i].kernels[k]];
                while *want > 0 && idle.len > keep && has_room(procs, i) {
                    let Some(sm) = idle.pop() else { break };
                    out.push(Decision::Assign { sm, kernel: *kernel, slice: None });
                    *want -= 1;
                    procs[i].committed += 1;
                }
            }
        }
        for p in &all[..live] {
            sc.active[p.slot.index() as usize] = None;
        }
        sc.procs = all;
    }
}

/// Process `i` may take one more idle SM: the levels above it reserve
/// nothing, or its level and those below hold less than the reserves leave.
fn has_room(procs: &[Proc], i: usize) -> bool {
    let Some(room) = procs[i].room else { return true };
    let me = procs[i].priority;
    let held: u32 = procs.iter().filter(|p| p.priority <= me).map(|p| p.committed).sum();
    held < room
}

/// A round's idle SMs, lowest handed out first, with their count kept as
/// they go (the second pass compares it with a share at every SM).
struct IdleSms {
    set: SmSet,
    len: u32,
}

impl IdleSms {
    fn new(set: SmSet) -> Self {
        IdleSms { set, len: set.len() }
    }

    /// The lowest idle SM, taken out.
    fn pop(&mut self) -> Option<SmId> {
        let sm = self.set.first()?;
        self.set.remove(sm);
        self.len -= 1;
        Some(sm)
    }
}

/// An SM for process `i`, preempted from a lower level (lowest priority,
/// then the youngest process, first) or else from a peer holding more than
/// its share (the one most over it first); highest SM first. Says whether
/// it came from a lower level.
fn take_from_others(procs: &mut [Proc], i: usize) -> Option<(SmId, bool)> {
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
    Some((sm, lower.is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_says_the_mechanism() {
        assert_eq!(PpqEven::new(Mechanism::Drain).name(), "ppq-even-drain");
        assert_eq!(PpqEven::new(Mechanism::ContextSwitch).name(), "ppq-even-cs");
        assert_eq!(PpqEven::without_reserve(Mechanism::Drain).name(), "ppq-even-drain-no-reserve");
    }
}
