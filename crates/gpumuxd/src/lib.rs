//! gpumuxd: real processes share a real GPU through gpumux (docs/daemon.md).
//!
//! One daemon owns one device or several (a CUDA context each, or the
//! simulator), an engine with a policy per device, and a Unix socket. Clients speak `gpumux-proto`.
//!
//! * [`config`]: who may connect and with which limits (TOML).
//! * [`conn`]: one connection's bytes → requests, with no I/O (what the
//!   reader thread, the tests and the fuzz target all drive).
//! * [`server`]: the socket, `SO_PEERCRED`, one reader and one writer thread per client.
//! * [`outbox`]: a client's way out, shared by the core (which writes into an
//!   open ring directly) and its writer thread.
//! * [`core`]: the one thread that owns the engine, the backend and every
//!   client's state; requests come to it over a channel. One per GPU.
//! * [`gpus`]: several GPUs, one core each; each connection routed to one.
//! * [`placement`]: which GPU a client goes to (least loaded, most free memory, or its pin).
//! * [`session`]: a client's state in the core (buffers, modules, streams, events, quota use).
//! * [`backend`]: what the daemon needs of a device; the simulated and the CUDA
//!   one, in this process or behind [`backend::remote`] in a child process.
//! * [`device_host`]: that child process (`gpumuxd --device-host`).
//! * [`shm`]: a client's shared-memory region.
//! * [`heap`]: the heap gives memory back after a burst of connections.
//! * [`recording`]: the lines `gpumuxd --record` writes (`gpumux replay` reads them).
//! * [`validate`]: the checks every request field passes before use.
//! * [`harness`]: the request path in-process (property tests, fuzzing).
//! * [`daemon`]: the options and [`run`], what `gpumuxd` and `gpumux daemon` call.
//! * [`cli`]: the command line both of them parse.

#![warn(missing_docs)]

pub mod backend;
pub mod cli;
pub mod config;
pub mod conn;
pub mod core;
pub mod daemon;
pub mod device_host;
mod fdpass;
pub mod gpus;
pub mod harness;
pub mod heap;
pub mod latency;
pub mod load;
pub mod outbox;
pub mod placement;
pub mod recording;
pub mod server;
pub mod session;
pub mod shm;
pub mod spin;
pub mod validate;

pub use daemon::{run, DeviceHosting, Options};
