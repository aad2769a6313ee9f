//! A device that hands out at most a set amount of its memory
//! (`--device-memory BYTES`, `[daemon] device_memory`; docs/oversubscription.md,
//! "How to configure it").
//!
//! Why: oversubscription is checked on one GPU of a host whose RAM is
//! smaller than three clients of 0.6 of the GPU (an H200 has 141 GB, the
//! one-GPU machine 128 GiB of RAM). Capping the memory the daemon hands
//! out makes three clients of 0.6 of the *cap* oversubscribe it while the
//! host holds their evicted copies. Everything the core reads about memory
//! goes through [`Backend::info`] and [`Backend::mem_info`], so the cap is
//! those two seen smaller: the device's total is the cap, and its free
//! memory is the cap less what is used (the device's own use counts, as
//! the context's does on a GPU). An allocation the cap has no room for is
//! refused here too, with the numbers, before the device is asked. Every
//! other call goes to the device unchanged.

use super::{
    ends_ahead, Backend, BufferMove, DevAddr, Failure, KernelCode, LoadError, Loaded, Looked, MemError, MemInfo,
    ModuleImage, Moved, OpFailed, OpWork, Registered, Wake,
};
use crate::shm::ShmRegion;
use gpumux_engine::device::{Command, Event};
use gpumux_engine::ids::{LaunchId, OpId};
use gpumux_engine::kernel::DeviceInfo;
use gpumux_engine::time::Nanos;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A device seen with `cap` bytes of memory (module doc).
pub struct Capped {
    inner: Box<dyn Backend>,
    /// The device's info with `mem_bytes` the cap.
    info: DeviceInfo,
    /// The device's memory past the cap: taken off its free memory.
    hidden: u64,
}

impl Capped {
    /// `inner` seen with `cap` bytes; an error names both sizes when the
    /// device has less than the cap, or the cap is 0.
    pub fn new(inner: Box<dyn Backend>, cap: u64) -> Result<Capped, MemError> {
        let total = inner.info().mem_bytes;
        if cap == 0 || cap > total {
            return Err(MemError::Device(format!(
                "--device-memory {cap} bytes: {} {} has {total} bytes of memory (the cap must be from 1 byte to that)",
                if cap == 0 { "nothing to hand out;" } else { "more than the device has;" },
                inner.describe()
            )));
        }
        let mut info = inner.info().clone();
        info.mem_bytes = cap;
        Ok(Capped { inner, info, hidden: total - cap })
    }
}

// Every method written out, those with a default too (`Backend`'s doc): a
// method added to the trait fails clippy here until it is forwarded.
#[deny(clippy::missing_trait_methods)]
impl Backend for Capped {
    fn describe(&self) -> String {
        format!("{} (memory capped at {} bytes)", self.inner.describe(), self.info.mem_bytes)
    }
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn compute_capability(&self) -> [u32; 2] {
        self.inner.compute_capability()
    }
    fn runs_block_ranges(&self) -> bool {
        self.inner.runs_block_ranges()
    }
    fn mem_info(&mut self) -> Result<MemInfo, MemError> {
        let m = self.inner.mem_info()?;
        Ok(MemInfo { free: m.free.saturating_sub(self.hidden), total: self.info.mem_bytes })
    }
    fn alloc(&mut self, bytes: u64) -> Result<DevAddr, MemError> {
        let m = self.mem_info()?;
        if bytes > m.free {
            let bound = format!("the daemon hands out {} bytes of this device (--device-memory)", m.total);
            return Err(MemError::OutOfMemory { bytes, free: m.free, total: m.total, bound });
        }
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
    fn unbind(&mut self, op: OpId) {
        self.inner.unbind(op)
    }
    fn now(&self) -> Nanos {
        self.inner.now()
    }
    fn now_at(&self, at: Instant) -> Nanos {
        self.inner.now_at(at)
    }
    fn submit(&mut self, command: Command) -> Result<(), Failure> {
        self.inner.submit(command)
    }
    fn poll(&mut self, events: &mut Vec<Event>) -> Result<Nanos, Failure> {
        self.inner.poll(events)
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
    fn next_wake(&self) -> Wake {
        self.inner.next_wake()
    }
    fn spin_for(&mut self, window: Duration) {
        self.inner.spin_for(window)
    }
    fn frees_retreats_at_once(&self) -> bool {
        self.inner.frees_retreats_at_once()
    }
    fn report_ends_ahead(&mut self) {
        self.inner.report_ends_ahead()
    }
    fn take_ends_ahead(&mut self, out: &mut Vec<ends_ahead::EndAhead>) {
        self.inner.take_ends_ahead(out)
    }
    fn run_end_landed(&self) -> Option<bool> {
        self.inner.run_end_landed()
    }
    fn look_between(&mut self, posts: usize) -> Result<Looked, Failure> {
        self.inner.look_between(posts)
    }
    fn submit_answered(&mut self, command: Command) -> Result<(), Failure> {
        self.inner.submit_answered(command)
    }
    fn retire_answered(&mut self, launch: LaunchId, op: OpId) -> Result<(), Failure> {
        self.inner.retire_answered(launch, op)
    }
    fn ends_answered(&self) -> u64 {
        self.inner.ends_answered()
    }
    fn take_answered(&mut self, events: &mut Vec<Event>) -> bool {
        self.inner.take_answered(events)
    }
    fn exchange_lap(&mut self) -> Option<String> {
        self.inner.exchange_lap()
    }
    fn hold_sends(&mut self) {
        self.inner.hold_sends()
    }
    fn release_sends(&mut self) {
        self.inner.release_sends()
    }
    fn rebuild(&mut self) -> Result<(), MemError> {
        self.inner.rebuild()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;

    const MIB: u64 = 1 << 20;

    fn sim() -> Box<dyn Backend> {
        Box::new(SimBackend::open("sim:h100,memory=64MiB").expect("the preset"))
    }

    #[test]
    fn a_cap_above_the_device_or_of_nothing_is_refused_naming_both_sizes() {
        let e = Capped::new(sim(), 65 * MIB).err().expect("65 MiB of a 64 MiB device").to_string();
        assert!(e.contains(&(65 * MIB).to_string()) && e.contains(&(64 * MIB).to_string()), "{e}");
        let e = Capped::new(sim(), 0).err().expect("0 bytes").to_string();
        assert!(e.contains("nothing to hand out"), "{e}");
        assert!(Capped::new(sim(), 64 * MIB).is_ok(), "all of it");
    }

    #[test]
    fn the_capped_device_shows_the_cap_and_refuses_what_the_cap_has_no_room_for() {
        let mut d = Capped::new(sim(), 32 * MIB).expect("32 of 64 MiB");
        assert_eq!(d.info().mem_bytes, 32 * MIB);
        let m = d.mem_info().expect("mem_info");
        assert_eq!((m.free, m.total), (32 * MIB, 32 * MIB), "nothing used yet");
        let a = d.alloc(20 * MIB).expect("20 of 32 MiB");
        let m = d.mem_info().expect("mem_info");
        assert_eq!(m.free, 12 * MIB, "the cap less what is used");
        // The device itself has 44 MiB free: the cap refuses 16.
        match d.alloc(16 * MIB) {
            Err(MemError::OutOfMemory { bytes, free, total, bound }) => {
                assert_eq!((bytes, free, total), (16 * MIB, 12 * MIB, 32 * MIB));
                assert!(bound.contains("--device-memory"), "{bound}");
            }
            other => panic!("16 MiB past a cap with 12 free: {other:?}"),
        }
        d.free(a).expect("free");
        assert_eq!(d.mem_info().expect("mem_info").free, 32 * MIB, "given back");
        assert!(d.describe().contains("capped"), "{}", d.describe());
    }

    /// Every call but the memory figures reaches the device unchanged: here
    /// the spans a split or a move reads and writes (before, the wrapper
    /// left them to the trait's defaults, "this device cannot", and a split
    /// under `--device-memory` lost its byte moves).
    #[test]
    fn spans_pass_through_to_the_device() {
        let mut d = Capped::new(sim(), 32 * MIB).expect("32 of 64 MiB");
        let a = d.alloc(MIB).expect("1 MiB");
        let bytes: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        d.write_span(a, 8192, &bytes).expect("the device writes spans").expect("written");
        let back = d.read_span(a, 8192, 4096).expect("the device reads spans").expect("read");
        assert_eq!(back, bytes);
        assert_eq!(d.read_back(a, 4).expect("a read-back").expect("read"), vec![0; 4], "the start untouched");
    }
}
