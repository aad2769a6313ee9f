//! Drives one device directly, without the engine: a kernel's blocks on chosen SMs, a copy,
//! a retreat, each timed by the device's own clock. The same code measures the real GPU and
//! the simulator (which is how `measure.rs`'s fit inverts the simulator's model).

use anyhow::{anyhow, bail, Result};
use gpumux_engine::device::{Command, CopyDirection, Device, Event, Mechanism};
use gpumux_engine::ids::{CopyId, KernelId, LaunchId, OpId, ProcessId};
use gpumux_engine::kernel::KernelDesc;
use gpumux_engine::ranges::BlockRanges;
use gpumux_engine::smset::SmSet;
use gpumux_engine::time::Nanos;
use std::sync::Arc;

/// When a launch started and ended (ns).
#[cfg(test)]
pub type Span = (Nanos, Nanos);

/// A device and the ids handed out so far. Every launch is process 0's.
pub struct Probe<'a> {
    dev: &'a mut (dyn Device + Send),
    now: Nanos,
    next_launch: u64,
    next_kernel: u64,
    next_copy: u64,
    events: Vec<Event>,
}

impl<'a> Probe<'a> {
    pub fn new(dev: &'a mut (dyn Device + Send)) -> Self {
        Probe { dev, now: 0, next_launch: 0, next_kernel: 0, next_copy: 0, events: Vec::new() }
    }

    /// The device's clock as last seen (ns).
    #[cfg(test)]
    pub fn now(&self) -> Nanos {
        self.now
    }

    pub fn num_sms(&self) -> u16 {
        self.dev.info().num_sms
    }

    /// Resident blocks of `desc` per SM on this device, from its declared resources.
    pub fn blocks_per_sm(&self, desc: &KernelDesc) -> Result<u32> {
        Ok(self.dev.info().blocks_per_sm(desc)?)
    }

    /// A new kernel invocation: the CUDA device runs each invocation's blocks once, so
    /// every measurement that launches part of a grid keeps to one invocation and ends it
    /// with [`Probe::finish_invocation`].
    pub fn invocation(&mut self) -> KernelId {
        self.next_kernel += 1;
        KernelId(self.next_kernel)
    }

    fn launch(
        &mut self,
        desc: &Arc<KernelDesc>,
        kernel: KernelId,
        blocks: BlockRanges,
        sms: SmSet,
    ) -> Result<LaunchId> {
        let launch = LaunchId(self.next_launch);
        self.next_launch += 1;
        let cmd = Command::Launch {
            launch,
            kernel,
            op: OpId(launch.0),
            process: ProcessId(0),
            priority: 0,
            desc: Arc::clone(desc),
            time_key: kernel.0,
            blocks,
            restore: Vec::new(),
            sms,
        };
        self.dev.submit(self.now, cmd).map_err(|e| anyhow!("launching `{}`: {e:#}", desc.name))?;
        Ok(launch)
    }

    /// Advances until `launch` ends; returns the work it handed back.
    fn wait_launch(&mut self, launch: LaunchId) -> Result<BlockRanges> {
        loop {
            self.now =
                self.dev.advance(None, &mut self.events).map_err(|e| anyhow!("running launch {launch}: {e:#}"))?;
            for e in self.events.drain(..) {
                if let Event::LaunchEnded { launch: l, remaining, saved, .. } = e {
                    if l == launch {
                        if !saved.is_empty() {
                            bail!("launch {launch} saved contexts though only drains were asked for");
                        }
                        return Ok(remaining);
                    }
                }
            }
        }
    }

    /// Runs `blocks` of `kernel` on `sms` and returns how long it took, in ns.
    pub fn timed(&mut self, desc: &Arc<KernelDesc>, kernel: KernelId, blocks: BlockRanges, sms: SmSet) -> Result<f64> {
        let t0 = self.now;
        let l = self.launch(desc, kernel, blocks, sms)?;
        let left = self.wait_launch(l)?;
        if !left.is_empty() {
            bail!("launch of `{}` ended with {} blocks not run", desc.name, left.len());
        }
        Ok((self.now - t0) as f64)
    }

    /// The whole grid on the first `sms` SMs, as a fresh invocation.
    pub fn whole(&mut self, desc: &Arc<KernelDesc>, sms: u16) -> Result<f64> {
        let k = self.invocation();
        self.timed(desc, k, BlockRanges::full(desc.shape.blocks), SmSet::range(0, sms))
    }

    /// Runs what `kernel` has not run yet (`used` ran) on every SM, untimed.
    pub fn finish_invocation(&mut self, desc: &Arc<KernelDesc>, kernel: KernelId, used: &BlockRanges) -> Result<()> {
        let mut rest = BlockRanges::full(desc.shape.blocks);
        for r in used.ranges() {
            rest.remove(r.clone());
        }
        if !rest.is_empty() {
            let sms = self.num_sms();
            self.timed(desc, kernel, rest, SmSet::range(0, sms))?;
        }
        Ok(())
    }

    /// Launches the whole grid on every SM, asks for every SM back (drain) `after_ns` later,
    /// and returns how long the device took to give them back (ns), or `None` if the kernel
    /// ended first. The invocation is run to its end afterwards.
    pub fn retreat_latency(&mut self, desc: &Arc<KernelDesc>, after_ns: Nanos) -> Result<Option<f64>> {
        let sms = SmSet::range(0, self.num_sms());
        let kernel = self.invocation();
        let launch = self.launch(desc, kernel, BlockRanges::full(desc.shape.blocks), sms)?;
        let at = self.now + after_ns;
        let mut ended = None;
        while self.now < at && ended.is_none() {
            self.now =
                self.dev.advance(Some(at), &mut self.events).map_err(|e| anyhow!("running `{}`: {e:#}", desc.name))?;
            for e in self.events.drain(..) {
                if let Event::LaunchEnded { launch: l, remaining, .. } = e {
                    if l == launch {
                        ended = Some(remaining);
                    }
                }
            }
        }
        if ended.is_some() {
            return Ok(None);
        }
        let t0 = self.now;
        let cmd = Command::Retreat { launch, sms, mechanism: Mechanism::Drain };
        self.dev.submit(self.now, cmd).map_err(|e| anyhow!("retreating `{}`: {e:#}", desc.name))?;
        let remaining = self.wait_launch(launch)?;
        let latency = (self.now - t0) as f64;
        if !remaining.is_empty() {
            self.timed(desc, kernel, remaining, sms)?;
        }
        Ok(Some(latency))
    }

    /// `runs` launches of `k`, back to back, on the first `sms` SMs, while `p` runs back to back
    /// on the others: the start and end of each of `k`'s launches and of each of `p`'s (the last
    /// of `p`'s waited for, so that `p` ran over all of `k`'s). A co-run with a probe kernel,
    /// as `gpumux replay --probe` reads one from a recording (its tests use the simulator as
    /// the GPU this way).
    #[cfg(test)]
    pub fn beside(
        &mut self,
        k: &Arc<KernelDesc>,
        sms: u16,
        p: &Arc<KernelDesc>,
        runs: u32,
    ) -> Result<(Vec<Span>, Vec<Span>)> {
        let n = self.num_sms();
        if sms == 0 || sms >= n {
            bail!("a co-run needs SMs on both sides: {sms} of {n} for `{}`", k.name);
        }
        let (ks, ps) = (SmSet::range(0, sms), SmSet::range(sms, n));
        let (mut k_runs, mut p_runs) = (Vec::new(), Vec::new());
        let inv = self.invocation();
        let mut kl = self.launch(k, inv, BlockRanges::full(k.shape.blocks), ks)?;
        let mut k0 = self.now;
        let inv = self.invocation();
        let mut pl = self.launch(p, inv, BlockRanges::full(p.shape.blocks), ps)?;
        let mut p0 = self.now;
        while k_runs.len() < runs as usize {
            self.now =
                self.dev.advance(None, &mut self.events).map_err(|e| anyhow!("co-running `{}`: {e:#}", k.name))?;
            let ended: Vec<LaunchId> = self
                .events
                .drain(..)
                .filter_map(|e| match e {
                    Event::LaunchEnded { launch, .. } => Some(launch),
                    _ => None,
                })
                .collect();
            for l in ended {
                if l == kl {
                    k_runs.push((k0, self.now));
                    if k_runs.len() < runs as usize {
                        let inv = self.invocation();
                        kl = self.launch(k, inv, BlockRanges::full(k.shape.blocks), ks)?;
                        k0 = self.now;
                    }
                } else if l == pl {
                    p_runs.push((p0, self.now));
                    let inv = self.invocation();
                    pl = self.launch(p, inv, BlockRanges::full(p.shape.blocks), ps)?;
                    p0 = self.now;
                }
            }
        }
        self.wait_launch(pl)?;
        p_runs.push((p0, self.now));
        Ok((k_runs, p_runs))
    }

    /// One copy of `bytes`, timed (ns).
    pub fn copy(&mut self, direction: CopyDirection, bytes: u64) -> Result<f64> {
        let copy = CopyId(self.next_copy);
        self.next_copy += 1;
        let t0 = self.now;
        let cmd = Command::Copy { copy, op: OpId(u64::MAX - copy.0), process: ProcessId(0), direction, bytes };
        self.dev.submit(self.now, cmd).map_err(|e| anyhow!("copy of {bytes} bytes: {e:#}"))?;
        loop {
            self.now = self.dev.advance(None, &mut self.events).map_err(|e| anyhow!("copy of {bytes} bytes: {e:#}"))?;
            if self.events.drain(..).any(|e| matches!(e, Event::CopyDone { copy: c } if c == copy)) {
                return Ok((self.now - t0) as f64);
            }
        }
    }
}
