//! Host memory the daemon copies from directly (`AttachHost`; the client
//! library's `alloc_host`, the C ABI's `gpumux_host_alloc`), against a real
//! daemon on the simulated device: data round-trips, the `host_memory` limit,
//! spans and memfds checked, a detach under a queued copy, and what a gone
//! client leaves (nothing).

mod common;

use common::{launch, memfd, own_uid, pread, pwrite, Daemon};
use gpumux_client::{ClientError, ConnectOptions, ErrorKind, HostBuffer};
use gpumux_proto::*;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const KERNELS: &str = "__global__ void scale(float* x, unsigned n) { unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2.0f; }\n\
__global__ void boom(int* p) { if (threadIdx.x == 0) __trap(); }\n";

fn pattern(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32).map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

fn library_client(d: &Daemon, name: &str, shm_bytes: u64) -> gpumux_client::Client {
    let options = ConnectOptions { socket: Some(d.socket.clone()), shm_bytes, ..ConnectOptions::named(name) };
    gpumux_client::Client::connect(options).expect("the client connects")
}

fn slice(buffer: BufferId, offset: u64) -> BufferSlice {
    BufferSlice { buffer, offset }
}

fn host(region: HostRegionId, offset: u64) -> HostSlice {
    HostSlice { region, offset }
}

/// Attaches `fd` as a host region of `bytes` over the raw protocol.
fn attach_host(c: &mut common::Client, fd: Option<&OwnedFd>, bytes: u64) -> Result<Reply, ErrorReply> {
    let id = c.send_fd(Request::AttachHost { bytes }, fd);
    c.wait(id)
}

fn attached(c: &mut common::Client, fd: &OwnedFd, bytes: u64) -> HostRegionId {
    match attach_host(c, Some(fd), bytes) {
        Ok(Reply::HostRegion(h)) => h,
        other => panic!("AttachHost: {other:?}"),
    }
}

/// The daemon's status, polled until `done` holds (or 5 s pass: then the last one).
fn status_when(c: &mut common::Client, done: impl Fn(&Status) -> bool) -> Status {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = c.status();
        if done(&s) || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn host_buffers_round_trip_with_no_shared_region() {
    round_trip(&[]);
}

#[test]
fn host_buffers_round_trip_with_the_device_in_a_child_process() {
    round_trip(&["--device-process"]);
}

/// A client with no shared region at all can copy only through host
/// buffers: every copy here went direct.
fn round_trip(args: &[&str]) {
    let d = Daemon::start_with(None, args);
    let client = library_client(&d, "host", 0);
    assert_eq!(client.shm_bytes(), 0);
    assert_eq!(client.welcome().limits.host_memory_bytes, 4 << 30, "the default limit");
    let n = 3 << 20;
    let data = pattern(n, 1);
    let mut src = client.alloc_host(n as u64).unwrap();
    assert_eq!(src.len(), n);
    assert!(src.iter().all(|&b| b == 0), "a host buffer starts zeroed");
    src.copy_from_slice(&data);
    let mut dst = client.alloc_host(n as u64).unwrap();
    let buf = client.alloc(n as u64 + 100).unwrap();
    let stream = gpumux_client::StreamId::DEFAULT;
    client.copy_to_device(&buf, 100, &src, stream).unwrap();
    client.copy_to_host(&buf, 100, &mut dst, stream).unwrap();
    assert!(dst[..] == data[..], "the bytes came back changed");
    // Slices inside a buffer go direct too, at their offsets.
    client.copy_to_device(&buf, 0, &src[1000..5000], stream).unwrap();
    client.copy_to_host(&buf, 0, &mut dst[7..4007], stream).unwrap();
    assert!(dst[7..4007] == data[1000..5000]);
    // Memory of no host buffer needs the shared region this client lacks.
    let e = client.copy_to_device(&buf, 0, &data[..16], stream).unwrap_err();
    assert!(matches!(e, ClientError::Invalid(_)) && e.to_string().contains("shared region"), "{e}");
    let s = client.status().unwrap();
    assert_eq!(s.host_memory_used, 2 * n as u64, "{s:?}");
    let me = s.clients.iter().find(|c| c.name == "host").unwrap();
    assert_eq!((me.host_memory_used, me.host_memory_quota), (2 * n as u64, 4 << 30));
    src.free().unwrap();
    assert_eq!(client.status().unwrap().host_memory_used, n as u64, "freed at once: nothing was queued");
    drop(dst);
    let s = client.status().unwrap();
    assert_eq!(s.host_memory_used, 0, "dropping one frees it: {s:?}");
    client.close().unwrap();
}

#[test]
fn host_buffers_and_the_shared_region_work_side_by_side() {
    let d = Daemon::start(None);
    let client = library_client(&d, "both", 1 << 16);
    let n = 200_000;
    let data = pattern(n, 2);
    let mut h = client.alloc_host(n as u64).unwrap();
    h.copy_from_slice(&data);
    let buf = client.alloc(2 * n as u64).unwrap();
    let stream = gpumux_client::StreamId::DEFAULT;
    client.copy_to_device(&buf, 0, &h, stream).unwrap();
    // Through the 64 KiB shared region, in chunks: a Vec.
    client.copy_to_device(&buf, n as u64, &data, stream).unwrap();
    let mut back = vec![0u8; 2 * n];
    client.copy_to_host(&buf, 0, &mut back, stream).unwrap();
    assert!(back[..n] == data[..] && back[n..] == data[..]);
    h.fill(0);
    client.copy_to_host(&buf, n as u64, &mut h, stream).unwrap();
    assert!(h[..] == data[..]);
    client.close().unwrap();
}

#[test]
fn over_the_host_memory_limit_is_refused_naming_it() {
    let uid = own_uid();
    let d = Daemon::start(Some(&format!("[[allow]]\nuid = {uid}\nhost_memory = \"1 MiB\"\n")));
    let client = library_client(&d, "quota", 0);
    assert_eq!(client.welcome().limits.host_memory_bytes, 1 << 20);
    let first = client.alloc_host(512 << 10).unwrap();
    let e = client.alloc_host(768 << 10).unwrap_err();
    assert_eq!(e.kind(), Some(&ErrorKind::Quota), "{e}");
    let message = e.to_string();
    assert!(message.contains("host_memory limit of 1048576 bytes"), "the limit is named: {message}");
    assert!(message.contains("1310720 bytes") && message.contains("you hold 524288 bytes"), "{message}");
    assert_eq!(client.status().unwrap().host_memory_used, 512 << 10, "the refusal pinned nothing");
    // Freed memory no longer counts.
    first.free().unwrap();
    let second = client.alloc_host(768 << 10).unwrap();
    assert_eq!(client.alloc_host(0).unwrap_err().to_string(), "a host buffer of 0 bytes");
    drop(second);
    client.close().unwrap();
}

/// A memfd of `bytes` without seals.
fn unsealed_memfd(bytes: u64) -> OwnedFd {
    unsafe {
        let fd = libc::memfd_create(c"gpumux-test".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, bytes as i64), 0);
        OwnedFd::from_raw_fd(fd)
    }
}

#[test]
fn spans_outside_a_host_region_and_unfit_memfds_are_refused() {
    let d = Daemon::start(None);
    let (mut c, _) = common::Client::hello(&d, "spans", 0);
    let b = c.alloc(1 << 16);
    let fd = memfd(8192);
    let h = attached(&mut c, &fd, 8192);
    let s0 = StreamId(0);
    let kind = |r: Result<Reply, ErrorReply>| r.map_err(|e| e.kind);
    let to_device = |region, offset, bytes| Request::CopyFromHostRegion {
        dst: slice(b, 0),
        src: host(region, offset),
        bytes,
        stream: StreamId(0),
    };
    assert_eq!(c.call(to_device(h, 0, 8192)), Ok(Reply::Done), "the whole region");
    let e = c.call(to_device(h, 4096, 8192)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::OutOfRange);
    assert!(e.message.contains("8192 bytes at offset 4096 do not fit in host region"), "{}", e.message);
    assert_eq!(kind(c.call(to_device(h, u64::MAX, 2))), Err(ErrorKind::OutOfRange), "no overflow");
    assert_eq!(kind(c.call(to_device(h, 0, 0))), Err(ErrorKind::Invalid));
    assert_eq!(kind(c.call(to_device(HostRegionId(999), 0, 1))), Err(ErrorKind::NoSuchHandle));
    let into = Request::CopyToHostRegion { src: slice(b, 0), dst: host(h, 8191), bytes: 2, stream: s0 };
    assert_eq!(kind(c.call(into)), Err(ErrorKind::OutOfRange));
    let past_buffer = Request::CopyToHostRegion { src: slice(b, (1 << 16) - 1), dst: host(h, 0), bytes: 2, stream: s0 };
    assert_eq!(kind(c.call(past_buffer)), Err(ErrorKind::OutOfRange));

    // The memfd must hold what is claimed, be sealed, and come at all.
    let e = attach_host(&mut c, Some(&memfd(4096)), 8192).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert!(e.message.contains("4096 bytes, not the 8192 bytes claimed"), "{}", e.message);
    let e = attach_host(&mut c, Some(&unsealed_memfd(4096)), 4096).unwrap_err();
    assert!(e.kind == ErrorKind::Invalid && e.message.contains("F_SEAL_SHRINK"), "{e:?}");
    let e = attach_host(&mut c, None, 4096).unwrap_err();
    assert!(e.kind == ErrorKind::Invalid && e.message.contains("without a memfd"), "{e:?}");
    assert_eq!(kind(attach_host(&mut c, Some(&memfd(4096)), 0)), Err(ErrorKind::Invalid));

    // Another client's region is unknown to this one.
    let (mut other, _) = common::Client::hello(&d, "other", 0);
    let ob = other.alloc(4096);
    let theirs = Request::CopyFromHostRegion { dst: slice(ob, 0), src: host(h, 0), bytes: 1, stream: s0 };
    assert_eq!(kind(other.call(theirs)), Err(ErrorKind::NoSuchHandle));
    assert_eq!(kind(other.call(Request::DetachHost(h))), Err(ErrorKind::NoSuchHandle));

    assert_eq!(c.call(Request::DetachHost(h)), Ok(Reply::Done));
    assert_eq!(kind(c.call(Request::DetachHost(h))), Err(ErrorKind::NoSuchHandle), "detached once");
    assert_eq!(kind(c.call(to_device(h, 0, 1))), Err(ErrorKind::NoSuchHandle), "gone with its detach");
    assert_eq!(c.status().host_memory_used, 0, "refused regions were never pinned");
}

#[test]
fn detaching_a_host_region_under_a_queued_copy_is_safe() {
    detach_under_copy(&[]);
}

#[test]
fn detaching_a_host_region_under_a_queued_copy_is_safe_in_a_device_process() {
    detach_under_copy(&["--device-process"]);
}

fn detach_under_copy(args: &[&str]) {
    let d = Daemon::start_with(None, args);
    let (mut c, _) = common::Client::hello(&d, "detacher", 0);
    let n = 1 << 20;
    let data = pattern(n, 3);
    let (from, into) = (memfd(n as u64), memfd(n as u64));
    pwrite(&from, 0, &data);
    let (hf, hi) = (attached(&mut c, &from, n as u64), attached(&mut c, &into, n as u64));
    let b = c.alloc(n as u64);
    c.ok(Request::CopyFromHostRegion { dst: slice(b, 0), src: host(hf, 0), bytes: n as u64, stream: StreamId(0) });
    let k = c.load(KERNELS);
    // One round of 300 ms blocks on every SM holds the stream; the copy waits behind it.
    c.launch_ok(launch(k[0].kernel, 132 * 16, 300_000_000, vec![Arg::Buffer(slice(b, 0)), Arg::U32(0)]));
    let copy =
        c.send(Request::CopyToHostRegion { src: slice(b, 0), dst: host(hi, 0), bytes: n as u64, stream: StreamId(0) });
    let t0 = Instant::now();
    let detach = c.send(Request::DetachHost(hi));
    assert_eq!(c.wait(detach), Ok(Reply::Done), "a detach is answered at once");
    assert!(t0.elapsed() < Duration::from_millis(200), "the detach waited for the copy");
    let s = c.status();
    assert_eq!(s.host_memory_used, 2 * n as u64, "still pinned for the queued copy: {s:?}");
    assert_eq!(s.clients[0].host_memory_used, n as u64, "but no longer the client's: {s:?}");
    let named = c.call(Request::CopyToHostRegion { src: slice(b, 0), dst: host(hi, 0), bytes: 1, stream: StreamId(0) });
    assert_eq!(named.map_err(|e| e.kind), Err(ErrorKind::NoSuchHandle), "the handle went with the detach");
    assert_eq!(c.wait(copy), Ok(Reply::Done), "the queued copy ran");
    assert!(pread(&into, 0, n) == data, "the copy wrote the detached region");
    let s = status_when(&mut c, |s| s.host_memory_used == n as u64);
    assert_eq!(s.host_memory_used, n as u64, "unpinned once its copy was done: {s:?}");
    assert_eq!(c.call(Request::Goodbye), Ok(Reply::Done));
}

#[test]
fn a_gone_client_leaves_no_host_memory_pinned() {
    let d = Daemon::start(None);
    let (mut observer, _) = common::Client::hello(&d, "observer", 0);
    assert_eq!(observer.status().host_memory_used, 0);

    // A raw client hangs up with a copy into its region queued behind a long kernel.
    let (mut c, _) = common::Client::hello(&d, "leaver", 0);
    let fd = memfd(1 << 20);
    let h = attached(&mut c, &fd, 1 << 20);
    let _second = attached(&mut c, &memfd(4096), 4096);
    let b = c.alloc(1 << 20);
    let k = c.load(KERNELS);
    c.launch_ok(launch(k[0].kernel, 132 * 16, 300_000_000, vec![Arg::Buffer(slice(b, 0)), Arg::U32(0)]));
    c.send(Request::CopyToHostRegion { src: slice(b, 0), dst: host(h, 0), bytes: 1 << 20, stream: StreamId(0) });
    assert_eq!(observer.status().host_memory_used, (1 << 20) + 4096);
    drop(c);
    let s = status_when(&mut observer, |s| s.host_memory_used == 0 && s.clients.len() == 1);
    assert_eq!((s.host_memory_used, s.clients.len()), (0, 1), "{s:?}");

    // A library client goes while its host buffer lives on (it may outlive it).
    let client = library_client(&d, "library", 0);
    let mut kept: HostBuffer = client.alloc_host(1 << 20).unwrap();
    let buf = client.alloc(1 << 20).unwrap();
    client.copy_to_host(&buf, 0, &mut kept, gpumux_client::StreamId::DEFAULT).unwrap();
    assert_eq!(observer.status().host_memory_used, 1 << 20);
    drop(client);
    let s = status_when(&mut observer, |s| s.host_memory_used == 0 && s.clients.len() == 1);
    assert_eq!((s.host_memory_used, s.clients.len()), (0, 1), "{s:?}");
    kept[0] = 1;
    drop(kept);
    assert_eq!(observer.status().memory_used, 0);
}

/// A context lost to another client's kernel: the regions attached stay
/// usable on the fresh context (a device process is a fresh process, so they
/// are registered there again), and one detached under a copy the fault lost
/// is unpinned.
#[test]
fn host_regions_outlive_a_context_rebuild() {
    let d = Daemon::start_with(None, &["--device-process"]);
    let (mut a, _) = common::Client::hello(&d, "keeper", 0);
    let (mut bad, _) = common::Client::hello(&d, "culprit", 5);
    let n = 1 << 16;
    let data = pattern(n, 4);
    let (from, into, lost) = (memfd(n as u64), memfd(n as u64), memfd(n as u64));
    pwrite(&from, 0, &data);
    let (hf, hi, hl) =
        (attached(&mut a, &from, n as u64), attached(&mut a, &into, n as u64), attached(&mut a, &lost, n as u64));
    let b = a.alloc(n as u64);
    let (ka, kb) = (a.load(KERNELS), bad.load(KERNELS));
    a.launch_ok(launch(ka[0].kernel, 8, 1_000_000_000, vec![Arg::Buffer(slice(b, 0)), Arg::U32(0)]));
    let lost_copy =
        a.send(Request::CopyToHostRegion { src: slice(b, 0), dst: host(hl, 0), bytes: n as u64, stream: StreamId(0) });
    assert_eq!(a.call(Request::DetachHost(hl)), Ok(Reply::Done));
    assert_eq!(a.status().host_memory_used, 3 * n as u64);
    let bbuf = bad.alloc(64);
    bad.launch_ok(launch(kb[1].kernel, 4, 100_000_000, vec![Arg::Buffer(slice(bbuf, 0))]));
    assert_eq!(bad.call(Request::SyncStream(StreamId(0))).map_err(|e| e.kind), Err(ErrorKind::KernelFault));
    assert_eq!(a.wait(lost_copy).map_err(|e| e.kind), Err(ErrorKind::ContextLost));
    a.ok(Request::CopyFromHostRegion { dst: slice(b, 0), src: host(hf, 0), bytes: n as u64, stream: StreamId(0) });
    a.ok(Request::CopyToHostRegion { src: slice(b, 0), dst: host(hi, 0), bytes: n as u64, stream: StreamId(0) });
    assert!(pread(&into, 0, n) == data, "the bytes came back changed after the rebuild");
    let s = a.status();
    assert_eq!((s.context_rebuilds, s.host_memory_used), (1, 2 * n as u64), "{s:?}");
}

/// `<target>/<profile>`: this binary is `<target>/<profile>/deps/host_memory-<hash>`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary knows its path");
    exe.parent().and_then(Path::parent).map(Path::to_path_buf).expect("the test binary lies in <target>/<profile>/deps")
}

/// A C client of `gpumux_host_alloc`: a round trip through host memory, and
/// every pointer the ABI must refuse.
const C_CLIENT: &str = r#"
#include "gpumux.h"
#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                                        \
    do {                                                                                   \
        enum gpumux_status s_ = (call);                                                    \
        if (s_ != GPUMUX_OK) {                                                             \
            fprintf(stderr, "line %d: %s: %d: %s\n", __LINE__, #call, (int)s_, gpumux_last_error()); \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)
#define EXPECT(call, status)                                                               \
    do {                                                                                   \
        enum gpumux_status s_ = (call);                                                    \
        if (s_ != (status)) {                                                              \
            fprintf(stderr, "line %d: %s gave %d, not %s\n", __LINE__, #call, (int)s_, #status); \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    gpumux_client *c = NULL;
    CHECK(gpumux_connect(argv[1], "c-host", 0, 1.0, 0, &c));
    size_t n = 3u << 20;
    unsigned char *src = NULL, *dst = NULL;
    CHECK(gpumux_host_alloc(c, n, (void **)&src));
    CHECK(gpumux_host_alloc(c, n, (void **)&dst));
    for (size_t i = 0; i < n; i++) src[i] = (unsigned char)((i * 2654435761u) >> 13);
    gpumux_buffer b;
    CHECK(gpumux_alloc(c, n, &b));
    CHECK(gpumux_copy_to_device(c, b, 0, src, n, 0));
    CHECK(gpumux_copy_to_host(c, b, 0, dst, n, 0));
    if (memcmp(src, dst, n) != 0) { fprintf(stderr, "the bytes came back changed\n"); return 1; }
    CHECK(gpumux_copy_to_host(c, b, 10, dst + 5, 1000, 0));
    if (memcmp(src + 10, dst + 5, 1000) != 0) { fprintf(stderr, "a part came back changed\n"); return 1; }

    int local = 0;
    void *p = NULL;
    EXPECT(gpumux_host_alloc(NULL, 16, &p), GPUMUX_ERR_NULL);
    EXPECT(gpumux_host_alloc(c, 16, NULL), GPUMUX_ERR_NULL);
    EXPECT(gpumux_host_alloc(c, 0, &p), GPUMUX_ERR_INVALID_ARGUMENT);
    EXPECT(gpumux_host_free(NULL, src), GPUMUX_ERR_NULL);
    EXPECT(gpumux_host_free(c, NULL), GPUMUX_OK);
    EXPECT(gpumux_host_free(c, src + 1), GPUMUX_ERR_INVALID_ARGUMENT);
    EXPECT(gpumux_host_free(c, &local), GPUMUX_ERR_INVALID_ARGUMENT);
    if (strstr(gpumux_last_error(), "gpumux_host_alloc") == NULL) {
        fprintf(stderr, "unclear message: %s\n", gpumux_last_error());
        return 1;
    }
    CHECK(gpumux_host_free(c, src));
    EXPECT(gpumux_host_free(c, src), GPUMUX_ERR_INVALID_ARGUMENT);
    /* dst is freed by the disconnect. */
    CHECK(gpumux_disconnect(c));
    printf("host memory check passed\n");
    return 0;
}
"#;

#[test]
fn a_c_client_copies_through_host_memory() {
    if let Err(why) = Command::new("cc").arg("--version").output() {
        eprintln!("SKIPPED a_c_client_copies_through_host_memory: no C compiler (`cc`: {why})");
        return;
    }
    let lib_dir = profile_dir().join("deps");
    assert!(
        lib_dir.join("libgpumux_client.so").exists(),
        "libgpumux_client.so is missing from {}: `cargo test` builds it",
        lib_dir.display()
    );
    let dir = tempfile::Builder::new().prefix("gpumuxd-host-c-").tempdir().expect("a temporary directory");
    let source = dir.path().join("host.c");
    std::fs::write(&source, C_CLIENT).unwrap();
    let program = dir.path().join("host");
    let include = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../gpumux-client/include");
    let o = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-std=c11"])
        .arg(format!("-I{}", include.display()))
        .arg(&source)
        .arg("-o")
        .arg(&program)
        .arg(format!("-L{}", lib_dir.display()))
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .arg("-lgpumux_client")
        .output()
        .expect("cc runs");
    assert!(o.status.success(), "cc host.c failed:\n{}", String::from_utf8_lossy(&o.stderr));

    let d = Daemon::start(None);
    let (mut observer, _) = common::Client::hello(&d, "observer", 0);
    let o = Command::new(&program).env("LD_LIBRARY_PATH", &lib_dir).arg(&d.socket).output().expect("the C client runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "the C client failed ({}):\n{stdout}{stderr}", o.status);
    assert!(stdout.contains("host memory check passed"), "{stdout}");
    let s = status_when(&mut observer, |s| s.clients.len() == 1 && s.host_memory_used == 0);
    assert_eq!((s.clients.len(), s.host_memory_used), (1, 0), "the C client left host memory pinned: {s:?}");
}
