//! The real work behind an engine operation of a client, bound by operation
//! id before the engine may start it (the engine's commands name the
//! operation; the device looks its work up).

/// A kernel of a loaded client module ([`ClientDevice::load_module`](super::ClientDevice::load_module)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelHandle(pub u64);

/// A host address a copy reads or writes: memory the caller registered
/// ([`ClientDevice::register_host`](super::ClientDevice::register_host)) and
/// keeps mapped while the operation is bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostPtr(pub *mut u8);

// SAFETY: a plain address; the binder guarantees it stays valid (ClientDevice::bind).
unsafe impl Send for HostPtr {}

/// One operation's work.
#[derive(Clone, Debug)]
pub enum ClientWork {
    /// A launch: `grid` × `block`, dynamic shared memory, one byte string per
    /// parameter (device addresses already resolved).
    Kernel {
        /// The kernel.
        kernel: KernelHandle,
        /// Grid, blocks.
        grid: [u32; 3],
        /// Block, threads.
        block: [u32; 3],
        /// Dynamic shared memory per block, bytes.
        shared_bytes: u32,
        /// The parameters' bytes, in order.
        params: Vec<Vec<u8>>,
    },
    /// Host to device.
    ToDevice {
        /// Destination.
        dst: u64,
        /// Source.
        src: HostPtr,
        /// How many bytes.
        bytes: u64,
    },
    /// Device to host.
    ToHost {
        /// Source.
        src: u64,
        /// Destination.
        dst: HostPtr,
        /// How many bytes.
        bytes: u64,
    },
    /// Device to device.
    DeviceCopy {
        /// Source.
        src: u64,
        /// Destination.
        dst: u64,
        /// How many bytes.
        bytes: u64,
    },
    /// Fill with a byte.
    Memset {
        /// Destination.
        dst: u64,
        /// The byte.
        value: u8,
        /// How many bytes.
        bytes: u64,
    },
    /// Fill with a 16- or 32-bit word (`cuMemsetD16`, `cuMemsetD32`).
    Fill {
        /// Destination, aligned to `width`.
        dst: u64,
        /// The word (its low 16 bits for `width` 2).
        value: u32,
        /// Bytes a word: 2 or 4.
        width: u8,
        /// How many bytes, a multiple of `width`.
        bytes: u64,
    },
    /// A pitched copy (`cuMemcpy2DAsync`): `height` rows of `width` bytes;
    /// host to device, device to host or device to device.
    Copy2D {
        /// Where the rows are read.
        src: PitchedSide,
        /// Where they are written.
        dst: PitchedSide,
        /// Bytes a row, at most either pitch.
        width: u64,
        /// Rows.
        height: u64,
    },
}

/// One side of a [`ClientWork::Copy2D`]: its first row and the bytes from
/// one row's start to the next's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PitchedSide {
    /// Device memory.
    Device {
        /// The first row.
        addr: u64,
        /// Bytes between row starts.
        pitch: u64,
    },
    /// Registered host memory, as [`ClientWork::ToDevice`]'s source.
    Host {
        /// The first row.
        ptr: HostPtr,
        /// Bytes between row starts.
        pitch: u64,
    },
}

impl ClientWork {
    /// The copy stream a copy goes on (`None` for a kernel): host to
    /// device, device to host, or on the device ([`ClientWork::Copy2D`] by
    /// its host side).
    pub fn copy_lane(&self) -> Option<CopyLane> {
        Some(match self {
            ClientWork::ToDevice { .. } => CopyLane::HostToDevice,
            ClientWork::ToHost { .. } => CopyLane::DeviceToHost,
            ClientWork::Copy2D { src: PitchedSide::Host { .. }, .. } => CopyLane::HostToDevice,
            ClientWork::Copy2D { dst: PitchedSide::Host { .. }, .. } => CopyLane::DeviceToHost,
            ClientWork::Copy2D { .. }
            | ClientWork::DeviceCopy { .. }
            | ClientWork::Memset { .. }
            | ClientWork::Fill { .. } => CopyLane::OnDevice,
            ClientWork::Kernel { .. } => return None,
        })
    }

    /// The bytes a copy moves or writes (0 for a kernel; saturating).
    pub fn copy_bytes(&self) -> u64 {
        match self {
            ClientWork::ToDevice { bytes, .. }
            | ClientWork::ToHost { bytes, .. }
            | ClientWork::DeviceCopy { bytes, .. }
            | ClientWork::Memset { bytes, .. }
            | ClientWork::Fill { bytes, .. } => *bytes,
            ClientWork::Copy2D { width, height, .. } => width.saturating_mul(*height),
            ClientWork::Kernel { .. } => 0,
        }
    }
}

/// Which of the device's copy streams a copy goes on: one per direction,
/// so that a copy up and a copy down move at once (each direction has its
/// own copy engine), and one for work on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyLane {
    /// Host to device.
    HostToDevice = 0,
    /// Device to host.
    DeviceToHost = 1,
    /// Device to device, memsets and fills.
    OnDevice = 2,
}

/// CUDA's grid limit per dimension (x, y, z), the same on every GPU since
/// compute capability 3.0 (the CUDA C Programming Guide's "Technical
/// Specifications" table). A kernel run as written (hardware priority) is
/// launched with the client's grid, so a y of 65,536 fails in `cuLaunchKernel`.
pub const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65_535, 65_535];
/// CUDA's block limit per dimension (x, y, z); the total is at most 1,024
/// threads and the kernel's own `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`.
pub const MAX_BLOCK: [u32; 3] = [1024, 1024, 64];
/// The most blocks one launch may have: the workers claim linearised block
/// indices in 31 bits (`cuda/prelude.cuh`), one value of which is kept for
/// "none left".
pub const MAX_LAUNCH_BLOCKS: u64 = (u32::MAX / 2 - 1) as u64;

/// Checks a launch's grid and block against [`MAX_GRID`], [`MAX_BLOCK`] and
/// [`MAX_LAUNCH_BLOCKS`]: the shape every device accepts (the daemon checks it
/// before binding, whatever its device; the CUDA device checks it again as its
/// own guard). Returns the linearised block count and the threads per block,
/// or what is wrong, in words.
pub fn check_launch_shape(grid: [u32; 3], block: [u32; 3]) -> Result<(u64, u64), String> {
    const AXES: [&str; 3] = ["x", "y", "z"];
    if grid.contains(&0) || block.contains(&0) {
        return Err(format!("grid {grid:?} and block {block:?} must be at least 1 in every dimension"));
    }
    for i in 0..3 {
        if grid[i] > MAX_GRID[i] {
            return Err(format!(
                "a grid {} of {} blocks is over CUDA's limit of {} (grid {grid:?})",
                AXES[i], grid[i], MAX_GRID[i]
            ));
        }
        if block[i] > MAX_BLOCK[i] {
            return Err(format!(
                "a block {} of {} threads is over CUDA's limit of {} (block {block:?})",
                AXES[i], block[i], MAX_BLOCK[i]
            ));
        }
    }
    let blocks = grid.iter().map(|&g| g as u64).product::<u64>();
    if blocks > MAX_LAUNCH_BLOCKS {
        return Err(format!(
            "a grid of {blocks} blocks (grid {grid:?}) is over the limit of {MAX_LAUNCH_BLOCKS} blocks a launch may have"
        ));
    }
    Ok((blocks, block.iter().map(|&b| b as u64).product::<u64>()))
}

/// Why a binding was refused (the daemon checks the same before binding;
/// this is the device's own guard).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BindError {
    /// No loaded kernel has this handle (it was unloaded, or the context was rebuilt).
    #[error("no loaded kernel {0:?} (unloaded, or lost with the context)")]
    UnknownKernel(KernelHandle),
    /// Arguments that do not match the kernel's parameters.
    #[error("kernel `{kernel}` takes parameters of {want:?} bytes, the launch gives {got:?}")]
    Params {
        /// The kernel.
        kernel: String,
        /// Its parameters' sizes.
        want: Vec<u32>,
        /// The arguments' sizes.
        got: Vec<u32>,
    },
    /// A launch shape the kernel cannot run with.
    #[error("kernel `{kernel}` cannot run {what}")]
    Shape {
        /// The kernel.
        kernel: String,
        /// What is wrong (`1024 threads per block (at most 512)`).
        what: String,
    },
    /// The operation is bound already.
    #[error("operation {0} is bound already")]
    Twice(u64),
    /// No kernel is bound to the operation.
    #[error("no kernel is bound to operation {0}")]
    NotBound(u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_shapes_at_cudas_limits_pass_and_one_past_them_fail() {
        assert_eq!(check_launch_shape([1, 1, 1], [1, 1, 1]), Ok((1, 1)));
        assert_eq!(check_launch_shape([1, 65_535, 1], [1024, 1, 1]), Ok((65_535, 1024)));
        assert_eq!(check_launch_shape([1, 1, 65_535], [1, 1, 64]), Ok((65_535, 64)));
        assert_eq!(check_launch_shape([MAX_LAUNCH_BLOCKS as u32, 1, 1], [32, 1, 1]), Ok((MAX_LAUNCH_BLOCKS, 32)));
        // Issue 36's case 0: the second stopped the daemon, the first ran nothing and synced clean.
        for (grid, block, says) in [
            ([1, 70_000, 1], [32, 1, 1], "grid y of 70000 blocks is over CUDA's limit of 65535"),
            ([i32::MAX as u32, 1, 1], [32, 1, 1], "over the limit of 2147483646 blocks"),
            ([1, 1, 65_536], [1, 1, 1], "grid z of 65536"),
            ([i32::MAX as u32 + 1, 1, 1], [1, 1, 1], "grid x of 2147483648"),
            ([1, 1, 1], [1025, 1, 1], "block x of 1025 threads"),
            ([1, 1, 1], [1, 1, 65], "block z of 65 threads"),
            ([65_535, 65_535, 1], [1, 1, 1], "over the limit of"),
            ([0, 1, 1], [1, 1, 1], "at least 1"),
            ([1, 1, 1], [1, 0, 1], "at least 1"),
        ] {
            let e = check_launch_shape(grid, block).expect_err("over a limit");
            assert!(e.contains(says), "{grid:?} {block:?}: {e}");
        }
    }
}
