//! Checks on a client's request fields, before anything is used: handles
//! belong to the client, offsets and sizes lie inside their buffer (checked
//! arithmetic), launch shapes and arguments make sense.

use crate::backend::{DevAddr, KernelImage};
use crate::session::Session;
use gpumux_cuda::client::check_launch_shape;
use gpumux_engine::kernel::DeviceInfo;
use gpumux_proto::{Arg, BufferSlice, ErrorKind, ErrorReply, HostSlice, Launch, MAX_ARGS, MAX_PARAM_BYTES};

/// The longest block time a launch may claim for the simulator (one minute):
/// keeps every simulated duration far from overflow.
pub const MAX_BLOCK_TIME_NS: u64 = 60_000_000_000;
/// Block time of a simulated kernel whose launch names none.
pub const DEFAULT_BLOCK_TIME_NS: u64 = 10_000;

/// An error of `kind` with `message`.
pub fn err(kind: ErrorKind, message: impl Into<String>) -> ErrorReply {
    ErrorReply::new(kind, message)
}

/// The device address of `bytes` bytes (> 0) from `slice`, if that span lies
/// inside one of the client's buffers.
pub fn device_span(s: &Session, slice: BufferSlice, bytes: u64) -> Result<DevAddr, ErrorReply> {
    if bytes == 0 {
        return Err(err(ErrorKind::Invalid, "a size of 0 bytes"));
    }
    let b = s.buffers.get(&slice.buffer).ok_or_else(|| {
        err(ErrorKind::NoSuchHandle, format!("buffer {} is not yours (or was freed)", slice.buffer.0))
    })?;
    match slice.offset.checked_add(bytes) {
        Some(end) if end <= b.bytes => Ok(b.addr + slice.offset),
        _ => Err(err(
            ErrorKind::OutOfRange,
            format!(
                "{bytes} bytes at offset {} do not fit in buffer {} of {} bytes",
                slice.offset, slice.buffer.0, b.bytes
            ),
        )),
    }
}

/// Checks that `[offset, offset + bytes)` lies in the client's shared region.
pub fn shm_span(s: &Session, offset: u64, bytes: u64) -> Result<std::sync::Arc<crate::shm::ShmRegion>, ErrorReply> {
    let r = s.region.as_ref().ok_or_else(|| err(ErrorKind::Invalid, "no shared region attached (AttachShm first)"))?;
    if !r.contains(offset, bytes) {
        return Err(err(
            ErrorKind::OutOfRange,
            format!("{bytes} bytes at offset {offset} do not fit in the shared region of {} bytes", r.len()),
        ));
    }
    Ok(r.clone())
}

/// The host region of `bytes` bytes (> 0) from `slice`, if that span lies
/// inside one of the client's host regions (`AttachHost`).
pub fn host_span(
    s: &Session,
    slice: HostSlice,
    bytes: u64,
) -> Result<std::sync::Arc<crate::shm::ShmRegion>, ErrorReply> {
    if bytes == 0 {
        return Err(err(ErrorKind::Invalid, "a size of 0 bytes"));
    }
    let r = s.host_regions.get(&slice.region).ok_or_else(|| {
        err(ErrorKind::NoSuchHandle, format!("host region {} is not yours (or was detached)", slice.region.0))
    })?;
    if !r.contains(slice.offset, bytes) {
        return Err(err(
            ErrorKind::OutOfRange,
            format!(
                "{bytes} bytes at offset {} do not fit in host region {} of {} bytes",
                slice.offset,
                slice.region.0,
                r.len()
            ),
        ));
    }
    Ok(r.clone())
}

/// A launch that passed every check.
pub struct CheckedLaunch {
    /// Blocks of the linearised grid.
    pub blocks: u64,
    /// Threads per block.
    pub threads: u32,
    /// Static plus dynamic shared memory per block.
    pub smem: u32,
    /// Each parameter's bytes, buffers resolved to addresses.
    pub params: Vec<Vec<u8>>,
    /// Simulated block time.
    pub block_time_ns: u64,
}

/// Checks a launch of `image` against the device and the client's handles.
pub fn launch(s: &Session, image: &KernelImage, device: &DeviceInfo, l: &Launch) -> Result<CheckedLaunch, ErrorReply> {
    let invalid = |m: String| err(ErrorKind::Invalid, m);
    // CUDA's grid and block limits, whatever the device: a launch the GPU
    // would refuse is refused here, before it is bound, on the simulated
    // device too (issue 36, case 0: one stopped the daemon, one ran nothing
    // and synced clean).
    let (blocks, threads) = check_launch_shape(l.grid, l.block).map_err(&invalid)?;
    let max_threads = image.max_threads_per_block.min(1024) as u64;
    if threads > max_threads {
        return Err(invalid(format!("a block of {threads} threads is over `{}`'s limit of {max_threads}", image.name)));
    }
    if l.shared_bytes > image.max_dynamic_smem {
        return Err(invalid(format!(
            "{} bytes of dynamic shared memory are over `{}`'s limit of {} (CUDA's default without an opt-in \
             is 48 KiB less the kernel's static shared memory)",
            l.shared_bytes, image.name, image.max_dynamic_smem
        )));
    }
    let smem =
        image.static_smem.checked_add(l.shared_bytes).filter(|&m| m <= device.sm.smem_bytes).ok_or_else(|| {
            invalid(format!(
                "{} bytes of dynamic plus {} of static shared memory are over the SM's {} bytes",
                l.shared_bytes, image.static_smem, device.sm.smem_bytes
            ))
        })?;
    if l.args.len() > MAX_ARGS {
        return Err(invalid(format!("{} arguments, over the limit of {MAX_ARGS}", l.args.len())));
    }
    let total: usize = l.args.iter().map(Arg::size).sum();
    if total > MAX_PARAM_BYTES {
        return Err(invalid(format!("{total} bytes of arguments, over the limit of {MAX_PARAM_BYTES}")));
    }
    if let Some(sizes) = &image.param_sizes {
        let given: Vec<u32> = l.args.iter().map(|a| a.size() as u32).collect();
        if &given != sizes {
            return Err(invalid(format!(
                "`{}` takes parameters of {sizes:?} bytes, the launch gives {given:?}",
                image.name
            )));
        }
    }
    let mut params = Vec::with_capacity(l.args.len());
    for (i, a) in l.args.iter().enumerate() {
        params.push(match a {
            Arg::Buffer(slice) => {
                let b = s.buffers.get(&slice.buffer).ok_or_else(|| {
                    err(
                        ErrorKind::NoSuchHandle,
                        format!("argument {i}: buffer {} is not yours (or was freed)", slice.buffer.0),
                    )
                })?;
                if slice.offset >= b.bytes {
                    return Err(err(
                        ErrorKind::OutOfRange,
                        format!(
                            "argument {i}: offset {} is past the end of buffer {} ({} bytes)",
                            slice.offset, slice.buffer.0, b.bytes
                        ),
                    ));
                }
                (b.addr + slice.offset).to_le_bytes().to_vec()
            }
            Arg::I32(v) => v.to_le_bytes().to_vec(),
            Arg::U32(v) => v.to_le_bytes().to_vec(),
            Arg::I64(v) => v.to_le_bytes().to_vec(),
            Arg::U64(v) => v.to_le_bytes().to_vec(),
            Arg::F32(v) => v.to_le_bytes().to_vec(),
            Arg::F64(v) => v.to_le_bytes().to_vec(),
            Arg::Bytes(b) => b.clone(),
        });
    }
    let block_time_ns = l.block_time_ns.unwrap_or(DEFAULT_BLOCK_TIME_NS);
    if block_time_ns > MAX_BLOCK_TIME_NS {
        return Err(invalid(format!("a block time of {block_time_ns} ns is over the limit of {MAX_BLOCK_TIME_NS} ns")));
    }
    Ok(CheckedLaunch { blocks, threads: threads as u32, smem, params, block_time_ns })
}
