//! One launch split over two simulated GPUs by the daemon (`sim:h100x2`;
//! docs/multi-gpu.md, "Splitting in the daemon"), through the Rust client
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
use std::time::{Duration, Instant};

const SCALE: &str = "__global__ void scale(float* x, unsigned n) {\n  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) x[i] *= 2.0f;\n}\n";
const HIST: &str = "__global__ void hist(const unsigned* v, unsigned* h, unsigned n) {\n  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) atomicAdd(&h[v[i] % 64], 1u);\n}\n";
const TWO: &str = "sim:h100x2";
/// Blocks of 1024 threads (two a simulated SM holds): 1056 blocks are four
/// waves of 264 on one H100, two on each of two.
const BLOCKS: u32 = 1056;
const THREADS: u32 = 1024;

fn connect(d: &Daemon, name: &str) -> Client {
    Client::connect(ConnectOptions {
        socket: Some(PathBuf::from(&d.socket)),
        shm_bytes: 8 << 20,
        ..ConnectOptions::named(name)
    })
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
    let d = Daemon::start_on(Some(TWO), None, &[]);
    let c = connect(&d, "splitter");
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
}

#[test]
fn a_kernel_with_global_atomics_is_refused_naming_them_unless_declared_splittable() {
    let d = Daemon::start_on(Some(TWO), None, &[]);
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
    let watcher = connect(&d, "watcher");
    let c = connect(&d, "leaver");
    assert_eq!((watcher.gpu(), c.gpu()), (0, 1), "least-loaded");
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
