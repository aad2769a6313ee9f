//! Short and many launches, the shape real programs have and the suite hides
//! (issue 10, 2b): a wavefront of 511 launches of 1-256 blocks of 16 threads,
//! and a shared-memory stencil with block barriers, 20 launches of ~0.2 ms.
//!
//! Each case runs, on one stream, side by side and interleaved:
//! * `native`: the kernels launched back to back;
//! * `native+sync`: the host waits after every launch (the cost of a round trip);
//! * `auto chain`: the default path, [`Chunk::Auto`] launches queued back to back
//!   (block times measured by a first, untimed run; short launches go native);
//! * `chunk 4 chain`: workers at a fixed chunk 4, queued back to back (the old default);
//! * `auto+sync`: the default path with the host waiting for each launch, as the
//!   engine's device does today.
//!
//! Outputs of every mode are checked bitwise against the native run first.

use crate::median;
use gpumux_cuda::error::{CudaError, Result};
use gpumux_cuda::launch_plan::{Chunk, Plan};
use gpumux_cuda::preempt::{SmMask, WorkerLaunch};
use gpumux_cuda::runtime::{DeviceBuffer, Event, Function, Gpu, Params, Stream};
use gpumux_cuda::suite::Rng;
use serde::Serialize;

/// Needleman-Wunsch-style alignment scores over T×T tiles of 16×16 cells; launch
/// d runs the tiles of anti-diagonal d, one 16-thread block per tile.
pub const WAVEFRONT_SOURCE: &str = r#"
extern "C" __global__ void nw_diag(int* __restrict__ score, const int* __restrict__ sim, unsigned int tiles,
                                   unsigned int d, int gap) {
    const unsigned int n = tiles * 16u + 1u;
    const unsigned int lo = d >= tiles ? d - tiles + 1u : 0u;
    const unsigned int ti = lo + blockIdx.x;
    const unsigned int tj = d - ti;
    const unsigned int tx = threadIdx.x;
    for (unsigned int k = 0; k < 31u; ++k) {
        if (tx <= k && k - tx < 16u) {
            const unsigned int r = ti * 16u + tx + 1u, c = tj * 16u + (k - tx) + 1u;
            const int diag = score[(r - 1u) * n + c - 1u] + sim[(r - 1u) * (n - 1u) + c - 1u];
            const int up = score[(r - 1u) * n + c] - gap;
            const int left = score[r * n + c - 1u] - gap;
            score[r * n + c] = max(diag, max(up, left));
        }
        __syncthreads();
    }
}
"#;

/// Jacobi 5-point step through a shared-memory tile with a halo (16×16 blocks, barriers).
pub const STENCIL_SMEM_SOURCE: &str = r#"
extern "C" __global__ void stencil_smem(float* __restrict__ out, const float* __restrict__ in, int n) {
    __shared__ float t[18][18];
    const int x = blockIdx.x * 16 + threadIdx.x, y = blockIdx.y * 16 + threadIdx.y;
    const int lx = threadIdx.x + 1, ly = threadIdx.y + 1;
    const bool inside = x < n && y < n;
    t[ly][lx] = inside ? in[(size_t)y * n + x] : 0.f;
    if (threadIdx.x == 0) t[ly][0] = (inside && x > 0) ? in[(size_t)y * n + x - 1] : 0.f;
    if (threadIdx.x == 15) t[ly][17] = (inside && x + 1 < n) ? in[(size_t)y * n + x + 1] : 0.f;
    if (threadIdx.y == 0) t[0][lx] = (inside && y > 0) ? in[(size_t)(y - 1) * n + x] : 0.f;
    if (threadIdx.y == 15) t[17][lx] = (inside && y + 1 < n) ? in[(size_t)(y + 1) * n + x] : 0.f;
    __syncthreads();
    if (inside) out[(size_t)y * n + x] = 0.2f * (t[ly][lx] + t[ly][lx - 1] + t[ly][lx + 1] + t[ly - 1][lx] + t[ly + 1][lx]);
}
"#;

/// One chain of short launches, native against gpumux's default path.
#[derive(Clone, Debug, Serialize)]
pub struct LaunchesRow {
    /// Which chain (`nw wavefront`, `stencil smem`).
    pub case: String,
    /// Launches in the chain.
    pub launches: usize,
    /// Native launches back to back, median ms.
    pub native_ms: f64,
    /// Native launches, a sync after each, median ms.
    pub native_sync_ms: f64,
    /// The default path (`auto`) back to back, median ms.
    pub auto_chain_ms: f64,
    /// Workers at chunk 4 back to back, median ms.
    pub chunk4_chain_ms: f64,
    /// The default path, a sync after each launch, median ms.
    pub auto_sync_ms: f64,
    /// Launches of the timed auto chain that ran natively.
    pub auto_native_launches: usize,
    /// Every path's outputs equal the native ones, bitwise.
    pub outputs_bitwise_equal: bool,
}

/// One launch of a case: grid, block, and each argument's bytes.
type CaseLaunch = ([u32; 3], [u32; 3], Vec<Vec<u8>>);

struct Case {
    name: String,
    native: Function,
    worker: Function,
    launches: Vec<CaseLaunch>,
    /// Buffers and their initial bytes.
    buffers: Vec<(DeviceBuffer, Vec<u8>)>,
    /// Index of the buffer compared between modes.
    output: usize,
}

impl Case {
    fn reset(&self) -> Result<()> {
        for (b, init) in &self.buffers {
            b.upload(init)?;
        }
        Ok(())
    }
    fn output(&self) -> Result<Vec<u8>> {
        self.buffers[self.output].0.download()
    }
    fn enqueue_native(&self, s: &Stream, sync_each: bool) -> Result<()> {
        for (grid, block, args) in &self.launches {
            let mut p = Params::default();
            for a in args {
                p.push_bytes(a);
            }
            // SAFETY: the arguments match the case's kernel.
            unsafe { self.native.launch(*grid, *block, 0, s, &mut p)? };
            if sync_each {
                s.sync()?;
            }
        }
        Ok(())
    }
    fn worker_launches(&self, gpu: &Gpu, chunk: Chunk) -> Result<Vec<WorkerLaunch>> {
        self.launches
            .iter()
            .map(|(grid, block, args)| {
                Ok(WorkerLaunch::new(self.worker.clone(), args.clone(), *grid, *block, 0, chunk, gpu.sm_count())?
                    .with_native(self.native.clone()))
            })
            .collect()
    }
}

/// Runs the launches queued back to back (`sync_each`: the host waits for each).
fn run_chain(ws: &mut [WorkerLaunch], s: &Stream, all: SmMask, sync_each: bool) -> Result<()> {
    for w in ws.iter_mut() {
        w.rewind()?;
        w.start(s, all)?;
        if sync_each {
            w.finish()?;
        }
    }
    for w in ws.iter_mut() {
        if !w.finish()?.done() {
            return Err(CudaError::Check("a chained launch stopped without a retreat".into()));
        }
    }
    Ok(())
}

fn le(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

fn wavefront(gpu: &Gpu, seed: u64) -> Result<Case> {
    let tiles = 256u32;
    let n = (tiles * 16 + 1) as usize;
    let gap = 2i32;
    let mut rng = Rng::new(seed ^ 0x0A11);
    let sim: Vec<u8> = (0..(n - 1) * (n - 1)).flat_map(|_| (rng.below(9) as i32 - 4).to_le_bytes()).collect();
    let mut score = vec![0i32; n * n];
    for i in 0..n {
        score[i] = -gap * i as i32;
        score[i * n] = -gap * i as i32;
    }
    let score: Vec<u8> = score.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (native_m, worker_m, _) = gpu.native_and_worker("nw_diag", WAVEFRONT_SOURCE)?;
    let (sb, mb) = (DeviceBuffer::new(score.len())?, DeviceBuffer::new(sim.len())?);
    let launches = (0..2 * tiles - 1)
        .map(|d| {
            let width = (d + 1).min(tiles).min(2 * tiles - 1 - d);
            let args =
                vec![sb.ptr.to_le_bytes().to_vec(), mb.ptr.to_le_bytes().to_vec(), le(tiles), le(d), le(gap as u32)];
            ([width, 1, 1], [16, 1, 1], args)
        })
        .collect();
    Ok(Case {
        name: "wavefront (nw, 16 threads)".into(),
        native: native_m.function("nw_diag")?,
        worker: worker_m.function("nw_diag")?,
        launches,
        buffers: vec![(sb, score), (mb, sim)],
        output: 0,
    })
}

fn stencil(gpu: &Gpu, seed: u64) -> Result<Case> {
    let n = 8192u32;
    let cells = (n * n) as usize;
    let mut rng = Rng::new(seed ^ 0x57E);
    let a: Vec<u8> = (0..cells).flat_map(|_| rng.f32().to_le_bytes()).collect();
    let (native_m, worker_m, _) = gpu.native_and_worker("stencil_smem", STENCIL_SMEM_SOURCE)?;
    let (ab, bb) = (DeviceBuffer::new(cells * 4)?, DeviceBuffer::new(cells * 4)?);
    let t = n.div_ceil(16);
    let launches = (0..20)
        .map(|s| {
            let (out, inp) = if s % 2 == 0 { (&bb, &ab) } else { (&ab, &bb) };
            let args =
                vec![out.ptr.to_le_bytes().to_vec(), inp.ptr.to_le_bytes().to_vec(), (n as i32).to_le_bytes().to_vec()];
            ([t, t, 1], [16, 16, 1], args)
        })
        .collect();
    Ok(Case {
        name: "stencil (smem + barrier, 16x16)".into(),
        native: native_m.function("stencil_smem")?,
        worker: worker_m.function("stencil_smem")?,
        launches,
        buffers: vec![(ab, a), (bb, vec![0xFF; cells * 4])],
        output: 0,
    })
}

/// Many short dependent launches (a Needleman-Wunsch wavefront, a barrier
/// stencil), native against the default path, `reps` interleaved
/// repetitions. Prints the table.
pub fn launches(gpu: &Gpu, reps: u32, seed: u64) -> Result<Vec<LaunchesRow>> {
    let s = Stream::low(gpu)?;
    let all = SmMask::range(0, gpu.sm_count());
    let (a, b) = (Event::new()?, Event::new()?);
    println!("\n== many short launches: native vs gpumux's default path (median of {reps}, ms) ==");
    println!(
        "{:<32} {:>8} {:>8} {:>11} {:>10} {:>12} {:>9} {:>12} {:>7}",
        "case", "launches", "native", "native+sync", "auto chain", "chunk4 chain", "auto+sync", "auto native", "equal"
    );
    let mut rows = Vec::new();
    for case in [wavefront(gpu, seed)?, stencil(gpu, seed)?] {
        case.reset()?;
        case.enqueue_native(&s, false)?;
        s.sync()?;
        let want = case.output()?;
        let mut auto = case.worker_launches(gpu, Chunk::Auto)?;
        let mut fixed = case.worker_launches(gpu, Chunk::Fixed(4))?;
        // Correctness, and the auto path's first (measuring) run.
        let mut equal = true;
        for _ in 0..2 {
            case.reset()?;
            run_chain(&mut auto, &s, all, false)?;
            equal &= case.output()? == want;
        }
        case.reset()?;
        run_chain(&mut fixed, &s, all, false)?;
        equal &= case.output()? == want;
        if !equal {
            return Err(CudaError::Check(format!("{}: worker output differs from native", case.name)));
        }
        let mut t: [Vec<f64>; 5] = Default::default();
        for rep in 0..=reps {
            for (mode, v) in t.iter_mut().enumerate() {
                case.reset()?;
                a.record(&s)?;
                match mode {
                    0 => case.enqueue_native(&s, false)?,
                    1 => case.enqueue_native(&s, true)?,
                    2 => run_chain(&mut auto, &s, all, false)?,
                    3 => run_chain(&mut fixed, &s, all, false)?,
                    _ => run_chain(&mut auto, &s, all, true)?,
                }
                b.record(&s)?;
                b.sync()?;
                if rep > 0 {
                    v.push(a.elapsed_ms(&b)? as f64);
                }
            }
        }
        // The auto chain's plans (the last mode ran the same launches).
        let native_launches = auto.iter().filter(|w| w.last_plan() == Some(Plan::Native)).count();
        let [n, ns, ac, fc, asy] = t.map(|mut v| median(&mut v));
        println!(
            "{:<32} {:>8} {:>8.3} {:>11.3} {:>10.3} {:>12.3} {:>9.3} {:>12} {:>7}",
            case.name,
            case.launches.len(),
            n,
            ns,
            ac,
            fc,
            asy,
            native_launches,
            equal
        );
        println!(
            "{:<32} auto chain {:+.1}% and chunk-4 chain {:+.1}% vs native back to back; auto+sync {:+.1}% vs native+sync",
            "",
            100.0 * (ac / n - 1.0),
            100.0 * (fc / n - 1.0),
            100.0 * (asy / ns - 1.0)
        );
        rows.push(LaunchesRow {
            case: case.name.clone(),
            launches: case.launches.len(),
            native_ms: n,
            native_sync_ms: ns,
            auto_chain_ms: ac,
            chunk4_chain_ms: fc,
            auto_sync_ms: asy,
            auto_native_launches: native_launches,
            outputs_bitwise_equal: equal,
        });
    }
    Ok(rows)
}
