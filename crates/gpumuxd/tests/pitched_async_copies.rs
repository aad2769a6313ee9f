//! Issue 40's copies against a real daemon on the simulated device: a
//! pitched copy is one request (`Copy2D`), between buffers or between a
//! buffer and a host region, each side with its own pitch; host-region
//! copies that do not wait (`CopyFromHostRegionAsync`,
//! `CopyToHostRegionAsync`) are answered only when refused and are ordered
//! by their streams and events, over the raw protocol and through the
//! library's `copy_to_device_async` / `copy_to_host_async`.

mod common;

use common::{memfd, pread, pwrite, Daemon};
use gpumux_client::{Client, ConnectOptions, ErrorKind, Pitched, StreamId};
use gpumux_proto::*;
use std::os::fd::OwnedFd;

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 8) as u8).collect()
}

fn attached(c: &mut common::Client, fd: &OwnedFd, bytes: u64) -> HostRegionId {
    let id = c.send_fd(Request::AttachHost { bytes }, Some(fd));
    match c.wait(id) {
        Ok(Reply::HostRegion(h)) => h,
        other => panic!("AttachHost: {other:?}"),
    }
}

fn device(buffer: BufferId, offset: u64, pitch: u64) -> Place2D {
    Place2D::Device { at: BufferSlice { buffer, offset }, pitch }
}

fn host(region: HostRegionId, offset: u64, pitch: u64) -> Place2D {
    Place2D::Host { at: HostSlice { region, offset }, pitch }
}

#[test]
fn a_pitched_copy_is_one_request_and_leaves_the_gaps_alone() {
    pitched_one_request(&[]);
}

#[test]
fn a_pitched_copy_is_one_request_with_the_device_in_a_child_process() {
    pitched_one_request(&["--device-process"]);
}

/// Host rows (pitch 96) → device rows (pitch 128, from offset 64) → other
/// device rows (pitch 80) → host rows (pitch 72, from offset 8), each one
/// `Copy2D` answered once; every row arrives and no gap is written.
fn pitched_one_request(args: &[&str]) {
    let d = Daemon::start_with(None, args);
    let (mut c, _) = common::Client::hello(&d, "pitched", 0);
    let (width, height) = (60u64, 300u64);
    let (hp, dp, dp2, op) = (96u64, 128u64, 80u64, 72u64);
    let src_bytes = hp * height;
    let out_bytes = 8 + op * height;
    let (src_fd, out_fd) = (memfd(src_bytes), memfd(out_bytes));
    let src = pattern(src_bytes as usize, 7);
    pwrite(&src_fd, 0, &src);
    pwrite(&out_fd, 0, &vec![0xEE; out_bytes as usize]);
    let (hs, ho) = (attached(&mut c, &src_fd, src_bytes), attached(&mut c, &out_fd, out_bytes));
    let (b1, b2) = (c.alloc(64 + dp * height), c.alloc(dp2 * height));
    let s = StreamId::DEFAULT;
    c.ok(Request::Memset {
        dst: BufferSlice { buffer: b1, offset: 0 },
        value: 0xAB,
        bytes: 64 + dp * height,
        stream: s,
    });
    c.ok(Request::Memset { dst: BufferSlice { buffer: b2, offset: 0 }, value: 0xCD, bytes: dp2 * height, stream: s });
    let copy = |src, dst, wait| Request::Copy2D { src, dst, width, height, stream: s, wait };
    assert_eq!(c.call(copy(host(hs, 0, hp), device(b1, 64, dp), true)), Ok(Reply::Done), "host to device");
    assert_eq!(c.call(copy(device(b1, 64, dp), device(b2, 0, dp2), false)), Ok(Reply::Done), "device to device");
    assert_eq!(c.call(copy(device(b2, 0, dp2), host(ho, 8, op), true)), Ok(Reply::Done), "device to host");
    let out = pread(&out_fd, 0, out_bytes as usize);
    assert!(out[..8].iter().all(|&b| b == 0xEE), "before the first row");
    for row in 0..height as usize {
        let want = &src[row * hp as usize..][..width as usize];
        let got = &out[8 + row * op as usize..][..op as usize];
        assert_eq!(&got[..width as usize], want, "row {row} went host → device → device → host");
        assert!(got[width as usize..].iter().all(|&b| b == 0xEE), "row {row}'s gap on the host");
    }
    // The device rows' gaps: read the whole middle buffer back plainly.
    let mid_fd = memfd(dp2 * height);
    let hm = attached(&mut c, &mid_fd, dp2 * height);
    assert_eq!(
        c.call(Request::CopyToHostRegion {
            src: BufferSlice { buffer: b2, offset: 0 },
            dst: HostSlice { region: hm, offset: 0 },
            bytes: dp2 * height,
            stream: s,
        }),
        Ok(Reply::Done)
    );
    let mid = pread(&mid_fd, 0, (dp2 * height) as usize);
    for row in 0..height as usize {
        let got = &mid[row * dp2 as usize..][..dp2 as usize];
        assert_eq!(&got[..width as usize], &src[row * hp as usize..][..width as usize], "row {row} on the device");
        assert!(got[width as usize..].iter().all(|&b| b == 0xCD), "row {row}'s gap on the device");
    }

    // Refused, with the numbers: each is one answer too.
    let kind = |r: Result<Reply, ErrorReply>| r.map_err(|e| (e.kind, e.message));
    let narrow = kind(c.call(copy(host(hs, 0, 50), device(b1, 0, dp), true))).unwrap_err();
    assert_eq!(narrow.0, ErrorKind::Invalid);
    assert!(narrow.1.contains("pitch of 50 bytes is less than a row of 60"), "{}", narrow.1);
    let past = kind(c.call(copy(host(hs, hp, hp), device(b1, 0, dp), true))).unwrap_err();
    assert_eq!(past.0, ErrorKind::OutOfRange, "the last row runs past the host region: {}", past.1);
    let past = kind(c.call(copy(host(hs, 0, hp), device(b1, 64 + dp - width + 1, dp), false))).unwrap_err();
    assert_eq!(past.0, ErrorKind::OutOfRange, "the last row runs past the buffer: {}", past.1);
    let both = kind(c.call(copy(host(hs, 0, hp), host(ho, 0, op), true))).unwrap_err();
    assert_eq!(both.0, ErrorKind::Invalid, "host to host: {}", both.1);
    let overflow = kind(c.call(copy(host(hs, 0, u64::MAX), device(b1, 0, dp), true))).unwrap_err();
    assert_eq!(overflow.0, ErrorKind::OutOfRange, "{}", overflow.1);
    let empty =
        Request::Copy2D { src: host(hs, 0, hp), dst: device(b1, 0, dp), width: 0, height, stream: s, wait: true };
    assert_eq!(kind(c.call(empty)).unwrap_err().0, ErrorKind::Invalid);
}

#[test]
fn an_async_host_copy_is_answered_only_when_refused() {
    let d = Daemon::start(None);
    let (mut c, _) = common::Client::hello(&d, "async", 0);
    let n = 1u64 << 20;
    let (from, into) = (memfd(n), memfd(n));
    let data = pattern(n as usize, 3);
    pwrite(&from, 0, &data);
    let (hf, hi) = (attached(&mut c, &from, n), attached(&mut c, &into, n));
    let b = c.alloc(n);
    let s = StreamId::DEFAULT;
    let up = c.send(Request::CopyFromHostRegionAsync {
        dst: BufferSlice { buffer: b, offset: 0 },
        src: HostSlice { region: hf, offset: 0 },
        bytes: n,
        stream: s,
    });
    let down = c.send(Request::CopyToHostRegionAsync {
        src: BufferSlice { buffer: b, offset: 0 },
        dst: HostSlice { region: hi, offset: 0 },
        bytes: n,
        stream: s,
    });
    let sync = c.send(Request::SyncStream(s));
    // No reply to either copy: the sync's is the next frame, and the data is there.
    match c.next_frame() {
        Some(ServerFrame::Reply { id, result }) => {
            assert_eq!(id, sync, "a reply to {} (copies {up} and {down} must have none)", id);
            assert_eq!(result, Ok(Reply::Done));
        }
        other => panic!("{other:?}"),
    }
    assert!(pread(&into, 0, n as usize) == data, "the copies ran in stream order");

    // A refusal is answered, with the copy's id.
    let refused = c.send(Request::CopyFromHostRegionAsync {
        dst: BufferSlice { buffer: b, offset: 1 },
        src: HostSlice { region: hf, offset: 0 },
        bytes: n,
        stream: s,
    });
    let e = c.wait(refused).unwrap_err();
    assert_eq!(e.kind, ErrorKind::OutOfRange, "{}", e.message);
}

fn connect(d: &Daemon) -> Client {
    Client::connect(ConnectOptions { socket: Some(d.socket.clone()), shm_bytes: 0, ..ConnectOptions::named("t") })
        .unwrap()
}

/// The pipeline's pattern through the library: chunks copied up on one
/// stream without waiting, down on another after an event, one sync at
/// the end; then a refused async copy reported at the next sync, by name.
#[test]
fn library_async_copies_on_two_streams_ordered_by_events_round_trip() {
    let d = Daemon::start(None);
    let c = connect(&d);
    let (chunks, chunk) = (8usize, 256usize << 10);
    let mut input = c.alloc_host((chunks * chunk) as u64).unwrap();
    input.copy_from_slice(&pattern(chunks * chunk, 11));
    let mut output = c.alloc_host((chunks * chunk) as u64).unwrap();
    let buf = c.alloc((chunks * chunk) as u64).unwrap();
    let (up, down) = (c.create_stream().unwrap(), c.create_stream().unwrap());
    let mut events = Vec::new();
    for (i, (from, into)) in input.chunks(chunk).zip(output.chunks_mut(chunk)).enumerate() {
        let at = (i * chunk) as u64;
        // SAFETY: neither host buffer is touched until the sync below.
        unsafe { c.copy_to_device_async(&buf, at, from, up).unwrap() };
        let arrived = c.record_event(up).unwrap();
        c.stream_wait_event(down, arrived).unwrap();
        // SAFETY: as above.
        unsafe { c.copy_to_host_async(&buf, at, into, down).unwrap() };
        events.push(arrived);
    }
    c.sync(down).unwrap();
    assert!(output[..] == input[..], "every chunk went up and came down after its event");
    for e in events {
        c.destroy_event(e).unwrap();
    }

    // From memory that is not a host buffer, an async copy waits, as CUDA's
    // from pageable memory (through the shared region: a client that has one).
    let p = Client::connect(ConnectOptions { socket: Some(d.socket.clone()), ..ConnectOptions::named("pageable") })
        .unwrap();
    let pbuf = p.alloc(4096).unwrap();
    let plain = pattern(4096, 5);
    let mut back = vec![0u8; 4096];
    // SAFETY: from memory that is not a host buffer the call returns when done.
    unsafe { p.copy_to_device_async(&pbuf, 0, &plain, StreamId::DEFAULT).unwrap() };
    // SAFETY: as above.
    unsafe { p.copy_to_host_async(&pbuf, 0, &mut back, StreamId::DEFAULT).unwrap() };
    assert_eq!(back, plain, "each returned when done");
    p.close().unwrap();

    // Refused (a stream that is not the client's): reported by the next call that waits, by name.
    // SAFETY: the copy is refused; nothing reads `input` meanwhile anyway.
    unsafe { c.copy_to_device_async(&buf, 0, &input[..chunk], StreamId(999)).unwrap() };
    let e = c.sync(up).unwrap_err();
    assert_eq!(e.kind(), Some(&ErrorKind::NoSuchHandle), "{e}");
    assert!(e.to_string().contains("CopyFromHostRegionAsync"), "{e}");
    c.sync(up).unwrap();
    c.close().unwrap();
}

/// The library's 2-D copies between buffers and host buffers: one `Copy2D`
/// each way, rows and gaps as a plain copy would leave them.
#[test]
fn library_pitched_copies_with_host_buffers_round_trip() {
    let d = Daemon::start(None);
    let c = connect(&d);
    let s = c.create_stream().unwrap();
    let (width, height, src_pitch, dst_pitch, out_pitch) = (100u64, 50u64, 128u64, 160u64, 112u64);
    let mut src = c.alloc_host(src_pitch * height).unwrap();
    src.copy_from_slice(&pattern((src_pitch * height) as usize, 9));
    let mut out = c.alloc_host(out_pitch * height).unwrap();
    out.fill(0x77);
    let buf = c.alloc(dst_pitch * height).unwrap();
    c.memset(&buf, 0, 0x33, buf.len(), s).unwrap();
    c.copy_to_device_2d(&buf, Pitched::new(0, dst_pitch), &src, src_pitch, width, height, s).unwrap();
    c.copy_to_host_2d(&buf, Pitched::new(0, dst_pitch), &mut out, out_pitch, width, height, s).unwrap();
    for row in 0..height as usize {
        let got = &out[row * out_pitch as usize..][..out_pitch as usize];
        assert_eq!(&got[..width as usize], &src[row * src_pitch as usize..][..width as usize], "row {row}");
        assert!(got[width as usize..].iter().all(|&b| b == 0x77), "row {row}'s gap on the host");
    }
    let mut plain = c.alloc_host(buf.len()).unwrap();
    c.copy_to_host(&buf, 0, &mut plain, s).unwrap();
    for row in 0..height as usize {
        let gap = &plain[row * dst_pitch as usize + width as usize..][..(dst_pitch - width) as usize];
        assert!(gap.iter().all(|&b| b == 0x33), "row {row}'s gap on the device");
    }
    c.close().unwrap();
}
