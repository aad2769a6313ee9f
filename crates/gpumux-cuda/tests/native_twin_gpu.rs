//! On a machine with a GPU: a native launch made with the kernel's twin
//! (`transform::NATIVE_SUFFIX`) publishes its own end in host memory, after
//! every block's writes, with no stream write or end event behind it.
//! Elsewhere the test prints why it skipped.

use gpumux_cuda::client::module;
use gpumux_cuda::launch_plan::{Chunk, Plan};
use gpumux_cuda::preempt::{SmMask, WorkerLaunch, NATIVE_END_VAR};
use gpumux_cuda::runtime::{DeviceBuffer, Gpu, Stream};
use std::time::{Duration, Instant};

/// Each thread adds one to its word, without an atomic: two launches that
/// overlapped would lose updates. Threads past `n` (in the last block)
/// return early, which must leave the body only.
const BUMP: &str = r#"
extern "C" __global__ void bump(unsigned int* x, unsigned int n) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] += 1u;
}
"#;

#[test]
fn a_native_twin_publishes_its_end_after_every_blocks_writes() {
    let test = "a_native_twin_publishes_its_end_after_every_blocks_writes";
    let gpu = match Gpu::open(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("SKIPPED {test}: {e}");
            return;
        }
    };
    if !gpumux_cuda::nvrtc::nvrtc_present() {
        eprintln!("SKIPPED {test}: libnvrtc not found");
        return;
    }
    if std::env::var(NATIVE_END_VAR).is_ok_and(|v| v.trim() != "kernel") {
        eprintln!("SKIPPED {test}: {NATIVE_END_VAR} turns the twin off");
        return;
    }
    let arch = gpu.arch();
    let mut compiled = module::compile("bump", BUMP, &[], arch).expect("workers");
    module::add_native(&mut compiled, "bump", BUMP, &[], arch).expect("native build");
    let loaded = module::load("bump", &compiled).expect("load");
    let k = &loaded.kernels[0];
    let native = k.native.clone().expect("the native build");
    let twin = k.native_publishing.clone().expect("the twin, beside the native build");

    let n: u32 = 1000 * 128 + 77;
    let x = DeviceBuffer::new(n as usize * 4).expect("buffer");
    x.fill(0).expect("zeroed");
    let (grid, block) = ([n.div_ceil(128), 1, 1], [128, 1, 1]);
    let args = vec![x.ptr.to_le_bytes().to_vec(), n.to_le_bytes().to_vec()];
    let mut w = WorkerLaunch::new(k.worker.clone(), args, grid, block, 0, Chunk::Auto, gpu.sm_count())
        .expect("launch record")
        .with_native(native);
    w.set_native_publishing(Some(twin));
    w.native_anywhere(true);
    // Launches alternate between two streams: the next starts only once
    // the host saw the last one's end, which is all that orders them.
    let streams = [Stream::low(&gpu).expect("stream"), Stream::low(&gpu).expect("stream")];
    let all = SmMask::range(0, gpu.sm_count());
    const LAUNCHES: u32 = 200;
    for i in 0..LAUNCHES {
        w.rewind().expect("rewind");
        // Neither a stream write nor an end event: only the kernel can publish its end.
        w.publish_end(false);
        w.lazy_end(true);
        w.start(&streams[i as usize % 2], all).expect("start");
        assert_eq!(w.last_plan(), Some(Plan::Native), "launch {i}");
        assert!(!w.end_unpublished(), "launch {i}: the twin publishes its end");
        let t = Instant::now();
        // A read of host memory, no driver call (no event is recorded).
        while !w.end_in_host_memory() {
            assert!(t.elapsed() < Duration::from_secs(5), "launch {i}: its end never showed in host memory");
            std::hint::spin_loop();
        }
        let out = w.finish().expect("finish");
        assert_eq!((out.next, out.end), (out.end, grid[0]), "launch {i}: every block ran");
    }
    for s in &streams {
        s.sync().expect("the last kernel exits");
    }
    let got = x.download().expect("download");
    let lost = got.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).filter(|&v| v != LAUNCHES);
    assert_eq!(lost.count(), 0, "every word was bumped once per launch: no launch overlapped the one before");
}
