//! The benchmark kernel suite: CUDA C sources written for gpumux, each app
//! described as buffers + a fixed sequence of launches, with a CPU reference.
//! Nothing here touches a GPU: the runtime turns a [`Workload`] into launches.

mod apps;
mod multi;
mod reference;

pub use apps::{build, build_sized, build_with, KMEANS_K};
pub use multi::{cpu_cost, outputs_from_bytes, sequence_outputs, sequence_workload, Sequence, SequenceError};

use serde::Serialize;

/// The suite's applications.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum App {
    /// STREAM triad (memory-bound).
    Triad,
    /// Batched tiled transpose, 3-D grid (memory-bound, shared memory).
    Transpose,
    /// CSR SpMV, warp per row (memory-bound, irregular).
    Spmv,
    /// Tiled SGEMM (compute-bound, shared memory).
    Sgemm,
    /// All-pairs n-body (compute-bound).
    Nbody,
    /// 256-bin byte histogram (atomics).
    Histogram,
    /// 5-point stencil, ping-pong, helpers read blockIdx (shared memory).
    Stencil,
    /// Two-kernel sum reduction, dynamic shared memory.
    Reduction,
    /// BFS level steps (irregular, many launches).
    Bfs,
    /// k-means iterations (multi-kernel application).
    Kmeans,
}

impl App {
    /// Every app, in the order tables list them.
    pub const ALL: [App; 10] = [
        App::Triad,
        App::Transpose,
        App::Spmv,
        App::Sgemm,
        App::Nbody,
        App::Histogram,
        App::Stencil,
        App::Reduction,
        App::Bfs,
        App::Kmeans,
    ];

    /// The app's name in workload files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            App::Triad => "triad",
            App::Transpose => "transpose",
            App::Spmv => "spmv",
            App::Sgemm => "sgemm",
            App::Nbody => "nbody",
            App::Histogram => "histogram",
            App::Stencil => "stencil",
            App::Reduction => "reduction",
            App::Bfs => "bfs",
            App::Kmeans => "kmeans",
        }
    }

    /// The app named `s`, if any.
    pub fn from_name(s: &str) -> Option<App> {
        App::ALL.into_iter().find(|a| a.name() == s)
    }

    /// One line on what the app is and what it stresses (for `--help`).
    pub fn summary(self) -> &'static str {
        match self {
            App::Triad => "STREAM triad (memory-bound)",
            App::Transpose => "Batched tiled transpose, 3-D grid (memory-bound, shared memory)",
            App::Spmv => "CSR SpMV, warp per row (memory-bound, irregular)",
            App::Sgemm => "Tiled SGEMM (compute-bound, shared memory)",
            App::Nbody => "All-pairs n-body (compute-bound)",
            App::Histogram => "256-bin byte histogram (atomics)",
            App::Stencil => "5-point stencil, ping-pong, helpers read blockIdx (shared memory)",
            App::Reduction => "Two-kernel sum reduction, dynamic shared memory",
            App::Bfs => "BFS level steps (irregular, many launches)",
            App::Kmeans => "k-means iterations (multi-kernel application)",
        }
    }

    /// The app's CUDA C source.
    pub fn source(self) -> &'static str {
        match self {
            App::Triad => include_str!("../../cuda/suite/triad.cu"),
            App::Transpose => include_str!("../../cuda/suite/transpose.cu"),
            App::Spmv => include_str!("../../cuda/suite/spmv.cu"),
            App::Sgemm => include_str!("../../cuda/suite/sgemm.cu"),
            App::Nbody => include_str!("../../cuda/suite/nbody.cu"),
            App::Histogram => include_str!("../../cuda/suite/histogram.cu"),
            App::Stencil => include_str!("../../cuda/suite/stencil.cu"),
            App::Reduction => include_str!("../../cuda/suite/reduction.cu"),
            App::Bfs => include_str!("../../cuda/suite/bfs.cu"),
            App::Kmeans => include_str!("../../cuda/suite/kmeans.cu"),
        }
    }
}

/// A name that is not one of the suite's apps.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown suite app `{0}`; the suite has: {apps}", apps = App::ALL.map(App::name).join(", "))]
pub struct UnknownApp(pub String);

impl std::str::FromStr for App {
    type Err = UnknownApp;

    fn from_str(s: &str) -> Result<App, UnknownApp> {
        App::from_name(s).ok_or_else(|| UnknownApp(s.to_string()))
    }
}

/// Source of the preemption benchmark's `spin` and `probe` kernels.
pub const SYNTHETIC_SOURCE: &str = include_str!("../../cuda/suite/synthetic.cu");

/// Every CUDA source of the suite, by name (for compile tests).
pub fn all_sources() -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<_> = App::ALL.iter().map(|a| (a.name(), a.source())).collect();
    v.push(("synthetic", SYNTHETIC_SOURCE));
    v
}

/// How big to make a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Scale {
    /// Small enough for a CPU reference in well under a second.
    Check,
    /// Fills an H100 for roughly 10-50 ms per run of the workload.
    Bench,
}

/// A buffer's contents on the host, by element type.
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    /// 32-bit floats.
    F32(Vec<f32>),
    /// 32-bit unsigned integers.
    U32(Vec<u32>),
}

impl HostData {
    /// Bytes the data takes on the GPU.
    pub fn byte_len(&self) -> usize {
        match self {
            HostData::F32(v) => v.len() * 4,
            HostData::U32(v) => v.len() * 4,
        }
    }

    /// Little-endian bytes, as the GPU holds them.
    pub fn to_bytes(&self) -> Vec<u8> {
        match self {
            HostData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    /// Reads bytes back as the same element type as `self`.
    pub fn like_from_bytes(&self, b: &[u8]) -> HostData {
        let words = b.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
        match self {
            HostData::F32(_) => HostData::F32(words.map(f32::from_le_bytes).collect()),
            HostData::U32(_) => HostData::U32(words.map(u32::from_le_bytes).collect()),
        }
    }
}

/// How a buffer starts every run.
#[derive(Clone, Debug, PartialEq)]
pub enum Init {
    /// Input: these contents.
    Data(HostData),
    /// Output: every byte 0xFF (NaN for floats), so unwritten elements show.
    Poison {
        /// The buffer's size.
        bytes: usize,
    },
    /// Accumulator that the kernels expect at zero.
    Zero {
        /// The buffer's size.
        bytes: usize,
    },
}

impl Init {
    /// The buffer's size in bytes.
    pub fn byte_len(&self) -> usize {
        match self {
            Init::Data(d) => d.byte_len(),
            Init::Poison { bytes } | Init::Zero { bytes } => *bytes,
        }
    }
}

/// One buffer of a workload.
#[derive(Clone, Debug, PartialEq)]
pub struct BufferSpec {
    /// Its name in the app's source and in messages (`cent`).
    pub name: &'static str,
    /// What it holds when a run starts.
    pub init: Init,
}

/// One kernel argument.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    /// The device address of buffer `i` of the workload.
    Buf(usize),
    /// A 32-bit unsigned value.
    U32(u32),
    /// A 32-bit signed value.
    I32(i32),
    /// A 32-bit float.
    F32(f32),
    /// A 64-bit unsigned value.
    U64(u64),
}

/// One kernel launch of a workload.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchSpec {
    /// The kernel's (`extern "C"`) name in the app's source.
    pub kernel: &'static str,
    /// Blocks, x y z.
    pub grid: [u32; 3],
    /// Threads per block, x y z.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes.
    pub shared_bytes: u32,
    /// The kernel's arguments, in order.
    pub args: Vec<Arg>,
}

impl LaunchSpec {
    /// Blocks of the grid.
    pub fn blocks(&self) -> u64 {
        self.grid.iter().map(|&g| g as u64).product()
    }
}

/// How an output is compared with its reference.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Tolerance {
    /// Bitwise equal.
    Exact,
    /// ‖out − ref‖₂ / ‖ref‖₂ at most this (floats only; NaN never passes).
    RelL2(f64),
    /// At most this fraction of the elements differ (bitwise); for labels
    /// that a CPU reference in other precision may put on the other side of a tie.
    Mismatches(f64),
}

/// A buffer whose contents a run is judged by.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputSpec {
    /// Index into the workload's buffers.
    pub buffer: usize,
    /// Against the CPU reference (the GPU-vs-GPU comparison is always bitwise).
    pub tolerance: Tolerance,
}

/// One app at one size: what to allocate, what to launch, what to check.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The app.
    pub app: App,
    /// Its main dimension ([`App::default_size`] says which).
    pub size: u64,
    /// Buffers, in the order launches name them.
    pub buffers: Vec<BufferSpec>,
    /// Launches, in the order they run.
    pub launches: Vec<LaunchSpec>,
    /// What a run is judged by.
    pub outputs: Vec<OutputSpec>,
    /// Some(how) when the GPU-vs-GPU comparison cannot be bitwise.
    pub nondeterministic: Option<&'static str>,
}

impl Workload {
    /// Expected contents of each of `outputs`, computed on the CPU.
    pub fn reference(&self) -> Vec<HostData> {
        reference::compute(self)
    }

    /// Blocks of all its launches together.
    pub fn total_blocks(&self) -> u64 {
        self.launches.iter().map(LaunchSpec::blocks).sum()
    }

    /// An empty [`HostData`] of buffer `buffer`'s element type (outputs that
    /// start poisoned or zeroed hold `u32` for histogram bins and kmeans
    /// labels, `f32` otherwise).
    pub fn element_like(&self, buffer: usize) -> HostData {
        match self.buffers.get(buffer).map(|b| (b.name, &b.init)) {
            Some((_, Init::Data(HostData::U32(_)))) => HostData::U32(Vec::new()),
            Some((_, Init::Data(HostData::F32(_)))) => HostData::F32(Vec::new()),
            Some((name, _))
                if (self.app, name) == (App::Histogram, "hist") || (self.app, name) == (App::Kmeans, "label") =>
            {
                HostData::U32(Vec::new())
            }
            _ => HostData::F32(Vec::new()),
        }
    }
}

/// Compares `got` with `want`; Err says where and by how much.
pub fn compare(got: &HostData, want: &HostData, tol: Tolerance) -> Result<(), String> {
    if let Tolerance::Mismatches(t) = tol {
        let (g, w) = match (got, want) {
            (HostData::U32(g), HostData::U32(w)) => (g.clone(), w.clone()),
            (HostData::F32(g), HostData::F32(w)) => (
                g.iter().map(|x| x.to_bits()).collect::<Vec<u32>>(),
                w.iter().map(|x| x.to_bits()).collect::<Vec<u32>>(),
            ),
            _ => return Err("element types differ".into()),
        };
        if g.len() != w.len() {
            return Err(format!("length {} != {}", g.len(), w.len()));
        }
        let bad = g.iter().zip(&w).filter(|(a, b)| a != b).count();
        if bad as f64 <= t * g.len() as f64 {
            return Ok(());
        }
        let i = g.iter().zip(&w).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!("{bad} of {} elements differ (at most {t:.1e} of them may), the first at {i}", g.len()));
    }
    match (got, want) {
        (HostData::U32(g), HostData::U32(w)) => {
            if g.len() != w.len() {
                return Err(format!("length {} != {}", g.len(), w.len()));
            }
            match g.iter().zip(w).position(|(a, b)| a != b) {
                None => Ok(()),
                Some(i) => Err(format!("element {i}: got {} want {}", g[i], w[i])),
            }
        }
        (HostData::F32(g), HostData::F32(w)) => {
            if g.len() != w.len() {
                return Err(format!("length {} != {}", g.len(), w.len()));
            }
            if let Some(i) = g.iter().position(|x| x.is_nan()) {
                return Err(format!("element {i} is NaN (unwritten or invalid)"));
            }
            match tol {
                Tolerance::Exact => match g.iter().zip(w).position(|(a, b)| a.to_bits() != b.to_bits()) {
                    None => Ok(()),
                    Some(i) => Err(format!("element {i}: got {} want {} (bitwise)", g[i], w[i])),
                },
                // Handled above, for both element types.
                Tolerance::Mismatches(_) => Ok(()),
                Tolerance::RelL2(t) => {
                    let (mut num, mut den) = (0f64, 0f64);
                    for (a, b) in g.iter().zip(w) {
                        num += (*a as f64 - *b as f64).powi(2);
                        den += (*b as f64).powi(2);
                    }
                    let rel = if den == 0.0 { num.sqrt() } else { (num / den).sqrt() };
                    if rel <= t {
                        Ok(())
                    } else {
                        Err(format!("relative L2 error {rel:.3e} above {t:.1e}"))
                    }
                }
            }
        }
        _ => Err("element types differ".into()),
    }
}

/// Deterministic pseudo-random numbers (xorshift64*), so inputs need no extra crate.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// The next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in [0, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [0, n) (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}
