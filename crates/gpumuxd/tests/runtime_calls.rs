//! Issue 40 against a real daemon on the simulated device, through the
//! client library (Rust and C): event times, device queries, cross-stream
//! waits, host functions in stream order, 16/32-bit fills and pitched (2-D)
//! copies and memsets.

mod common;

use ::gpumux_client::ffi::*;
use ::gpumux_client::{Arg, Buffer, Client, ConnectOptions, ErrorKind, Event, Kernel, LaunchConfig, Pitched, StreamId};
use common::Daemon;
use std::ffi::{c_void, CStr, CString};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SOURCE: &str = "extern \"C\" __global__ void k(float* p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] += 1.0f; }";
const MS: i64 = 1_000_000;

fn connect(d: &Daemon) -> Client {
    Client::connect(ConnectOptions { socket: Some(d.socket.clone()), ..ConnectOptions::named("t") }).unwrap()
}

/// A launch of `blocks` one-wave blocks of `ms` each on `stream` (132 SMs × 8
/// blocks a wave for a block of 256 threads: `blocks` ≤ 1056 is one wave).
fn launch(c: &Client, k: &Kernel, buf: &Buffer, blocks: u32, ms: u64, stream: StreamId) {
    let cfg = LaunchConfig::new([blocks, 1, 1], [256, 1, 1]).stream(stream).block_time_ns(ms * 1_000_000);
    c.launch(k, &cfg, &[Arg::buffer(buf), 1024i32.into()]).unwrap();
}

#[test]
fn event_times_are_monotone_and_match_the_simulated_clock() {
    let d = Daemon::start(None);
    let c = connect(&d);
    let k = c.load_module("m", SOURCE, &[]).unwrap().kernel("k").unwrap();
    let buf = c.alloc(4096).unwrap();
    let s = StreamId::DEFAULT;
    let e0 = c.record_event(s).unwrap();
    launch(&c, &k, &buf, 4, 30, s);
    let e1 = c.record_event(s).unwrap();
    launch(&c, &k, &buf, 4, 10, s);
    let e2 = c.record_event(s).unwrap();
    let early = c.event_elapsed_ns(e0, e2).unwrap_err();
    assert_eq!(early.kind(), Some(&ErrorKind::NotReady), "{early}");
    c.wait_event(e2).unwrap();
    let (a, b) = (c.event_elapsed_ns(e0, e1).unwrap(), c.event_elapsed_ns(e1, e2).unwrap());
    // A one-wave kernel takes its block time; the daemon sees its end at
    // its next poll, well within 10 ms on a loaded CI machine.
    assert!((30 * MS..40 * MS).contains(&a), "the 30 ms kernel measured {a} ns");
    assert!((10 * MS..20 * MS).contains(&b), "the 10 ms kernel measured {b} ns");
    assert_eq!(c.event_elapsed_ns(e0, e2).unwrap(), a + b, "times add up");
    assert_eq!(c.event_elapsed_ns(e2, e0).unwrap(), -(a + b), "the other way round is negative");
    assert_eq!(c.event_elapsed_ns(e1, e1).unwrap(), 0);
    c.destroy_event(e1).unwrap();
    let gone = c.event_elapsed_ns(e0, e1).unwrap_err();
    assert_eq!(gone.kind(), Some(&ErrorKind::NoSuchHandle), "{gone}");
    c.close().unwrap();
}

#[test]
fn device_and_occupancy_queries_answer() {
    let d = Daemon::start(None);
    let c = connect(&d);
    let p = c.device_properties().unwrap();
    assert_eq!((p.name.as_str(), p.simulated, p.compute_capability, p.sms), ("sim:h100", true, [9, 0], 132));
    assert_eq!((p.max_threads_per_block, p.max_block_dims, p.warp_size), (1024, [1024, 1024, 64], 32));
    assert_eq!((p.max_threads_per_sm, p.max_blocks_per_sm, p.registers_per_sm), (2048, 32, 65536));
    assert_eq!(p.shared_bytes_per_sm, 228 << 10);
    assert_eq!(p.memory_bytes, c.welcome().limits.memory_bytes.max(p.memory_bytes));
    let k = c.load_module("m", SOURCE, &[]).unwrap().kernel("k").unwrap();
    // 32 registers a thread assumed on sim: 2048 threads an SM bound first.
    assert_eq!(c.occupancy(&k, 256, 0).unwrap(), 8);
    assert_eq!(c.occupancy(&k, 1024, 0).unwrap(), 2);
    assert_eq!(c.occupancy(&k, 32, 0).unwrap(), 32, "then the 32 block slots");
    assert_eq!(c.occupancy(&k, 32, 100 << 10).unwrap(), 0, "over the kernel's dynamic shared memory");
    let e = c.occupancy(&k, 2048, 0).unwrap_err();
    assert_eq!(e.kind(), Some(&ErrorKind::Invalid), "{e}");
    c.close().unwrap();
}

#[test]
fn a_stream_waiting_for_another_streams_event_runs_after_it_without_blocking_the_host() {
    let d = Daemon::start(None);
    let c = connect(&d);
    let k = c.load_module("m", SOURCE, &[]).unwrap().kernel("k").unwrap();
    let buf = c.alloc(4096).unwrap();
    let (a, b) = (c.create_stream().unwrap(), c.create_stream().unwrap());
    let start = c.record_event(a).unwrap();
    launch(&c, &k, &buf, 4, 40, a);
    let produced = c.record_event(a).unwrap();
    let t = std::time::Instant::now();
    c.stream_wait_event(b, produced).unwrap();
    launch(&c, &k, &buf, 4, 1, b);
    c.memset(&buf, 0, 7, 64, b).unwrap();
    let consumed = c.record_event(b).unwrap();
    assert!(t.elapsed() < Duration::from_millis(30), "the wait did not block the host");
    assert!(!c.query_event(consumed).unwrap(), "stream b waits while a's kernel runs");
    c.wait_event(consumed).unwrap();
    let (p, q) = (c.event_elapsed_ns(start, produced).unwrap(), c.event_elapsed_ns(start, consumed).unwrap());
    assert!(p >= 40 * MS, "a's kernel took {p} ns");
    assert!(q >= p + MS, "b's kernel (1 ms) ran after a's ended: {q} ns against {p}");
    // Waiting for an event that has ended orders nothing; an unknown one is refused.
    c.stream_wait_event(b, produced).unwrap();
    let e = c.stream_wait_event(b, Event(gpumux_proto::EventId(999))).unwrap_err();
    assert_eq!(e.kind(), Some(&ErrorKind::NoSuchHandle), "{e}");
    let e = c.stream_wait_event(StreamId(77), produced).unwrap_err();
    assert_eq!(e.kind(), Some(&ErrorKind::NoSuchHandle), "{e}");
    c.close().unwrap();
}

#[test]
fn host_functions_run_in_stream_order_and_hold_the_stream_until_they_return() {
    let d = Daemon::start(None);
    let c = connect(&d);
    let k = c.load_module("m", SOURCE, &[]).unwrap().kernel("k").unwrap();
    let buf = c.alloc(4096).unwrap();
    let s = c.create_stream().unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let before = c.record_event(s).unwrap();
    launch(&c, &k, &buf, 4, 20, s);
    let kernel_done = c.record_event(s).unwrap();
    for i in 0..3 {
        let order = Arc::clone(&order);
        c.launch_host_func(s, move || {
            // Sleeps: what comes after on the stream must wait for it.
            std::thread::sleep(Duration::from_millis(15));
            order.lock().unwrap().push(i);
        })
        .unwrap();
    }
    let after = c.record_event(s).unwrap();
    assert!(order.lock().unwrap().is_empty(), "nothing ran before the kernel ended");
    c.sync(s).unwrap();
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2], "in stream order, all before the sync returned");
    let held = c.event_elapsed_ns(kernel_done, after).unwrap();
    assert!(held >= 45 * MS, "the event after three 15 ms functions came {held} ns after the kernel");
    assert!(c.event_elapsed_ns(before, kernel_done).unwrap() >= 20 * MS);
    // A function on a stream that is not the client's: reported at the next sync, not run.
    let ran = Arc::new(Mutex::new(false));
    let r = Arc::clone(&ran);
    c.launch_host_func(StreamId(99), move || *r.lock().unwrap() = true).unwrap();
    let e = c.sync(s).unwrap_err();
    assert_eq!(e.kind(), Some(&ErrorKind::NoSuchHandle), "{e}");
    assert!(!*ran.lock().unwrap());
    c.close().unwrap();
}

/// A test pattern: byte i of `n` is a function of `i` and `seed`.
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn pitched_copies_and_memsets_round_trip_and_leave_the_gaps_alone() {
    let d = Daemon::start(None);
    let c = connect(&d);
    let s = c.create_stream().unwrap();
    let (width, height, pitch) = (300u64, 70u64, 512u64);
    let buf = c.alloc(64 + pitch * height).unwrap();
    c.memset(&buf, 0, 0xEE, buf.len(), s).unwrap();
    let dst = Pitched::new(64, pitch);
    let src_pitch = 320u64;
    let host = pattern((src_pitch * height) as usize, 3);
    c.copy_to_device_2d(&buf, dst, &host, src_pitch, width, height, s).unwrap();
    let mut back = vec![0u8; (310 * height) as usize];
    c.copy_to_host_2d(&buf, dst, &mut back, 310, width, height, s).unwrap();
    let mut all = vec![0u8; buf.len() as usize];
    c.copy_to_host(&buf, 0, &mut all, s).unwrap();
    for row in 0..height as usize {
        let want = &host[row * src_pitch as usize..][..width as usize];
        assert_eq!(&back[row * 310..][..width as usize], want, "row {row} round-trips");
        let on_device = &all[64 + row * pitch as usize..][..pitch as usize];
        assert_eq!(&on_device[..width as usize], want, "row {row} on the device");
        assert!(on_device[width as usize..].iter().all(|&b| b == 0xEE), "row {row}'s gap is untouched");
    }
    assert!(all[..64].iter().all(|&b| b == 0xEE), "before the first row is untouched");

    // A device-to-device 2-D copy into another pitch, then a 2-D memset of part of it.
    let other = c.alloc(200 * height).unwrap();
    c.memset(&other, 0, 0x11, other.len(), s).unwrap();
    c.copy_device_2d(&buf, dst, &other, Pitched::new(0, 200), 150, height, s).unwrap();
    c.memset_2d(&other, Pitched::new(10, 200), 0x5A, 20, height - 1, s).unwrap();
    let mut got = vec![0u8; other.len() as usize];
    c.copy_to_host(&other, 0, &mut got, s).unwrap();
    for row in 0..height as usize {
        let r = &got[row * 200..][..200];
        let mut want = host[row * src_pitch as usize..][..150].to_vec();
        if row < height as usize - 1 {
            want[10..30].fill(0x5A);
        }
        assert_eq!(&r[..150], &want[..], "row {row}");
        assert!(r[150..].iter().all(|&b| b == 0x11), "row {row}'s gap");
    }

    // Contiguous rows take the one-request path and agree.
    let flat = c.alloc(width * 4).unwrap();
    c.copy_to_device_2d(&flat, Pitched::new(0, width), &host, src_pitch, width, 4, s).unwrap();
    let mut flat_back = vec![0u8; (width * 4) as usize];
    c.copy_to_host_2d(&flat, Pitched::new(0, width), &mut flat_back, width, width, 4, s).unwrap();
    for row in 0..4 {
        assert_eq!(
            &flat_back[row * width as usize..][..width as usize],
            &host[row * src_pitch as usize..][..width as usize]
        );
    }

    // Shapes that do not fit are refused before anything is sent.
    let e = c.copy_to_device_2d(&buf, Pitched::new(0, 100), &host, src_pitch, width, 2, s).unwrap_err();
    assert!(e.to_string().contains("pitch of 100"), "{e}");
    let e = c.memset_2d(&buf, Pitched::new(64, pitch), 0, width, height + 1, s).unwrap_err();
    assert!(e.to_string().contains("run past the end"), "{e}");
    let short = vec![0u8; 10];
    assert!(c.copy_to_device_2d(&buf, dst, &short, src_pitch, width, 2, s).is_err());
    c.close().unwrap();
}

#[test]
fn sixteen_and_thirty_two_bit_fills_write_their_pattern_and_nothing_else() {
    let d = Daemon::start(None);
    let c = connect(&d);
    let s = StreamId::DEFAULT;
    let n = 100_003u64; // over the simulator's first page: its doubling, with a ragged end
    let buf = c.alloc(8 + n * 4 + 8).unwrap();
    c.memset(&buf, 0, 0x77, buf.len(), s).unwrap();
    c.memset_d32(&buf, 8, 0xDEAD_BEEF, n, s).unwrap();
    let mut got = vec![0u8; buf.len() as usize];
    c.copy_to_host(&buf, 0, &mut got, s).unwrap();
    assert!(got[..8].iter().chain(&got[8 + n as usize * 4..]).all(|&b| b == 0x77), "outside is untouched");
    for (i, w) in got[8..8 + n as usize * 4].chunks_exact(4).enumerate() {
        assert_eq!(u32::from_le_bytes([w[0], w[1], w[2], w[3]]), 0xDEAD_BEEF, "word {i}");
    }
    c.memset_d16(&buf, 2, 0x1234, 5, s).unwrap();
    c.memset_d32(&buf, 0, 0x0909_0909, 1, s).unwrap();
    c.copy_to_host(&buf, 0, &mut got[..16], s).unwrap();
    assert_eq!(&got[..16], &[9, 9, 9, 9, 0x34, 0x12, 0x34, 0x12, 0x34, 0x12, 0x34, 0x12, 0xEF, 0xBE, 0xAD, 0xDE]);
    assert!(c.memset_d32(&buf, 4, 1, n + 4, s).is_err(), "past the end");
    assert!(c.memset_d32(&buf, 0, 1, u64::MAX / 2, s).is_err(), "overflow");
    let e = c.memset_d32(&buf, 2, 1, 1, s).unwrap_err();
    assert_eq!(e.kind(), Some(&ErrorKind::Invalid), "a 32-bit fill at an odd offset: {e}");
    assert!(e.to_string().contains("multiple of 4"), "{e}");
    c.close().unwrap();
}

extern "C" fn count_up(user_data: *mut c_void) {
    // SAFETY: the test passes a pointer to a live AtomicU32.
    let n = unsafe { &*(user_data as *const std::sync::atomic::AtomicU32) };
    n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

#[test]
fn the_c_abi_covers_the_new_calls_and_checks_their_arguments() {
    use gpumux_status::*;
    let d = Daemon::start(None);
    let socket = CString::new(d.socket.to_str().unwrap()).unwrap();
    let name = CString::new("c").unwrap();
    let mut c = std::ptr::null_mut();
    assert_eq!(unsafe { gpumux_connect(socket.as_ptr(), name.as_ptr(), 0, 1.0, 0, &mut c) }, GPUMUX_OK);
    let last = || unsafe { CStr::from_ptr(gpumux_last_error()) }.to_string_lossy().into_owned();

    let mut p = std::mem::MaybeUninit::<gpumux_device_properties>::uninit();
    assert_eq!(unsafe { gpumux_get_device_properties(c, p.as_mut_ptr()) }, GPUMUX_OK);
    let p = unsafe { p.assume_init() };
    assert_eq!(unsafe { CStr::from_ptr(p.name.as_ptr()) }.to_str().unwrap(), "sim:h100");
    assert_eq!((p.sms, p.compute_capability_major, p.compute_capability_minor, p.simulated), (132, 9, 0, true));
    assert_eq!(unsafe { gpumux_get_device_properties(c, std::ptr::null_mut()) }, GPUMUX_ERR_NULL);

    let (mut e0, mut e1, mut ms, mut ns) = (0u64, 0u64, 0f32, 0i64);
    let mut buf = Buffer::default();
    assert_eq!(unsafe { gpumux_alloc(c, 1 << 20, &mut buf) }, GPUMUX_OK);
    assert_eq!(unsafe { gpumux_record_event(c, 0, &mut e0) }, GPUMUX_OK);
    let n = std::sync::atomic::AtomicU32::new(0);
    let data = &n as *const _ as *mut c_void;
    assert_eq!(unsafe { gpumux_launch_host_func(c, 0, Some(count_up), data) }, GPUMUX_OK);
    assert_eq!(unsafe { gpumux_launch_host_func(c, 0, None, data) }, GPUMUX_ERR_NULL);
    assert_eq!(unsafe { gpumux_memset_d32(c, buf, 0, 0xA0B0C0D0, 1000, 0) }, GPUMUX_OK);
    assert_eq!(unsafe { gpumux_record_event(c, 0, &mut e1) }, GPUMUX_OK);
    let mut s1 = 0u32;
    assert_eq!(unsafe { gpumux_create_stream(c, &mut s1) }, GPUMUX_OK);
    assert_eq!(unsafe { gpumux_stream_wait_event(c, s1, e1) }, GPUMUX_OK);
    assert_eq!(unsafe { gpumux_stream_wait_event(c, s1, 12345) }, GPUMUX_ERR_NO_SUCH_HANDLE);
    assert_eq!(unsafe { gpumux_sync(c, s1) }, GPUMUX_OK);
    assert_eq!(n.load(std::sync::atomic::Ordering::SeqCst), 1, "the host function ran before the sync returned");
    assert_eq!(unsafe { gpumux_event_elapsed_ms(c, e0, e1, &mut ms) }, GPUMUX_OK);
    assert_eq!(unsafe { gpumux_event_elapsed_ns(c, e0, e1, &mut ns) }, GPUMUX_OK);
    assert!(ns >= 0 && (ms - ns as f32 / 1e6).abs() < 1e-3, "{ms} ms, {ns} ns");
    assert_eq!(unsafe { gpumux_event_elapsed_ms(c, e0, e1, std::ptr::null_mut()) }, GPUMUX_ERR_NULL);

    // 2-D through C: rows of 16 bytes, 32 apart on the device, 20 apart on the host.
    let host: Vec<u8> = (0..20 * 8).map(|i| i as u8).collect();
    let st = unsafe { gpumux_copy_to_device_2d(c, buf, 0, 32, host.as_ptr().cast(), 20, 16, 8, 0) };
    assert_eq!(st, GPUMUX_OK, "{}", last());
    let mut back = vec![0u8; 16 * 8];
    let st = unsafe { gpumux_copy_to_host_2d(c, buf, 0, 32, back.as_mut_ptr().cast(), 16, 16, 8, 0) };
    assert_eq!(st, GPUMUX_OK, "{}", last());
    for row in 0..8 {
        assert_eq!(&back[row * 16..][..16], &host[row * 20..][..16]);
    }
    assert_eq!(unsafe { gpumux_memset_2d(c, buf, 0, 32, 1, 16, 8, 0) }, GPUMUX_OK);
    assert_eq!(unsafe { gpumux_copy_device_2d(c, buf, 0, 32, buf, 4096, 16, 16, 8, 0) }, GPUMUX_OK);
    assert_eq!(unsafe { gpumux_memset_d16(c, buf, 0, 7, 3, 0) }, GPUMUX_OK);
    let st = unsafe { gpumux_copy_to_device_2d(c, buf, 0, 32, std::ptr::null(), 20, 16, 8, 0) };
    assert_eq!(st, GPUMUX_ERR_NULL);
    let st = unsafe { gpumux_copy_to_host_2d(c, buf, 0, 32, back.as_mut_ptr().cast(), usize::MAX, 16, 8, 0) };
    assert_eq!(st, GPUMUX_ERR_INVALID_ARGUMENT, "a span past the address space: {}", last());
    let st = unsafe { gpumux_copy_to_device_2d(c, buf, 0, 8, host.as_ptr().cast(), 20, 16, 8, 0) };
    assert_eq!(st, GPUMUX_ERR_INVALID_ARGUMENT, "a pitch under the width: {}", last());

    let src = CString::new(SOURCE).unwrap();
    let mut m = std::ptr::null_mut();
    assert_eq!(unsafe { gpumux_load_module(c, name.as_ptr(), src.as_ptr(), std::ptr::null(), 0, &mut m) }, GPUMUX_OK);
    let kname = CString::new("k").unwrap();
    let mut k = std::ptr::null();
    assert_eq!(unsafe { gpumux_module_kernel(m, kname.as_ptr(), &mut k) }, GPUMUX_OK);
    let mut blocks = 0u32;
    assert_eq!(unsafe { gpumux_occupancy(c, k, 256, 0, &mut blocks) }, GPUMUX_OK);
    assert_eq!(blocks, 8);
    assert_eq!(unsafe { gpumux_occupancy(c, std::ptr::dangling(), 256, 0, &mut blocks) }, GPUMUX_ERR_INVALID_ARGUMENT);
    assert_eq!(unsafe { gpumux_occupancy(c, k, 256, 0, std::ptr::null_mut()) }, GPUMUX_ERR_NULL);
    assert_eq!(unsafe { gpumux_module_free(m) }, GPUMUX_OK);
    assert_eq!(unsafe { gpumux_disconnect(c) }, GPUMUX_OK);
}
