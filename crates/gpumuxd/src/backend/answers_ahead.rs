//! Ends known ahead for a device in the daemon's own process
//! (`--device-in-process`; issue 35).
//!
//! A device process reports the kernels its device ran ahead with its poll
//! answers, and the daemon's side answers the engine's launch commands for
//! them without a round trip ([`super::ends_ahead`]: [`KnownEnds`] in
//! [`super::remote`], [`Silenced`] in [`crate::device_host`]). In-process
//! the device had no such path: a launch command for a kernel the GPU had
//! already run was carried out, and its end waited for the next poll of the
//! device, one per kernel (a chain of 511 short kernels: 4-4.5x native on
//! the H200, worse than through the device process). [`AnswersAhead`] is
//! that pair in one process, around any backend: it asks the device to
//! report ends ahead, learns them at each poll, answers a launch of such a
//! kernel at once ([`Backend::take_answered`], read by the engine in the
//! turn that made the launch), tells the device the launch was answered
//! ([`Backend::submit_answered`]) and drops the events the device then
//! sends for it. Every rule of [`super::ends_ahead`] holds as it does
//! through a device process. A device that reports nothing (the simulated
//! one unless scripted) is served as without it.

use super::ends_ahead::{KnownEnds, Silenced};
use super::{
    Backend, BufferMove, DevAddr, Failure, KernelCode, LoadError, Loaded, MemError, MemInfo, ModuleImage, Moved,
    OpFailed, OpWork, Registered, Wake,
};
use crate::core::id_map::IdMap;
use crate::shm::ShmRegion;
use gpumux_engine::device::{Command, DeviceError, Event};
use gpumux_engine::ids::{LaunchId, OpId};
use gpumux_engine::kernel::DeviceInfo;
use gpumux_engine::time::Nanos;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A backend whose launches of kernels it ran ahead are answered here (module doc).
pub struct AnswersAhead {
    inner: Box<dyn Backend>,
    known: KnownEnds,
    silenced: Silenced,
    /// Launches that went to the device and whose end was not read yet: a
    /// report of their operation is stale (the device answers them itself).
    launched: IdMap<LaunchId, OpId>,
    /// `take_ends_ahead`'s buffer, kept to spare an allocation per poll.
    ends: Vec<super::ends_ahead::EndAhead>,
}

impl AnswersAhead {
    /// `inner`, asked to report the kernels it runs ahead.
    pub fn new(mut inner: Box<dyn Backend>) -> AnswersAhead {
        inner.report_ends_ahead();
        AnswersAhead {
            inner,
            known: KnownEnds::default(),
            silenced: Silenced::default(),
            launched: IdMap::default(),
            ends: Vec::new(),
        }
    }
}

impl Drop for AnswersAhead {
    fn drop(&mut self) {
        if self.known.count() > 0 {
            tracing::info!(
                "device {}: {} launch commands answered from ends the device saw ahead",
                self.inner.describe(),
                self.known.count()
            );
        }
    }
}

// Every method written out, those with a default too (`Backend`'s doc): a
// method added to the trait fails clippy here until it is forwarded.
#[deny(clippy::missing_trait_methods)]
impl Backend for AnswersAhead {
    fn submit(&mut self, command: Command) -> Result<(), Failure> {
        if self.known.drops(&command) {
            // Its launch was answered here and ran every block (`ends_ahead`).
            return Ok(());
        }
        if self.known.answer(&command) {
            if let Command::Launch { launch, .. } = &command {
                self.silenced.add(*launch);
            }
            return self.inner.submit_answered(command);
        }
        if let Command::Launch { launch, op, .. } = &command {
            self.launched.insert(*launch, *op);
        }
        self.inner.submit(command)
    }

    fn poll(&mut self, events: &mut Vec<Event>) -> Result<Nanos, Failure> {
        let first = events.len();
        let t = self.inner.poll(events)?;
        if !self.silenced.is_empty() {
            // The device's events only (an allocation only while answered launches are on it).
            let mut theirs = events.split_off(first);
            if let Err(what) = self.silenced.filter(&mut theirs) {
                return Err(Failure::Fatal(DeviceError::backend("the device", what)));
            }
            events.append(&mut theirs);
        }
        if !self.launched.is_empty() {
            for e in &events[first..] {
                if let Event::LaunchEnded { launch, .. } = e {
                    self.launched.remove(launch);
                }
            }
        }
        // After the device's: those launches went to it after this poll.
        self.known.take(events);
        self.inner.take_ends_ahead(&mut self.ends);
        let launched = &self.launched;
        self.known.learn(self.ends.drain(..), |op| launched.values().any(|&o| o == op));
        Ok(t)
    }

    fn take_answered(&mut self, events: &mut Vec<Event>) -> bool {
        if !self.known.pending() {
            return false;
        }
        self.known.take(events);
        true
    }

    fn unbind(&mut self, op: OpId) {
        self.known.forget(op);
        self.inner.unbind(op)
    }

    fn next_wake(&self) -> Wake {
        if self.known.pending() {
            return Wake::After(Duration::ZERO);
        }
        self.inner.next_wake()
    }

    fn ends_answered(&self) -> u64 {
        self.known.count()
    }

    fn rebuild(&mut self) -> Result<(), MemError> {
        self.known = KnownEnds::default();
        self.silenced = Silenced::default();
        self.launched.clear();
        self.inner.rebuild()
    }

    // Reported here, not passed on.
    fn report_ends_ahead(&mut self) {}
    // Read from the device at each poll and answered here: the core gets
    // answers (`take_answered`), not ends.
    fn take_ends_ahead(&mut self, _out: &mut Vec<super::ends_ahead::EndAhead>) {}
    // For a device process's held polls; the core here polls every `--poll-us`.
    fn run_end_landed(&self) -> Option<bool> {
        self.inner.run_end_landed()
    }
    // A device process's, between the daemon's messages; in one process the
    // core's polls are all there is.
    fn look_between(&mut self, _posts: usize) -> Result<super::Looked, Failure> {
        Ok(super::Looked::default())
    }

    fn hold_sends(&mut self) {
        self.inner.hold_sends()
    }
    fn release_sends(&mut self) {
        self.inner.release_sends()
    }

    // The rest is the device's own: every method is written out (clippy's
    // `missing_trait_methods` is denied on this impl), so a method added to
    // `Backend` with a default cannot be left unforwarded unnoticed.
    fn read_back(&mut self, addr: DevAddr, bytes: u64) -> Option<Result<Vec<u8>, MemError>> {
        self.inner.read_back(addr, bytes)
    }
    fn write_in(&mut self, addr: DevAddr, data: &[u8]) -> Option<Result<(), MemError>> {
        self.inner.write_in(addr, data)
    }
    fn read_span(&mut self, addr: DevAddr, offset: u64, bytes: u64) -> Option<Result<Vec<u8>, MemError>> {
        self.inner.read_span(addr, offset, bytes)
    }
    fn write_span(&mut self, addr: DevAddr, offset: u64, data: &[u8]) -> Option<Result<(), MemError>> {
        self.inner.write_span(addr, offset, data)
    }
    fn read_to_region(
        &mut self,
        addr: DevAddr,
        offset: u64,
        region: &Arc<ShmRegion>,
        at: u64,
        len: u64,
    ) -> Option<Result<(), MemError>> {
        self.inner.read_to_region(addr, offset, region, at, len)
    }
    fn write_from_region(
        &mut self,
        addr: DevAddr,
        offset: u64,
        region: &Arc<ShmRegion>,
        at: u64,
        len: u64,
    ) -> Option<Result<(), MemError>> {
        self.inner.write_from_region(addr, offset, region, at, len)
    }
    fn read_piece(&mut self, addr: DevAddr, offset: u64, into: &mut [u8]) -> Option<Result<(), MemError>> {
        self.inner.read_piece(addr, offset, into)
    }
    fn write_piece(&mut self, addr: DevAddr, offset: u64, from: &[u8]) -> Option<Result<(), MemError>> {
        self.inner.write_piece(addr, offset, from)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }
    fn compute_capability(&self) -> [u32; 2] {
        self.inner.compute_capability()
    }
    fn runs_block_ranges(&self) -> bool {
        self.inner.runs_block_ranges()
    }
    fn mem_info(&mut self) -> Result<MemInfo, MemError> {
        self.inner.mem_info()
    }
    fn alloc(&mut self, bytes: u64) -> Result<DevAddr, MemError> {
        self.inner.alloc(bytes)
    }
    fn free(&mut self, addr: DevAddr) -> Result<(), MemError> {
        self.inner.free(addr)
    }
    fn swap_granularity(&self) -> Option<u64> {
        self.inner.swap_granularity()
    }
    fn reserve(&mut self, bytes: u64) -> Result<DevAddr, MemError> {
        self.inner.reserve(bytes)
    }
    fn evict(&mut self, addr: DevAddr) -> Result<Nanos, MemError> {
        self.inner.evict(addr)
    }
    fn restore(&mut self, addr: DevAddr) -> Result<Nanos, MemError> {
        self.inner.restore(addr)
    }
    fn start_move(&mut self, token: u64, what: BufferMove) -> Option<Result<Nanos, MemError>> {
        self.inner.start_move(token, what)
    }
    fn take_moved(&mut self, out: &mut Vec<Moved>) {
        self.inner.take_moved(out)
    }
    fn settle_moves(&mut self, out: &mut Vec<Moved>) {
        self.inner.settle_moves(out)
    }
    fn evicted_survive_rebuild(&self) -> bool {
        self.inner.evicted_survive_rebuild()
    }
    fn readdress_evicted(&mut self, addr: DevAddr) -> Result<DevAddr, MemError> {
        self.inner.readdress_evicted(addr)
    }
    fn register_host(&mut self, region: &Arc<ShmRegion>) -> Result<(), MemError> {
        self.inner.register_host(region)
    }
    fn start_register(&mut self, token: u64, region: &Arc<ShmRegion>) {
        self.inner.start_register(token, region)
    }
    fn take_registered(&mut self, out: &mut Vec<Registered>) {
        self.inner.take_registered(out)
    }
    fn unregister_host(&mut self, region: &ShmRegion) {
        self.inner.unregister_host(region)
    }
    fn load_module(&mut self, name: &str, source: &str, options: &[String]) -> Result<ModuleImage, LoadError> {
        self.inner.load_module(name, source, options)
    }
    fn start_load(&mut self, token: u64, name: &str, source: &str, options: &[String]) {
        self.inner.start_load(token, name, source, options)
    }
    fn take_loaded(&mut self, out: &mut Vec<Loaded>) {
        self.inner.take_loaded(out)
    }
    fn unload_module(&mut self, kernels: &[KernelCode]) {
        self.inner.unload_module(kernels)
    }
    fn kernels_loaded(&self) -> usize {
        self.inner.kernels_loaded()
    }
    fn bind(&mut self, op: OpId, work: OpWork) {
        self.inner.bind(op, work)
    }
    fn now(&self) -> Nanos {
        self.inner.now()
    }
    fn now_at(&self, at: Instant) -> Nanos {
        self.inner.now_at(at)
    }
    fn take_failed(&mut self, out: &mut Vec<OpFailed>) {
        self.inner.take_failed(out)
    }
    fn start_poll(&mut self) -> bool {
        self.inner.start_poll()
    }
    fn start_held_poll(&mut self, hold: Duration) -> bool {
        self.inner.start_held_poll(hold)
    }
    fn end_hold(&mut self) {
        self.inner.end_hold()
    }
    fn poll_ready(&mut self) -> bool {
        self.inner.poll_ready()
    }
    fn spin_for(&mut self, window: Duration) {
        self.inner.spin_for(window)
    }
    fn frees_retreats_at_once(&self) -> bool {
        self.inner.frees_retreats_at_once()
    }
    fn submit_answered(&mut self, command: Command) -> Result<(), Failure> {
        self.inner.submit_answered(command)
    }
    // Whoever answers a launch here sends it `submit_answered`; one that
    // retires it too (a device process's daemon side) speaks to the device
    // itself: forwarded.
    fn retire_answered(&mut self, launch: LaunchId, op: OpId) -> Result<(), Failure> {
        self.known.forget(op);
        self.inner.retire_answered(launch, op)
    }
    fn exchange_lap(&mut self) -> Option<String> {
        self.inner.exchange_lap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;
    use gpumux_engine::ids::{KernelId, ProcessId};
    use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
    use gpumux_engine::ranges::BlockRanges;
    use gpumux_engine::smset::SmSet;

    fn one_block(after: Option<OpId>) -> OpWork {
        OpWork::Kernel {
            code: KernelCode(1),
            grid: [1, 1, 1],
            block: [32, 1, 1],
            shared_bytes: 0,
            params: Vec::new(),
            after,
            range: None,
        }
    }

    fn launch(lid: u64, op: OpId) -> Command {
        Command::Launch {
            launch: LaunchId(lid),
            kernel: KernelId(op.0),
            op,
            process: ProcessId(0),
            priority: 0,
            desc: Arc::new(KernelDesc::new("k", KernelShape::new(1, 32, 32)).with_sim_timing(SimTiming::new(1_000))),
            time_key: op.0,
            blocks: BlockRanges::full(1),
            restore: Vec::new(),
            sms: SmSet::range(0, 2),
        }
    }

    /// The simulated device scripted to report kernels bound after another
    /// as run ahead: a launch of one is answered at once (its SMs released,
    /// then its end), the device's own events for it are dropped at the
    /// next poll, and a report of an operation whose launch went to the
    /// device first is stale.
    #[test]
    fn a_launch_of_a_kernel_run_ahead_is_answered_at_once_and_the_devices_events_for_it_dropped() {
        let mut sim = SimBackend::with_info(gpumux_sim::presets::h100());
        sim.script_ends_ahead();
        let mut b = AnswersAhead::new(Box::new(sim));
        b.bind(OpId(2), one_block(Some(OpId(1))));
        b.bind(OpId(3), one_block(Some(OpId(2))));
        let mut events = Vec::new();
        // Op 3's launch goes to the device before the poll that reports it: stale.
        b.submit(launch(30, OpId(3))).expect("submitted");
        b.poll(&mut events).expect("polled");
        assert!(!b.take_answered(&mut events), "nothing answered yet");
        b.submit(launch(20, OpId(2))).expect("answered");
        let mut answered = Vec::new();
        assert!(b.take_answered(&mut answered));
        let released = answered.iter().filter(|e| matches!(e, Event::SmReleased { launch: LaunchId(20), .. })).count();
        assert_eq!(released, 2, "both SMs of the launch released: {answered:?}");
        assert!(
            matches!(answered.last(), Some(Event::LaunchEnded { launch: LaunchId(20), remaining, completed: 1, .. }) if remaining.is_empty()),
            "then its end, its block done: {answered:?}"
        );
        assert_eq!(b.ends_answered(), 1, "op 3's report was stale: its launch is the device's");
        let mut later = Vec::new();
        b.poll(&mut later).expect("polled");
        assert!(
            !later.iter().any(|e| matches!(
                e,
                Event::SmReleased { launch: LaunchId(20), .. } | Event::LaunchEnded { launch: LaunchId(20), .. }
            )),
            "the device's events for the answered launch are dropped: {later:?}"
        );
        assert!(b.silenced.is_empty(), "its end was seen on the device");
    }
}
