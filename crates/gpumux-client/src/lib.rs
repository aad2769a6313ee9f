//! Talk to gpumuxd: allocate device memory, copy data, load CUDA C modules,
//! launch kernels, and order work with streams and events, sharing one GPU
//! with every other client of the daemon (docs/daemon.md).
//!
//! This crate links no CUDA: a client needs no GPU driver and makes no CUDA
//! context. It speaks [`gpumux_proto`] over the daemon's Unix socket, and
//! moves bulk data through a sealed memfd it shares with the daemon, or,
//! for [`HostBuffer`]s ([`Client::alloc_host`]), straight between the
//! caller's memory and the device.
//!
//! ```no_run
//! use gpumux_client::{Arg, Client, ConnectOptions, LaunchConfig, StreamId};
//! # fn main() -> gpumux_client::Result<()> {
//! let client = Client::connect(ConnectOptions::named("example"))?;
//! let n = 1024u32;
//! let x = client.alloc(u64::from(n) * 4)?;
//! client.copy_to_device(&x, 0, &vec![0u8; n as usize * 4], StreamId::DEFAULT)?;
//! let module = client.load_module("scale.cu", "extern \"C\" __global__ void scale(float* x, int n) {\
//!     int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2.0f; }", &[])?;
//! let scale = module.kernel("scale")?;
//! client.launch(&scale, &LaunchConfig::for_threads(n, 256), &[Arg::buffer(&x), (n as i32).into()])?;
//! client.sync(StreamId::DEFAULT)?;
//! # Ok(()) }
//! ```
//!
//! The C ABI (`libgpumux_client.so`, `include/gpumux.h`) wraps the same calls.
//!
//! Environment (both APIs): `GPUMUX_SOCKET`, the daemon's socket when none is
//! given; `GPUMUX_SPIN_US`, how long the library's reader thread and a call
//! waiting for its answer poll before they sleep, in µs (default 100, and
//! 5,000 for a client of priority above 0, whose requests a few ms apart then
//! find its threads awake; docs/daemon.md, "Latency and the CPU it costs");
//! `GPUMUX_COPY_THREADS`, the threads that move a copy's bytes through the
//! shared region (default: half the hardware threads, at most 4;
//! [`ConnectOptions::copy_threads`]); `GPUMUX_COPY_THREADS_BESIDE`, how many
//! of them a copy takes while the daemon says other clients are busy
//! (default 2, 0: all; [`ConnectOptions::copy_threads_beside`]);
//! `GPUMUX_COPY_NICE`, those threads' nice value (default 10, 0: the
//! caller's); `GPUMUX_COPY_SLOTS`, the slots the shared region is cut into
//! (default: [`slots_for`]). The last two are for comparisons (issue 35).

#![warn(missing_docs)]

mod chunk;
mod client;
mod conn;
mod copier;
mod error;
pub mod ffi;
mod handles;
mod host;
mod reply_ring;
mod runtime_calls;
mod shm;
mod streaming;

pub use client::{
    Client, ConnectOptions, Event, CLASS_ENV, DEFAULT_SHM_BYTES, DEFAULT_SHM_MAX_BYTES, DEFAULT_WAIT_FOR_DAEMON,
    GPU_ENV, SOCKET_ENV, WAIT_ENV,
};
pub use copier::{CopyStats, DEFAULT_BESIDE_THREADS};
pub use error::{ClientError, Result};
pub use gpumux_proto::{
    printable_name, ClientClass, ClientStatus, DeviceProperties, ErrorKind, GpuStatus, HostRegionId, Limits, LostWork,
    Notice, Split, SplitMerge, Splittable, Status, StreamId, Welcome,
};
pub use handles::{Arg, Buffer, Kernel, LaunchConfig, Module};
pub use host::HostBuffer;
pub use runtime_calls::Pitched;

#[doc(hidden)]
pub use chunk::{plan as plan_chunks, slots_for, Chunk};
#[doc(hidden)]
pub use copier::{Copier, Toward};
