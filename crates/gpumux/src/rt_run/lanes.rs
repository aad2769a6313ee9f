//! A lane: one task's connection to gpumuxd on one GPU (pinned there, at the task's
//! priority), with its buffers, its pinned host memory and the work kernel. A task holds a
//! lane per GPU it may use; copies and launches of a subtask go through the lane of the GPU
//! the arbiter granted.

use anyhow::{anyhow, Context, Result};
use gpumux_client::{Arg, Buffer, Client, ConnectOptions, HostBuffer, Kernel, LaunchConfig, StreamId};
use std::path::Path;

/// The kernel every GPU subtask runs (`work.cu`).
pub const KERNEL_SOURCE: &str = include_str!("work.cu");
/// Threads per block of the work kernel.
pub const BLOCK_THREADS: u32 = 256;
/// Blocks per SM of a whole kernel: two waves of 8 resident 256-thread blocks on an H100 or
/// H200 (and on their simulated presets), so half the kernel is one wave on each GPU.
pub const BLOCKS_PER_SM: u32 = 16;
/// On a simulated device, which computes nothing, a block takes this long per iteration
/// (the launch's `block_time_ns`); a real GPU ignores it.
pub const SIM_NS_PER_ITER: u64 = 64;
/// The largest copy, bytes: a subtask that moves more copies this many bytes several times.
pub const MAX_PIECE: u64 = 32 << 20;

/// One connection to one GPU (module doc).
pub struct Lane {
    /// The daemon's GPU index.
    pub gpu: usize,
    client: Client,
    kernel: Kernel,
    input: Buffer,
    output: Buffer,
    up: HostBuffer,
    down: HostBuffer,
    /// Blocks of a whole kernel.
    pub grid: u32,
}

impl Lane {
    /// Connects to `socket` pinned to `gpu` at gpumuxd `priority`, with copies of up to
    /// `piece` bytes each way and a kernel of `grid` blocks (0: from this GPU's SMs).
    pub fn open(socket: &Path, name: &str, gpu: usize, priority: i32, piece: u64, grid: u32) -> Result<Lane> {
        let options = ConnectOptions {
            socket: Some(socket.to_path_buf()),
            priority,
            gpu: Some(gpu as u32),
            // Copies go straight from pinned host buffers: no staging region needed.
            shm_bytes: 0,
            ..ConnectOptions::named(name)
        };
        let client = Client::connect(options).with_context(|| format!("{name}: connecting to gpumuxd on GPU {gpu}"))?;
        let grid = if grid > 0 { grid } else { client.welcome().sms.max(1) * BLOCKS_PER_SM };
        let module = client
            .load_module("rt_work.cu", KERNEL_SOURCE, &[])
            .with_context(|| format!("{name}: loading the work kernel on GPU {gpu}"))?;
        let kernel = module.kernel("rt_work")?;
        let piece = piece.max(4);
        let input = client.alloc(piece).with_context(|| format!("{name}: {piece} bytes on GPU {gpu}"))?;
        let out_bytes = piece.max(u64::from(grid) * 4);
        let output = client.alloc(out_bytes).with_context(|| format!("{name}: {out_bytes} bytes on GPU {gpu}"))?;
        let up = client.alloc_host(piece).with_context(|| format!("{name}: {piece} bytes of pinned host memory"))?;
        let down = client.alloc_host(piece)?;
        let mut lane = Lane { gpu, client, kernel, input, output, up, down, grid };
        lane.warm().with_context(|| format!("{name}: a first launch and copies on GPU {gpu}"))?;
        Ok(lane)
    }

    /// Launches of both shapes and a copy each way at their largest: the first of each pays
    /// for things a job must not (the kernel's first use at a grid size, the pinned memory's
    /// first touch), and would show up as a first job far over its bound, or as a calibration
    /// outlier (on 2 H200s, d531e74 warmed the whole kernel only, and one run's calibration
    /// gave the half kernel 457 µs of fixed cost where others gave 57 µs).
    fn warm(&mut self) -> Result<()> {
        for _ in 0..2 {
            // Both shapes a subtask launches: the whole kernel and one GPU's half of it.
            for blocks in [self.grid, first_half(self.grid)] {
                self.launch(0, 0, blocks, 0)?;
                self.sync()?;
            }
            self.upload(self.piece())?;
            self.download(self.piece())?;
        }
        Ok(())
    }

    /// Whether the device computes nothing (`sim:`): kernels' outputs cannot be checked.
    pub fn simulated(&self) -> bool {
        self.client.is_simulated()
    }

    /// The most bytes one copy can move here.
    pub fn piece(&self) -> u64 {
        self.up.len() as u64
    }

    /// Copies `bytes` of the pinned host buffer to the device; returns when done.
    pub fn upload(&self, bytes: u64) -> Result<()> {
        let n = self.clamp(bytes);
        self.client
            .copy_to_device(&self.input, 0, &self.up.as_slice()[..n], StreamId::DEFAULT)
            .with_context(|| format!("copying {n} bytes to GPU {}", self.gpu))
    }

    /// Copies the first `bytes` of the output buffer to the pinned host buffer; returns when
    /// done. [`Lane::downloaded_word`] reads them.
    pub fn download(&mut self, bytes: u64) -> Result<()> {
        let n = self.clamp(bytes);
        let gpu = self.gpu;
        self.client
            .copy_to_host(&self.output, 0, &mut self.down.as_mut_slice()[..n], StreamId::DEFAULT)
            .with_context(|| format!("copying {n} bytes from GPU {gpu}"))
    }

    fn clamp(&self, bytes: u64) -> usize {
        bytes.clamp(4, self.piece()) as usize
    }

    /// Launches blocks `[first, first + blocks)` of the work kernel, `iters` iterations per
    /// thread, stamping `stamp`; [`Lane::sync`] waits for it.
    pub fn launch(&self, iters: u32, first: u32, blocks: u32, stamp: u32) -> Result<()> {
        let config = LaunchConfig::new([blocks.max(1), 1, 1], [BLOCK_THREADS, 1, 1])
            .block_time_ns((u64::from(iters) * SIM_NS_PER_ITER).max(1));
        let args = [Arg::buffer(&self.output), iters.into(), first.into(), stamp.into()];
        self.client.launch(&self.kernel, &config, &args).with_context(|| format!("launching on GPU {}", self.gpu))
    }

    /// Waits for this lane's work.
    pub fn sync(&self) -> Result<()> {
        self.client.sync(StreamId::DEFAULT).with_context(|| format!("waiting for GPU {}", self.gpu))
    }

    /// Word `w` of the last download (`None` past it).
    pub fn downloaded_word(&self, w: usize, downloaded: u64) -> Option<u32> {
        let end = self.clamp(downloaded);
        let at = w.checked_mul(4)?;
        let bytes = self.down.as_slice().get(at..at + 4).filter(|_| at + 4 <= end)?;
        Some(u32::from_le_bytes(bytes.try_into().ok()?))
    }
}

/// Blocks of a whole kernel that the first GPU of a two-GPU launch runs.
pub fn first_half(grid: u32) -> u32 {
    grid / 2
}

/// The GPU count a daemon serves (asked once with a probe connection).
pub fn gpu_count(socket: &Path) -> Result<(usize, gpumux_client::Welcome)> {
    let options =
        ConnectOptions { socket: Some(socket.to_path_buf()), shm_bytes: 0, ..ConnectOptions::named("rt-probe") };
    let c = Client::connect(options).with_context(|| format!("connecting to gpumuxd at {}", socket.display()))?;
    let status = c.status().context("asking gpumuxd for its GPUs")?;
    let welcome = c.welcome().clone();
    let n = status.gpus.len().max(1);
    c.close().map_err(|e| anyhow!("closing the probe connection: {e}"))?;
    Ok((n, welcome))
}
