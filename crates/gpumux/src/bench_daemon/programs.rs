//! The programs experiment (issue 35): whole programs of the shapes that
//! microbenchmarks hide, each checked against a CPU reference, timed natively
//! alone and through gpumuxd.
//!
//! * **chain**: a Needleman-Wunsch wavefront over 256 x 256 tiles of 16 x 16
//!   cells, 511 dependent launches of 1-256 blocks of 16 threads (shared
//!   memory, a barrier per inner diagonal), as the third-party program the
//!   issue measured at 3-4x its native time through the daemon;
//! * **stencil**: 20 launches of a 5-point integer Jacobi step on an
//!   8192 x 8192 grid (about 0.2 ms each on an H100), 16 x 16 blocks through a
//!   shared tile with a halo, ping-pong buffers;
//! * **copy**: 1 GiB uploaded, 1 added to each u32 on the GPU, 1 GiB
//!   downloaded, from host memory of a [`HostMemory`] kind.
//!
//! Each repetition is timed from its first launch (chain, stencil) or copy
//! (copy) to its final sync; what comes before (inputs, the reset of the
//! outputs) and after (the download of a result and its check) is not. A
//! first, untimed repetition warms up what a program's first run pays once:
//! the module, the daemon's block-time measurement of each kernel, host pages.
//!
//! The inputs are made on the GPU from [`hash`] (the copy's on the host), and
//! the references here compute the same integers, so a result must equal its
//! reference bitwise. On a simulated device kernels compute nothing: the
//! check is skipped and says so (the copy still checks that its bytes made
//! the round trip).

use super::gpu::{HostMemory, JobGpu, KArg};
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Tiles per side of the wavefront (2 x 256 - 1 = 511 launches).
pub(super) const CHAIN_TILES: u32 = 256;
/// The wavefront's gap penalty.
const CHAIN_GAP: i32 = 2;
/// Cells per side of the stencil's grid (8192^2 u32: 256 MiB, read and
/// written once a launch, about 0.2 ms on an H100).
const STENCIL_N: u32 = 8192;
/// The stencil's side with `--quick`: a simulated device simulates each
/// block, and 20 launches of 262,144 blocks cost it about a second of CPU a
/// repetition.
const STENCIL_N_QUICK: u32 = 2048;
/// Launches of the stencil.
const STENCIL_STEPS: u32 = 20;
/// The stencil's inputs are below this, so 8 of them sum within 32 bits.
const STENCIL_MAX: u32 = 1 << 20;
/// Seeds of the inputs.
const SEED_SIM: u32 = 0x5eed_0001;
const SEED_GRID: u32 = 0x5eed_0002;
const SEED_COPY: u32 = 0x5eed_0003;
/// Block time the simulated device assumes of each kernel, ns (a real GPU
/// ignores it; gpumuxd measures its own): a wavefront tile, a stencil block
/// (0.2 ms over 248 waves of 132 x 8 blocks), an `add_one` block (16 KiB
/// read and written), the init kernels'.
const TILE_NS: u64 = 2_000;
const JACOBI_NS: u64 = 800;
const ADD_ONE_NS: u64 = 11_000;
const INIT_NS: u64 = 5_000;
/// Grid of the grid-stride kernels that make inputs.
const INIT_BLOCKS: u32 = 1024;
/// u32s each `add_one` thread adds to.
const ADD_ONE_PER_THREAD: u64 = 16;

/// One program (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "program", rename_all = "snake_case")]
pub enum Program {
    /// The wavefront of dependent short launches over `tiles` x `tiles`
    /// tiles (2 x `tiles` - 1 launches).
    Chain { tiles: u32 },
    /// The barrier stencil on an `n` x `n` grid.
    Stencil { n: u32 },
    /// `bytes` each way around a kernel, from host memory `host`.
    Copy { host: HostMemory, bytes: u64 },
}

/// A program as `gpumux bench daemon --programs` names it: a copy is both
/// of its host memories.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProgramKind {
    /// [`Program::Chain`].
    Chain,
    /// [`Program::Stencil`].
    Stencil,
    /// [`Program::Copy`], from every host memory.
    Copy,
}

impl Program {
    /// Which of `--programs` it is.
    pub fn kind(self) -> ProgramKind {
        match self {
            Program::Chain { .. } => ProgramKind::Chain,
            Program::Stencil { .. } => ProgramKind::Stencil,
            Program::Copy { .. } => ProgramKind::Copy,
        }
    }

    /// Its name in tables: `chain`, `stencil`, `copy, pinned`.
    pub fn name(self) -> String {
        match self {
            Program::Chain { .. } => "chain".into(),
            Program::Stencil { .. } => "stencil".into(),
            Program::Copy { host, .. } => format!("copy, {}", host.name()),
        }
    }

    /// What it does, for the table's legend.
    pub fn describe(self) -> String {
        match self {
            Program::Chain { tiles: t } => format!(
                "chain: a Needleman-Wunsch wavefront over {t} x {t} tiles of 16 x 16 cells ({c} x {c} i32), \
                 {l} dependent launches of 1-{t} blocks of 16 threads (shared memory, a barrier per inner diagonal), one sync",
                c = t * 16,
                l = 2 * t - 1
            ),
            Program::Stencil { n } => format!(
                "stencil: {STENCIL_STEPS} launches of a 5-point integer Jacobi step on {n} x {n} u32, \
                 16 x 16 blocks through a shared tile with a halo, ping-pong buffers, one sync"
            ),
            Program::Copy { bytes, .. } => format!(
                "copy: {} host to device, 1 added to each u32 on the GPU, the same back; a sync after each \
                 step (GB/s = 10^9 bytes/s each way); pageable: a Vec; pinned: cuMemHostAlloc natively, \
                 a HostBuffer (Client::alloc_host) through gpumuxd",
                size(bytes)
            ),
        }
    }
}

/// `1 GiB`, `64 MiB`, `4 KiB`, `12 bytes`.
pub(super) fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

/// The programs' sizes where they are options.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub stencil_n: u32,
    pub copy_bytes: u64,
}

impl Sizes {
    /// The full sizes, or `--quick`'s smaller stencil; the copy's from
    /// `--program-copy-mib` (which `--quick` caps already).
    pub fn new(quick: bool, copy_mib: u64) -> Sizes {
        Sizes { stencil_n: if quick { STENCIL_N_QUICK } else { STENCIL_N }, copy_bytes: copy_mib << 20 }
    }
}

/// The programs of the native rows: the copy from both kinds of host memory.
pub fn native_programs(sizes: Sizes) -> Vec<Program> {
    let mut p = vec![Program::Chain { tiles: CHAIN_TILES }, Program::Stencil { n: sizes.stencil_n }];
    p.extend([HostMemory::Pageable, HostMemory::Pinned].map(|host| Program::Copy { host, bytes: sizes.copy_bytes }));
    p
}

/// Host memory the gpumuxd rows copy from: a `Vec` (the client library's
/// staging path) and a `HostBuffer` (`Client::alloc_host`, copied directly).
/// A kind it learns later is one more entry here (and its case in
/// `DaemonGpu::host_alloc`); each row is compared with the native row of the
/// same program and kind.
const DAEMON_HOST_MEMORY: [HostMemory; 2] = [HostMemory::Pageable, HostMemory::Pinned];

/// The programs of the gpumuxd rows.
pub fn daemon_programs(sizes: Sizes) -> Vec<Program> {
    let mut p = vec![Program::Chain { tiles: CHAIN_TILES }, Program::Stencil { n: sizes.stencil_n }];
    p.extend(DAEMON_HOST_MEMORY.map(|host| Program::Copy { host, bytes: sizes.copy_bytes }));
    p
}

/// A program's output against its reference.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", content = "detail", rename_all = "snake_case")]
pub enum Check {
    /// Every repetition's output equals the reference bitwise.
    Ok,
    /// What differed (the first repetition that did).
    Failed(String),
    /// Why there was nothing to compare.
    Skipped(String),
}

impl Check {
    /// Its table cell.
    pub fn cell(&self) -> &'static str {
        match self {
            Check::Ok => "ok",
            Check::Failed(_) => "FAILED",
            Check::Skipped(_) => "skipped",
        }
    }
}

/// What a program job measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProgramResult {
    /// Each timed repetition, first launch or copy to the final sync, ns.
    pub total_ns: Vec<u64>,
    /// Copies: each repetition's upload and download (each with its sync), ns.
    pub upload_ns: Vec<u64>,
    pub download_ns: Vec<u64>,
    /// Copies: bytes each way (0 for the others).
    pub bytes: u64,
    pub check: Check,
}

/// A program's buffers, ready to run.
pub struct Ready {
    program: Program,
    /// Device buffers (by [`JobGpu::alloc`] index) and the host buffer of a copy.
    bufs: Vec<usize>,
    host: Option<usize>,
    /// The device buffer that holds the result (chain, stencil), and its rows' length.
    out: usize,
    width: usize,
    /// The reference (`None` on a simulated device, where nothing is compared).
    want: Option<Vec<u32>>,
}

/// What one repetition measured.
struct Rep {
    total_ns: u64,
    /// (upload, download) of a copy.
    copies_ns: Option<(u64, u64)>,
}

fn grid1(blocks: u32) -> [u32; 3] {
    [blocks, 1, 1]
}
const BLOCK256: [u32; 3] = [256, 1, 1];

/// Buffers, inputs and the reference of `program`, then one untimed
/// repetition (module doc).
pub fn prepare(gpu: &mut dyn JobGpu, program: Program) -> Result<Ready> {
    let sim = gpu.simulated();
    let r = match program {
        Program::Chain { tiles } => {
            if tiles == 0 || tiles > 1 << 10 {
                bail!("a wavefront of {tiles} x {tiles} tiles: expected 1 to 1024 a side (indices in 32 bits)");
            }
            let m = tiles as u64 * 16 + 1;
            let n = m - 1;
            let score = gpu.alloc(m * m * 4)?;
            let sim_buf = gpu.alloc(n * n * 4)?;
            let args =
                [KArg::Buf(sim_buf), KArg::U32(n as u32 * n as u32), KArg::U32(SEED_SIM), KArg::U32(9), KArg::I32(-4)];
            gpu.launch("init_hash", grid1(INIT_BLOCKS), BLOCK256, &args, INIT_NS)?;
            let want = (!sim).then(|| chain_reference(tiles, CHAIN_GAP, SEED_SIM));
            Ready {
                program,
                bufs: vec![score, sim_buf],
                host: None,
                out: score,
                width: m as usize,
                want: want.map(|w| w.into_iter().map(|v| v as u32).collect()),
            }
        }
        Program::Stencil { n } => {
            if n == 0 || n > 1 << 15 {
                bail!("a stencil of {n} x {n}: expected 1 to 32768 cells a side (indices in 32 bits)");
            }
            let cells = n as u64 * n as u64;
            let (a, b) = (gpu.alloc(cells * 4)?, gpu.alloc(cells * 4)?);
            let want = (!sim).then(|| stencil_reference(n, STENCIL_STEPS, SEED_GRID));
            // The result is where the last step wrote.
            let out = if STENCIL_STEPS.is_multiple_of(2) { a } else { b };
            Ready { program, bufs: vec![a, b], host: None, out, width: n as usize, want }
        }
        Program::Copy { host, bytes } => {
            if bytes == 0 || bytes % 4 != 0 {
                bail!("a copy of {bytes} bytes: expected a positive multiple of 4");
            }
            let dev = gpu.alloc(bytes)?;
            let h = gpu.host_alloc(host, bytes)?;
            Ready { program, bufs: vec![dev], host: Some(h), out: dev, width: 0, want: None }
        }
    };
    gpu.sync()?;
    rep(gpu, &r)?;
    Ok(r)
}

/// `reps` timed repetitions of a prepared program, each checked.
pub fn run(gpu: &mut dyn JobGpu, r: Ready, reps: u32) -> Result<ProgramResult> {
    let mut out = ProgramResult {
        total_ns: Vec::new(),
        upload_ns: Vec::new(),
        download_ns: Vec::new(),
        bytes: 0,
        check: Check::Ok,
    };
    if let Program::Copy { bytes, .. } = r.program {
        out.bytes = bytes;
    }
    for i in 0..reps.max(1) {
        let t = rep(gpu, &r)?;
        out.total_ns.push(t.total_ns);
        if let Some((up, down)) = t.copies_ns {
            out.upload_ns.push(up);
            out.download_ns.push(down);
        }
        // The first failure is kept; a skip (the simulated device) stands
        // unless a repetition failed.
        match (&out.check, check(gpu, &r)?) {
            (Check::Failed(_), _) | (_, Check::Ok) => {}
            (_, Check::Failed(why)) => out.check = Check::Failed(format!("repetition {}: {why}", i + 1)),
            (_, skipped) => out.check = skipped,
        }
    }
    Ok(out)
}

/// One repetition: the untimed reset, then the timed program.
fn rep(gpu: &mut dyn JobGpu, r: &Ready) -> Result<Rep> {
    match r.program {
        Program::Chain { tiles } => {
            let (score, sim) = (r.bufs[0], r.bufs[1]);
            gpu.launch(
                "wave_init",
                grid1(INIT_BLOCKS),
                BLOCK256,
                &[KArg::Buf(score), KArg::U32(tiles), KArg::I32(CHAIN_GAP)],
                INIT_NS,
            )?;
            gpu.sync()?;
            let t0 = Instant::now();
            for d in 0..2 * tiles - 1 {
                let width = (d + 1).min(2 * tiles - 1 - d);
                let args = [KArg::Buf(score), KArg::Buf(sim), KArg::U32(tiles), KArg::U32(d), KArg::I32(CHAIN_GAP)];
                gpu.launch("wave_tile", grid1(width), [16, 1, 1], &args, TILE_NS)?;
            }
            gpu.sync()?;
            Ok(Rep { total_ns: t0.elapsed().as_nanos() as u64, copies_ns: None })
        }
        Program::Stencil { n } => {
            let (a, b) = (r.bufs[0], r.bufs[1]);
            let cells = n * n;
            let args = [KArg::Buf(a), KArg::U32(cells), KArg::U32(SEED_GRID), KArg::U32(STENCIL_MAX), KArg::I32(0)];
            gpu.launch("init_hash", grid1(INIT_BLOCKS), BLOCK256, &args, INIT_NS)?;
            // The other buffer holds the last repetition's next-to-last step:
            // a launch that read it before this repetition wrote it must not pass.
            gpu.memset(b, 0xff)?;
            gpu.sync()?;
            let t0 = Instant::now();
            let tiles = n.div_ceil(16);
            for s in 0..STENCIL_STEPS {
                let (out, inp) = if s % 2 == 0 { (b, a) } else { (a, b) };
                gpu.launch(
                    "jacobi_tile",
                    [tiles, tiles, 1],
                    [16, 16, 1],
                    &[KArg::Buf(out), KArg::Buf(inp), KArg::U32(n)],
                    JACOBI_NS,
                )?;
            }
            gpu.sync()?;
            Ok(Rep { total_ns: t0.elapsed().as_nanos() as u64, copies_ns: None })
        }
        Program::Copy { bytes, .. } => {
            let (dev, host) = (r.bufs[0], r.host.unwrap_or_default());
            fill_hashes(gpu.host(host)?, SEED_COPY);
            let words = bytes / 4;
            let blocks = u32::try_from(words.div_ceil(256 * ADD_ONE_PER_THREAD))?.max(1);
            let t0 = Instant::now();
            gpu.upload(dev, host)?;
            gpu.sync()?;
            let t1 = Instant::now();
            gpu.launch("add_one", grid1(blocks), BLOCK256, &[KArg::Buf(dev), KArg::U64(words)], ADD_ONE_NS)?;
            gpu.sync()?;
            let t2 = Instant::now();
            gpu.download_into(dev, host)?;
            gpu.sync()?;
            let t3 = Instant::now();
            let ns = |a: Instant, b: Instant| b.duration_since(a).as_nanos() as u64;
            Ok(Rep { total_ns: ns(t0, t3), copies_ns: Some((ns(t0, t1), ns(t2, t3))) })
        }
    }
}

/// The last repetition's output against the reference.
fn check(gpu: &mut dyn JobGpu, r: &Ready) -> Result<Check> {
    const NOTHING: &str = "the simulated device computes nothing";
    Ok(match r.program {
        Program::Chain { .. } | Program::Stencil { .. } => {
            let Some(want) = &r.want else { return Ok(Check::Skipped(NOTHING.into())) };
            let got = gpu.download(r.out, want.len() as u64 * 4)?;
            compare(&got, |i| want.get(i).copied(), r.width)
        }
        Program::Copy { bytes, .. } => {
            // The kernel adds 1; on a simulated device it adds nothing, and
            // the bytes must still have made the round trip unchanged.
            let sim = gpu.simulated();
            let add = if sim { 0 } else { 1 };
            let got = gpu.host(r.host.unwrap_or_default())?;
            match compare(got, |i| Some(hash(i as u32, SEED_COPY).wrapping_add(add)), 0) {
                Check::Ok if sim => {
                    Check::Skipped(format!("{NOTHING} (the {} made the round trip unchanged)", size(bytes)))
                }
                c => c,
            }
        }
    })
}

/// `got`, little-endian u32s, against `want(i)` for each index: how many
/// differ and the first (as row, column of rows `width` long; 0: as an index).
pub(super) fn compare(got: &[u8], want: impl Fn(usize) -> Option<u32> + Sync, width: usize) -> Check {
    let words = got.len() / 4;
    let per = words.div_ceil(threads()).max(1);
    let (bad, first) = std::thread::scope(|s| {
        let handles: Vec<_> = got
            .chunks(per * 4)
            .enumerate()
            .map(|(c, chunk)| {
                let want = &want;
                s.spawn(move || {
                    let (mut bad, mut first) = (0u64, None);
                    for (k, w) in chunk.chunks_exact(4).enumerate() {
                        let i = c * per + k;
                        let g = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                        let e = want(i);
                        if e != Some(g) {
                            bad += 1;
                            first = first.or(Some((i, g, e)));
                        }
                    }
                    (bad, first)
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).fold((0u64, None), |(b, f), (b2, f2)| (b + b2, f.or(f2)))
    });
    match first {
        None if words > 0 => Check::Ok,
        None => Check::Failed("no output".into()),
        Some((i, g, e)) => {
            let at = match i.checked_div(width) {
                Some(row) => format!("row {row}, column {}", i % width),
                None => format!("word {i}"),
            };
            let e = e.map_or("nothing (past the end)".into(), |e| e.to_string());
            Check::Failed(format!("{bad} of {words} values differ; the first at {at}: {g}, expected {e}"))
        }
    }
}

/// Host threads for the references and checks.
fn threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get()).min(32)
}

/// A 32-bit integer mix of index `i`: `bench_hash` of kernels.cu, bit for bit.
pub fn hash(i: u32, seed: u32) -> u32 {
    let mut x = i.wrapping_mul(0x9e37_79b9).wrapping_add(seed);
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// `init_hash` of kernels.cu: `hash(i, seed) % modulus + offset`, wrapping.
fn init_hash(i: u32, seed: u32, modulus: u32, offset: i32) -> u32 {
    (hash(i, seed) % modulus).wrapping_add(offset as u32)
}

/// Fills `bytes` with little-endian `hash(i, seed)`, word `i` at byte 4i.
pub(super) fn fill_hashes(bytes: &mut [u8], seed: u32) {
    let per = (bytes.len() / 4).div_ceil(threads()).max(1);
    std::thread::scope(|s| {
        for (c, chunk) in bytes.chunks_mut(per * 4).enumerate() {
            s.spawn(move || {
                for (k, w) in chunk.chunks_exact_mut(4).enumerate() {
                    w.copy_from_slice(&hash((c * per + k) as u32, seed).to_le_bytes());
                }
            });
        }
    });
}

/// The wavefront's scores, (tiles * 16 + 1)^2 row major, row by row: the
/// recurrence of `wave_tile` does not depend on the order cells are computed
/// in, as long as each comes after its three neighbours above and left.
pub fn chain_reference(tiles: u32, gap: i32, seed: u32) -> Vec<i32> {
    let n = tiles as usize * 16;
    let m = n + 1;
    let sim: Vec<i32> = (0..n * n).map(|i| init_hash(i as u32, seed, 9, -4) as i32).collect();
    let mut s = vec![0i32; m * m];
    for (c, v) in s[..m].iter_mut().enumerate() {
        *v = -gap * c as i32;
    }
    for r in 1..m {
        s[r * m] = -gap * r as i32;
        for c in 1..m {
            let diag = s[(r - 1) * m + c - 1] + sim[(r - 1) * n + c - 1];
            s[r * m + c] = diag.max((s[(r - 1) * m + c] - gap).max(s[r * m + c - 1] - gap));
        }
    }
    s
}

/// The stencil's grid after `steps` steps of `jacobi_tile` from `init_hash`'s
/// input (values below [`STENCIL_MAX`]), zero outside the grid.
pub fn stencil_reference(n: u32, steps: u32, seed: u32) -> Vec<u32> {
    let n = n as usize;
    let mut a: Vec<u32> = (0..n * n).map(|i| init_hash(i as u32, seed, STENCIL_MAX, 0)).collect();
    let mut b = vec![0u32; n * n];
    let rows = n.div_ceil(threads()).max(1);
    for _ in 0..steps {
        let src = &a;
        std::thread::scope(|s| {
            for (c, chunk) in b.chunks_mut(rows * n).enumerate() {
                s.spawn(move || {
                    for (k, row) in chunk.chunks_mut(n).enumerate() {
                        let y = c * rows + k;
                        for (x, out) in row.iter_mut().enumerate() {
                            let at = |yy: usize, xx: usize| src[yy * n + xx];
                            let up = if y > 0 { at(y - 1, x) } else { 0 };
                            let down = if y + 1 < n { at(y + 1, x) } else { 0 };
                            let left = if x > 0 { at(y, x - 1) } else { 0 };
                            let right = if x + 1 < n { at(y, x + 1) } else { 0 };
                            *out = (4 * at(y, x) + up + down + left + right + 4) >> 3;
                        }
                    }
                });
            }
        });
        std::mem::swap(&mut a, &mut b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One launch of `wave_tile` of kernels.cu on the host, block by block
    /// and inner diagonal by inner diagonal as the GPU runs it (the indexing
    /// of tiles, halos and inner diagonals, which no GPU checks here).
    fn wave_tile(score: &mut [i32], sim: &[i32], tiles: u32, d: u32, gap: i32, blocks: u32) {
        let m = tiles * 16 + 1;
        let lo = if d >= tiles { d - tiles + 1 } else { 0 };
        for block in 0..blocks {
            let (ti, tj) = (lo + block, d - lo - block);
            assert!(ti < tiles && tj < tiles, "tile ({ti}, {tj}) of diagonal {d}");
            let (r0, c0) = (ti * 16, tj * 16);
            let mut s = [[0i32; 17]; 17];
            let mut refs = [[0i32; 16]; 16];
            for tx in 0..16u32 {
                for k in 0..16u32 {
                    refs[k as usize][tx as usize] = sim[((r0 + k) * (m - 1) + c0 + tx) as usize];
                }
                s[0][tx as usize + 1] = score[(r0 * m + c0 + tx + 1) as usize];
                s[tx as usize + 1][0] = score[((r0 + tx + 1) * m + c0) as usize];
            }
            s[0][0] = score[(r0 * m + c0) as usize];
            for k in 0..31u32 {
                for tx in 0..16u32 {
                    if tx <= k && k - tx < 16 {
                        let (r, c) = (tx as usize + 1, (k - tx) as usize + 1);
                        s[r][c] =
                            (s[r - 1][c - 1] + refs[r - 1][c - 1]).max((s[r - 1][c] - gap).max(s[r][c - 1] - gap));
                    }
                }
            }
            for tx in 0..16u32 {
                for k in 0..16u32 {
                    score[((r0 + k + 1) * m + c0 + tx + 1) as usize] = s[k as usize + 1][tx as usize + 1];
                }
            }
        }
    }

    /// `wave_init` of kernels.cu.
    fn wave_init(tiles: u32, gap: i32) -> Vec<i32> {
        let m = tiles as usize * 16 + 1;
        (0..m * m)
            .map(|i| {
                let (r, c) = ((i / m) as i32, (i % m) as i32);
                if r == 0 {
                    -gap * c
                } else if c == 0 {
                    -gap * r
                } else {
                    1 << 30
                }
            })
            .collect()
    }

    fn chain_as_launched(tiles: u32, gap: i32, seed: u32) -> Vec<i32> {
        let sim: Vec<i32> = (0..(tiles * 16).pow(2)).map(|i| init_hash(i, seed, 9, -4) as i32).collect();
        let mut score = wave_init(tiles, gap);
        for d in 0..2 * tiles - 1 {
            wave_tile(&mut score, &sim, tiles, d, gap, (d + 1).min(2 * tiles - 1 - d));
        }
        score
    }

    fn words(b: &[u8]) -> Vec<u32> {
        b.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect()
    }
    fn bytes(w: impl IntoIterator<Item = u32>) -> Vec<u8> {
        w.into_iter().flat_map(u32::to_le_bytes).collect()
    }

    /// A device on the host: each kernel of the programs written again in
    /// Rust from kernels.cu, so the programs' host side (buffers, arguments,
    /// ping-pong, resets, copies, checks) runs end to end here. `skip`
    /// drops the launches of one kernel whose index is in it (a lost launch).
    #[derive(Default)]
    struct HostGpu {
        bufs: Vec<Vec<u8>>,
        hosts: Vec<Vec<u8>>,
        skip: Option<(&'static str, std::ops::Range<u32>)>,
        launched: std::collections::HashMap<String, u32>,
        simulated: bool,
    }

    impl JobGpu for HostGpu {
        fn alloc(&mut self, bytes: u64) -> Result<usize> {
            self.bufs.push(vec![0; bytes as usize]);
            Ok(self.bufs.len() - 1)
        }
        fn launch(&mut self, kernel: &str, grid: [u32; 3], block: [u32; 3], args: &[KArg], _: u64) -> Result<()> {
            let nth = self.launched.entry(kernel.to_owned()).or_default();
            *nth += 1;
            if self.skip.as_ref().is_some_and(|(k, r)| *k == kernel && r.contains(&(*nth - 1))) || self.simulated {
                return Ok(());
            }
            let buf = |i: usize| match args[i] {
                KArg::Buf(b) => b,
                other => panic!("{kernel}: argument {i} is {other:?}, not a buffer"),
            };
            let u = |i: usize| match args[i] {
                KArg::U32(v) => v,
                other => panic!("{kernel}: argument {i} is {other:?}, not a u32"),
            };
            let int = |i: usize| match args[i] {
                KArg::I32(v) => v,
                other => panic!("{kernel}: argument {i} is {other:?}, not an i32"),
            };
            match (kernel, args.len()) {
                ("init_hash", 5) => {
                    let (seed, modulus, offset) = (u(2), u(3), int(4));
                    self.bufs[buf(0)] = bytes((0..u(1)).map(|i| init_hash(i, seed, modulus, offset)));
                }
                ("wave_init", 3) => self.bufs[buf(0)] = bytes(wave_init(u(1), int(2)).into_iter().map(|v| v as u32)),
                ("wave_tile", 5) => {
                    assert_eq!(block, [16, 1, 1]);
                    let mut score: Vec<i32> = words(&self.bufs[buf(0)]).into_iter().map(|v| v as i32).collect();
                    let sim: Vec<i32> = words(&self.bufs[buf(1)]).into_iter().map(|v| v as i32).collect();
                    wave_tile(&mut score, &sim, u(2), u(3), int(4), grid[0]);
                    self.bufs[buf(0)] = bytes(score.into_iter().map(|v| v as u32));
                }
                ("jacobi_tile", 3) => {
                    let n = u(2) as usize;
                    assert_eq!(
                        (grid, block),
                        (
                            [n.div_ceil(16) as u32; 2].into_iter().chain([1]).collect::<Vec<_>>().try_into().unwrap(),
                            [16, 16, 1]
                        )
                    );
                    let a = words(&self.bufs[buf(1)]);
                    let g = |y: isize, x: isize| {
                        if y < 0 || x < 0 || y >= n as isize || x >= n as isize {
                            0
                        } else {
                            a[y as usize * n + x as usize]
                        }
                    };
                    self.bufs[buf(0)] = bytes((0..n * n).map(|i| {
                        let (y, x) = ((i / n) as isize, (i % n) as isize);
                        // u32 arithmetic wraps on the GPU: here too (a debug build checks it).
                        let sum = [g(y - 1, x), g(y + 1, x), g(y, x - 1), g(y, x + 1), 4]
                            .into_iter()
                            .fold(g(y, x).wrapping_mul(4), u32::wrapping_add);
                        sum >> 3
                    }));
                }
                ("add_one", 2) => {
                    let KArg::U64(n) = args[1] else { panic!("add_one: n is {:?}", args[1]) };
                    let b = &mut self.bufs[buf(0)];
                    assert_eq!(b.len() as u64, n * 4);
                    *b = bytes(words(b).into_iter().map(|v| v.wrapping_add(1)));
                }
                other => panic!("no kernel {other:?} in kernels.cu"),
            }
            Ok(())
        }
        fn mark(&mut self) -> Result<()> {
            Ok(())
        }
        fn wait_marks(&mut self, _: usize) -> Result<()> {
            Ok(())
        }
        fn sync(&mut self) -> Result<()> {
            Ok(())
        }
        fn download(&mut self, buf: usize, bytes: u64) -> Result<Vec<u8>> {
            Ok(self.bufs[buf][..bytes as usize].to_vec())
        }
        fn shape(&mut self, _: &str, _: u32) -> Result<(u32, u32)> {
            Ok((1, 1))
        }
        fn simulated(&self) -> bool {
            self.simulated
        }
        fn memset(&mut self, buf: usize, byte: u8) -> Result<()> {
            self.bufs[buf].fill(byte);
            Ok(())
        }
        fn host_alloc(&mut self, _: HostMemory, bytes: u64) -> Result<usize> {
            self.hosts.push(vec![0; bytes as usize]);
            Ok(self.hosts.len() - 1)
        }
        fn host(&mut self, host: usize) -> Result<&mut [u8]> {
            Ok(&mut self.hosts[host])
        }
        fn upload(&mut self, buf: usize, host: usize) -> Result<()> {
            let h = &self.hosts[host];
            self.bufs[buf][..h.len()].copy_from_slice(h);
            Ok(())
        }
        fn download_into(&mut self, buf: usize, host: usize) -> Result<()> {
            let n = self.hosts[host].len();
            self.hosts[host].copy_from_slice(&self.bufs[buf][..n]);
            Ok(())
        }
    }

    /// `program` prepared and run `reps` times on `gpu`.
    fn run_on(gpu: &mut HostGpu, program: Program, reps: u32) -> ProgramResult {
        let ready = prepare(gpu, program).unwrap();
        run(gpu, ready, reps).unwrap()
    }

    #[test]
    fn every_program_passes_its_check_on_a_device_that_computes_what_kernels_cu_says() {
        let copy = Program::Copy { host: HostMemory::Pageable, bytes: 4096 };
        for p in [Program::Chain { tiles: 5 }, Program::Stencil { n: 40 }, copy] {
            let r = run_on(&mut HostGpu::default(), p, 2);
            assert_eq!(r.check, Check::Ok, "{p:?}");
            assert_eq!(r.total_ns.len(), 2, "{p:?}");
        }
        let r = run_on(&mut HostGpu::default(), copy, 3);
        assert_eq!((r.bytes, r.upload_ns.len(), r.download_ns.len()), (4096, 3, 3));
    }

    #[test]
    fn a_lost_or_repeated_launch_fails_the_check_and_says_where() {
        // Diagonal 6 of 9 lost in the first timed repetition (the warm-up is launches 0-8).
        let mut gpu = HostGpu { skip: Some(("wave_tile", 9 + 6..9 + 7)), ..HostGpu::default() };
        let Check::Failed(why) = run_on(&mut gpu, Program::Chain { tiles: 5 }, 2).check else {
            panic!("a lost diagonal passed")
        };
        assert!(why.starts_with("repetition 1: ") && why.contains("values differ; the first at row "), "{why}");
        // The stencil's first step lost: the other buffer's stale 0xff bytes must not pass.
        let mut gpu = HostGpu { skip: Some(("jacobi_tile", 20..21)), ..HostGpu::default() };
        assert!(matches!(run_on(&mut gpu, Program::Stencil { n: 40 }, 1).check, Check::Failed(_)));
        // The copy's kernel lost in the second repetition.
        let mut gpu = HostGpu { skip: Some(("add_one", 2..3)), ..HostGpu::default() };
        let copy = Program::Copy { host: HostMemory::Pageable, bytes: 64 };
        let Check::Failed(why) = run_on(&mut gpu, copy, 2).check else { panic!("a lost add passed") };
        assert!(why.starts_with("repetition 2: 16 of 16 values differ; the first at word 0: "), "{why}");
    }

    #[test]
    fn on_a_simulated_device_the_checks_are_skipped_and_say_why() {
        let copy = Program::Copy { host: HostMemory::Pageable, bytes: 1 << 20 };
        for p in [Program::Chain { tiles: 5 }, Program::Stencil { n: 40 }, copy] {
            let Check::Skipped(why) = run_on(&mut HostGpu { simulated: true, ..HostGpu::default() }, p, 1).check else {
                panic!("{p:?} was not skipped")
            };
            assert!(why.starts_with("the simulated device computes nothing"), "{why}");
        }
        let Check::Skipped(why) = run_on(&mut HostGpu { simulated: true, ..HostGpu::default() }, copy, 1).check else {
            panic!()
        };
        assert!(why.ends_with("(the 1 MiB made the round trip unchanged)"), "{why}");
    }

    #[test]
    fn the_wavefront_as_launched_equals_the_row_by_row_reference() {
        for tiles in [1, 2, 5] {
            let want = chain_reference(tiles, CHAIN_GAP, SEED_SIM);
            assert_eq!(chain_as_launched(tiles, CHAIN_GAP, SEED_SIM), want, "{tiles} tiles");
            assert!(want.iter().all(|&v| v < 1 << 29), "a sentinel survived");
        }
    }

    #[test]
    fn the_wavefront_launches_cover_every_tile_once_in_511_launches_of_1_to_256_blocks() {
        let t = CHAIN_TILES;
        let widths: Vec<u32> = (0..2 * t - 1).map(|d| (d + 1).min(2 * t - 1 - d)).collect();
        assert_eq!(widths.len(), 511);
        assert_eq!((widths.iter().min(), widths.iter().max()), (Some(&1), Some(&256)));
        assert_eq!(widths.iter().sum::<u32>(), t * t);
    }

    #[test]
    fn the_stencil_reference_smooths_with_zero_outside_and_stays_in_range() {
        // One step by hand on a 3 x 3 grid of 8s: the corner sees two
        // neighbours, the edge three, the centre four.
        let n = 3usize;
        let step = |a: &[u32]| -> Vec<u32> {
            (0..n * n)
                .map(|i| {
                    let (y, x) = (i / n, i % n);
                    let g = |yy: isize, xx: isize| {
                        if yy < 0 || xx < 0 || yy >= n as isize || xx >= n as isize {
                            0
                        } else {
                            a[yy as usize * n + xx as usize]
                        }
                    };
                    let (y, x) = (y as isize, x as isize);
                    (4 * g(y, x) + g(y - 1, x) + g(y + 1, x) + g(y, x - 1) + g(y, x + 1) + 4) >> 3
                })
                .collect()
        };
        assert_eq!(step(&[8; 9]), vec![6, 7, 6, 7, 8, 7, 6, 7, 6]);
        // The reference is that step, repeated, from init_hash's input.
        let want = {
            let mut a: Vec<u32> = (0..n * n).map(|i| init_hash(i as u32, 9, STENCIL_MAX, 0)).collect();
            for _ in 0..3 {
                a = step(&a);
            }
            a
        };
        assert_eq!(stencil_reference(n as u32, 3, 9), want);
        assert!(stencil_reference(64, 4, SEED_GRID).iter().all(|&v| v < STENCIL_MAX));
    }

    #[test]
    fn hash_matches_its_reference_values_and_fills_bytes_little_endian() {
        // lowbias32 of 0 is 0; of the golden ratio's first multiple, a fixed value.
        assert_eq!(hash(0, 0), 0);
        assert_eq!(hash(1, 0), hash(0, 0x9e37_79b9));
        let mut b = vec![0u8; 4 * 1000 + 3];
        fill_hashes(&mut b, 7);
        for i in [0usize, 1, 499, 999] {
            assert_eq!(u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap()), hash(i as u32, 7));
        }
        assert_eq!(&b[4000..], &[0, 0, 0], "a partial word is left alone");
        assert_eq!(init_hash(5, 1, 9, -4) as i32, (hash(5, 1) % 9) as i32 - 4);
    }

    #[test]
    fn compare_counts_differences_and_names_the_first() {
        let want: Vec<u32> = (0..100).collect();
        let mut got: Vec<u8> = want.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(compare(&got, |i| want.get(i).copied(), 10), Check::Ok);
        got[4 * 23] = 99;
        got[4 * 71] = 0;
        let Check::Failed(why) = compare(&got, |i| want.get(i).copied(), 10) else { panic!("no failure") };
        assert_eq!(why, "2 of 100 values differ; the first at row 2, column 3: 99, expected 23");
        let Check::Failed(why) = compare(&got[..8], |_| Some(7), 0) else { panic!("no failure") };
        assert!(why.starts_with("2 of 2 values differ; the first at word 0: 0, expected 7"), "{why}");
        assert_eq!(compare(&[], |_| Some(0), 0), Check::Failed("no output".into()));
    }

    #[test]
    fn programs_round_trip_through_json_and_every_daemon_row_has_its_native_row() {
        let sizes = Sizes::new(false, 1024);
        let all = native_programs(sizes);
        let text = serde_json::to_string(&all).unwrap();
        let back: Vec<Program> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, all);
        for p in daemon_programs(sizes) {
            assert!(all.contains(&p), "{p:?}");
        }
        assert_eq!(Program::Copy { host: HostMemory::Pinned, bytes: 1 << 30 }.name(), "copy, pinned");
        assert!(Program::Copy { host: HostMemory::Pageable, bytes: 1 << 30 }.describe().starts_with("copy: 1 GiB"));
        assert_eq!(size(64 << 20), "64 MiB");
    }
}
