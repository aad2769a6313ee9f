//! Refill: a launch given back SMs it cannot go on in is cut where its
//! workers are and fresh workers start over all its SMs at once, instead of
//! a drain of every worker and a restart.
//!
//! **Why.** A per-SM retreat (docs/daemon-cuda.md) asks the workers on the
//! SMs taken to leave; a worker that has left cannot come back. When the
//! engine gives SMs back, the launch goes on in place if its workers still
//! cover 3/4 of its SMs (those that had not left yet go on; the slots of
//! those that did stay idle until the launch ends). Otherwise (a launch that
//! lost a quarter of its SMs to several urgent kernels, or one given SMs it
//! never had) it used to drain: every worker finishes its block and leaves,
//! each slot idle from then until the slowest worker's end, and only then
//! does the launch restart on the larger set.
//!
//! **How.** The launch is *cut*: one thread (`gmx_cut`, on a stream of its
//! own) sets the retreat request in each worker launch's claim word with a
//! compare-and-swap, which also returns the next block index at that
//! instant. Every claim after it runs nothing, so the workers stop exactly
//! there ([`crate::preempt`]'s retreat, with the stopping point known at
//! once instead of when the last worker leaves). Fresh workers for the
//! blocks from the cut on start at once on a stream of their own, over all
//! the SMs the launch holds; the old ones finish the blocks they claimed
//! and leave, each slot passing from an old worker to a new one as it does.
//! A cut that finds the launch over (its last worker leaves the claim word
//! holding its own seq) or already asked to retreat cuts nothing.
//!
//! The launch ends when the old workers and the new have all left. Nothing
//! is queued ahead behind a refilled launch (its blocks run on two streams).
//!
//! **Where not.** Refilling every grow that gave back SMs some workers had
//! left (the first version) cut every worker of launches whose workers had
//! mostly not left yet: each replacement costs its slot a claim under the
//! neighbours' contention, and the low-priority client of the priority
//! experiment lost 0.07-0.09 of its rate at 1000 µs blocks (docs/benchmarks.md,
//! runs 92-93). Where the launch would drain instead, a refill is faster:
//! 932-963 against 1143-1219 µs for a launch given back half its SMs (run 95).

use super::{failed, failed_with, place, start_segs, state_of, SegPlan};
use crate::error::CudaError;
use crate::preempt::WorkerLaunch;
use crate::runtime::{Function, HostMapped, Module, Params, Stream};
use gpumux_engine::device::DeviceError;
use gpumux_engine::ids::LaunchId;
use gpumux_engine::ranges::BlockRanges;
use gpumux_engine::smset::SmSet;

type Result<T> = std::result::Result<T, CudaError>;

/// When a grow refills a launch ([`super::ClientDevice::set_refill`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Refill {
    /// Never: a grow that cannot go on in place drains every worker and
    /// restarts the launch on the larger set.
    Off,
    /// Where a grow cannot go on in place (the workers cover less than 3/4
    /// of the launch's SMs, or it is given SMs it never had): the default.
    #[default]
    Drained,
    /// Also whenever a grow gives back SMs some of its workers had left
    /// (module doc, "Where not": it cost the priority experiment's
    /// low-priority client at 1000 µs blocks).
    Always,
}

/// The cut: for record `c` of a launch numbered `seq`, asks its workers to
/// stop and writes where they stop (the claim word's block index then) to
/// `out[0]` (`0xffffffff`: nothing cut), then `seq` to `out[1]`.
const CUT_KERNEL: &str = r#"
extern "C" __global__ void gmx_cut(gmx_ctl_t* c, unsigned int seq, volatile unsigned int* out) {
    unsigned long long old = *((volatile unsigned long long*)&c->claim);
    unsigned int cut = 0xffffffffu;
    for (;;) {
        // Over (the last worker left its seq here) or already asked to stop.
        if ((unsigned int)(old >> 32) == seq) break;
        const unsigned long long want = (((unsigned long long)seq) << 32) | (old & 0xffffffffull);
        const unsigned long long got = atomicCAS(&c->claim, old, want);
        if (got == old) {
            cut = (unsigned int)old;
            break;
        }
        old = got;
    }
    out[0] = cut;
    __threadfence_system();
    out[1] = seq;
}
"#;

/// The cut kernel, loaded in the device's context.
pub(super) struct CutKernel {
    pub(super) func: Function,
    _module: Module,
}

impl CutKernel {
    /// Compiles (NVRTC, cached) and loads the cut kernel for `arch`.
    pub(super) fn load(arch: u32) -> Result<CutKernel> {
        let src = format!("{}\n{CUT_KERNEL}", crate::transform::PRELUDE);
        let compiled = crate::nvrtc::compile("gmx_cut", &src, arch, &[])?;
        let module = Module::load("gmx_cut", &compiled.cubin)?;
        let func = module.function("gmx_cut")?;
        Ok(CutKernel { func, _module: module })
    }
}

/// Cuts asked for one launch, answered in pinned host memory.
pub(super) struct PendingCut {
    out: HostMapped,
    /// Per worker launch of the launch: its seq, or `None` where nothing was
    /// asked (a native launch, or one not running).
    asked: Vec<Option<u32>>,
}

/// Answer words kept for the next cut (pinned memory costs a system call to make).
pub(super) const KEEP_BUFFERS: usize = 8;

impl PendingCut {
    /// Asks a cut of every running worker launch of `segs`, on `ctl`,
    /// answered in `spare` if it is large enough (else in new pinned memory).
    pub(super) fn ask(
        kernel: &CutKernel,
        ctl: &Stream,
        segs: &[WorkerLaunch],
        spare: Option<HostMapped>,
    ) -> Result<PendingCut> {
        let bytes = 8 * segs.len().max(4);
        let out = match spare {
            Some(b) if b.bytes >= bytes => b,
            _ => HostMapped::new(bytes)?,
        };
        // Another launch's answers may be there (worker launches number their runs each on their own).
        out.write_bytes(0, &vec![0u8; bytes]);
        let mut asked = Vec::with_capacity(segs.len());
        for (i, w) in segs.iter().enumerate() {
            let Some((record, seq)) = w.cut_target() else {
                asked.push(None);
                continue;
            };
            let mut p = Params::default();
            p.ptr(record).u32(seq).ptr(out.dev + 8 * i as u64);
            // SAFETY: the parameters follow gmx_cut's signature; the record
            // and the pinned words outlive the kernel (the launch keeps both
            // until the answer is read).
            unsafe { kernel.func.launch([1, 1, 1], [1, 1, 1], 0, ctl, &mut p)? };
            asked.push(Some(seq));
        }
        Ok(PendingCut { out, asked })
    }

    /// Every cut answered?
    pub(super) fn ready(&self) -> bool {
        let words = self.out.words();
        self.asked.iter().enumerate().all(|(i, a)| a.is_none_or(|seq| words.read(2 * i + 1) == seq))
    }

    /// Where each worker launch stops, relative to its first block (`None`:
    /// nothing cut). Only once [`PendingCut::ready`].
    pub(super) fn cuts(&self) -> Vec<Option<u32>> {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let words = self.out.words();
        self.asked
            .iter()
            .enumerate()
            .map(|(i, a)| a.and_then(|_| Some(words.read(2 * i)).filter(|&c| c != u32::MAX)))
            .collect()
    }

    /// The answer words, for the next cut.
    pub(super) fn into_buffer(self) -> HostMapped {
        self.out
    }
}

impl super::ClientDevice {
    /// Cuts launch `lid`'s workers so that fresh ones fill every SM it holds
    /// (module doc). False where it cannot be refilled (off, stopping, no
    /// worker running, or no cut kernel): the caller drains it or leaves it
    /// as it is.
    pub(super) fn ask_refill(&mut self, lid: LaunchId) -> std::result::Result<bool, DeviceError> {
        if self.refill == Refill::Off {
            return Ok(false);
        }
        let st = state_of(&self.ctx, &mut self.st).map_err(failed("making the context current"))?;
        let Some(live) = st.launches.get(&lid) else { return Ok(false) };
        if live.stopping
            || live.cut.is_some()
            || live.sms.is_empty()
            || live.segs.iter().all(|w| w.cut_target().is_none())
        {
            return Ok(false);
        }
        let Some(kernel) = st.cut_kernel.as_ref() else { return Ok(false) };
        let Some(live) = st.launches.get_mut(&lid) else { return Ok(false) };
        let spare = st.cut_buffers.pop();
        let cut = PendingCut::ask(kernel, &st.cut_stream, &live.segs, spare)
            .map_err(failed_with(|| format!("cutting launch {lid} to refill it")))?;
        live.cut = Some(cut);
        live.note("cut to refill");
        self.refills.0 += 1;
        Ok(true)
    }

    /// Launches whose cut is answered: their workers become leaving ones, and
    /// fresh workers start for the blocks from the cuts on, over every SM
    /// the launch holds now (none if it was asked to retreat meanwhile).
    pub(super) fn poll_cuts(&mut self) -> std::result::Result<(), DeviceError> {
        let Some(st) = self.st.as_ref() else { return Ok(()) };
        let mut ready: Vec<LaunchId> = st
            .launches
            .iter()
            .filter(|(_, l)| l.cut.as_ref().is_some_and(PendingCut::ready))
            .map(|(&id, _)| id)
            .collect();
        ready.sort();
        for lid in ready {
            self.refill_now(lid)?;
        }
        Ok(())
    }

    fn refill_now(&mut self, lid: LaunchId) -> std::result::Result<(), DeviceError> {
        let (chunk, sm_count, co_locate) = (self.chunk, self.info.num_sms as u32, self.co_locate);
        let priority = match self.st.as_ref().and_then(|st| st.launches.get(&lid)) {
            Some(l) => l.priority,
            None => return Ok(()),
        };
        let stream = self.stream(priority).map_err(failed_with(|| format!("a stream to refill launch {lid}")))?;
        let st = state_of(&self.ctx, &mut self.st).map_err(failed("making the context current"))?;
        let Some(mut live) = st.launches.remove(&lid) else {
            st.return_stream(stream);
            return Ok(());
        };
        let Some(cut) = live.cut.take() else {
            st.launches.insert(lid, live);
            st.return_stream(stream);
            return Ok(());
        };
        let cuts = cut.cuts();
        if st.cut_buffers.len() < KEEP_BUFFERS {
            st.cut_buffers.push(cut.into_buffer());
        }
        // The blocks from each cut on, for fresh workers.
        let mut rest = BlockRanges::new();
        for (w, c) in live.segs.iter().zip(&cuts) {
            if let Some(c) = c {
                let from = w.next as u64 + *c as u64;
                if from < w.end as u64 {
                    rest.insert(from..w.end as u64);
                }
            }
        }
        live.leaving.append(&mut live.segs);
        if rest.is_empty() || live.stopping || live.sms.is_empty() {
            // Nothing to start: the launch ends once its leaving workers have
            // (with the rest handed back if it was asked to retreat).
            live.note(if rest.is_empty() { "cut found it done" } else { "cut while retreating" });
            st.launches.insert(lid, live);
            st.return_stream(stream);
            return Ok(());
        }
        let old = std::mem::replace(&mut live.stream, stream);
        live.leaving_streams.push(old);
        let (placed, corun) = place(co_locate, self.chooser.as_mut(), sm_count, st, &live);
        live.corun = corun;
        let how = SegPlan {
            place: placed,
            never_native: false,
            native_anywhere: false,
            native_if_long: false,
            chunk,
            sm_count,
            publish_end: true,
            lazy_end: false,
        };
        let (ops, spare, segs) = (&mut st.ops, &mut st.spare, &mut live.segs);
        let r = start_segs(ops, spare, live.op, &rest, &live.stream, how, lid, segs, None, &mut self.clock);
        live.mask = live.sms;
        live.place = placed;
        live.gone = SmSet::EMPTY;
        live.vacated = SmSet::EMPTY;
        live.note("refilled");
        st.launches.insert(lid, live);
        self.refills.1 += 1;
        r.map_err(failed_with(|| format!("starting the fresh workers of launch {lid}")))
    }
}

#[cfg(test)]
mod tests {
    use super::CUT_KERNEL;

    /// The cut kernel compiles with the prelude it reads the record through
    /// (NVRTC, no GPU needed; skipped where NVRTC is missing).
    #[test]
    fn the_cut_kernel_compiles_against_the_prelude() {
        if !crate::nvrtc::nvrtc_present() {
            eprintln!(
                "SKIPPED the_cut_kernel_compiles_against_the_prelude: libnvrtc not found (source .ci/install-nvrtc.sh)"
            );
            return;
        }
        let src = format!("{}\n{CUT_KERNEL}", crate::transform::PRELUDE);
        let compiled = crate::nvrtc::compile("gmx_cut_test", &src, 90, &[]).expect("gmx_cut compiles for sm_90");
        assert!(!compiled.cubin.is_empty());
        assert!(CUT_KERNEL.contains("atomicCAS(&c->claim"), "the request and the stopping point in one atomic");
    }
}
