//! One launch split over two simulated GPUs by the daemon (`sim:h100x2`;
//! docs/split.md, "Splitting in the daemon"), through the Rust client
//! library: the part runs on GPU 1 (its session shows there while it
//! runs), the stream's next operations wait for the merge, the bytes come
//! back as they went (the simulator computes nothing; the merge of bytes a
//! kernel changed is tested in `core/split.rs` with bytes set through the
//! device), a kernel with global atomics is refused naming them, a client
//! gone mid-split leaves nothing on either GPU, and a daemon of one GPU runs
//! the launch whole. The split's wall time against the whole launch's, on
//! the simulator's wall-clock kernels: below.

mod common;

use common::Daemon;
use gpumux_client::{Arg, Client, ConnectOptions, LaunchConfig, Split, SplitMerge, Splittable, Status, StreamId};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const SCALE: &str = "__global__ void scale(float* x, unsigned n) {\n  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) x[i] *= 2.0f;\n}\n";
const HIST: &str = "__global__ void hist(const unsigned* v, unsigned* h, unsigned n) {\n  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) atomicAdd(&h[v[i] % 64], 1u);\n}\n";
const TWO: &str = "sim:h100x2";
/// Blocks of 1024 threads (two a simulated SM holds): 1056 blocks are four
/// waves of 264 on one H100, two on each of two.
const BLOCKS: u32 = 1056;
const THREADS: u32 = 1024;

fn connect(d: &Daemon, name: &str) -> Client {
    connect_on(d, name, None)
}

/// Connects pinned to `gpu` (`None`: placed by the daemon).
fn connect_on(d: &Daemon, name: &str, gpu: Option<u32>) -> Client {
    let socket = Some(PathBuf::from(&d.socket));
    Client::connect(ConnectOptions { socket, shm_bytes: 8 << 20, gpu, ..ConnectOptions::named(name) })
        .expect("connects")
}

fn config(block_time: Duration) -> LaunchConfig {
    let mut c = LaunchConfig::new([BLOCKS, 1, 1], [THREADS, 1, 1]);
    c.block_time_ns = Some(block_time.as_nanos() as u64);
    c
}

fn checked() -> Split {
    Split { splittable: Splittable::IfChecked, gpus: 0, merges: Vec::new() }
}

fn data() -> Vec<u8> {
    (0..(BLOCKS * THREADS * 4)).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect()
}

/// Waits until `f` holds for the daemon's status, seen by `c`.
fn until(c: &Client, what: &str, f: impl Fn(&Status) -> bool) -> Status {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = c.status().expect("status");
        if f(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "{what}: {s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn on_gpu(s: &Status, gpu: u32) -> Vec<String> {
    s.clients.iter().filter(|c| c.gpu == gpu).map(|c| c.name.clone()).collect()
}

#[test]
fn a_split_launch_runs_part_on_each_gpu_and_the_stream_waits_for_its_merge() {
    part_on_each_gpu(&[]);
}

/// The same with each GPU's device in a child process (a CUDA device's
/// default): the part's range and bytes cross the device link.
#[test]
fn a_split_launch_through_device_processes_runs_part_on_each_gpu() {
    part_on_each_gpu(&["--device-process"]);
}

fn part_on_each_gpu(args: &[&str]) {
    let d = Daemon::start_on(Some(TWO), None, args);
    let c = connect_on(&d, "splitter", Some(0));
    assert_eq!(c.gpu(), 0);
    let data = data();
    let (x, y) = (c.alloc(data.len() as u64).expect("alloc"), c.alloc(data.len() as u64).expect("alloc"));
    c.copy_to_device(&x, 0, &data, StreamId::DEFAULT).expect("up");
    let module = c.load_module("scale.cu", SCALE, &[]).expect("loads");
    let scale = module.kernel("scale").expect("scale");
    let args = [Arg::buffer(&x), Arg::from(BLOCKS * THREADS)];
    for split in [
        checked(),
        // Each block writes its 1024 floats: declared, they come back as they are.
        Split {
            merges: vec![(0, SplitMerge::Slices { granule_blocks: 1, bytes_per_granule: 4096, offset: 0 })],
            ..checked()
        },
    ] {
        c.launch_split(&scale, &config(Duration::from_millis(100)), &args, &split).expect("accepted");
        // Behind it on the stream: a device copy of what it left.
        c.copy_device(&x, 0, &y, 0, data.len() as u64, StreamId::DEFAULT).expect("queued");
        // GPU 1 runs its part as a session of its own while the launch runs.
        let s = until(&c, "GPU 1 runs a part", |s| !on_gpu(s, 1).is_empty());
        let part = on_gpu(&s, 1);
        assert!(part.len() == 1 && part[0].ends_with("(split from GPU 0)"), "{part:?}");
        assert!(s.gpus[1].memory_used >= data.len() as u64, "the buffer is replicated on GPU 1: {s:?}");
        c.sync(StreamId::DEFAULT).expect("the split launch and the copy behind it end");
        let mut back = vec![0u8; data.len()];
        c.copy_to_host(&y, 0, &mut back, StreamId::DEFAULT).expect("down");
        assert!(back == data, "the copy behind the split saw other bytes than the merge's ({split:?})");
        let s = until(&c, "GPU 1 gives the part back", |s| on_gpu(s, 1).is_empty() && s.gpus[1].memory_used == 0);
        assert_eq!(on_gpu(&s, 0), ["splitter"]);
    }
    // A kernel that only writes its output, with declared slices: only GPU
    // 1's slices go there and come back (through the split's region, across
    // the device processes' links where there are some); the simulator
    // computes nothing, so the bytes must be the ones there before.
    let fma = c.load_module("fma.cu", FMA, &[]).expect("loads").kernel("fma_loop").expect("fma_loop");
    let n = BLOCKS * 256;
    let mut cfg = LaunchConfig::for_threads(n, 256);
    cfg.block_time_ns = Some(1_000_000);
    let slices = SplitMerge::Slices { granule_blocks: 1, bytes_per_granule: 1024, offset: 0 };
    let split = Split { merges: vec![(0, slices)], ..checked() };
    c.launch_split(&fma, &cfg, &[Arg::buffer(&x), Arg::from(n), Arg::from(1u32)], &split).expect("accepted");
    c.sync(StreamId::DEFAULT).expect("the split launch ends");
    let mut back = vec![0u8; data.len()];
    c.copy_to_host(&x, 0, &mut back, StreamId::DEFAULT).expect("down");
    assert!(back == data, "a write-only output's bytes changed through the split");
}

#[test]
fn a_kernel_with_global_atomics_is_refused_naming_them_unless_declared_splittable() {
    let d = Daemon::start_on(Some(multi_device()), None, &[]);
    let c = connect(&d, "hist");
    let module = c.load_module("hist.cu", HIST, &[]).expect("loads");
    let hist = module.kernel("hist").expect("hist");
    let e = c.split_kernel(&hist, Some(&checked())).expect_err("refused");
    let text = e.to_string();
    assert!(text.contains("kernel `hist` is not split: line 3: atomicAdd on global memory (`h`)"), "{text}");
    // A refused split launch reports at the next sync, as a refused launch does.
    let (v, h) = (c.alloc(4096).expect("alloc"), c.alloc(256).expect("alloc"));
    let args = [Arg::buffer(&v), Arg::buffer(&h), Arg::from(1024u32)];
    c.launch_split(&hist, &LaunchConfig::new([4, 1, 1], [256, 1, 1]), &args, &checked()).expect("sent");
    let e = c.sync(StreamId::DEFAULT).expect_err("refused at the sync");
    assert!(e.to_string().contains("atomicAdd on global memory"), "{e}");
    let declared = Split { splittable: Splittable::Declared, ..checked() };
    c.split_kernel(&hist, Some(&declared)).expect("a declared kernel is split");
    c.split_kernel(&hist, None).expect("and runs whole again");
}

#[test]
fn a_client_gone_mid_split_leaves_nothing_on_either_gpu() {
    let d = Daemon::start_on(Some(TWO), None, &[]);
    let watcher = connect_on(&d, "watcher", Some(0));
    let c = connect_on(&d, "leaver", Some(1));
    assert_eq!((watcher.gpu(), c.gpu()), (0, 1), "pinned");
    let data = data();
    let x = c.alloc(data.len() as u64).expect("alloc");
    c.copy_to_device(&x, 0, &data, StreamId::DEFAULT).expect("up");
    let scale = c.load_module("scale.cu", SCALE, &[]).expect("loads").kernel("scale").expect("scale");
    c.launch_split(
        &scale,
        &config(Duration::from_millis(200)),
        &[Arg::buffer(&x), Arg::from(BLOCKS * THREADS)],
        &checked(),
    )
    .expect("accepted");
    until(&watcher, "GPU 0 runs leaver's part", |s| on_gpu(s, 0).iter().any(|n| n.ends_with("(split from GPU 1)")));
    drop(c);
    let s = until(&watcher, "both GPUs let go", |s| {
        on_gpu(s, 1).is_empty() && on_gpu(s, 0) == ["watcher"] && s.gpus.iter().all(|g| g.memory_used == 0)
    });
    assert_eq!(s.clients.len(), 1, "{s:?}");
}

#[test]
fn a_daemon_of_one_gpu_runs_a_split_launch_whole() {
    let d = Daemon::start_on(Some("sim:h100"), None, &[]);
    let c = connect(&d, "alone");
    let data = data();
    let x = c.alloc(data.len() as u64).expect("alloc");
    c.copy_to_device(&x, 0, &data, StreamId::DEFAULT).expect("up");
    let scale = c.load_module("scale.cu", SCALE, &[]).expect("loads").kernel("scale").expect("scale");
    c.launch_split(
        &scale,
        &config(Duration::from_millis(1)),
        &[Arg::buffer(&x), Arg::from(BLOCKS * THREADS)],
        &checked(),
    )
    .expect("accepted");
    c.sync(StreamId::DEFAULT).expect("ran whole");
    let mut back = vec![0u8; data.len()];
    c.copy_to_host(&x, 0, &mut back, StreamId::DEFAULT).expect("down");
    assert!(back == data);
}

/// The simulator's kernels take wall-clock time: four waves of blocks on
/// one GPU, two on each of two. The split (replication and merge of 4 MiB
/// through host memory included) takes well under the whole launch's time.
#[test]
fn a_split_launch_of_four_waves_takes_about_half_the_time_on_two_simulated_gpus() {
    let d = Daemon::start_on(Some(TWO), None, &[]);
    let c = connect(&d, "timed");
    let data = data();
    let x = c.alloc(data.len() as u64).expect("alloc");
    c.copy_to_device(&x, 0, &data, StreamId::DEFAULT).expect("up");
    let scale = c.load_module("scale.cu", SCALE, &[]).expect("loads").kernel("scale").expect("scale");
    let args = [Arg::buffer(&x), Arg::from(BLOCKS * THREADS)];
    let wave = Duration::from_millis(100);
    let time = |split: bool| {
        let t = Instant::now();
        if split {
            c.launch_split(&scale, &config(wave), &args, &checked()).expect("accepted");
        } else {
            c.launch(&scale, &config(wave), &args).expect("accepted");
        }
        c.sync(StreamId::DEFAULT).expect("ends");
        t.elapsed()
    };
    let whole = time(false);
    let split = time(true);
    eprintln!(
        "whole {:.0} ms, split over 2 simulated GPUs {:.0} ms",
        whole.as_secs_f64() * 1e3,
        split.as_secs_f64() * 1e3
    );
    assert!(whole >= wave * 4, "four waves on one GPU: {whole:?}");
    assert!(split < whole.mul_f64(0.75), "split {split:?} against whole {whole:?}");
}

/// A compute-bound kernel: four FMA chains per thread, seeded by its index,
/// each block writing its own 1 KiB of `out` (after the split check's
/// `fma_loop`). The chains converge, so the index is added at the end: every
/// thread's value differs, and a block merged in the wrong place shows. No
/// product feeds an addition outside `fmaf`, so no build may contract it
/// differently (a native whole-grid build against the workers').
const FMA: &str = "__global__ void fma_loop(float* out, unsigned n, unsigned iters) {\n\
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n\
  if (i >= n) return;\n\
  float a = (float)(i & 1023) * 0.001f;\n\
  float b = a * 1.5f, c = a * 2.5f, d = a * 3.5f;\n\
  for (unsigned k = 0; k < iters; ++k) {\n\
    a = fmaf(a, 0.9999f, 1e-4f); b = fmaf(b, 0.9998f, 2e-4f);\n\
    c = fmaf(c, 0.9997f, 3e-4f); d = fmaf(d, 0.9996f, 4e-4f);\n\
  }\n\
  out[i] = a + b + c + d + (float)i;\n\
}\n";

/// The two-GPU device of [`a_compute_bound_kernel_split_over_two_gpus_is_bitwise_equal_to_one_gpu`]
/// and of the refusal test:
/// `GPUMUXD_TEST_MULTI_DEVICE` (`cuda:0,1` in scripts/multi-gpu-daemon-check.sh's
/// `MULTI_ONLY=split`), else `sim:h100x2`.
fn multi_device() -> &'static str {
    static D: OnceLock<String> = OnceLock::new();
    D.get_or_init(|| std::env::var("GPUMUXD_TEST_MULTI_DEVICE").unwrap_or_else(|_| TWO.into()))
}

fn env_u32(name: &str, default: u32) -> u32 {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v}: not a number")),
        Err(_) => default,
    }
}

/// The goal on two GPUs (the split check's compute-bound case
/// through the daemon): the FMA kernel run whole on GPU 0, then split over
/// both with each merge; every output byte equal to the whole run's, and
/// (on a GPU) different from the buffer's contents before, so the kernel
/// really wrote it. Prints the median times and the ratio beside the goal
/// (>= 1.9x), which is not asserted: a shared machine's timing is not a
/// test. On `sim:h100x2` the kernel computes nothing: the bytes check the
/// path (replication, both merges) and the times the simulator's waves.
/// `GPUMUXD_SPLIT_FMA_N` threads (default 2^21), `GPUMUXD_SPLIT_FMA_ITERS`
/// iterations (default 1,000,000: a kernel long beside the split's fixed
/// costs), `GPUMUXD_SPLIT_REPS` timed runs (default 5).
#[test]
fn a_compute_bound_kernel_split_over_two_gpus_is_bitwise_equal_to_one_gpu() {
    let device = multi_device();
    let on_gpu = device.starts_with("cuda");
    let n = env_u32("GPUMUXD_SPLIT_FMA_N", if on_gpu { 1 << 21 } else { 1 << 16 });
    let iters = env_u32("GPUMUXD_SPLIT_FMA_ITERS", 1_000_000);
    let reps = env_u32("GPUMUXD_SPLIT_REPS", 5).max(1);
    let d = Daemon::start_on(Some(device), None, &[]);
    let c = connect_on(&d, "fma", Some(0));
    assert_eq!(c.gpu(), 0);
    let bytes = u64::from(n) * 4;
    let out = c.alloc(bytes).expect("alloc");
    let before = vec![0xA5u8; bytes as usize];
    let fma = c.load_module("fma.cu", FMA, &[]).expect("loads").kernel("fma_loop").expect("fma_loop");
    let mut cfg = LaunchConfig::for_threads(n, 256);
    cfg.block_time_ns = Some(20_000_000);
    let args = [Arg::buffer(&out), Arg::from(n), Arg::from(iters)];
    // Each run starts from the same bytes: the merge compares with them.
    let run = |split: Option<&Split>| {
        c.copy_to_device(&out, 0, &before, StreamId::DEFAULT).expect("up");
        c.sync(StreamId::DEFAULT).expect("up");
        let t = Instant::now();
        match split {
            Some(s) => c.launch_split(&fma, &cfg, &args, s).expect("accepted"),
            None => c.launch(&fma, &cfg, &args).expect("accepted"),
        }
        c.sync(StreamId::DEFAULT).expect("ends");
        let took = t.elapsed();
        let mut back = vec![0u8; bytes as usize];
        c.copy_to_host(&out, 0, &mut back, StreamId::DEFAULT).expect("down");
        (took, back)
    };
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (_, whole_out) = run(None);
    if on_gpu {
        assert!(whole_out != before, "the kernel wrote nothing on {device}");
    }
    let whole = median((0..reps).map(|_| run(None).0).collect());
    let slices = SplitMerge::Slices { granule_blocks: 1, bytes_per_granule: 256 * 4, offset: 0 };
    for (name, split) in [("shadow", checked()), ("slices", Split { merges: vec![(0, slices)], ..checked() })] {
        let (_, first) = run(Some(&split));
        assert!(first == whole_out, "{name}: the split's output differs from one GPU's on {device}");
        let mut times = Vec::new();
        for _ in 0..reps {
            let (t, o) = run(Some(&split));
            assert!(o == whole_out, "{name}: a split's output differs from one GPU's on {device}");
            times.push(t);
        }
        let split_t = median(times);
        let ratio = whole.as_secs_f64() / split_t.as_secs_f64();
        eprintln!(
            "split {name}: fma_loop n={n} iters={iters} on {device}: one GPU {:.1} ms, split over 2 {:.1} ms: {ratio:.2}x \
             (goal >= 1.9x: {}), bitwise equal",
            whole.as_secs_f64() * 1e3,
            split_t.as_secs_f64() * 1e3,
            if ratio >= 1.9 { "met" } else { "not met" }
        );
    }
}

/// The C ABI's split (`gpumux_launch_split`, `gpumux_split_kernel`): a
/// launch split with declared slices syncs and leaves the bytes as they
/// went; a kernel with global atomics is refused naming them (in
/// `gpumux_last_error`) unless declared; a `declared` other than 0 or 1 and
/// a NULL split are refused before anything is sent.
#[test]
fn the_c_abi_splits_a_launch_and_refuses_what_the_analysis_refuses() {
    use ::gpumux_client::ffi::*;
    use std::ffi::{CStr, CString};
    use std::ptr::{null, null_mut};
    let last_error = || unsafe { CStr::from_ptr(gpumux_last_error()) }.to_string_lossy().into_owned();
    let d = Daemon::start_on(Some(TWO), None, &[]);
    let socket = CString::new(d.socket.to_str().expect("a UTF-8 path")).expect("no NUL");
    let name = CString::new("c-split").expect("no NUL");
    let mut client = null_mut();
    let ok = gpumux_status::GPUMUX_OK;
    assert_eq!(unsafe { gpumux_connect(socket.as_ptr(), name.as_ptr(), 0, 1.0, 8 << 20, &mut client) }, ok);
    let load = |src: &str, kernel: &str| {
        let (n, s, k) = (CString::new("m.cu").unwrap(), CString::new(src).unwrap(), CString::new(kernel).unwrap());
        let mut module = null_mut();
        assert_eq!(unsafe { gpumux_load_module(client, n.as_ptr(), s.as_ptr(), null(), 0, &mut module) }, ok);
        let mut k_ptr = null();
        assert_eq!(unsafe { gpumux_module_kernel(module, k.as_ptr(), &mut k_ptr) }, ok);
        (module, k_ptr)
    };
    let (scale_module, scale) = load(SCALE, "scale");
    let data = data();
    let mut x = ::gpumux_client::Buffer::default();
    assert_eq!(unsafe { gpumux_alloc(client, data.len() as u64, &mut x) }, ok);
    assert_eq!(unsafe { gpumux_copy_to_device(client, x, 0, data.as_ptr().cast(), data.len(), 0) }, ok);
    let cfg = gpumux_launch_config {
        grid: [BLOCKS, 1, 1],
        block: [THREADS, 1, 1],
        shared_bytes: 0,
        stream: 0,
        block_time_ns: 1_000_000,
    };
    let args = [gpumux_arg_buffer(x, 0), gpumux_arg_u32(BLOCKS * THREADS)];
    let slices = [gpumux_split_slices { arg: 0, granule_blocks: 1, bytes_per_granule: 4096, offset: 0 }];
    let split = gpumux_split { declared: 0, gpus: 0, slices: slices.as_ptr(), n_slices: 1 };
    assert_eq!(unsafe { gpumux_launch_split(client, scale, &cfg, args.as_ptr(), 2, &split) }, ok, "{}", last_error());
    assert_eq!(unsafe { gpumux_sync(client, 0) }, ok, "{}", last_error());
    let mut back = vec![0u8; data.len()];
    assert_eq!(unsafe { gpumux_copy_to_host(client, x, 0, back.as_mut_ptr().cast(), back.len(), 0) }, ok);
    assert!(back == data);
    let bad = gpumux_split { declared: 7, ..split };
    let invalid = gpumux_status::GPUMUX_ERR_INVALID_ARGUMENT;
    assert_eq!(unsafe { gpumux_launch_split(client, scale, &cfg, args.as_ptr(), 2, &bad) }, invalid);
    assert!(last_error().contains("`declared` is 7"), "{}", last_error());
    let null_split = unsafe { gpumux_launch_split(client, scale, &cfg, args.as_ptr(), 2, null()) };
    assert_eq!(null_split, gpumux_status::GPUMUX_ERR_NULL);
    let (hist_module, hist) = load(HIST, "hist");
    let checked = gpumux_split { declared: 0, gpus: 0, slices: null(), n_slices: 0 };
    assert_eq!(unsafe { gpumux_split_kernel(client, hist, &checked) }, gpumux_status::GPUMUX_ERR_INVALID);
    assert!(last_error().contains("line 3: atomicAdd on global memory (`h`)"), "{}", last_error());
    let declared = gpumux_split { declared: 1, ..checked };
    assert_eq!(unsafe { gpumux_split_kernel(client, hist, &declared) }, ok, "{}", last_error());
    assert_eq!(unsafe { gpumux_split_kernel(client, hist, null()) }, ok, "NULL: whole again");
    unsafe {
        gpumux_module_free(hist_module);
        gpumux_module_free(scale_module);
        gpumux_disconnect(client);
    }
}
