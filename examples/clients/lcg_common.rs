//! What the two LCG examples (stream_pipeline, event_timing) share: their
//! arguments, their input, and the CPU reference of `kernels/lcg.cu`.
//! native_lcg.py makes the same input and runs the same kernel with CuPy.

use std::path::PathBuf;

/// The command line both take.
pub struct Args {
    pub socket: Option<PathBuf>,
    pub out: Option<PathBuf>,
    pub check: bool,
    pub chunks: usize,
    /// Elements (u32) a chunk.
    pub chunk_elems: usize,
    pub iters: u32,
    /// Host memory from a `Vec` instead of `alloc_host` (`cudaMallocHost`).
    pub pageable: bool,
    /// Timed repetitions, after one untimed.
    pub repeat: usize,
    /// `LCG_TIMING=old`: time as fe4d877 did (see [`Args::parse`]).
    pub old_timing: bool,
}

pub const USAGE: &str =
    "[--socket PATH] [--out FILE] [--check] [--chunks N] [--chunk-mib M] [--iters K] [--pageable] [--repeat R]";

impl Args {
    /// Parses the command line; the defaults size a chunk's kernel near its
    /// copies on an H100 (16 chunks of 16 MiB, 2048 steps an element) and
    /// time 7 repetitions. `LCG_TIMING=old` in the environment restores the
    /// timing of fe4d877 and earlier for an A/B in one build (native_lcg.py
    /// reads it too): a warm-up of one chunk instead of one whole untimed
    /// repetition, and stream_pipeline zeroing its host output after the
    /// device's sync instead of before it (the daemon's threads then idle
    /// through that fill just before the timed pipeline starts).
    pub fn parse() -> Result<Args, String> {
        let mut a = Args {
            socket: None,
            out: None,
            check: false,
            chunks: 16,
            chunk_elems: 4 << 20,
            iters: 2048,
            pageable: false,
            repeat: 7,
            old_timing: match std::env::var("LCG_TIMING").as_deref() {
                Ok("old") => true,
                Ok("new") | Err(std::env::VarError::NotPresent) => false,
                Ok(other) => return Err(format!("LCG_TIMING={other:?}: \"old\" or \"new\" (the default)")),
                Err(e) => return Err(format!("LCG_TIMING: {e}")),
            },
        };
        let mut args = std::env::args().skip(1);
        let number = |name: &str, v: Option<String>| -> Result<usize, String> {
            v.and_then(|s| s.parse::<usize>().ok()).filter(|&n| n > 0).ok_or(format!("{name} needs a number > 0"))
        };
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--socket" => a.socket = Some(PathBuf::from(args.next().ok_or("--socket needs a path")?)),
                "--out" => a.out = Some(PathBuf::from(args.next().ok_or("--out needs a file")?)),
                "--check" => a.check = true,
                "--pageable" => a.pageable = true,
                "--chunks" => a.chunks = number("--chunks", args.next())?,
                "--chunk-mib" => a.chunk_elems = number("--chunk-mib", args.next())? << 18,
                "--iters" => a.iters = u32::try_from(number("--iters", args.next())?).map_err(|e| e.to_string())?,
                "--repeat" => a.repeat = number("--repeat", args.next())?,
                other => return Err(format!("unknown argument {other:?} ({USAGE})")),
            }
        }
        if a.chunks * a.chunk_elems > i32::MAX as usize {
            return Err("more than 2^31 elements in all".into());
        }
        Ok(a)
    }
}

/// Element `i` of the input: a multiplicative hash, so every chunk differs.
pub fn input(n: usize) -> Vec<u8> {
    (0..n as u64).flat_map(|i| (i.wrapping_mul(2_654_435_761) as u32).to_le_bytes()).collect()
}

/// The kernel's `iters` steps as one affine map x ↦ a·x + c (mod 2^32): the
/// CPU checks every element with one multiply-add instead of `iters`.
pub fn lcg_map(iters: u32) -> (u32, u32) {
    (0..iters).fold((1u32, 0u32), |(a, c), _| {
        (a.wrapping_mul(1_664_525), c.wrapping_mul(1_664_525).wrapping_add(1_013_904_223))
    })
}

/// The first element of `out` (little-endian u32s) that is not the kernel
/// of `input` with `iters` steps, if any.
pub fn first_wrong(input: &[u8], out: &[u8], iters: u32) -> Option<usize> {
    let (a, c) = lcg_map(iters);
    input.chunks_exact(4).zip(out.chunks_exact(4)).position(|(x, y)| {
        let x = u32::from_le_bytes([x[0], x[1], x[2], x[3]]);
        u32::from_le_bytes([y[0], y[1], y[2], y[3]]) != a.wrapping_mul(x).wrapping_add(c)
    })
}

/// Host memory of `bytes`: pinned by the daemon (`alloc_host`, as
/// `cudaMallocHost`), or a plain `Vec` with `pageable`.
pub fn host_memory(
    client: &gpumux_client::Client,
    bytes: usize,
    pageable: bool,
) -> gpumux_client::Result<Box<dyn std::ops::DerefMut<Target = [u8]>>> {
    Ok(if pageable { Box::new(vec![0u8; bytes]) } else { Box::new(client.alloc_host(bytes as u64)?) })
}

/// The median of `v` (sorted in place; the upper one of an even count).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `v` as `a,b,c` (ms, 3 decimals), in the order measured: the GPU check
/// pools every repetition of every run (scripts/pipeline-times.py).
pub fn list(v: &[f64]) -> String {
    v.iter().map(|x| format!("{x:.3}")).collect::<Vec<_>>().join(",")
}
