//! Receiving bytes with the descriptors sent alongside them (`SCM_RIGHTS`):
//! the one `recvmsg` both the client sockets (`server.rs`) and the device
//! process's socket pair (`backend/link.rs`) read with.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Descriptors taken from one read; more in one message are closed by the kernel.
const MAX_FDS_PER_READ: usize = 4;

/// One `recvmsg` on `sock` into `buf` (retried if a signal interrupts it);
/// the descriptors that came with the bytes are appended to `fds`, owned, so
/// an unused one is closed. `Ok(0)` at end of stream. With `dont_wait` it
/// returns `WouldBlock` at once where nothing is there, even on a blocking
/// socket (`MSG_DONTWAIT`).
pub(crate) fn recv_with_fds(
    sock: RawFd,
    buf: &mut [u8],
    fds: &mut impl Extend<OwnedFd>,
    dont_wait: bool,
) -> io::Result<usize> {
    let flags = libc::MSG_CMSG_CLOEXEC | if dont_wait { libc::MSG_DONTWAIT } else { 0 };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS_PER_READ * std::mem::size_of::<libc::c_int>()) as u32) } as usize;
    let mut cmsg = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let n = loop {
        // SAFETY: msg describes live buffers of the lengths given.
        let n = unsafe { libc::recvmsg(sock, &mut msg, flags) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // SAFETY: walking the control messages recvmsg wrote, with the libc macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<libc::c_int>();
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<libc::c_int>();
                fds.extend((0..count).map(|i| OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)))));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(n)
}
