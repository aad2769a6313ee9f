//! Clients' kernels, memory and copies on a real GPU through
//! [`ClientDevice`] and the engine's commands: a copy round trip, a client
//! kernel preempted and resumed equal to its native launch, a per-SM retreat
//! (released at once, the other SMs finish the launch), an urgent launch on
//! the SMs a retreat took (run there, once, as the workers left), a stream of
//! dependent kernels queued ahead on the GPU (in order under retreats, a
//! dropped one never run), a launch refilled on SMs it was given back (every
//! block once), a kernel unloaded while it runs (its work runs
//! out, its module goes with the last of it), hardware priority (a launch
//! alone on the GPU native, an urgent one native beside it, a short one
//! beside another priority's workers kept as workers), a one-block launch
//! on SMs the engine kept beside a long grid of the same priority (started
//! at once: issue 36), and a faulting
//! kernel reported as a lost context and survived by a rebuild. Without a
//! GPU (or NVRTC) each test says it skipped and why.

mod examples;
mod gpu_test;
use examples::example;
use gpu_test::{test_name, Pinned};
use gpumux_cuda::client::module;
use gpumux_cuda::client::{
    ClientDevice, ClientWork, ContextLost, HostPtr, KernelHandle, PitchedSide, Refill, DEEP_MAX,
};
use gpumux_cuda::nvrtc;
use gpumux_cuda::runtime::{Module, Params, Stream};
use gpumux_engine::device::{Command, CopyDirection, Device, DeviceError, Event, Mechanism};
use gpumux_engine::ids::{CopyId, KernelId, LaunchId, OpId, ProcessId};
use gpumux_engine::kernel::{KernelDesc, KernelShape};
use gpumux_engine::ranges::BlockRanges;
use gpumux_engine::smset::SmSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One test on the GPU at a time: the fault test breaks a context on purpose,
/// and the others' timing (the preemption test's retreat) should not depend on it.
static GPU: Mutex<()> = Mutex::new(());

/// The GPU for test `test` (held for the test: [`GPU`]), or `None` with a
/// line saying it skipped and why.
fn device_or_skip(test: &str) -> Option<(MutexGuard<'static, ()>, ClientDevice)> {
    device_or_skip_with(test, ClientDevice::open)
}

/// [`device_or_skip`], the device opened by `open` (co-located, say).
fn device_or_skip_with(
    test: &str,
    open: fn(i32) -> Result<ClientDevice, gpumux_cuda::CudaError>,
) -> Option<(MutexGuard<'static, ()>, ClientDevice)> {
    if !nvrtc::nvrtc_present() {
        eprintln!("SKIPPED {test}: libnvrtc not found (source .ci/install-nvrtc.sh)");
        return None;
    }
    let guard = GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    match open(0) {
        Ok(d) => Some((guard, d)),
        Err(e) => {
            eprintln!("SKIPPED {test}: {}", gpumux_cuda::error::Chain(&e));
            None
        }
    }
}

/// Advances until `done` says the events seen so far are enough (10 s at most).
fn run_until(d: &mut ClientDevice, mut done: impl FnMut(&[Event]) -> bool) -> Result<Vec<Event>, DeviceError> {
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(&events) {
        assert!(
            Instant::now() < deadline,
            "no progress in 10 s: events {events:?}; operations in flight {:?}; hardware priority {:?}; {:?}",
            d.in_flight(),
            d.hw_priority(),
            d.ahead_counts()
        );
        let now = d.now();
        d.advance(Some(now + 1_000_000), &mut events)?;
    }
    Ok(events)
}

/// Runs launch `lid` to its end and returns the blocks it handed back.
fn run_to_end(d: &mut ClientDevice, lid: LaunchId) -> BlockRanges {
    let events = run_until(d, ended(lid)).expect("launch");
    remaining_of(&events, lid)
}

/// Polls until launch `last` ends, unless `events` has its end already;
/// the events seen meanwhile are added to `events`.
fn until_ended(d: &mut ClientDevice, events: &mut Vec<Event>, last: LaunchId) {
    if end_of(events, last).is_none() {
        events.extend(run_until(d, ended(last)).expect("the last launch"));
    }
}

/// Every one of `steps` launches `first_lid`, `first_lid + 1`, .. ended
/// among `events` with all its `blocks` done.
fn assert_each_step_ran(events: &[Event], first_lid: u64, steps: u32, blocks: u64) {
    for k in 0..steps {
        assert_eq!(ended_with(events, first_lid + u64::from(k)), Some((0, blocks)), "step {k} ran every block");
    }
}

/// Launch `lid`'s end among `events`, if it ended there: the blocks it
/// handed back and how many it completed.
fn end_of(events: &[Event], lid: LaunchId) -> Option<(&BlockRanges, u64)> {
    events.iter().find_map(|e| match e {
        Event::LaunchEnded { launch, remaining, completed, .. } if *launch == lid => Some((remaining, *completed)),
        _ => None,
    })
}

/// The blocks launch `lid` handed back at its end among `events` (none if it did not end there).
fn remaining_of(events: &[Event], lid: LaunchId) -> BlockRanges {
    end_of(events, lid).map(|(remaining, _)| remaining.clone()).unwrap_or_default()
}

/// How launch `lid` ended among `events`: (blocks handed back, blocks
/// completed), if it did.
fn ended_with(events: &[Event], lid: u64) -> Option<(u64, u64)> {
    end_of(events, LaunchId(lid)).map(|(remaining, completed)| (remaining.len(), completed))
}

fn copy_done(copy: CopyId) -> impl FnMut(&[Event]) -> bool {
    move |ev| ev.iter().any(|e| matches!(e, Event::CopyDone { copy: c } if *c == copy))
}

fn ended(launch: LaunchId) -> impl FnMut(&[Event]) -> bool {
    move |ev| ev.iter().any(|e| matches!(e, Event::LaunchEnded { launch: l, .. } if *l == launch))
}

/// Binds and runs one copy to its end.
fn copy(d: &mut ClientDevice, id: u64, work: ClientWork) {
    let bytes = work.copy_bytes();
    // SAFETY: the tests' host buffers are registered and outlive the copy.
    unsafe { d.bind(OpId(id), work) }.expect("bind");
    let c = CopyId(id);
    let cmd =
        Command::Copy { copy: c, op: OpId(id), process: ProcessId(0), direction: CopyDirection::DeviceToDevice, bytes };
    d.submit(d.now(), cmd).expect("submit copy");
    run_until(d, copy_done(c)).expect("copy");
    d.unbind(OpId(id));
}

fn launch(op: u64, launch: u64, blocks: BlockRanges, sms: SmSet, total: u64) -> Command {
    Command::Launch {
        launch: LaunchId(launch),
        kernel: KernelId(op),
        op: OpId(op),
        process: ProcessId(0),
        priority: 0,
        desc: Arc::new(KernelDesc::new("client", KernelShape::new(total, 256, 32))),
        time_key: op,
        blocks,
        restore: Vec::new(),
        sms,
    }
}

/// [`launch`] at priority 1: an urgent launch beside priority 0's.
fn urgent_launch(op: u64, lid: u64, blocks: BlockRanges, sms: SmSet, total: u64) -> Command {
    let mut c = launch(op, lid, blocks, sms, total);
    if let Command::Launch { priority, .. } = &mut c {
        *priority = 1;
    }
    c
}

/// The SMs `events` say were released, in order.
fn released_sms(events: &[Event]) -> Vec<u16> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::SmReleased { sm, .. } => Some(sm.0),
            _ => None,
        })
        .collect()
}

/// Takes `sms` from launch `lid` and polls once: they must be released at
/// once, long before the launch ends. Returns that poll's events.
fn retreat_released_at_once(d: &mut ClientDevice, lid: LaunchId, sms: SmSet) -> Vec<Event> {
    d.submit(d.now(), Command::Retreat { launch: lid, sms, mechanism: Mechanism::Drain }).expect("retreat");
    let mut events = Vec::new();
    d.advance(Some(d.now()), &mut events).expect("poll");
    assert_eq!(released_sms(&events), sms.iter().map(|s| s.0).collect::<Vec<_>>(), "released at once: {events:?}");
    events
}

fn round_trip(d: &mut ClientDevice, first_op: u64) {
    let n = 1 << 20;
    let data: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
    let mut src = Pinned::new(d, data.clone());
    let mut back = Pinned::new(d, vec![0u8; n]);
    let a = d.alloc(n as u64).expect("alloc a");
    let b = d.alloc(n as u64).expect("alloc b");
    copy(d, first_op, ClientWork::ToDevice { dst: a, src: src.ptr(), bytes: n as u64 });
    copy(d, first_op + 1, ClientWork::DeviceCopy { src: a, dst: b, bytes: n as u64 });
    copy(d, first_op + 2, ClientWork::Memset { dst: b, value: 0xab, bytes: 16 });
    // 32- and 16-bit fills (cuMemsetD32 / D16, issue 40) after it, in order.
    copy(d, first_op + 3, ClientWork::Fill { dst: b + 16, value: 0x0403_0201, width: 4, bytes: 8 });
    copy(d, first_op + 4, ClientWork::Fill { dst: b + 24, value: 0xBBAA, width: 2, bytes: 4 });
    copy(d, first_op + 5, ClientWork::ToHost { src: b, dst: back.ptr(), bytes: n as u64 });
    assert!(back.0[..16].iter().all(|&x| x == 0xab), "memset");
    assert_eq!(&back.0[16..28], &[1, 2, 3, 4, 1, 2, 3, 4, 0xAA, 0xBB, 0xAA, 0xBB], "fills");
    assert_eq!(&back.0[28..], &data[28..], "host → device → device → host");
    // A pitched copy each way (a linear copy per row, issue 40): rows of 200 bytes,
    // 256 apart on the host, 512 on the device, 300 back on the host.
    let (w, h) = (200usize, 64usize);
    back.0.fill(0xEE);
    let up = ClientWork::Copy2D {
        src: PitchedSide::Host { ptr: src.ptr(), pitch: 256 },
        dst: PitchedSide::Device { addr: a, pitch: 512 },
        width: w as u64,
        height: h as u64,
    };
    copy(d, first_op + 6, up);
    let down = ClientWork::Copy2D {
        src: PitchedSide::Device { addr: a, pitch: 512 },
        dst: PitchedSide::Host { ptr: back.ptr(), pitch: 300 },
        width: w as u64,
        height: h as u64,
    };
    copy(d, first_op + 7, down);
    for row in 0..h {
        assert_eq!(&back.0[row * 300..][..w], &data[row * 256..][..w], "pitched row {row}");
        assert!(back.0[row * 300 + w..][..300 - w].iter().all(|&x| x == 0xEE), "row {row}'s gap");
    }
    d.free(a).expect("free");
    d.free(b).expect("free");
    assert_eq!(d.allocated(), 0);
    d.unregister_host(src.ptr().0);
    d.unregister_host(back.ptr().0);
}

#[test]
fn memory_round_trips_through_copies() {
    let Some((_gpu, mut d)) = device_or_skip(test_name!()) else { return };
    let (free, total) = d.mem_info().expect("mem info");
    assert!(free > 0 && free <= total);
    round_trip(&mut d, 1);
    let huge = d.alloc(total * 2);
    assert!(matches!(huge, Err(gpumux_cuda::client::MemoryError::OutOfMemory { .. })), "{huge:?}");
}

#[test]
fn a_preempted_client_kernel_equals_its_native_launch() {
    let Some((_gpu, mut d)) = device_or_skip(test_name!()) else { return };
    let src = example("matmul");
    let n: u32 = 2048;
    let bytes = (n * n * 4) as u64;
    let inputs: Vec<u8> =
        (0..n * n).flat_map(|i| (((i * 2654435761u32) >> 20) as f32 / 4096.0 - 0.5).to_le_bytes()).collect();
    let mut host = Pinned::new(&mut d, inputs);
    let (a, b, c, c_native) =
        (d.alloc(bytes).unwrap(), d.alloc(bytes).unwrap(), d.alloc(bytes).unwrap(), d.alloc(bytes).unwrap());
    copy(&mut d, 1, ClientWork::ToDevice { dst: a, src: host.ptr(), bytes });
    copy(&mut d, 2, ClientWork::ToDevice { dst: b, src: host.ptr(), bytes });

    // Native: the untransformed kernel, in the device's context (current after its calls).
    let native_cubin = nvrtc::compile("matmul_native", &src, d.arch(), &[]).expect("native compile");
    let native = Module::load("matmul_native", &native_cubin.cubin).expect("load native");
    let f = native.function("matmul").expect("native kernel");
    let s = Stream::in_range((0, 0), 0).expect("stream");
    let (grid, block) = ([n / 16, n / 16, 1], [16, 16, 1]);
    let mut p = Params::default();
    p.ptr(a).ptr(b).ptr(c_native).u32(n);
    // SAFETY: the arguments follow matmul's signature.
    unsafe { f.launch(grid, block, 0, &s, &mut p) }.expect("native launch");
    s.sync().expect("native run");

    // Workers: launched on every SM, half the SMs taken away at once, then
    // all; then resumed with what was left.
    let compiled = module::compile("matmul", &src, &[], d.arch()).expect("compile");
    let (kernels, _) = d.load_module("matmul", &compiled).expect("load");
    let (h, k) = kernels.into_iter().next().expect("one kernel");
    assert_eq!(k.param_sizes, vec![8, 8, 8, 4]);
    assert!(k.static_smem >= 2 * 16 * 16 * 4, "two tiles of shared memory: {}", k.static_smem);
    let params =
        vec![a.to_le_bytes().to_vec(), b.to_le_bytes().to_vec(), c.to_le_bytes().to_vec(), n.to_le_bytes().to_vec()];
    let work = ClientWork::Kernel { kernel: h, grid, block, shared_bytes: 0, params };
    // SAFETY: a kernel binds no host memory.
    unsafe { d.bind(OpId(10), work) }.expect("bind");
    let total = (grid[0] * grid[1]) as u64;
    let all = SmSet::range(0, d.info().num_sms);
    let half = SmSet::range(0, d.info().num_sms / 2);
    d.submit(d.now(), launch(10, 1, BlockRanges::full(total), all, total)).expect("launch");
    d.submit(d.now(), Command::Retreat { launch: LaunchId(1), sms: half, mechanism: Mechanism::Drain })
        .expect("retreat half");
    d.submit(d.now(), Command::Retreat { launch: LaunchId(1), sms: all, mechanism: Mechanism::Drain })
        .expect("retreat all");
    let events = run_until(&mut d, ended(LaunchId(1))).expect("first launch");
    let remaining = events
        .iter()
        .find_map(|e| match e {
            Event::LaunchEnded { remaining, .. } => Some(remaining.clone()),
            _ => None,
        })
        .unwrap_or_default();
    eprintln!("retreated with {} of {total} blocks left", remaining.len());
    assert!(!remaining.is_empty(), "the retreat came after every block had run: nothing was preempted");
    d.submit(d.now(), launch(10, 2, remaining, all, total)).expect("resume");
    let events = run_until(&mut d, ended(LaunchId(2))).expect("resumed launch");
    assert!(events.iter().any(|e| matches!(e, Event::LaunchEnded { remaining, .. } if remaining.is_empty())));
    d.unbind(OpId(10));

    let mut out = Pinned::new(&mut d, vec![0u8; 2 * bytes as usize]);
    let o = out.ptr().0;
    copy(&mut d, 3, ClientWork::ToHost { src: c, dst: HostPtr(o), bytes });
    // SAFETY: the second half of `out`.
    copy(&mut d, 4, ClientWork::ToHost { src: c_native, dst: HostPtr(unsafe { o.add(bytes as usize) }), bytes });
    let (workers, native_out) = out.0.split_at(bytes as usize);
    assert!(workers == native_out, "preempted workers differ from the native launch");
    d.unregister_host(o);
    d.unregister_host(host.ptr().0);
}

/// A kernel whose blocks spin `spin_ns` and record, each, that they ran
/// (a count), the SM they ran on and when they started (globaltimer, ns).
const STAMP: &str = r#"
extern "C" __global__ void stamp(unsigned int* runs, unsigned int* sm_of, unsigned long long* start, unsigned long long spin_ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < spin_ns);
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int s;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
        atomicAdd(&runs[blockIdx.x], 1u);
        sm_of[blockIdx.x] = s;
        start[blockIdx.x] = t0;
    }
}
"#;

/// What `stamp`'s blocks recorded, per block.
struct Stamped {
    runs: Vec<u32>,
    sm_of: Vec<u32>,
    start: Vec<u64>,
}

/// `stamp`'s output buffers for `n` blocks (run counts zeroed).
struct Stamps {
    n: u64,
    runs: u64,
    sm_of: u64,
    start: u64,
}

impl Stamps {
    /// Loads `stamp` (once per test: each test has a device of its own).
    fn kernel(d: &mut ClientDevice) -> KernelHandle {
        let compiled = module::compile("stamp", STAMP, &[], d.arch()).expect("compile");
        d.load_module("stamp", &compiled).expect("load").0[0].0
    }

    /// Buffers for `n` blocks; `op` is the memset's operation id.
    fn new(d: &mut ClientDevice, n: u64, op: u64) -> Stamps {
        let st = Stamps {
            n,
            runs: d.alloc(n * 4).expect("alloc"),
            sm_of: d.alloc(n * 4).expect("alloc"),
            start: d.alloc(n * 8).expect("alloc"),
        };
        copy(d, op, ClientWork::Memset { dst: st.runs, value: 0, bytes: n * 4 });
        st
    }

    /// `stamp` over these buffers, one 256-thread block per entry, spinning `spin_ns`.
    fn work(&self, kernel: KernelHandle, spin_ns: u64) -> ClientWork {
        self.work_of(kernel, spin_ns, 256)
    }

    /// [`Stamps::work`] with blocks of `threads`.
    fn work_of(&self, kernel: KernelHandle, spin_ns: u64, threads: u32) -> ClientWork {
        let params = [self.runs, self.sm_of, self.start, spin_ns].iter().map(|v| v.to_le_bytes().to_vec()).collect();
        ClientWork::Kernel { kernel, grid: [self.n as u32, 1, 1], block: [threads, 1, 1], shared_bytes: 0, params }
    }

    /// Reads what the blocks recorded (three copies, operations `op`..`op + 3`) and frees the buffers.
    fn read_and_free(self, d: &mut ClientDevice, op: u64) -> Stamped {
        let n = self.n as usize;
        let mut host = Pinned::new(d, vec![0u8; n * 16]);
        let o = host.ptr().0;
        for (i, (src, at, bytes)) in
            [(self.runs, 0, n * 4), (self.sm_of, n * 4, n * 4), (self.start, n * 8, n * 8)].into_iter().enumerate()
        {
            // SAFETY: `at + bytes` is within `host` (16 bytes per block).
            let dst = HostPtr(unsafe { o.add(at) });
            copy(d, op + i as u64, ClientWork::ToHost { src, dst, bytes: bytes as u64 });
        }
        d.unregister_host(o);
        for a in [self.runs, self.sm_of, self.start] {
            d.free(a).expect("free");
        }
        let v = &host.0;
        let u32s = |b: &[u8]| b.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect();
        let u64s = |b: &[u8]| b.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8]))).collect();
        Stamped { runs: u32s(&v[..n * 4]), sm_of: u32s(&v[n * 4..n * 8]), start: u64s(&v[n * 8..]) }
    }
}

/// Runs `stamp` with blocks of 10 µs (40 waves) on every SM, takes `gone`
/// away right after the launch, optionally gives it back, and returns the
/// events and what the blocks recorded.
fn stamp_with_retreat(d: &mut ClientDevice, op: u64, gone: SmSet, give_back: bool) -> (Vec<Event>, Stamped) {
    let h = Stamps::kernel(d);
    let sms = d.info().num_sms;
    let total = sms as u64 * 8 * 40;
    let out = Stamps::new(d, total, op + 1);
    // SAFETY: a kernel binds no host memory.
    unsafe { d.bind(OpId(op), out.work(h, 10_000)) }.expect("bind");
    let all = SmSet::range(0, sms);
    d.submit(d.now(), launch(op, op, BlockRanges::full(total), all, total)).expect("launch");
    let mut events = retreat_released_at_once(d, LaunchId(op), gone);
    if give_back {
        d.submit(d.now(), Command::Grow { launch: LaunchId(op), sms: gone }).expect("grow");
    }
    events.extend(run_until(d, ended(LaunchId(op))).expect("launch"));
    d.unbind(OpId(op));
    let stamped = out.read_and_free(d, op + 2);
    (events, stamped)
}

#[test]
fn a_per_sm_retreat_releases_at_once_and_the_other_sms_finish_the_launch() {
    let Some((_gpu, mut d)) = device_or_skip(test_name!()) else { return };
    let sms = d.info().num_sms;
    // Half the SMs taken away for good.
    let half = SmSet::range(sms / 2, sms);
    let (events, Stamped { runs, sm_of, .. }) = stamp_with_retreat(&mut d, 100, half, false);
    assert!(runs.iter().all(|&r| r == 1), "every block ran exactly once");
    let end = events.iter().find_map(|e| match e {
        Event::LaunchEnded { remaining, completed, .. } => Some((remaining.len(), *completed)),
        _ => None,
    });
    assert_eq!(end, Some((0, runs.len() as u64)), "the other SMs finished the launch without a restart");
    let on_gone = sm_of.iter().filter(|&&s| s >= (sms / 2) as u32).count();
    eprintln!("{on_gone} of {} blocks ran on the SMs taken away", runs.len());
    // Workers there finish the chunk they hold (a claim of at most 2 blocks of
    // 10 µs) and leave: a few blocks per worker, far from half the launch.
    assert!(on_gone * 10 < runs.len(), "{on_gone} of {} blocks ran on SMs taken away", runs.len());
    let exhausted: Vec<u16> = events
        .iter()
        .filter_map(|e| match e {
            Event::SmReleased { sm, cause: gpumux_engine::device::ReleaseCause::Exhausted, .. } => Some(sm.0),
            _ => None,
        })
        .collect();
    assert_eq!(exhausted, (0..sms / 2).collect::<Vec<_>>(), "each SM released once");

    // Sixteen SMs taken away and given back: the launch goes on where its
    // workers are (no drain, no restart) and still holds every SM at its end.
    let few = SmSet::range(sms - 16, sms);
    let (events, Stamped { runs, .. }) = stamp_with_retreat(&mut d, 200, few, true);
    assert!(runs.iter().all(|&r| r == 1), "every block ran exactly once");
    let released = released_sms(&events);
    let mut want: Vec<u16> = few.iter().map(|s| s.0).collect();
    want.extend(0..sms);
    assert_eq!(released, want, "the sixteen at once, then every SM at the end");
}

#[test]
fn an_urgent_launch_on_retreated_sms_runs_there_as_the_low_priority_workers_leave() {
    let Some((_gpu, mut d)) = device_or_skip(test_name!()) else { return };
    let d = &mut d;
    let h = Stamps::kernel(d);
    let sms = d.info().num_sms;
    // Low priority: 2 waves of 1 ms blocks on every SM. Urgent: 132 blocks of 15 µs.
    let (lp_total, hp_total) = (sms as u64 * 8 * 2, 132u64);
    let (lp, hp) = (Stamps::new(d, lp_total, 301), Stamps::new(d, hp_total, 302));
    // SAFETY: kernels bind no host memory.
    unsafe { d.bind(OpId(310), lp.work(h, 1_000_000)) }.expect("bind");
    unsafe { d.bind(OpId(311), hp.work(h, 15_000)) }.expect("bind");
    let all = SmSet::range(0, sms);
    let taken = SmSet::range(sms - 17, sms);
    d.submit(d.now(), launch(310, 310, BlockRanges::full(lp_total), all, lp_total)).expect("launch");
    // Let the low-priority blocks get going, then take 17 SMs for the urgent launch.
    std::thread::sleep(Duration::from_micros(300));
    let t_retreat = d.now();
    d.submit(d.now(), Command::Retreat { launch: LaunchId(310), sms: taken, mechanism: Mechanism::Drain })
        .expect("retreat");
    d.submit(d.now(), urgent_launch(311, 311, BlockRanges::full(hp_total), taken, hp_total)).expect("urgent launch");
    let t_launched = d.now();
    let events = run_until(d, ended(LaunchId(311))).expect("urgent");
    let t_urgent_end = d.now();
    drop(events);
    run_until(d, ended(LaunchId(310))).expect("low priority");
    let t_lp_end = d.now();
    d.unbind(OpId(310));
    d.unbind(OpId(311));
    let Stamped { runs: lp_runs, start: lp_start, .. } = lp.read_and_free(d, 320);
    let Stamped { runs: hp_runs, sm_of: hp_sm, start: hp_start } = hp.read_and_free(d, 330);
    assert!(lp_runs.iter().all(|&r| r == 1), "every low-priority block ran exactly once");
    assert!(hp_runs.iter().all(|&r| r == 1), "every urgent block ran exactly once");
    assert!(hp_sm.iter().all(|&s| s >= (sms - 17) as u32), "urgent blocks ran only on the SMs taken: {hp_sm:?}");
    // Where the time went (printed, not asserted: tests are not timed).
    let lp0 = lp_start.iter().copied().min().unwrap_or(0);
    let (h0, h1) = (hp_start.iter().copied().min().unwrap_or(0), hp_start.iter().copied().max().unwrap_or(0));
    eprintln!(
        "urgent: launched {:.0} µs after the retreat, ended {:.0} µs after its launch (host); its blocks started \
         {:.0} .. {:.0} µs after the first low-priority block (GPU clock); low priority ended {:.0} µs after the retreat",
        (t_launched - t_retreat) as f64 / 1e3,
        (t_urgent_end - t_launched) as f64 / 1e3,
        h0.saturating_sub(lp0) as f64 / 1e3,
        h1.saturating_sub(lp0) as f64 / 1e3,
        (t_lp_end - t_retreat) as f64 / 1e3,
    );
    let mut starts: Vec<u64> = hp_start.iter().map(|t| t.saturating_sub(h0) / 1000).collect();
    starts.sort();
    eprintln!("urgent block starts, µs after the first: {:?}", starts.iter().step_by(11).collect::<Vec<_>>());
}

#[test]
fn with_hardware_priority_a_lone_launch_runs_natively_and_an_urgent_one_takes_slots_as_its_blocks_end() {
    let Some((_gpu, mut d)) = device_or_skip(test_name!()) else { return };
    let d = &mut d;
    d.set_hw_priority(true);
    let mut compiled = module::compile("stamp", STAMP, &[], d.arch()).expect("compile");
    module::add_native(&mut compiled, "stamp", STAMP, &[], d.arch()).expect("native build");
    let h = d.load_module("stamp", &compiled).expect("load").0[0].0;
    let sms = d.info().num_sms;
    // Low priority: about 4 waves of 200 µs blocks of 224 threads on every SM.
    // Urgent: 132 blocks of 256 threads, 15 µs, short: native because the
    // low-priority launch beside it is.
    let (lp_total, hp_total) = (sms as u64 * 8 * 4, 132u64);
    let (lp, hp) = (Stamps::new(d, lp_total, 401), Stamps::new(d, hp_total, 402));
    // SAFETY: kernels bind no host memory.
    unsafe { d.bind(OpId(410), lp.work_of(h, 200_000, 224)) }.expect("bind");
    unsafe { d.bind(OpId(411), hp.work(h, 15_000)) }.expect("bind");
    let (all, taken) = (SmSet::range(0, sms), SmSet::range(sms - 17, sms));
    // Alone on the GPU, a launch runs natively from its first (nothing to time).
    d.submit(d.now(), launch(410, 410, BlockRanges::full(lp_total), all, lp_total)).expect("launch");
    let native_lp = d.hw_priority().1;
    std::thread::sleep(Duration::from_micros(300));
    // The engine takes 17 SMs for the urgent launch: a native launch cannot
    // leave them, so they are released at once and it goes on.
    retreat_released_at_once(d, LaunchId(410), taken);
    let t_launched = d.now();
    d.submit(d.now(), urgent_launch(411, 411, BlockRanges::full(hp_total), taken, hp_total)).expect("urgent launch");
    let native_hp = d.hw_priority().1;
    let urgent_events = run_until(d, ended(LaunchId(411))).expect("urgent");
    let t_urgent_end = d.now();
    let lp_events = run_until(d, ended(LaunchId(410))).expect("low priority");
    let t_lp_end = d.now();
    d.unbind(OpId(410));
    d.unbind(OpId(411));
    let Stamped { runs: lp_runs, .. } = lp.read_and_free(d, 420);
    let Stamped { runs: hp_runs, sm_of: hp_sm, .. } = hp.read_and_free(d, 430);
    assert!(lp_runs.iter().all(|&r| r == 1), "every low-priority block ran exactly once");
    assert!(hp_runs.iter().all(|&r| r == 1), "every urgent block ran exactly once");
    assert_eq!(ended_with(&urgent_events, 411), Some((0, hp_total)));
    assert_eq!(ended_with(&lp_events, 410), Some((0, lp_total)), "the native launch ran every block, retreat or not");
    assert_eq!(
        (native_lp, native_hp),
        (1, 2),
        "the one alone on the GPU and the urgent one beside its native blocks ran natively"
    );
    assert!(t_urgent_end < t_lp_end, "the urgent launch ended first");
    let spread: std::collections::BTreeSet<u32> = hp_sm.iter().copied().collect();
    eprintln!(
        "urgent: ended {:.0} µs after its launch (host), its blocks on {} SMs; low priority ended {:.0} µs after it",
        (t_urgent_end - t_launched) as f64 / 1e3,
        spread.len(),
        (t_lp_end - t_urgent_end) as f64 / 1e3
    );
}

#[test]
fn with_hardware_priority_a_stream_of_dependent_native_kernels_runs_in_order_under_retreats() {
    let Some((_gpu, mut d)) = device_or_skip(test_name!()) else { return };
    d.set_hw_priority(true);
    // Alone on the GPU, every step runs natively (3 waves of 20 µs blocks),
    // queued behind the one before by the launcher thread, its end read
    // from host memory; retreats release SMs at once and never stop a
    // native step, and a launch on fewer SMs runs on every SM all the same.
    let (got, want) = dependent_stream(&mut d, 24, |k| match k % 4 {
        0 => Disturb::None,
        1 => Disturb::Half,
        2 => Disturb::All,
        _ => Disturb::Fewer,
    });
    assert!(got == want, "24 steps: x differs from the host's");
    let (on, native) = d.hw_priority();
    eprintln!("native launches: {native}; {:?}", d.ahead_counts());
    assert!(on && native == 24, "every step ran natively: {native}");
}

/// Deep queue ahead (`client/device/ahead.rs`, "Deep"): a stream of 40
/// short dependent kernels alone on the GPU, all bound before the first is
/// launched, is queued natively behind the first launch, a run of them at
/// most `DEEP_MAX` long; kernels the GPU ran before the engine launched them
/// are seen ended ahead and reported by operation (every block of the whole
/// grid), and their launch commands then end them with every block done.
/// `x` must be the host's.
#[test]
fn with_hardware_priority_a_stream_of_short_native_kernels_is_queued_deep_and_seen_ended_ahead() {
    let Some((_gpu, mut d)) = device_or_skip(test_name!()) else { return };
    d.set_hw_priority(true);
    d.set_report_ends_ahead(true);
    let steps = 40u32;
    let sx = StepX::new(&mut d, 1, hashed);
    let (sms, blocks, n) = (d.info().num_sms, sx.blocks, sx.n);
    let op = |k: u32| 100 + k as u64;
    sx.bind_chain(&mut d, op(0), steps, 0);
    let all = SmSet::range(0, sms);
    d.submit(d.now(), launch(op(0), 1000, BlockRanges::full(blocks as u64), all, blocks as u64)).expect("launch");
    let queued = d.in_flight().len();
    assert!(queued > 2, "kernels were queued behind the first launch: {queued} in flight, {:?}", d.ahead_counts());
    assert!(queued <= 1 + DEEP_MAX, "at most DEEP_MAX queued: {queued} in flight");
    // The GPU runs ahead of the launch commands.
    std::thread::sleep(Duration::from_millis(2));
    let mut reported = Vec::new();
    for k in 0..steps {
        let lid = 1000 + k as u64;
        if k > 0 {
            d.submit(d.now(), launch(op(k), lid, BlockRanges::full(blocks as u64), all, blocks as u64))
                .expect("launch");
        }
        let events = run_until(&mut d, ended(LaunchId(lid))).expect("launch");
        assert_eq!(ended_with(&events, lid), Some((0, blocks as u64)), "step {k} ran every block");
        reported.extend(d.take_ends_ahead());
        d.unbind(OpId(op(k)));
    }
    assert!(!d.busy(), "nothing left on the device once every step ended");
    let want = hashed_stepped(n, steps);
    assert!(sx.read(&mut d, 2) == want, "40 steps queued deep: x differs from the host's");
    let c = d.ahead_counts();
    eprintln!("deep: {c:?}; reported ends ahead: {}", reported.len());
    assert!(c.deep > 0, "kernels were queued behind kernels themselves queued");
    assert!(c.ended_ahead > 0 && !reported.is_empty(), "ends were seen before the launch commands");
    assert!(
        reported.iter().all(|&(o, b)| (op(1)..op(steps)).contains(&o.0) && b == blocks as u64),
        "ends ahead name queued steps, each its whole grid: {reported:?}"
    );
    assert_eq!(d.hw_priority().1, steps as u64, "every step ran natively");
}

/// The daemon's pattern with ends known ahead (gpumuxd's `backend::ends_ahead`):
/// the launch command of a kernel reported ended ahead comes, with its
/// operation's unbind, right after the one before it, with no poll of the
/// device between them (the daemon answered the one before itself). Each
/// adoption must take the stream the run is queued on (a fresh one let
/// later kernels run before earlier ones: wrong output on the H200 at
/// a508b4a), and `x` must be the host's.
#[test]
fn with_hardware_priority_launches_of_kernels_seen_ended_ahead_sent_without_polls_keep_stream_order() {
    let Some((_gpu, mut d)) = device_or_skip(test_name!()) else { return };
    d.set_hw_priority(true);
    d.set_report_ends_ahead(true);
    let steps = 120u32;
    let sx = StepX::new(&mut d, 1, hashed);
    let (sms, blocks, n) = (d.info().num_sms, sx.blocks, sx.n);
    let op = |k: u32| 100 + k as u64;
    sx.bind_chain(&mut d, op(0), steps, 0);
    // The engine gives each small launch of a chain a few SMs, other ones
    // each time: a native kernel runs wherever slots free, and its queued
    // kernel is adopted as it is all the same (at ff1bfb4 these adoptions
    // restarted, and the run was not extended at them).
    let few = |k: u32| SmSet::range(0, (1 + k % 8).min(sms as u32) as u16);
    let whole = || BlockRanges::full(blocks as u64);
    let mut events = Vec::new();
    let mut reported = std::collections::HashSet::new();
    let (mut next, mut answered) = (0u32, 0u32);
    let mut answered_lids = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while next < steps {
        assert!(Instant::now() < deadline, "no progress in 20 s at step {next}: {:?}", d.ahead_counts());
        let now = d.now();
        d.advance(Some(now), &mut events).expect("poll");
        reported.extend(d.take_ends_ahead().map(|(o, _)| o));
        if next > 0 && reported.contains(&OpId(op(next))) {
            // Answered by the daemon: launch commands back to back, no poll between.
            while next < steps && reported.contains(&OpId(op(next))) {
                let lid = 1000 + next as u64;
                d.submit_answered(d.now(), launch(op(next), lid, whole(), few(next), blocks as u64)).expect("launch");
                d.unbind(OpId(op(next)));
                answered_lids.push(LaunchId(lid));
                next += 1;
                answered += 1;
            }
            continue;
        }
        // Not reported: launched once the one before ended, as the engine would.
        let before_ended = next == 0 || ended_with(&events, 1000 + next as u64 - 1).is_some();
        if before_ended {
            let lid = 1000 + next as u64;
            d.submit(d.now(), launch(op(next), lid, whole(), few(next), blocks as u64)).expect("launch");
            events.extend(run_until(&mut d, ended(LaunchId(lid))).expect("launch"));
            d.unbind(OpId(op(next)));
            next += 1;
        }
    }
    let last = LaunchId(1000 + steps as u64 - 1);
    until_ended(&mut d, &mut events, last);
    assert_each_step_ran(&events, 1000, steps, blocks as u64);
    assert!(!d.busy(), "nothing left on the device once every step ended");
    let want = hashed_stepped(n, steps);
    assert!(sx.read(&mut d, 2) == want, "{steps} steps, {answered} launched as answered: x differs from the host's");
    let c = d.ahead_counts();
    eprintln!("answered pattern: {answered} of {steps} launched back to back; {c:?}");
    assert!(answered > 0, "some launch commands came for kernels seen ended ahead");
    let released =
        events.iter().any(|e| matches!(e, Event::SmReleased { launch, .. } if answered_lids.contains(launch)));
    assert!(!released, "a launch answered by the daemon reports its end alone, no SM released");
    assert_eq!(c.restarted, 0, "every adoption took the run's stream as it was, whatever SMs it was given");
    assert_eq!(d.hw_priority().1, steps as u64, "every step ran natively");
}

/// Records back at the end (`client/device/ahead.rs`): a run of kernels
/// queued natively goes on as its kernels end, with no launch command for
/// them, through the device's polls: more kernels run ahead than there are
/// launch records made with the context (each seen ended gives its record
/// back), every step after the first is reported ended ahead, and the launch
/// commands that come afterwards, answered, end each with every block done.
/// `x` must be the host's.
#[test]
fn with_hardware_priority_a_run_queued_natively_goes_on_as_its_kernels_end_without_launch_commands() {
    let Some((_gpu, mut d)) = device_or_skip(test_name!()) else { return };
    d.set_hw_priority(true);
    d.set_report_ends_ahead(true);
    let steps = 80u32;
    let sx = StepX::new(&mut d, 1, hashed);
    let (sms, blocks, n) = (d.info().num_sms, sx.blocks as u64, sx.n);
    let op = |k: u32| 100 + k as u64;
    sx.bind_chain(&mut d, op(0), steps, 0);
    let all = SmSet::range(0, sms);
    let kept = d.launch_records().0.len();
    d.submit(d.now(), launch(op(0), 1000, BlockRanges::full(blocks), all, blocks)).expect("launch");
    let mut events = run_until(&mut d, ended(LaunchId(1000))).expect("the first launch");
    // No launch command from here on: the polls see the run's kernels end and queue more.
    let mut reported = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while reported.len() < steps as usize - 1 {
        assert!(
            Instant::now() < deadline,
            "{} of {} seen ended in 10 s: {:?}",
            reported.len(),
            steps - 1,
            d.ahead_counts()
        );
        let now = d.now();
        d.advance(Some(now), &mut events).expect("poll");
        reported.extend(d.take_ends_ahead().map(|(o, b)| {
            assert_eq!(b, blocks, "{o} reported with its whole grid");
            o
        }));
    }
    assert!(
        reported.len() > kept,
        "more kernels ran ahead ({}) than the launch records made with the context ({kept})",
        reported.len()
    );
    // The daemon's launch commands, answered from those ends: each ends with every block done.
    for k in 1..steps {
        let lid = 1000 + k as u64;
        d.submit_answered(d.now(), launch(op(k), lid, BlockRanges::full(blocks), all, blocks)).expect("launch");
        d.unbind(OpId(op(k)));
    }
    d.unbind(OpId(op(0)));
    let last = LaunchId(1000 + steps as u64 - 1);
    until_ended(&mut d, &mut events, last);
    assert_each_step_ran(&events, 1000, steps, blocks);
    assert!(!d.busy(), "nothing left on the device once every step ended");
    let want = hashed_stepped(n, steps);
    assert!(sx.read(&mut d, 2) == want, "{steps} steps run ahead: x differs from the host's");
    let c = d.ahead_counts();
    eprintln!("run ahead without launch commands: {c:?}; {kept} kept records");
    assert_eq!(c.ended_ahead, steps as u64 - 1, "every step after the first seen ended ahead");
    assert_eq!(d.hw_priority().1, steps as u64, "every step ran natively");
}

/// A run queued natively goes on at looks between polls
/// (`ClientDevice::look_between`, gpumuxd's `GPUMUX_DEEPEN_BETWEEN`): with no
/// poll after the first launch's end, looks alone see the steps end from
/// host memory, give their records back and queue the next, so the run
/// outgrows the records made with the context; a launch command that comes
/// (not answered) for a kernel a look saw ended ends that launch itself and
/// its end is not reported; the rest are reported once each, in stream
/// order, and their answered launch commands end every block. `x` must be
/// the host's.
#[test]
fn with_hardware_priority_a_run_goes_on_at_looks_between_polls_and_reports_each_end_once_in_order() {
    let Some((_gpu, mut d)) = device_or_skip(test_name!()) else { return };
    d.set_hw_priority(true);
    d.set_report_ends_ahead(true);
    let steps = 80u32;
    let sx = StepX::new(&mut d, 1, hashed);
    let (sms, blocks, n) = (d.info().num_sms, sx.blocks as u64, sx.n);
    let op = |k: u32| 100 + k as u64;
    sx.bind_chain(&mut d, op(0), steps, 0);
    let all = SmSet::range(0, sms);
    let kept = d.launch_records().0.len();
    d.submit(d.now(), launch(op(0), 1000, BlockRanges::full(blocks), all, blocks)).expect("launch");
    let mut events = run_until(&mut d, ended(LaunchId(1000))).expect("the first launch");
    // No poll from here on: looks only, as between the daemon's messages
    // (the polls that saw the first launch end may have seen a few steps too).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut queued = 0;
    while d.ahead_counts().ended_ahead < steps as u64 - 1 {
        assert!(Instant::now() < deadline, "10 s of looks: {:?}", d.ahead_counts());
        let looked = d.look_between(4).expect("a look");
        assert!(looked.queued <= 4, "a look queues at most its bound: {looked:?}");
        queued += looked.queued;
    }
    let c = d.ahead_counts();
    assert!(queued > 0 && c.queued_between == queued, "looks queued the run's next kernels: {c:?}");
    assert!(c.ended_between > 0, "looks saw steps end: {c:?}");
    assert!(
        c.ended_ahead as usize > kept,
        "more kernels ran ahead ({}) than the launch records made with the context ({kept})",
        c.ended_ahead
    );
    // A launch command for step 1, not answered (it crossed the ends a look
    // saw): the device ends that launch itself, and step 1 is not reported.
    d.submit(d.now(), launch(op(1), 1001, BlockRanges::full(blocks), all, blocks)).expect("launch");
    let reported: Vec<(OpId, u64)> = d.take_ends_ahead().collect();
    let want: Vec<(OpId, u64)> = (2..steps).map(|k| (OpId(op(k)), blocks)).collect();
    assert_eq!(reported, want, "the ends the looks saw, once each, in stream order, step 1's dropped");
    d.unbind(OpId(op(1)));
    for k in 2..steps {
        let lid = 1000 + k as u64;
        d.submit_answered(d.now(), launch(op(k), lid, BlockRanges::full(blocks), all, blocks)).expect("launch");
        d.unbind(OpId(op(k)));
    }
    d.unbind(OpId(op(0)));
    until_ended(&mut d, &mut events, LaunchId(1000 + steps as u64 - 1));
    assert_each_step_ran(&events, 1000, steps, blocks);
    assert!(!d.busy(), "nothing left on the device once every step ended");
    let want = hashed_stepped(n, steps);
    assert!(sx.read(&mut d, 2) == want, "{steps} steps run ahead at looks: x differs from the host's");
    eprintln!("run ahead at looks between polls: {:?}; {kept} kept records", d.ahead_counts());
    assert_eq!(d.hw_priority().1, steps as u64, "every step ran natively");
}

/// The daemon's `GPUMUX_RETIRE_ANSWERED=1`: each kernel of a run queued
/// natively that was reported ended ahead is retired (its answered launch
/// and its unbind at once, `ClientDevice::retire_answered`) as the reports
/// come, while the run behind it is still queued: the run goes on on the
/// same stream, no launch is made for a retired kernel and no event comes
/// for it, and every step runs once, in order (`x` is the host's).
#[test]
fn with_hardware_priority_kernels_seen_ended_ahead_are_retired_with_no_launch_and_the_run_goes_on_in_order() {
    let Some((_gpu, mut d)) = device_or_skip(test_name!()) else { return };
    d.set_hw_priority(true);
    d.set_report_ends_ahead(true);
    let steps = 80u32;
    let sx = StepX::new(&mut d, 1, hashed);
    let (sms, blocks, n) = (d.info().num_sms, sx.blocks as u64, sx.n);
    let op = |k: u32| 100 + k as u64;
    sx.bind_chain(&mut d, op(0), steps, 0);
    let all = SmSet::range(0, sms);
    d.submit(d.now(), launch(op(0), 1000, BlockRanges::full(blocks), all, blocks)).expect("launch");
    let mut events = run_until(&mut d, ended(LaunchId(1000))).expect("the first launch");
    d.unbind(OpId(op(0)));
    // Each end reported is retired at once, in the order reported, as the
    // daemon's core would: the run behind it is still queued.
    let mut retired = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while retired.len() < steps as usize - 1 {
        assert!(
            Instant::now() < deadline,
            "{} of {} retired in 10 s: {:?}",
            retired.len(),
            steps - 1,
            d.ahead_counts()
        );
        let now = d.now();
        d.advance(Some(now), &mut events).expect("poll");
        let reported: Vec<(OpId, u64)> = d.take_ends_ahead().collect();
        for (o, b) in reported {
            assert_eq!(b, blocks, "{o} reported with its whole grid");
            let lid = LaunchId(1000 + o.0 - op(0));
            d.retire_answered(lid, o).expect("retired");
            retired.push(o.0);
        }
    }
    assert_eq!(retired, (1..steps).map(op).collect::<Vec<_>>(), "each step reported once, in stream order");
    let deadline = Instant::now() + Duration::from_secs(10);
    while d.busy() {
        assert!(Instant::now() < deadline, "the device still busy 10 s after the last retire");
        let now = d.now();
        d.advance(Some(now), &mut events).expect("poll");
    }
    let others: Vec<&Event> = events
        .iter()
        .filter(|e| {
            !matches!(
                e,
                Event::SmReleased { launch: LaunchId(1000), .. } | Event::LaunchEnded { launch: LaunchId(1000), .. }
            )
        })
        .collect();
    assert!(others.is_empty(), "no event for a retired kernel: {others:?}");
    let want = hashed_stepped(n, steps);
    assert!(sx.read(&mut d, 2) == want, "{steps} steps run ahead and retired: x differs from the host's");
    let c = d.ahead_counts();
    eprintln!("retired as seen ended ahead: {c:?}");
    assert_eq!(c.retired, steps as u64 - 1, "every step after the first retired");
    assert_eq!(c.adopted, 0, "no launch adopted a retired kernel");
    assert_eq!(d.hw_priority().1, steps as u64, "every step ran natively");
}

#[test]
fn with_hardware_priority_a_short_launch_beside_another_prioritys_workers_stays_workers_and_alone_runs_natively() {
    let Some((_gpu, mut d)) = device_or_skip(test_name!()) else { return };
    let d = &mut d;
    d.set_hw_priority(true);
    // The low-priority kernel has no native build: it runs as workers.
    let lp_kernel = Stamps::kernel(d);
    let mut compiled = module::compile("stamp", STAMP, &[], d.arch()).expect("compile");
    module::add_native(&mut compiled, "stamp", STAMP, &[], d.arch()).expect("native build");
    let hp_kernel = d.load_module("stamp", &compiled).expect("load").0[0].0;
    let sms = d.info().num_sms;
    let (lp_total, hp_total) = (sms as u64 * 8 * 4, 132u64);
    let (lp, hp, alone) = (Stamps::new(d, lp_total, 501), Stamps::new(d, hp_total, 502), Stamps::new(d, hp_total, 503));
    // SAFETY: kernels bind no host memory.
    unsafe { d.bind(OpId(510), lp.work_of(lp_kernel, 100_000, 224)) }.expect("bind");
    unsafe { d.bind(OpId(511), hp.work(hp_kernel, 15_000)) }.expect("bind");
    unsafe { d.bind(OpId(512), alone.work(hp_kernel, 15_000)) }.expect("bind");
    let (all, taken) = (SmSet::range(0, sms), SmSet::range(sms - 17, sms));
    d.submit(d.now(), launch(510, 510, BlockRanges::full(lp_total), all, lp_total)).expect("launch");
    std::thread::sleep(Duration::from_micros(300));
    // The engine takes 17 SMs for the urgent launch; the workers there leave.
    d.submit(d.now(), Command::Retreat { launch: LaunchId(510), sms: taken, mechanism: Mechanism::Drain })
        .expect("retreat");
    d.submit(d.now(), urgent_launch(511, 511, BlockRanges::full(hp_total), taken, hp_total)).expect("urgent launch");
    assert_eq!(d.hw_priority(), (true, 0), "a short urgent launch beside low-priority workers runs as workers");
    // Both ends, in whichever order they come: the low-priority launch's 400 µs
    // of blocks may end in the same poll as the urgent launch, or before it
    // (waiting for one end after the other, the test waited for an end it had
    // been given already, 2-3 times in 10 in a fresh process: run 194).
    let events = run_until(d, |ev| ended(LaunchId(511))(ev) && ended(LaunchId(510))(ev)).expect("both launches");
    let lp_left = remaining_of(&events, LaunchId(510));
    // The low-priority launch's workers left the taken SMs with blocks left: relaunched on the rest.
    if !lp_left.is_empty() {
        d.submit(d.now(), launch(510, 513, lp_left, all.difference(&taken), lp_total)).expect("relaunch");
        assert!(run_to_end(d, LaunchId(513)).is_empty(), "the relaunch ran the rest");
    }
    assert_eq!(d.hw_priority(), (true, 0), "nothing ran natively beside workers");
    // Alone on the GPU now, the same short kernel runs natively, its end read from host memory.
    d.submit(d.now(), urgent_launch(512, 514, BlockRanges::full(hp_total), taken, hp_total)).expect("alone");
    let events = run_until(d, ended(LaunchId(514))).expect("alone");
    assert_eq!(d.hw_priority(), (true, 1), "a short launch alone on the GPU runs natively");
    assert_eq!(ended_with(&events, 514), Some((0, hp_total)), "the native launch ran every block");
    for op in 510..=512 {
        d.unbind(OpId(op));
    }
    let Stamped { runs: lp_runs, .. } = lp.read_and_free(d, 520);
    let Stamped { runs: hp_runs, sm_of: hp_sm, .. } = hp.read_and_free(d, 530);
    let Stamped { runs: alone_runs, sm_of: alone_sm, .. } = alone.read_and_free(d, 540);
    assert!(lp_runs.iter().all(|&r| r == 1), "every low-priority block ran exactly once");
    assert!(hp_runs.iter().all(|&r| r == 1), "every urgent block ran exactly once");
    assert!(alone_runs.iter().all(|&r| r == 1), "every block of the lone launch ran exactly once");
    assert!(hp_sm.iter().all(|&s| s >= (sms - 17) as u32), "urgent workers ran only on the SMs taken: {hp_sm:?}");
    let spread: std::collections::BTreeSet<u32> = alone_sm.iter().copied().collect();
    assert!(spread.len() > 17, "the native launch ran beyond the 17 SMs it was given: {} SMs", spread.len());
}

/// One step of a stream whose kernels depend on each other: each block
/// spins `spin_ns`, then each thread does `x = 3x + k`. Steps in another
/// order, overlapping, run twice or skipped give another `x`.
const STEP: &str = r#"
extern "C" __global__ void step(unsigned int* x, unsigned int k, unsigned long long spin_ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < spin_ns);
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    x[i] = x[i] * 3u + k;
}
"#;

/// What the engine would do to a launch of the dependent stream (the test's stand-in for a policy).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Disturb {
    /// Nothing: it runs on every SM.
    None,
    /// Half its SMs taken away right after its launch (a per-SM retreat).
    Half,
    /// Every SM taken away right after its launch; the rest relaunched.
    All,
    /// Launched on the first half of the SMs only.
    Fewer,
}

/// `STEP` loaded and its `x` (one word per thread of 3 waves of 256-thread
/// blocks on every SM) in device memory, with a pinned host copy.
struct StepX {
    kernel: KernelHandle,
    blocks: u32,
    n: usize,
    x: u64,
    host: Pinned,
}

impl StepX {
    /// Loads `STEP` and sets `x[i]` to `start(i)` (copy operation `op`).
    fn new(d: &mut ClientDevice, op: u64, start: impl Fn(u32) -> u32) -> StepX {
        let mut compiled = module::compile("step", STEP, &[], d.arch()).expect("compile");
        if d.hw_priority().0 {
            module::add_native(&mut compiled, "step", STEP, &[], d.arch()).expect("native build");
        }
        let kernel = d.load_module("step", &compiled).expect("load").0[0].0;
        let blocks = d.info().num_sms as u32 * 8 * 3;
        let n = blocks as usize * 256;
        let mut host = Pinned::new(d, (0..n as u32).flat_map(|i| start(i).to_le_bytes()).collect());
        let x = d.alloc(n as u64 * 4).expect("alloc");
        copy(d, op, ClientWork::ToDevice { dst: x, src: host.ptr(), bytes: n as u64 * 4 });
        StepX { kernel, blocks, n, x, host }
    }

    /// A launch of `STEP` over `x` adding `k`, each block spinning `spin_ns` first.
    fn work(&self, k: u32, spin_ns: u64) -> ClientWork {
        let params = vec![self.x.to_le_bytes().to_vec(), k.to_le_bytes().to_vec(), spin_ns.to_le_bytes().to_vec()];
        ClientWork::Kernel {
            kernel: self.kernel,
            grid: [self.blocks, 1, 1],
            block: [256, 1, 1],
            shared_bytes: 0,
            params,
        }
    }

    /// Binds `steps` launches of `STEP` as one stream: operations
    /// `first_op`, `first_op + 1`, .., each following the one before, launch
    /// `k` adding `k + 1` (so `x` ends [`stepped`] `steps` times), its blocks
    /// spinning `spin_ns` first.
    fn bind_chain(&self, d: &mut ClientDevice, first_op: u64, steps: u32, spin_ns: u64) {
        for k in 0..steps {
            let after = k.checked_sub(1).map(|p| OpId(first_op + u64::from(p)));
            // SAFETY: a kernel binds no host memory.
            unsafe { d.bind_after(OpId(first_op + u64::from(k)), self.work(k + 1, spin_ns), after) }.expect("bind");
        }
    }

    /// `x` read back (copy operation `op`); its memory is released.
    fn read(mut self, d: &mut ClientDevice, op: u64) -> Vec<u32> {
        copy(d, op, ClientWork::ToHost { src: self.x, dst: self.host.ptr(), bytes: self.n as u64 * 4 });
        d.unregister_host(self.host.ptr().0);
        d.free(self.x).expect("free");
        self.host.0.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect()
    }
}

/// Where `x` starts in the tests that check it against the host: a hash of the index.
fn hashed(i: u32) -> u32 {
    i.wrapping_mul(2654435761)
}

/// `x` after `steps` launches of `STEP` adding 1, 2, .. `steps` in order, from `start`.
fn stepped(start: u32, steps: u32) -> u32 {
    (1..=steps).fold(start, |v, k| v.wrapping_mul(3).wrapping_add(k))
}

/// `x` of `n` words [`hashed`] at the start, after `steps` launches of `STEP` in order.
fn hashed_stepped(n: usize, steps: u32) -> Vec<u32> {
    (0..n as u32).map(|i| stepped(hashed(i), steps)).collect()
}

/// Runs `steps` dependent kernels (`STEP`, 3 waves of 20 µs blocks) as one
/// stream, each bound as following the one before, each launched when the
/// one before ended as a policy would, disturbed as `disturb` says; returns
/// `x` and the queue-ahead counts.
fn dependent_stream(d: &mut ClientDevice, steps: u32, disturb: impl Fn(u32) -> Disturb) -> (Vec<u32>, Vec<u32>) {
    let sx = StepX::new(d, 1, hashed);
    let (sms, blocks, n) = (d.info().num_sms, sx.blocks, sx.n);
    let op = |k: u32| 100 + k as u64;
    sx.bind_chain(d, op(0), steps, 20_000);
    let (all, first_half) = (SmSet::range(0, sms), SmSet::range(0, sms / 2));
    let mut next_launch = 1000;
    for k in 0..steps {
        let mut left = BlockRanges::full(blocks as u64);
        let how = disturb(k);
        while !left.is_empty() {
            let lid = next_launch;
            next_launch += 1;
            let on = if how == Disturb::Fewer { first_half } else { all };
            d.submit(d.now(), launch(op(k), lid, left.clone(), on, blocks as u64)).expect("launch");
            let take = match how {
                Disturb::Half => Some(SmSet::range(sms / 2, sms)),
                Disturb::All if left.len() == blocks as u64 => Some(all),
                _ => None,
            };
            if let Some(sms) = take {
                let retreat = Command::Retreat { launch: LaunchId(lid), sms, mechanism: Mechanism::Drain };
                d.submit(d.now(), retreat).expect("retreat");
            }
            left = run_to_end(d, LaunchId(lid));
        }
        d.unbind(OpId(op(k)));
    }
    assert!(!d.busy(), "nothing left on the device once every step ended");
    let want = hashed_stepped(n, steps);
    (sx.read(d, 2), want)
}

/// 24 dependent kernels queued ahead, undisturbed (every step after the
/// first takes its queued workers as they are) and then under per-SM
/// retreats, whole retreats and relaunches and launches on fewer SMs than
/// the queued workers run on (every kind cancels or moves them): `x` must be
/// the host's both times. On a device that has queued nothing yet.
fn queued_stream_in_order(d: &mut ClientDevice) {
    let (got, want) = dependent_stream(d, 24, |_| Disturb::None);
    assert!(got == want, "24 undisturbed steps: x differs from the host's");
    let c = d.ahead_counts();
    eprintln!("undisturbed: {c:?}");
    assert_eq!((c.queued, c.adopted, c.restarted, c.cancelled), (23, 23, 0, 0), "every step after the first queued");

    let (got, want) = dependent_stream(d, 24, |k| match k % 4 {
        0 => Disturb::None,
        1 => Disturb::Half,
        2 => Disturb::All,
        _ => Disturb::Fewer,
    });
    assert!(got == want, "24 disturbed steps: x differs from the host's");
    let c2 = d.ahead_counts();
    eprintln!("disturbed: {c2:?}");
    assert!(c2.cancelled > c.cancelled, "retreats cancelled queued workers");
    assert!(c2.restarted > c.restarted, "launches restarted queued workers elsewhere");
    assert!(c2.adopted > c.adopted, "undisturbed steps still took their queued workers");
}

#[test]
fn a_stream_of_dependent_kernels_queued_ahead_runs_in_order_under_retreats() {
    let Some((_gpu, mut d)) = device_or_skip(test_name!()) else { return };
    d.set_queue_ahead(true);
    assert!(d.launch_thread(), "queued workers are launched by the launcher thread by default");
    queued_stream_in_order(&mut d);

    // A kernel dropped while queued (its client died): it never runs.
    let (got, want) = {
        let sx = StepX::new(&mut d, 3, |_| 0);
        let (sms, blocks, n) = (d.info().num_sms, sx.blocks, sx.n);
        for (k, after) in [(1u32, None), (2, Some(OpId(501)))] {
            // SAFETY: a kernel binds no host memory.
            unsafe { d.bind_after(OpId(500 + k as u64), sx.work(k, 20_000), after) }.expect("bind");
        }
        let all = SmSet::range(0, sms);
        d.submit(d.now(), launch(501, 2000, BlockRanges::full(blocks as u64), all, blocks as u64)).expect("launch");
        d.unbind(OpId(502));
        run_until(&mut d, ended(LaunchId(2000))).expect("launch");
        d.unbind(OpId(501));
        let deadline = Instant::now() + Duration::from_secs(10);
        while d.busy() {
            assert!(Instant::now() < deadline, "the dropped kernel's queued workers were never reaped");
            d.advance(Some(d.now()), &mut Vec::new()).expect("poll");
        }
        (sx.read(&mut d, 4), vec![1u32; n])
    };
    assert!(got == want, "the dropped kernel ran (or the first did not run once)");
    eprintln!("after a dropped kernel: {:?}", d.ahead_counts());
}

/// The same stream with the queued workers launched in the command that
/// queues them (`set_launch_thread(false)`), as before the launcher thread
/// and as when it would not start: in order, undisturbed and under retreats.
#[test]
fn a_stream_queued_ahead_without_the_launcher_thread_runs_in_order_under_retreats() {
    let Some((_gpu, mut d)) = device_or_skip(test_name!()) else { return };
    d.set_queue_ahead(true);
    d.set_launch_thread(false);
    assert!(!d.launch_thread());
    queued_stream_in_order(&mut d);
}

/// A launch that lost half its SMs to a per-SM retreat and gets them back
/// is refilled: its workers are cut where they are and fresh ones start over
/// every SM at once. Every block runs exactly once (x is the host's), with
/// and without refills, and with a retreat of the whole launch while its cut
/// is on the way.
#[test]
fn a_launch_given_back_the_sms_it_left_is_refilled_and_runs_each_block_once() {
    let Some((_gpu, mut d)) = device_or_skip(test_name!()) else { return };
    // 3 waves of 200 µs blocks: a launch of about 600 µs.
    let sx = StepX::new(&mut d, 1, hashed);
    let (sms, blocks, n) = (d.info().num_sms, sx.blocks, sx.n);
    let (all, half) = (SmSet::range(0, sms), SmSet::range(sms / 2, sms));
    let mut next_launch = 4000;
    // (refill on, and a whole retreat right after the grow), per step.
    let steps = [(true, false), (false, false), (true, false), (false, false), (true, true), (true, false)];
    for (k, &(refill, retreat_after)) in steps.iter().enumerate() {
        d.set_refill(if refill { Refill::Drained } else { Refill::Off });
        let began = Instant::now();
        let op = 700 + k as u64;
        // SAFETY: a kernel binds no host memory.
        unsafe { d.bind(OpId(op), sx.work(k as u32 + 1, 200_000)) }.expect("bind");
        let mut left = BlockRanges::full(blocks as u64);
        let mut first = true;
        while !left.is_empty() {
            let lid = next_launch;
            next_launch += 1;
            d.submit(d.now(), launch(op, lid, left.clone(), all, blocks as u64)).expect("launch");
            if first {
                first = false;
                let retreat = Command::Retreat { launch: LaunchId(lid), sms: half, mechanism: Mechanism::Drain };
                d.submit(d.now(), retreat).expect("retreat half");
                // Let the workers there leave (a block is 200 µs), then give the SMs back.
                let until = Instant::now() + Duration::from_micros(300);
                while Instant::now() < until {
                    d.advance(Some(d.now()), &mut Vec::new()).expect("poll");
                }
                d.submit(d.now(), Command::Grow { launch: LaunchId(lid), sms: half }).expect("grow back");
                if retreat_after {
                    let all_back = Command::Retreat { launch: LaunchId(lid), sms: all, mechanism: Mechanism::Drain };
                    d.submit(d.now(), all_back).expect("retreat all");
                }
            }
            left = run_to_end(&mut d, LaunchId(lid));
        }
        // What a refill buys: the step's time with half its SMs back after 300 µs
        // (without a refill the launch drains and restarts; alone it takes ~600 µs).
        eprintln!(
            "step {k}: refill {refill}, retreat after the grow {retreat_after}: {:.0} µs",
            began.elapsed().as_secs_f64() * 1e6
        );
        d.unbind(OpId(op));
    }
    let (asked, started) = d.refills();
    eprintln!("refills: {asked} cut, {started} started fresh workers");
    assert!(asked >= 4, "each step with refills on and SMs given back was cut ({asked})");
    assert!(started >= 2, "cuts of launches with blocks left started fresh workers ({started})");
    assert!(!d.busy(), "nothing left on the device");
    let got = sx.read(&mut d, 2);
    let want = hashed_stepped(n, steps.len() as u32);
    assert!(got == want, "x differs from the host's: a block ran twice or not at all");
}

/// A client that leaves has its kernels unloaded by the daemon while their
/// last launch may still run and the next wait queued on the GPU: the bound
/// work runs out whole, and the module goes once nothing holds it.
/// The launch records made with the context serve client after client: a
/// client's launch takes one of them instead of making one (0.8-2.1 ms on
/// the H100), and when its kernel is unloaded the record is idle again and
/// holds none of its module, which goes.
/// Issue 36's huge grid beside a well-behaved client, on a co-locating
/// device as the daemon opens it: a long grid of 1024-thread blocks (two
/// per SM) is given every SM but the last two while a one-block peer runs
/// (so co-location would spread it), and the engine starts a one-block
/// launch of 32 threads on one of the two SMs it kept. The grid's share of
/// each SM rounds to the whole SM, so it runs on its own SMs: the small
/// launch finds its slot at once, long before the grid ends, with no
/// restart, and no block of the grid runs on the kept SMs. Before the fix
/// the grid took both slots of every SM, the kept ones included, and the
/// small launch waited for the grid's end.
#[test]
fn a_one_block_launch_on_sms_the_engine_kept_starts_at_once_beside_a_long_grid() {
    let Some((_gpu, mut d)) = device_or_skip_with(test_name!(), ClientDevice::open_co_located) else { return };
    let d = &mut d;
    // Always co-located (the daemon's chooser starts a pair co-located too).
    d.set_choose_placement(false);
    let h = Stamps::kernel(d);
    let sms = d.info().num_sms;
    let (grid_sms, kept) = (SmSet::range(0, sms - 2), SmSet::range(sms - 2, sms));
    // The grid: 300 waves of 1 ms blocks on its SMs, about 300 ms.
    let grid_total = (sms as u64 - 2) * 2 * 300;
    let (grid, peer, small) = (Stamps::new(d, grid_total, 501), Stamps::new(d, 1, 502), Stamps::new(d, 1, 503));
    // SAFETY: kernels bind no host memory.
    unsafe { d.bind(OpId(510), grid.work_of(h, 1_000_000, 1024)) }.expect("bind grid");
    unsafe { d.bind(OpId(511), peer.work_of(h, 3_000_000, 32)) }.expect("bind peer");
    unsafe { d.bind(OpId(512), small.work_of(h, 10_000, 32)) }.expect("bind small");
    // The peer first, on a kept SM, so that the grid has a peer when it is placed.
    d.submit(d.now(), launch(511, 511, BlockRanges::full(1), SmSet::range(sms - 1, sms), 1)).expect("peer");
    d.submit(d.now(), launch(510, 510, BlockRanges::full(grid_total), grid_sms, grid_total)).expect("grid");
    let mut events = run_until(d, ended(LaunchId(511))).expect("peer");
    let unplaced = d.ahead_counts().unplaced;
    let t = Instant::now();
    d.submit(d.now(), launch(512, 512, BlockRanges::full(1), SmSet::range(sms - 1, sms), 1)).expect("small");
    events.extend(run_until(d, ended(LaunchId(512))).expect("small"));
    let took = t.elapsed();
    let grid_ended_first = ended(LaunchId(510))(&events);
    let restarts = d.ahead_counts().unplaced - unplaced;
    events.extend(run_until(d, ended(LaunchId(510))).expect("grid"));
    eprintln!("the small launch beside the grid: ended {:.0} µs after its launch", took.as_secs_f64() * 1e6);
    for op in [510, 511, 512] {
        d.unbind(OpId(op));
    }
    let grid_out = grid.read_and_free(d, 520);
    let peer_out = peer.read_and_free(d, 530);
    let small_out = small.read_and_free(d, 540);
    assert!(grid_out.runs.iter().all(|&r| r == 1), "every block of the grid ran exactly once");
    assert_eq!((peer_out.runs[0], small_out.runs[0]), (1, 1), "the peer's block and the small one's ran once");
    assert!(!grid_ended_first, "the small launch waited for the grid's end ({took:?}): {events:?}");
    assert!(took < Duration::from_millis(100), "the small launch took {took:?} beside the grid (which runs ~300 ms)");
    assert_eq!(restarts, 0, "the small launch started again: no worker found room");
    let on_kept = grid_out.sm_of.iter().filter(|&&s| kept.contains(gpumux_engine::ids::SmId(s as u16))).count();
    assert_eq!(on_kept, 0, "{on_kept} blocks of the grid ran on the SMs the engine kept for the small launch");
    eprintln!("the small launch's block ran on SM {} (kept: {} and {})", small_out.sm_of[0], sms - 2, sms - 1);
}

#[test]
fn launch_records_made_with_the_context_serve_every_client_and_outlive_them() {
    let Some((_gpu, mut d)) = device_or_skip(test_name!()) else { return };
    let sorted = |mut v: Vec<u64>| {
        v.sort_unstable();
        v
    };
    let (kept, idle) = d.launch_records();
    assert!(!kept.is_empty(), "records are made with the context");
    assert_eq!(sorted(idle), sorted(kept.clone()), "all of them idle at first");
    let modules = gpumux_cuda::runtime::loaded_modules();
    for round in 0..2u64 {
        let sx = StepX::new(&mut d, 700 + 10 * round, hashed);
        let (sms, blocks, n, h) = (d.info().num_sms, sx.blocks as u64, sx.n, sx.kernel);
        let op = 701 + 10 * round;
        // SAFETY: a kernel binds no host memory.
        unsafe { d.bind_after(OpId(op), sx.work(1, 0), None) }.expect("bind");
        let lid = 4000 + round;
        d.submit(d.now(), launch(op, lid, BlockRanges::full(blocks), SmSet::range(0, sms), blocks)).expect("launch");
        let (_, idle) = d.launch_records();
        assert!(idle.len() < kept.len(), "round {round}: the launch took a kept record");
        run_to_end(&mut d, LaunchId(lid));
        d.unbind(OpId(op));
        let got = sx.read(&mut d, op + 1);
        assert!(got == hashed_stepped(n, 1), "round {round}: x");
        d.unload_kernel(h);
        let (_, idle) = d.launch_records();
        assert_eq!(sorted(idle), sorted(kept.clone()), "round {round}: the kept records idle again, no other made");
        assert_eq!(gpumux_cuda::runtime::loaded_modules(), modules, "round {round}: the client's module went");
    }
}

#[test]
fn an_unloaded_kernel_runs_out_its_bound_work_and_its_module_goes_with_the_last_of_it() {
    let Some((_gpu, mut d)) = device_or_skip(test_name!()) else { return };
    d.set_queue_ahead(true);
    let before = (gpumux_cuda::runtime::loaded_modules(), d.kernels_loaded());
    let sx = StepX::new(&mut d, 1, |_| 0);
    assert_eq!(gpumux_cuda::runtime::loaded_modules(), before.0 + 1);
    let (sms, blocks, h) = (d.info().num_sms, sx.blocks, sx.kernel);
    for (k, after) in [(1u32, None), (2, Some(OpId(601)))] {
        // SAFETY: a kernel binds no host memory.
        unsafe { d.bind_after(OpId(600 + k as u64), sx.work(k, 20_000), after) }.expect("bind");
    }
    let all = SmSet::range(0, sms);
    d.submit(d.now(), launch(601, 3000, BlockRanges::full(blocks as u64), all, blocks as u64)).expect("launch");
    // The first kernel runs, the second waits behind it on the GPU: unload now.
    d.unload_kernel(h);
    assert_eq!(d.kernels_loaded(), before.1, "the handle is gone");
    assert_eq!(gpumux_cuda::runtime::loaded_modules(), before.0 + 1, "its bound work keeps the module");
    run_until(&mut d, ended(LaunchId(3000))).expect("the first kernel");
    d.unbind(OpId(601));
    d.submit(d.now(), launch(602, 3001, BlockRanges::full(blocks as u64), all, blocks as u64)).expect("launch");
    run_until(&mut d, ended(LaunchId(3001))).expect("the second kernel");
    d.unbind(OpId(602));
    assert!(!d.busy(), "nothing left on the device");
    let got = sx.read(&mut d, 2);
    // x = (0 * 3 + 1) * 3 + 2 for every element: both kernels ran, once each, in order.
    assert!(got.iter().all(|&v| v == 5), "x differs from (0 * 3 + 1) * 3 + 2");
    assert_eq!(gpumux_cuda::runtime::loaded_modules(), before.0, "the module went with the last of its work");
    eprintln!("unloaded while running: {:?}", d.ahead_counts());
}

#[test]
fn z_a_faulting_kernel_loses_the_context_last_as_it_poisons_the_process() {
    let Some((_gpu, mut d)) = device_or_skip(test_name!()) else { return };
    let compiled = module::compile("fault", &example("fault"), &[], d.arch()).expect("compile");
    let (kernels, _) = d.load_module("fault", &compiled).expect("load");
    let h: KernelHandle = kernels[0].0;
    let p = d.alloc(4).expect("alloc");
    let work = ClientWork::Kernel {
        kernel: h,
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_bytes: 0,
        params: vec![p.to_le_bytes().to_vec()],
    };
    // SAFETY: a kernel binds no host memory.
    unsafe { d.bind(OpId(7), work) }.expect("bind");
    let all = SmSet::range(0, d.info().num_sms);
    let err = match d.submit(d.now(), launch(7, 1, BlockRanges::full(1), all, 1)) {
        Err(e) => e,
        Ok(()) => run_until(&mut d, ended(LaunchId(1))).expect_err("the fault is seen"),
    };
    let lost = ContextLost::find(&err).unwrap_or_else(|| panic!("not a lost context: {err:?}"));
    eprintln!("{lost}");
    assert_eq!(d.in_flight(), vec![OpId(7)], "the faulting launch is the suspect");
    // On an H100 with driver 580 the driver keeps the fault for the whole
    // process: a new context fails too, and the rebuild says the process
    // must restart (docs/daemon-cuda.md). Where a rebuild succeeds, the new
    // context must work and hold nothing of the old.
    match d.rebuild() {
        Err(e) => assert!(e.to_string().contains("must be restarted"), "{e}"),
        Ok(()) => {
            assert_eq!(d.allocated(), 0, "allocations are lost with the context");
            assert!(d.free(p).is_err(), "an allocation of the old context is not one of the new");
            let params = vec![vec![0; 8]];
            let stale = ClientWork::Kernel { kernel: h, grid: [1, 1, 1], block: [32, 1, 1], shared_bytes: 0, params };
            // SAFETY: a kernel binds no host memory.
            assert!(unsafe { d.bind(OpId(8), stale) }.is_err(), "kernels are lost with the context");
            round_trip(&mut d, 20);
        }
    }
}
