//! A device for tests that computes nothing, like wgpu-hal's `empty`
//! backend: it answers the engine's commands by fixed rules and delivers
//! events a test scripts at the times it gives, so the engine can be tested
//! next to itself, with every time known in advance.
//!
//! The rules:
//!
//! * a launch of n blocks on s SMs finishes all its blocks
//!   `block_time_ns × ⌈n / (s × blocks per SM)⌉` after it starts (SMs added
//!   by `Grow` do not speed it up); then it releases its SMs (`Exhausted`)
//!   and ends;
//! * a retreated SM is released `retreat_ns` later, whatever the mechanism
//!   (or in the command itself, as the CUDA device does, with
//!   [`ScriptedDevice::freeing_retreats_in_the_command`]);
//!   a launch left with no SM ends at once and hands back all its blocks (it
//!   makes progress all at once or not at all);
//! * a copy takes `copy_ns`.
//!
//! Every command is logged with its time, and the blocks each kernel
//! completed are kept, so a test can check that none was lost or run twice.

use crate::device::{Command, Device, DeviceError, DeviceStats, Event, Message, ProtocolError, ReleaseCause};
use crate::ids::{CopyId, KernelId, LaunchId, SmId};
use crate::kernel::DeviceInfo;
use crate::ranges::BlockRanges;
use crate::smset::SmSet;
use crate::time::{later, Nanos};
use std::collections::{BTreeMap, HashMap};

/// A launch on the scripted device.
struct Run {
    kernel: KernelId,
    blocks: BlockRanges,
    /// SMs it may issue on.
    held: SmSet,
    /// SMs being retreated, with when each is released.
    leaving: Vec<(SmId, Nanos)>,
    /// When all its blocks are done, if it keeps an SM until then.
    done_at: Nanos,
}

/// A test device driven by rules and a script (see the module doc).
pub struct ScriptedDevice {
    info: DeviceInfo,
    now: Nanos,
    retreat_ns: Nanos,
    copy_ns: Nanos,
    launches: BTreeMap<LaunchId, Run>,
    /// Which launch each SM is given to (held or leaving).
    owner: Vec<Option<LaunchId>>,
    copies: Vec<(Nanos, CopyId)>,
    /// Scripted events by time, in the order they were scripted.
    script: BTreeMap<(Nanos, u64), Event>,
    script_seq: u64,
    log: Vec<(Nanos, Command)>,
    done: HashMap<KernelId, BlockRanges>,
    ran_twice: Vec<(KernelId, std::ops::Range<u64>)>,
    stats: DeviceStats,
    /// Retreats free their SMs in the command; their events wait in `freed`.
    free_in_command: bool,
    freed: Vec<Event>,
}

impl ScriptedDevice {
    /// A device like `info` whose SMs free at once and whose copies take 1 µs.
    pub fn new(info: DeviceInfo) -> Self {
        let n = info.num_sms as usize;
        ScriptedDevice {
            info,
            now: 0,
            retreat_ns: 0,
            copy_ns: 1_000,
            launches: BTreeMap::new(),
            owner: vec![None; n],
            copies: Vec::new(),
            script: BTreeMap::new(),
            script_seq: 0,
            log: Vec::new(),
            done: HashMap::new(),
            ran_twice: Vec::new(),
            stats: DeviceStats::default(),
            free_in_command: false,
            freed: Vec::new(),
        }
    }

    /// The same, freeing a retreat's SMs in the command itself (another
    /// launch may take them at once), announced at the next `advance`, before
    /// anything else: the CUDA device's way, for an engine built
    /// `with_retreats_freeing_at_once`.
    pub fn freeing_retreats_in_the_command(mut self) -> Self {
        self.free_in_command = true;
        self
    }

    /// The same with retreated SMs released `ns` after the `Retreat`.
    pub fn with_retreat_ns(mut self, ns: Nanos) -> Self {
        self.retreat_ns = ns;
        self
    }

    /// The same with copies taking `ns`.
    pub fn with_copy_ns(mut self, ns: Nanos) -> Self {
        self.copy_ns = ns;
        self
    }

    /// Delivers `event` at `at`, after the device's own events of that instant.
    pub fn script(&mut self, at: Nanos, event: Event) {
        self.script_seq += 1;
        self.script.insert((at, self.script_seq), event);
    }

    /// Every command received, with the time it was submitted at.
    pub fn log(&self) -> &[(Nanos, Command)] {
        &self.log
    }

    /// Blocks of `kernel` completed so far.
    pub fn blocks_done(&self, kernel: KernelId) -> u64 {
        self.done.get(&kernel).map_or(0, |r| r.len())
    }

    /// Blocks that completed a second time (none, if the engine is right).
    pub fn ran_twice(&self) -> &[(KernelId, std::ops::Range<u64>)] {
        &self.ran_twice
    }

    fn sm_index(&self, sm: SmId) -> Result<usize, ProtocolError> {
        let i = sm.0 as usize;
        if i < self.owner.len() {
            Ok(i)
        } else {
            Err(ProtocolError::NoSuchSm { sm, device: self.info.name.clone(), sms: self.owner.len() })
        }
    }

    /// Gives `sms` to `launch`, refusing SMs another launch has.
    fn take_sms(&mut self, launch: LaunchId, sms: SmSet, by: Message) -> Result<(), ProtocolError> {
        for sm in sms.iter() {
            let i = self.sm_index(sm)?;
            if let Some(owner) = self.owner[i] {
                return Err(ProtocolError::SmOwned { launch, sm, owner, by });
            }
        }
        for sm in sms.iter() {
            self.owner[sm.0 as usize] = Some(launch);
        }
        Ok(())
    }

    /// The earliest time something happens, if anything will.
    fn next_time(&self) -> Option<Nanos> {
        let runs = self.launches.values().flat_map(|r| {
            let done = (!r.held.is_empty()).then_some(r.done_at);
            r.leaving.iter().map(|l| l.1).chain(done)
        });
        let copies = self.copies.iter().map(|c| c.0);
        let script = self.script.keys().next().map(|k| k.0);
        let freed = (!self.freed.is_empty()).then_some(self.now);
        runs.chain(copies).chain(script).chain(freed).min()
    }

    /// Appends every event due at `t`.
    fn fire(&mut self, t: Nanos, events: &mut Vec<Event>) {
        // Freed in their retreat commands: announced before anything else.
        events.append(&mut self.freed);
        let mut ended = Vec::new();
        for (&launch, run) in self.launches.iter_mut() {
            for &(sm, _) in run.leaving.iter().filter(|l| l.1 <= t) {
                events.push(Event::SmReleased { launch, sm, cause: ReleaseCause::Retreated });
                self.owner[sm.0 as usize] = None;
            }
            run.leaving.retain(|l| l.1 > t);
            if !run.held.is_empty() && run.done_at <= t {
                // Done: SMs still being retreated are free now too.
                for (sm, _) in run.leaving.drain(..) {
                    events.push(Event::SmReleased { launch, sm, cause: ReleaseCause::Retreated });
                    self.owner[sm.0 as usize] = None;
                }
                for sm in run.held.iter() {
                    events.push(Event::SmReleased { launch, sm, cause: ReleaseCause::Exhausted });
                    self.owner[sm.0 as usize] = None;
                }
                run.held = SmSet::EMPTY;
                let blocks = std::mem::take(&mut run.blocks);
                let done = self.done.entry(run.kernel).or_default();
                for r in blocks.ranges() {
                    if let Err(twice) = done.try_insert(r.clone()) {
                        self.ran_twice.push((run.kernel, twice));
                    }
                }
                self.stats.blocks_completed += blocks.len();
                events.push(Event::LaunchEnded {
                    launch,
                    remaining: BlockRanges::new(),
                    saved: Vec::new(),
                    completed: blocks.len(),
                });
                ended.push(launch);
            } else if run.held.is_empty() && run.leaving.is_empty() {
                // Retreated from every SM before finishing: all its blocks go back.
                let remaining = std::mem::take(&mut run.blocks);
                events.push(Event::LaunchEnded { launch, remaining, saved: Vec::new(), completed: 0 });
                ended.push(launch);
            }
        }
        for l in ended {
            self.launches.remove(&l);
        }
        self.copies.retain(|&(at, copy)| {
            let due = at <= t;
            if due {
                events.push(Event::CopyDone { copy });
            }
            !due
        });
        while let Some(entry) = self.script.first_entry() {
            if entry.key().0 > t {
                break;
            }
            events.push(entry.remove());
        }
        self.stats.events += events.len() as u64;
    }
}

impl Device for ScriptedDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&mut self, now: Nanos, command: Command) -> Result<(), DeviceError> {
        if now > self.now {
            return Err(ProtocolError::AheadOfDevice { at: now, device_now: self.now }.into());
        }
        self.log.push((now, command.clone()));
        match command {
            Command::Launch { launch, kernel, desc, blocks, restore, sms, .. } => {
                if self.launches.contains_key(&launch) {
                    return Err(ProtocolError::LaunchedTwice { launch }.into());
                }
                if !restore.is_empty() {
                    return Err(ProtocolError::CannotRestore { launch, blocks: restore.len() }.into());
                }
                if sms.is_empty() {
                    return Err(ProtocolError::NoSms { launch, kernel: desc.name.clone() }.into());
                }
                self.take_sms(launch, sms, Message::Launch)?;
                let per_wave = sms.len() as u64 * self.info.blocks_per_sm(&desc).map_err(ProtocolError::from)? as u64;
                let waves = blocks.len().div_ceil(per_wave);
                let what = || format!("launch {launch} of `{}`", desc.name);
                // A wave takes the kernel's block time: the one timing rule this device has.
                let block_ns = desc.sim_timing.map(|t| t.block_time_ns).ok_or_else(|| ProtocolError::Unsupported {
                    device: self.info.name.clone(),
                    command: format!("launch {launch} of `{}`, a kernel with no block time", desc.name),
                })?;
                let done_at = later(self.now, block_ns.saturating_mul(waves), what)?;
                self.launches.insert(launch, Run { kernel, blocks, held: sms, leaving: Vec::new(), done_at });
            }
            Command::Grow { launch, sms } => {
                if !self.launches.contains_key(&launch) {
                    return Err(ProtocolError::UnknownLaunch { launch, by: Message::Grow }.into());
                }
                self.take_sms(launch, sms, Message::Grow)?;
                if let Some(run) = self.launches.get_mut(&launch) {
                    run.held = run.held.union(&sms);
                }
            }
            Command::Retreat { launch, sms, mechanism: _ } => {
                let release_at = later(self.now, self.retreat_ns, || format!("retreat of launch {launch}"))?;
                let run = self
                    .launches
                    .get_mut(&launch)
                    .ok_or(ProtocolError::UnknownLaunch { launch, by: Message::Retreat })?;
                // SMs it no longer holds were released already.
                let gone = sms.intersection(&run.held);
                run.held = run.held.difference(&gone);
                if self.free_in_command {
                    for sm in gone.iter() {
                        self.owner[sm.0 as usize] = None;
                        self.freed.push(Event::SmReleased { launch, sm, cause: ReleaseCause::Retreated });
                    }
                } else {
                    run.leaving.extend(gone.iter().map(|sm| (sm, release_at)));
                }
            }
            Command::Copy { copy, bytes, .. } => {
                let at = later(self.now, self.copy_ns, || format!("copy {copy}"))?;
                self.stats.bytes_copied += bytes;
                self.copies.push((at, copy));
            }
        }
        Ok(())
    }

    fn advance(&mut self, until: Option<Nanos>, events: &mut Vec<Event>) -> Result<Nanos, DeviceError> {
        match (self.next_time(), until) {
            (Some(t), Some(u)) if t > u => {
                self.now = self.now.max(u);
                Ok(self.now)
            }
            (Some(t), _) => {
                self.now = self.now.max(t);
                self.fire(self.now, events);
                Ok(self.now)
            }
            (None, Some(u)) => {
                self.now = self.now.max(u);
                Ok(self.now)
            }
            (None, None) => Err(DeviceError::Stalled { now: self.now }),
        }
    }

    fn stats(&self) -> DeviceStats {
        self.stats.clone()
    }
}
