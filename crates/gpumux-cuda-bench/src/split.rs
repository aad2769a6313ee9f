//! `gpumux-cuda-check split`: one launch split over several GPUs
//! (`gpumux_cuda::split`), each result compared bytewise with the native
//! kernel on one GPU, timed end to end against it, and the issue's goals
//! printed with the anchors' figures beside them.
//!
//! Cases: a compute-bound FMA loop (ours, many waves) and nbody (suite);
//! two memory-bound kernels with merged outputs, triad (output a third of
//! its traffic) and reduce_partial (output tiny); each merged with the
//! shadow buffers and with declared slices, with inputs replicated in every
//! run and already on every GPU; then kernels the analysis refuses.

use crate::median;
use gpumux_cuda::split::{BlockSlices, LinkKind, Merge, SplitError, SplitGpus, SplitTiming, Splittable, SuiteLaunch};
use gpumux_cuda::suite::{self, App, Arg, BufferSpec, HostData, Init, LaunchSpec, Rng};
use serde::Serialize;

/// The compute-bound kernel: four independent FMA chains per thread, one
/// output per thread; `iters` sets the time.
pub const FMA_SOURCE: &str = r#"
extern "C" __global__ void __launch_bounds__(256) fma_loop(float* __restrict__ out, const float* __restrict__ in,
                                                          unsigned int iters, unsigned int n) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float a = in[i], b = a * 0.5f, c = a + 1.0f, d = a - 1.0f;
    for (unsigned int k = 0; k < iters; ++k) {
        a = fmaf(a, 0.99991f, 0.00013f);
        b = fmaf(b, 0.99993f, 0.00011f);
        c = fmaf(c, 0.99995f, 0.00007f);
        d = fmaf(d, 0.99997f, 0.00005f);
    }
    out[i] = a + b + c + d;
}
"#;

/// What to run.
#[derive(Clone, Debug)]
pub struct SplitConfig {
    /// GPUs to use (None: every GPU the driver sees, at most 8).
    pub gpus: Option<usize>,
    /// Timed runs per row (the median is reported).
    pub reps: u32,
    /// Threads of the FMA kernel.
    pub fma_n: u32,
    /// FMA iterations per thread.
    pub fma_iters: u32,
    /// nbody bodies.
    pub nbody_n: u64,
    /// triad elements.
    pub triad_n: u64,
    /// reduce_partial elements.
    pub reduction_n: u64,
    /// Inputs.
    pub seed: u64,
}

/// One row: a kernel on some GPUs with a merge method.
#[derive(Clone, Debug, Serialize)]
pub struct SplitRow {
    /// The kernel and what bounds it.
    pub case: String,
    /// GPUs that ran blocks.
    pub gpus: usize,
    /// `native` (the reference), `workers` (the same workers on one GPU), `shadow` or `slices`.
    pub merge: String,
    /// `replicated` (copied to the other GPUs in every run) or `resident` (copied once before).
    pub inputs: String,
    /// Median end to end (replication, kernels, copies back, merge), ms.
    pub wall_ms: f64,
    /// Median of the longest GPU's kernel, ms.
    pub kernel_ms: f64,
    /// Median of the longest replication, ms.
    pub replicate_ms: f64,
    /// Median of the longest copy back, ms.
    pub copy_back_ms: f64,
    /// Median of the merge kernels, ms.
    pub merge_ms: f64,
    /// The native kernel on one GPU end to end / this, both medians.
    pub speedup: f64,
    /// The native kernel's time / this row's longest kernel.
    pub kernel_speedup: f64,
    /// Bytes between GPUs per run, GB.
    pub link_gb: f64,
    /// Every output byte equals the native one-GPU run's.
    pub bitwise_equal: bool,
    /// Blocks per GPU.
    pub ranges: Vec<(u32, u32)>,
}

/// A kernel the analysis refused, and why.
#[derive(Clone, Debug, Serialize)]
pub struct RefusedRow {
    /// The kernel.
    pub kernel: String,
    /// The error as printed.
    pub error: String,
}

/// One line of the goals table.
#[derive(Clone, Debug, Serialize)]
pub struct GoalRow {
    /// The goal.
    pub goal: String,
    /// The speedup it asks for.
    pub target: f64,
    /// What was measured (None: not run).
    pub measured: Option<f64>,
    /// Which row.
    pub row: String,
    /// The anchors' figures.
    pub anchor: String,
}

/// Everything `split` measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SplitReport {
    /// The GPUs, home first.
    pub gpus: Vec<String>,
    /// How the home GPU reaches each.
    pub links: Vec<LinkKind>,
    /// The rows.
    pub rows: Vec<SplitRow>,
    /// Refused kernels.
    pub refused: Vec<RefusedRow>,
    /// The goals.
    pub goals: Vec<GoalRow>,
}

/// A case: a launch and the slices its blocks write (for the declared merge).
struct Case<'g> {
    name: String,
    launch: SuiteLaunch<'g>,
    slices: BlockSlices,
    memory_bound: bool,
}

fn one_per_block(bytes: u64) -> BlockSlices {
    BlockSlices { granule_blocks: 1, bytes_per_granule: bytes, offset: 0 }
}

fn cases<'g>(gpus: &'g SplitGpus, cfg: &SplitConfig) -> anyhow::Result<Vec<Case<'g>>> {
    let mut rng = Rng::new(cfg.seed);
    let n = cfg.fma_n as usize;
    let input: Vec<f32> = (0..n).map(|_| rng.f32() * 2.0 - 1.0).collect();
    let fma = SuiteLaunch::from_parts(
        gpus,
        FMA_SOURCE,
        vec![
            BufferSpec { name: "out", init: Init::Poison { bytes: n * 4 } },
            BufferSpec { name: "in", init: Init::Data(HostData::F32(input)) },
        ],
        LaunchSpec {
            kernel: "fma_loop",
            grid: [cfg.fma_n.div_ceil(256), 1, 1],
            block: [256, 1, 1],
            shared_bytes: 0,
            args: vec![Arg::Buf(0), Arg::Buf(1), Arg::U32(cfg.fma_iters), Arg::U32(cfg.fma_n)],
        },
        Splittable::IfChecked,
    )?;
    let suite_case = |app: App, size: u64, index: usize| -> anyhow::Result<SuiteLaunch<'g>> {
        Ok(SuiteLaunch::new(gpus, suite::build_sized(app, size, 1, cfg.seed), index, Splittable::IfChecked)?)
    };
    Ok(vec![
        Case {
            name: format!("fma_loop, {} threads x {} iterations (compute-bound)", cfg.fma_n, cfg.fma_iters),
            launch: fma,
            slices: one_per_block(256 * 4),
            memory_bound: false,
        },
        Case {
            name: format!("nbody, {} bodies (compute-bound)", cfg.nbody_n),
            launch: suite_case(App::Nbody, cfg.nbody_n, 0)?,
            slices: one_per_block(256 * 16),
            memory_bound: false,
        },
        Case {
            name: format!("triad, {} floats (memory-bound)", cfg.triad_n),
            launch: suite_case(App::Triad, cfg.triad_n, 0)?,
            slices: one_per_block(256 * 4),
            memory_bound: true,
        },
        Case {
            name: format!("reduce_partial, {} floats (memory-bound, small output)", cfg.reduction_n),
            launch: suite_case(App::Reduction, cfg.reduction_n, 0)?,
            slices: one_per_block(4),
            memory_bound: true,
        },
    ])
}

/// Medians of `runs`' parts.
fn medians(runs: &[SplitTiming]) -> (f64, f64, f64, f64, f64) {
    let m = |f: &dyn Fn(&SplitTiming) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    (
        m(&|t| t.wall_ms),
        m(&|t| t.kernel_max_ms()),
        m(&|t| max(&t.replicate_ms)),
        m(&|t| max(&t.copy_back_ms)),
        m(&|t| t.merge_ms),
    )
}

/// Does every output of `l` equal `want`? Prints where it does not.
fn equal(l: &SuiteLaunch<'_>, want: &[Vec<u8>], what: &str) -> anyhow::Result<bool> {
    let got = l.read_outputs()?;
    for (o, (a, b)) in got.iter().zip(want).enumerate() {
        if let Some(i) = a.iter().zip(b).position(|(x, y)| x != y) {
            println!("  MISMATCH {what}: output {o} differs from the native one-GPU run from byte {i} on");
            return Ok(false);
        }
    }
    Ok(got.len() == want.len())
}

/// Runs one case on every GPU count and merge; rows, and whether all were bitwise equal.
fn measure(gpus: &SplitGpus, c: &Case<'_>, counts: &[usize], reps: u32) -> anyhow::Result<(Vec<SplitRow>, bool)> {
    let l = &c.launch;
    let (grid, block, smem) = (l.launch.grid, l.launch.block, l.launch.shared_bytes);
    let reps = reps.max(1);
    // The reference: the native kernel on the home GPU.
    l.reset()?;
    l.run_native()?;
    let (mut walls, mut kernels) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        l.reset_outputs()?;
        let t = std::time::Instant::now();
        kernels.push(l.run_native()?);
        walls.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let native_wall = median(&mut walls);
    let native_kernel = median(&mut kernels);
    let want = l.read_outputs()?;
    let mut rows = vec![SplitRow {
        case: c.name.clone(),
        gpus: 1,
        merge: "native".into(),
        inputs: "-".into(),
        wall_ms: native_wall,
        kernel_ms: native_kernel,
        replicate_ms: 0.0,
        copy_back_ms: 0.0,
        merge_ms: 0.0,
        speedup: 1.0,
        kernel_speedup: 1.0,
        link_gb: 0.0,
        bitwise_equal: true,
        ranges: vec![(0, l.launch.blocks() as u32)],
    }];
    print_row(&rows[0]);
    let mut ok = true;
    let mut variants: Vec<(usize, &str, Merge, bool)> = vec![(1, "workers", Merge::Shadow, false)];
    for &n in counts {
        for (name, m) in [("shadow", Merge::Shadow), ("slices", Merge::Slices { slices: c.slices, verify: false })] {
            variants.push((n, name, m, false));
            if c.memory_bound {
                variants.push((n, name, m, true));
            }
        }
    }
    for (n, name, m, resident) in variants {
        let what = format!("{} on {n} GPU(s), {name}{}", c.name, if resident { ", inputs resident" } else { "" });
        // A variant that fails is reported and the others still run: one device
        // run should show everything that works.
        let result = (|| -> anyhow::Result<Option<(Vec<SplitTiming>, bool)>> {
            if let Merge::Slices { slices, .. } = m {
                // The declaration checked once on the GPU, untimed.
                l.reset_outputs()?;
                let args = l.args(&|_| Merge::Slices { slices, verify: true })?;
                let mut p = gpus.prepare(&l.kernel, grid, block, smem, args, n)?;
                if let Err(e) = p.run() {
                    println!("  FAILED {what}: the declared slices' check: {e}");
                    return Ok(None);
                }
            }
            let mut p = gpus.prepare(&l.kernel, grid, block, smem, l.args(&|_| m)?, n)?;
            if resident {
                p.replicate_inputs_once()?;
            }
            l.reset_outputs()?;
            p.run()?;
            let mut runs = Vec::new();
            for _ in 0..reps {
                l.reset_outputs()?;
                runs.push(p.run()?);
            }
            Ok(Some((runs, equal(l, &want, &what)?)))
        })();
        let (runs, equal) = match result {
            Ok(Some(r)) => r,
            Ok(None) => {
                ok = false;
                continue;
            }
            Err(e) => {
                println!("  FAILED {what}: {e:#}");
                ok = false;
                continue;
            }
        };
        ok &= equal;
        let (wall, kernel, rep, back, merge) = medians(&runs);
        let last = runs.last().cloned();
        let row = SplitRow {
            case: c.name.clone(),
            gpus: n,
            merge: name.into(),
            inputs: if n == 1 {
                "-".into()
            } else if resident {
                "resident".into()
            } else {
                "replicated".into()
            },
            wall_ms: wall,
            kernel_ms: kernel,
            replicate_ms: rep,
            copy_back_ms: back,
            merge_ms: merge,
            speedup: native_wall / wall.max(1e-9),
            kernel_speedup: native_kernel / kernel.max(1e-9),
            link_gb: last.as_ref().map_or(0.0, |t| t.link_bytes as f64 / 1e9),
            bitwise_equal: equal,
            ranges: last.map_or_else(Vec::new, |t| t.ranges.iter().map(|r| (r.start, r.end)).collect()),
        };
        print_row(&row);
        rows.push(row);
    }
    Ok((rows, ok))
}

fn print_header() {
    println!(
        "  {:>4} {:>8} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>7}  bitwise",
        "gpus", "merge", "inputs", "e2e ms", "kernel", "replic.", "back", "merge", "speedup", "kernel x", "link GB"
    );
}

fn print_row(r: &SplitRow) {
    println!(
        "  {:>4} {:>8} {:>10} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>8.3} {:>7.2}x {:>7.2}x {:>7.3}  {}",
        r.gpus,
        r.merge,
        r.inputs,
        r.wall_ms,
        r.kernel_ms,
        r.replicate_ms,
        r.copy_back_ms,
        r.merge_ms,
        r.speedup,
        r.kernel_speedup,
        r.link_gb,
        if r.bitwise_equal { "equal" } else { "DIFFERENT" }
    );
}

/// The best split row of `rows` over `gpus` GPUs that `pick` accepts.
fn best<'r>(rows: &'r [SplitRow], gpus: usize, pick: &dyn Fn(&SplitRow) -> bool) -> Option<&'r SplitRow> {
    rows.iter()
        .filter(|r| r.gpus == gpus && r.merge != "native" && r.merge != "workers" && r.bitwise_equal && pick(r))
        .max_by(|a, b| a.speedup.total_cmp(&b.speedup))
}

fn goal(goal: &str, target: f64, row: Option<&SplitRow>, anchor: &str, missing: &str) -> GoalRow {
    GoalRow {
        goal: goal.into(),
        target,
        measured: row.map(|r| r.speedup),
        row: row.map_or_else(
            || missing.to_string(),
            |r| format!("{}, {} GPUs, {}, inputs {}", r.case, r.gpus, r.merge, r.inputs),
        ),
        anchor: anchor.into(),
    }
}

/// Runs the split check; the report, and `false` when a result was not bitwise equal.
pub fn split(cfg: &SplitConfig) -> anyhow::Result<(SplitReport, bool)> {
    let seen = gpumux_cuda::runtime::gpu_count().max(0) as usize;
    let n = cfg.gpus.unwrap_or(seen).min(seen).min(8);
    if n < 2 {
        anyhow::bail!("the split check needs 2 GPUs; the driver sees {seen}");
    }
    let ordinals: Vec<i32> = (0..n as i32).collect();
    let gpus = SplitGpus::open(&ordinals)?;
    let mut rep = SplitReport { links: gpus.links().to_vec(), ..Default::default() };
    for i in 0..gpus.len() {
        if let Some(g) = gpus.gpu(i) {
            rep.gpus.push(format!("{} ({} SMs)", g.summary.name, g.sm_count()));
        }
    }
    println!("split over GPUs {:?}: {}", gpus.ordinals(), rep.gpus.join(", "));
    println!(
        "links from GPU {}: {:?} (Peer: peer access enabled, cuMemcpyPeerAsync goes over NVLink/PCIe directly; Host: staged by the driver through host memory)",
        ordinals[0], rep.links
    );
    let counts: Vec<usize> = [2usize, 4].into_iter().filter(|&c| c <= n).collect();
    let mut ok = true;
    for c in cases(&gpus, cfg)? {
        println!("\n{}", c.name);
        print_header();
        match measure(&gpus, &c, &counts, cfg.reps) {
            Ok((rows, good)) => {
                ok &= good;
                rep.rows.extend(rows);
            }
            Err(e) => {
                println!("  FAILED {}: {e:#}", c.name);
                ok = false;
            }
        }
    }

    println!("\nrefused (never split silently):");
    for (app, index) in [(App::Histogram, 0), (App::Reduction, 1), (App::Bfs, 0)] {
        let w = suite::build(app, suite::Scale::Check, cfg.seed);
        let kernel = w.launches[index].kernel.to_string();
        match SuiteLaunch::new(&gpus, w, index, Splittable::IfChecked) {
            Err(e @ SplitError::Refused { .. }) => {
                println!("  {kernel}: {e}");
                rep.refused.push(RefusedRow { kernel, error: e.to_string() });
            }
            Err(e) => anyhow::bail!("{kernel}: failed for another reason than a refusal: {e}"),
            Ok(_) => {
                println!("  FAILED {kernel}: not refused");
                ok = false;
            }
        }
    }

    let compute = |r: &SplitRow| r.case.contains("compute-bound");
    let memory = |r: &SplitRow| r.case.contains("memory-bound");
    rep.goals = vec![
        goal(
            "compute-bound kernel over 2 GPUs, bitwise equal",
            1.9,
            best(&rep.rows, 2, &compute),
            "Share-a-GPU 1.65x; AMGE (ICS'15) 1.98x on 2 GPUs",
            "not run",
        ),
        goal(
            "memory-bound kernel with a merged output, inputs replicated in the run",
            1.6,
            best(&rep.rows, 2, &|r| memory(r) && r.inputs == "replicated"),
            "-",
            "not run",
        ),
        goal(
            "memory-bound kernel with a merged output, inputs already on every GPU",
            1.6,
            best(&rep.rows, 2, &|r| memory(r) && r.inputs == "resident"),
            "-",
            "not run",
        ),
        goal(
            "4 GPUs: the split (compute-bound)",
            3.6,
            best(&rep.rows, 4, &compute),
            "AMGE (ICS'15) 3.89x on 4 GPUs",
            "not run: fewer than 4 GPUs",
        ),
    ];
    println!(
        "\ngoals (speedup = native kernel on one GPU, end to end / the split end to end, medians of {} runs)",
        cfg.reps
    );
    println!("  {:<72} {:>7} {:>9}  {:<40}  row", "goal", "target", "measured", "anchor");
    for g in &rep.goals {
        let m = g.measured.map_or("-".to_string(), |m| format!("{m:.2}x"));
        let met = match g.measured {
            Some(m) if m >= g.target => "met",
            Some(_) => "NOT met",
            None => "",
        };
        println!("  {:<72} {:>6.1}x {:>9} {:<7} {:<40}  {}", g.goal, g.target, m, met, g.anchor, g.row);
    }
    Ok((rep, ok))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(case: &str, gpus: usize, merge: &str, inputs: &str, speedup: f64, equal: bool) -> SplitRow {
        SplitRow {
            case: case.into(),
            gpus,
            merge: merge.into(),
            inputs: inputs.into(),
            wall_ms: 1.0,
            kernel_ms: 1.0,
            replicate_ms: 0.0,
            copy_back_ms: 0.0,
            merge_ms: 0.0,
            speedup,
            kernel_speedup: speedup,
            link_gb: 0.0,
            bitwise_equal: equal,
            ranges: Vec::new(),
        }
    }

    #[test]
    fn a_goal_takes_the_best_bitwise_equal_split_of_its_kind() {
        let rows = vec![
            row("fma (compute-bound)", 1, "native", "-", 1.0, true),
            row("fma (compute-bound)", 1, "workers", "-", 1.1, true),
            row("fma (compute-bound)", 2, "shadow", "replicated", 1.95, true),
            row("fma (compute-bound)", 2, "slices", "replicated", 2.5, false),
            row("fma (compute-bound)", 4, "slices", "replicated", 3.7, true),
            row("triad (memory-bound)", 2, "slices", "resident", 0.6, true),
            row("triad (memory-bound)", 2, "shadow", "replicated", 0.2, true),
        ];
        let compute = |r: &SplitRow| r.case.contains("compute-bound");
        // A row that differs from the one-GPU run never counts, however fast.
        assert_eq!(best(&rows, 2, &compute).map(|r| r.merge.as_str()), Some("shadow"));
        assert_eq!(best(&rows, 4, &compute).map(|r| r.speedup), Some(3.7));
        let resident = |r: &SplitRow| r.case.contains("memory-bound") && r.inputs == "resident";
        assert_eq!(best(&rows, 2, &resident).map(|r| r.speedup), Some(0.6));
        assert!(best(&rows, 8, &compute).is_none());
        let g = goal("g", 1.9, best(&rows, 2, &compute), "a", "not run");
        assert_eq!(g.measured, Some(1.95));
        assert_eq!(g.row, "fma (compute-bound), 2 GPUs, shadow, inputs replicated");
        assert_eq!(goal("g", 3.6, None, "a", "not run: fewer than 4 GPUs").row, "not run: fewer than 4 GPUs");
    }
}
