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
}
