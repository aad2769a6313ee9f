//! What a client holds: buffers, modules and kernels, kernel arguments, and
//! a launch's shape.

use crate::error::{ClientError, Result};
use gpumux_proto::{BufferId, BufferSlice, KernelEntry, KernelId, ModuleId, StreamId, MAX_ARGS, MAX_PARAM_BYTES};

/// A device buffer of this client: an opaque handle and its size. Freed with
/// [`crate::Client::free`] (or when the client disconnects). `repr(C)` so the
/// C ABI passes the same value. `Default` names no buffer (handle 0): a
/// placeholder for out-parameters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Buffer {
    pub(crate) handle: u64,
    pub(crate) bytes: u64,
}

impl Buffer {
    /// Its size, bytes.
    pub fn len(&self) -> u64 {
        self.bytes
    }

    /// Never true: the daemon allocates no empty buffer.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The protocol's name for it.
    pub fn id(&self) -> BufferId {
        BufferId(self.handle)
    }

    /// `[offset, offset + bytes)` of it, checked to lie inside.
    pub(crate) fn slice(&self, offset: u64, bytes: u64, what: &str) -> Result<BufferSlice> {
        if offset.checked_add(bytes).is_none_or(|end| end > self.bytes) {
            return Err(ClientError::Invalid(format!(
                "{what} of {bytes} bytes at offset {offset} runs past the end of a buffer of {} bytes",
                self.bytes
            )));
        }
        Ok(BufferSlice { buffer: self.id(), offset })
    }
}

/// A kernel of a loaded module, ready to launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    pub(crate) id: KernelId,
    pub(crate) name: String,
    pub(crate) param_sizes: Option<Vec<u32>>,
}

impl Kernel {
    /// Its name in the source.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its parameter sizes in bytes, where the daemon knows them.
    pub fn param_sizes(&self) -> Option<&[u32]> {
        self.param_sizes.as_deref()
    }

    /// The protocol's name for it.
    pub fn id(&self) -> KernelId {
        self.id
    }
}

/// A module the daemon compiled for this client.
#[derive(Clone, Debug)]
pub struct Module {
    pub(crate) id: ModuleId,
    pub(crate) name: String,
    pub(crate) kernels: Vec<Kernel>,
    pub(crate) log: String,
    pub(crate) cached: bool,
}

impl Module {
    pub(crate) fn new(id: ModuleId, name: String, entries: Vec<KernelEntry>, log: String, cached: bool) -> Module {
        let kernels =
            entries.into_iter().map(|e| Kernel { id: e.kernel, name: e.name, param_sizes: e.param_sizes }).collect();
        Module { id, name, kernels, log, cached }
    }

    /// The kernel named `name`, or an error listing the module's kernels.
    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        self.kernel_ref(name).cloned()
    }

    /// As [`Module::kernel`], borrowed (the C ABI hands out pointers into the module).
    pub(crate) fn kernel_ref(&self, name: &str) -> Result<&Kernel> {
        self.kernels.iter().find(|k| k.name == name).ok_or_else(|| ClientError::NoSuchKernel {
            module: self.name.clone(),
            name: name.to_owned(),
            available: self.kernels.iter().map(|k| k.name.clone()).collect(),
        })
    }

    /// Its kernels.
    pub fn kernels(&self) -> &[Kernel] {
        &self.kernels
    }

    /// The name it was loaded with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The compiler's warnings, if any.
    pub fn log(&self) -> &str {
        &self.log
    }

    /// Whether the daemon had it compiled already (same source and options).
    pub fn cached(&self) -> bool {
        self.cached
    }

    /// The protocol's name for it.
    pub fn id(&self) -> ModuleId {
        self.id
    }
}

/// A kernel argument: a buffer (plus offset), a number, or raw bytes.
///
/// `Arg::buffer(&buf)`, `Arg::from(n)` for `i32`/`u32`/`i64`/`u64`/`f32`/`f64`
/// (so `n.into()`), `Arg::bytes(..)` for a struct passed by value.
#[derive(Clone, Debug, PartialEq)]
pub struct Arg(pub(crate) gpumux_proto::Arg);

impl Arg {
    /// A pointer to the start of `buffer`.
    pub fn buffer(buffer: &Buffer) -> Arg {
        Arg::buffer_at(buffer, 0)
    }

    /// A pointer `offset` bytes into `buffer` (the daemon checks it lies inside).
    pub fn buffer_at(buffer: &Buffer, offset: u64) -> Arg {
        Arg(gpumux_proto::Arg::Buffer(BufferSlice { buffer: buffer.id(), offset }))
    }

    /// Bytes laid out as the kernel's parameter expects (a struct by value).
    pub fn bytes(bytes: impl Into<Vec<u8>>) -> Arg {
        Arg(gpumux_proto::Arg::Bytes(bytes.into()))
    }

    /// Bytes it takes in the kernel's parameter block.
    pub fn size(&self) -> usize {
        self.0.size()
    }

    /// The protocol's form.
    pub fn as_proto(&self) -> &gpumux_proto::Arg {
        &self.0
    }
}

macro_rules! arg_from {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for Arg {
            fn from(x: $t) -> Arg {
                Arg(gpumux_proto::Arg::$v(x))
            }
        }
    )*};
}
arg_from!(i32 => I32, u32 => U32, i64 => I64, u64 => U64, f32 => F32, f64 => F64);

/// Checks `args` against `kernel`'s parameters before anything is sent, so
/// a mismatch names the argument instead of corrupting a launch.
pub(crate) fn check_args(kernel: &Kernel, args: &[Arg]) -> Result<()> {
    let name = &kernel.name;
    if args.len() > MAX_ARGS {
        return Err(ClientError::Invalid(format!("{name}: {} arguments, at most {MAX_ARGS} are allowed", args.len())));
    }
    let total: usize = args.iter().map(Arg::size).sum();
    if total > MAX_PARAM_BYTES {
        return Err(ClientError::Invalid(format!(
            "{name}: the arguments take {total} bytes, more than CUDA's {MAX_PARAM_BYTES}"
        )));
    }
    let Some(sizes) = &kernel.param_sizes else { return Ok(()) };
    if sizes.len() != args.len() {
        return Err(ClientError::Invalid(format!(
            "{name} takes {} parameters, {} arguments were given",
            sizes.len(),
            args.len()
        )));
    }
    for (i, (arg, &want)) in args.iter().zip(sizes).enumerate() {
        if arg.size() != want as usize {
            return Err(ClientError::Invalid(format!(
                "argument {} of {name} is {} bytes ({:?}), the kernel's parameter is {want} bytes",
                i + 1,
                arg.size(),
                arg.0
            )));
        }
    }
    Ok(())
}

/// A launch's shape and stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Grid, in blocks, x y z.
    pub grid: [u32; 3],
    /// Block, in threads, x y z (at most 1024 in all).
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes.
    pub shared_bytes: u32,
    /// The stream it is ordered on.
    pub stream: StreamId,
    /// How long one block takes on a simulated device (which computes
    /// nothing and takes this time instead); a real GPU ignores it.
    pub block_time_ns: Option<u64>,
}

impl LaunchConfig {
    /// `grid` blocks of `block` threads, no dynamic shared memory, stream 0.
    pub fn new(grid: [u32; 3], block: [u32; 3]) -> LaunchConfig {
        LaunchConfig { grid, block, shared_bytes: 0, stream: StreamId::DEFAULT, block_time_ns: None }
    }

    /// A 1-D launch: enough blocks of `block` threads to cover `n` threads.
    pub fn for_threads(n: u32, block: u32) -> LaunchConfig {
        LaunchConfig::new([n.div_ceil(block.max(1)).max(1), 1, 1], [block, 1, 1])
    }

    /// With `bytes` of dynamic shared memory per block.
    pub fn shared_bytes(mut self, bytes: u32) -> LaunchConfig {
        self.shared_bytes = bytes;
        self
    }

    /// On `stream`.
    pub fn stream(mut self, stream: StreamId) -> LaunchConfig {
        self.stream = stream;
        self
    }

    /// With a block-time hint for a simulated device.
    pub fn block_time_ns(mut self, ns: u64) -> LaunchConfig {
        self.block_time_ns = Some(ns);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(sizes: Option<Vec<u32>>) -> Kernel {
        Kernel { id: KernelId(1), name: "vector_add".into(), param_sizes: sizes }
    }

    #[test]
    fn args_pack_as_the_kernel_expects() {
        let buf = Buffer { handle: 9, bytes: 64 };
        let args = [Arg::buffer(&buf), Arg::buffer_at(&buf, 16), Arg::from(3i32), 2.5f32.into(), Arg::from(7u64)];
        assert_eq!(args.iter().map(Arg::size).collect::<Vec<_>>(), vec![8, 8, 4, 4, 8]);
        assert_eq!(args[1].0, gpumux_proto::Arg::Buffer(BufferSlice { buffer: BufferId(9), offset: 16 }));
        assert_eq!(args[3].0, gpumux_proto::Arg::F32(2.5));
        assert!(check_args(&kernel(Some(vec![8, 8, 4, 4, 8])), &args).is_ok());
        assert!(check_args(&kernel(None), &args).is_ok(), "unknown parameter sizes are the daemon's to check");
    }

    #[test]
    fn a_mismatch_names_the_argument() {
        let buf = Buffer { handle: 9, bytes: 64 };
        let k = kernel(Some(vec![8, 8, 8, 4]));
        let wrong_count = check_args(&k, &[Arg::buffer(&buf)]).unwrap_err().to_string();
        assert_eq!(wrong_count, "vector_add takes 4 parameters, 1 arguments were given");
        let args = [Arg::buffer(&buf), Arg::buffer(&buf), Arg::buffer(&buf), Arg::from(4u64)];
        let wrong_size = check_args(&k, &args).unwrap_err().to_string();
        assert!(wrong_size.starts_with("argument 4 of vector_add is 8 bytes (U64(4))"), "{wrong_size}");
    }

    #[test]
    fn too_many_parameter_bytes_are_refused_before_sending() {
        let args = [Arg::bytes(vec![0u8; MAX_PARAM_BYTES]), Arg::from(1u32)];
        let e = check_args(&kernel(None), &args).unwrap_err().to_string();
        assert!(e.contains("more than CUDA's 32764"), "{e}");
    }

    #[test]
    fn a_slice_past_the_end_is_refused() {
        let buf = Buffer { handle: 1, bytes: 100 };
        assert_eq!(buf.slice(90, 10, "copy").unwrap(), BufferSlice { buffer: BufferId(1), offset: 90 });
        let e = buf.slice(90, 11, "copy").unwrap_err().to_string();
        assert_eq!(e, "copy of 11 bytes at offset 90 runs past the end of a buffer of 100 bytes");
        assert!(buf.slice(u64::MAX, 2, "copy").is_err(), "overflow is out of range, not a wrap");
    }

    #[test]
    fn for_threads_covers_every_thread() {
        assert_eq!(LaunchConfig::for_threads(1000, 256).grid, [4, 1, 1]);
        assert_eq!(LaunchConfig::for_threads(0, 256).grid, [1, 1, 1]);
    }
}
