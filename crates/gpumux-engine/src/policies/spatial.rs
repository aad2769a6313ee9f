//! Spatial multitasking (Adriaens ch. 5-7): the SMs are split among
//! processes by a partition heuristic (`partition.rs`); a process keeps its
//! share across its kernels, and its kernels run only on SMs of that share.
//!
//! * static (the thesis's GPGPU-Sim set-up): the split is made over every
//!   process seen so far and changes only when a new process shows up (or
//!   one is removed); a process with no kernel active leaves its SMs idle.
//! * dynamic (`-dyn`, what the thesis expected to be better): the split is
//!   remade over the processes with active kernels whenever a kernel arrives
//!   or finishes, from the current kernels' characteristics; SMs over a
//!   process's new share are taken back with the configured mechanism.
//!
//! Shares are SM counts, not fixed SM indices: which SMs a process holds
//! does not matter to a model with uniform SMs, and counts avoid moving a
//! kernel only to keep its SMs contiguous.

use super::partition::{self, AppChar};
use crate::device::Mechanism;
use crate::ids::{KernelId, Slot, SmId};
use crate::policy::{ActiveKernel, Decision, Policy, SchedView, SmState};
use std::collections::HashMap;

/// Which partition function.
#[derive(Clone, Debug, PartialEq)]
pub enum Heuristic {
    /// As even as possible.
    Even,
    /// Even, but no more SMs than a process has blocks.
    SmartEven,
    /// Even, but no more SMs than needed to hold all blocks at once.
    Packed,
    /// Fewest total rounds of blocks, none worse than Even.
    Rounds,
    /// Proportional to blocks per kernel (Eq. 6.2).
    Blocks,
    /// Proportional to threads per block.
    ThreadsPerBlock,
    /// Proportional to threads per kernel.
    Threads,
    /// Maximise Σ speedup^(1/N) (Eq. 6.1).
    Profile,
    /// Equalise predicted slowdowns.
    Fair,
    /// Counts given in process order (oracle search, QoS reservations).
    Fixed(Vec<u32>),
}

impl Heuristic {
    /// The named heuristics, as spelt in policy names (`spatial-<name>`).
    pub const NAMED: [(&'static str, Heuristic); 9] = [
        ("even", Heuristic::Even),
        ("smart-even", Heuristic::SmartEven),
        ("packed", Heuristic::Packed),
        ("rounds", Heuristic::Rounds),
        ("blocks", Heuristic::Blocks),
        ("tpb", Heuristic::ThreadsPerBlock),
        ("threads", Heuristic::Threads),
        ("profile", Heuristic::Profile),
        ("fair", Heuristic::Fair),
    ];

    /// The heuristic named `s` in [`Heuristic::NAMED`].
    pub fn by_name(s: &str) -> Option<Heuristic> {
        Self::NAMED.iter().find(|(n, _)| *n == s).map(|(_, h)| h.clone())
    }

    /// Its name in policy names (`fixed:a/b/...` for given counts).
    pub fn name(&self) -> String {
        match self {
            Heuristic::Fixed(c) => format!("fixed:{}", c.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("/")),
            h => Self::NAMED.iter().find(|(_, x)| x == h).map_or("?", |(n, _)| n).to_string(),
        }
    }

    /// SM counts for `apps` (in process order) on `sms` SMs.
    pub fn split(&self, apps: &[AppChar], sms: u32) -> Vec<u32> {
        match self {
            Heuristic::Even => partition::even(apps.len(), sms),
            Heuristic::SmartEven => partition::smart_even(apps, sms),
            Heuristic::Packed => partition::packed(apps, sms),
            Heuristic::Rounds => partition::rounds_heuristic(apps, sms),
            Heuristic::Blocks => partition::blocks(apps, sms),
            Heuristic::ThreadsPerBlock => partition::threads_per_block(apps, sms),
            Heuristic::Threads => partition::threads(apps, sms),
            Heuristic::Profile => partition::profile(apps, sms),
            Heuristic::Fair => partition::fair(apps, sms),
            Heuristic::Fixed(c) => (0..apps.len()).map(|i| c.get(i).copied().unwrap_or(0)).collect(),
        }
    }
}

/// A process given a fixed number of SMs (QoS): the heuristic splits what is left among the others.
#[derive(Clone, Debug, PartialEq)]
pub struct Reservation {
    /// The process, by name.
    pub process_name: String,
    /// Its SMs.
    pub sms: u32,
}

/// Spatial multitasking (see the module doc).
#[derive(Debug)]
pub struct Spatial {
    /// How the SMs are split.
    pub heuristic: Heuristic,
    /// Remade on every kernel arrival or finish (`-dyn`), or only when the
    /// set of processes changes.
    pub dynamic: bool,
    /// How SMs over a share are taken back.
    pub mechanism: Mechanism,
    /// Characteristics by process name (thesis Table 6.1 and measured
    /// profiles); a process not listed is characterised by its current kernel.
    pub profiles: HashMap<String, AppChar>,
    /// A process given a fixed number of SMs (QoS).
    pub reservation: Option<Reservation>,
    /// Processes the split covers, in order of first appearance, and their share.
    members: Vec<(Slot, AppChar)>,
    shares: HashMap<Slot, u32>,
    /// What the last split was made for (dynamic: processes and kernels).
    last_key: Vec<(Slot, KernelId)>,
    /// A member was removed: the static split is remade at the next round.
    member_removed: bool,
    /// Times the split was remade (for tests and experiments).
    pub repartitions: u64,
}

impl Spatial {
    /// A spatial policy splitting by `heuristic`; `dynamic` remakes the
    /// split as kernels come and go, taking SMs back with `mechanism`.
    pub fn new(heuristic: Heuristic, dynamic: bool, mechanism: Mechanism) -> Self {
        Spatial {
            heuristic,
            dynamic,
            mechanism,
            profiles: HashMap::new(),
            reservation: None,
            members: Vec::new(),
            shares: HashMap::new(),
            last_key: Vec::new(),
            member_removed: false,
            repartitions: 0,
        }
    }

    /// The same, characterising the named processes by `profiles`.
    pub fn with_profiles(mut self, profiles: HashMap<String, AppChar>) -> Self {
        self.profiles = profiles;
        self
    }

    /// The same, with a fixed share for one process.
    pub fn with_reservation(mut self, r: Reservation) -> Self {
        self.reservation = Some(r);
        self
    }

    fn characterise(&self, k: &ActiveKernel, sms: u32) -> AppChar {
        match self.profiles.get(k.process_name()) {
            Some(a) => a.clone(),
            None => {
                let desc = k.desc();
                AppChar::predicted(
                    desc.shape.blocks as f64,
                    desc.shape.threads_per_block as f64,
                    k.blocks_per_sm(),
                    sms,
                )
            }
        }
    }

    fn resplit(&mut self, view: &SchedView<'_>) {
        let sms = view.device.num_sms as u32;
        let names: HashMap<Slot, &str> = view.kernels().map(|k| (k.process(), k.process_name())).collect();
        let mut counts = vec![0u32; self.members.len()];
        let reserved = self.reservation.as_ref().and_then(|r| {
            let i = self.members.iter().position(|(p, _)| names.get(p).is_some_and(|n| *n == r.process_name))?;
            Some((i, r.sms.min(sms)))
        });
        let others: Vec<usize> = (0..self.members.len()).filter(|i| Some(*i) != reserved.map(|r| r.0)).collect();
        let left = sms - reserved.map_or(0, |r| r.1);
        let apps: Vec<AppChar> = others.iter().map(|&i| self.members[i].1.clone()).collect();
        for (slot, c) in others.iter().zip(self.heuristic.split(&apps, left)) {
            counts[*slot] = c;
        }
        if let Some((i, n)) = reserved {
            counts[i] = n;
        }
        self.shares = self.members.iter().map(|(p, _)| *p).zip(counts).collect();
        self.repartitions += 1;
    }
}

impl Policy for Spatial {
    fn name(&self) -> String {
        let mut s = format!("spatial-{}", self.heuristic.name());
        if self.dynamic {
            s.push_str("-dyn");
            if self.mechanism != Mechanism::ContextSwitch {
                s.push('-');
                s.push_str(self.mechanism.short());
            }
        }
        if let Some(r) = &self.reservation {
            s.push_str(&format!("+qos:{}={}", r.process_name, r.sms));
        }
        s
    }

    fn process_removed(&mut self, slot: Slot) {
        let before = self.members.len();
        self.members.retain(|(p, _)| *p != slot);
        self.shares.remove(&slot);
        // Its share goes back to the others (dynamic: the next key differs anyway).
        self.member_removed |= self.members.len() != before;
    }

    fn schedule(&mut self, view: &SchedView<'_>, out: &mut Vec<Decision>) {
        let sms = view.device.num_sms as u32;
        // Each process's oldest active kernel stands for the process.
        let mut heads: Vec<ActiveKernel> = Vec::new();
        for k in view.kernels() {
            if !heads.iter().any(|h| h.process() == k.process()) {
                heads.push(k);
            }
        }
        if self.dynamic {
            let key: Vec<(Slot, KernelId)> = heads.iter().map(|k| (k.process(), k.id())).collect();
            if key != self.last_key && !key.is_empty() {
                self.members = heads.iter().map(|k| (k.process(), self.characterise(k, sms))).collect();
                self.last_key = key;
                self.resplit(view);
            }
        } else {
            let new: Vec<&ActiveKernel> =
                heads.iter().filter(|k| !self.members.iter().any(|(p, _)| *p == k.process())).collect();
            if !new.is_empty() || self.member_removed {
                for k in new {
                    let c = self.characterise(k, sms);
                    self.members.push((k.process(), c));
                }
                self.member_removed = false;
                self.resplit(view);
            }
        }

        // SMs each process holds or has on the way.
        let mut committed: HashMap<Slot, u32> = HashMap::new();
        for k in view.kernels() {
            *committed.entry(k.process()).or_default() += k.sms_committed();
        }
        let share = |p: Slot| self.shares.get(&p).copied().unwrap_or(0);
        // SMs over a process's share, to be taken back (youngest kernel, highest SM first).
        let mut victims: Vec<SmId> = Vec::new();
        let mut over: HashMap<Slot, u32> = HashMap::new();
        for (&p, &c) in &committed {
            if c > share(p) {
                over.insert(p, c - share(p));
            }
        }
        for (i, s) in view.sms.iter().enumerate().rev() {
            if let SmState::Running { kernel, .. } = s {
                if let Some(k) = view.kernel(*kernel) {
                    if let Some(n) = over.get_mut(&k.process()).filter(|n| **n > 0) {
                        *n -= 1;
                        victims.push(SmId(i as u16));
                    }
                }
            }
        }
        victims.reverse(); // pop() takes the highest SM first
        let mut idle: Vec<SmId> = view.idle_sms().collect();
        idle.reverse();
        for k in view.kernels() {
            let have = committed.get(&k.process()).copied().unwrap_or(0);
            let mut room = share(k.process()).saturating_sub(have);
            let mut want = k.useful_sms().saturating_sub(k.sms_committed()).min(room);
            while want > 0 {
                if let Some(sm) = idle.pop() {
                    out.push(Decision::Assign { sm, kernel: k.id(), slice: None });
                } else if let Some(sm) = victims.pop() {
                    out.push(Decision::Preempt { sm, mechanism: self.mechanism, next: Some(k.id()) });
                } else {
                    break;
                }
                want -= 1;
                room -= 1;
                *committed.entry(k.process()).or_default() += 1;
            }
            let _ = room;
        }
        // Static: SMs over a share are only taken back when the split changed
        // (a new process); they are then released, to be claimed as above.
        for sm in victims {
            out.push(Decision::Preempt { sm, mechanism: self.mechanism, next: None });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(Spatial::new(Heuristic::SmartEven, false, Mechanism::ContextSwitch).name(), "spatial-smart-even");
        assert_eq!(Spatial::new(Heuristic::Rounds, true, Mechanism::ContextSwitch).name(), "spatial-rounds-dyn");
        assert_eq!(Spatial::new(Heuristic::Even, true, Mechanism::Drain).name(), "spatial-even-dyn-drain");
        assert_eq!(Heuristic::by_name("tpb"), Some(Heuristic::ThreadsPerBlock));
        assert_eq!(Heuristic::Fixed(vec![3, 27]).split(&[], 30), Vec::<u32>::new());
    }
}
