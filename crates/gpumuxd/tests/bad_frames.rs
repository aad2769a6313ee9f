//! Property: whatever bytes a client sends, the daemon's request path never
//! panics, answers every complete bad frame with an error frame, and a good
//! client works afterwards. Runs in-process (no socket) through
//! `gpumuxd::harness`, so a million frames fit in CI time in `--release`
//! (`GPUMUXD_BAD_FRAMES` sets the count; debug builds default to 50,000).

use gpumux_proto::*;
use gpumuxd::config::ClientLimits;
use gpumuxd::harness::Harness;

/// xorshift64*: deterministic, so a failure names its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn frame(id: u64, request: Request) -> Vec<u8> {
    encode_frame(&ClientFrame { id, request }).expect("test frames encode")
}

fn hello() -> Vec<u8> {
    frame(1, Request::hello("fuzz", 0))
}

/// A well-formed request with random fields (small handles, so some exist).
fn random_request(r: &mut Rng) -> Request {
    let slice = |r: &mut Rng| BufferSlice { buffer: BufferId(r.below(6)), offset: r.below(1 << 12) };
    let stream = |r: &mut Rng| StreamId(r.below(3) as u32);
    // Host regions take handles from the counter buffers use: ids up to 12.
    let host = |r: &mut Rng| HostSlice { region: HostRegionId(r.below(12)), offset: r.below(1 << 14) };
    match r.below(27) {
        0 => Request::Alloc { bytes: r.below(1 << 17) },
        1 => Request::Free(BufferId(r.below(6))),
        2 => Request::Memset { dst: slice(r), value: r.next() as u8, bytes: r.below(1 << 13), stream: stream(r) },
        3 => Request::CopyDevice { src: slice(r), dst: slice(r), bytes: r.below(1 << 13), stream: stream(r) },
        4 => Request::CopyToDevice { dst: slice(r), shm_offset: r.next(), bytes: r.below(64), stream: stream(r) },
        5 => Request::AttachShm { bytes: r.next() },
        6 => Request::LoadModule {
            name: "m.cu".into(),
            source: ["__global__ void k(int* p) { p[0] = 1; }", "__global__ void k() { this_grid(); }", "garbage {"]
                [r.below(3) as usize]
                .into(),
            options: vec![],
        },
        7 => Request::Launch(Launch {
            kernel: KernelId(r.below(8)),
            grid: [r.below(3) as u32, 1, 1],
            block: [r.below(2048) as u32, 1, 1],
            shared_bytes: r.below(1 << 18) as u32,
            args: vec![Arg::Buffer(slice(r)), Arg::U32(r.next() as u32)],
            stream: stream(r),
            block_time_ns: Some(r.below(2_000)),
        }),
        8 => Request::CreateStream,
        9 => Request::DestroyStream(stream(r)),
        10 => Request::SyncStream(stream(r)),
        11 => Request::RecordEvent(stream(r)),
        12 => Request::QueryEvent(EventId(r.below(8))),
        13 => Request::SetPriority(r.next() as i32),
        14 => Request::SetWeight(f64::from_bits(r.next())),
        // Mostly sizes the harness's memfd covers (it gives one to every
        // AttachHost), some over it or over the limit.
        15 => Request::AttachHost { bytes: if r.below(4) == 0 { r.next() } else { r.below(1 << 15) } },
        16 => Request::DetachHost(HostRegionId(r.below(12))),
        17 => Request::CopyFromHostRegion { dst: slice(r), src: host(r), bytes: r.below(1 << 13), stream: stream(r) },
        18 => Request::CopyToHostRegion { src: slice(r), dst: host(r), bytes: r.below(1 << 13), stream: stream(r) },
        // Issue 40's: a wait or a host function that nobody ends holds only
        // its own client's stream.
        19 => Request::StreamWaitEvent { stream: stream(r), event: EventId(r.below(8)) },
        20 => Request::EventElapsed { start: EventId(r.below(8)), end: EventId(r.below(8)) },
        21 => Request::Occupancy {
            kernel: KernelId(r.below(8)),
            block_threads: r.below(2048) as u32,
            dynamic_shared_bytes: r.below(1 << 18) as u32,
        },
        22 => Request::HostFunc(stream(r)),
        23 => Request::EndHostFunc { token: r.below(64) },
        24 => Request::DeviceProperties,
        25 => Request::Fill {
            dst: slice(r),
            value: r.next() as u32,
            width: r.below(6) as u8,
            count: r.below(1 << 12),
            stream: stream(r),
        },
        _ => Request::Status,
    }
}

/// What a bad client sends, and whether it must get an error frame.
fn bad_client(r: &mut Rng, frames: &mut u64) -> (Vec<Vec<u8>>, bool) {
    match r.below(7) {
        // Garbage with a plausible length prefix.
        0 => {
            let n = 1 + r.below(64) as usize;
            let mut b = (n as u32).to_le_bytes().to_vec();
            let body = r.bytes(n);
            // A body that happens to decode as a Hello is a good client.
            let hello = matches!(
                decode_frame_body::<ClientFrame>(&body),
                Ok(ClientFrame { request: Request::Hello { .. }, .. })
            );
            b.extend(body);
            *frames += 1;
            (vec![b], !hello)
        }
        // A length of 0 or over the limit.
        1 => {
            *frames += 1;
            let len = if r.below(2) == 0 { 0 } else { MAX_FRAME_BYTES + 1 + r.below(1 << 20) as u32 };
            (vec![len.to_le_bytes().to_vec()], true)
        }
        // A request before Hello.
        2 => {
            *frames += 1;
            (vec![frame(r.next(), random_request(r))], true)
        }
        // Two Hellos.
        3 => {
            *frames += 2;
            (vec![hello(), hello()], true)
        }
        // Truncated: a good frame cut short, then the client leaves.
        4 => {
            let f = frame(2, random_request(r));
            let cut = r.below(f.len() as u64) as usize;
            *frames += 1;
            (vec![hello(), f[..cut].to_vec()], false)
        }
        // Hello, a run of well-formed requests with random fields, then garbage.
        5 => {
            let mut chunks = vec![hello()];
            for i in 0..8 {
                chunks.push(frame(10 + i, random_request(r)));
            }
            let mut junk = 5u32.to_le_bytes().to_vec();
            junk.extend([0xff; 5]);
            chunks.push(junk);
            *frames += 10;
            (chunks, true)
        }
        // A good frame split at random points, with trailing bytes in its body.
        _ => {
            let mut f = frame(3, random_request(r));
            f.push(0);
            let len = (f.len() - 4) as u32;
            f[..4].copy_from_slice(&len.to_le_bytes());
            let cut = 1 + r.below(f.len() as u64 - 1) as usize;
            *frames += 2;
            let mut first = hello();
            first.extend(&f[..cut]);
            (vec![first, f[cut..].to_vec()], true)
        }
    }
}

fn is_error_frame(f: &ServerFrame) -> bool {
    matches!(f, ServerFrame::Reply { result: Err(_), .. })
}

#[test]
fn a_million_bad_frames_never_break_the_daemon() {
    let default = if cfg!(debug_assertions) { 50_000 } else { 1_000_000 };
    let target: u64 = std::env::var("GPUMUXD_BAD_FRAMES").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let limits =
        ClientLimits { memory: 1 << 20, queued_ops: 64, shm: 1 << 20, host_memory: 1 << 16, ..ClientLimits::default() };
    let mut h = Harness::new(limits).expect("core starts");
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut frames, mut clients, mut host_regions) = (0u64, 0u64, 0u64);
    while frames < target {
        let seed = r.0;
        let (chunks, must_error) = bad_client(&mut r, &mut frames);
        let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
        let out = h.connection(&refs).unwrap_or_else(|e| panic!("the core failed (seed {seed:#x}): {e}"));
        host_regions +=
            out.iter().filter(|f| matches!(f, ServerFrame::Reply { result: Ok(Reply::HostRegion(_)), .. })).count()
                as u64;
        if must_error {
            assert!(out.iter().any(is_error_frame), "client {clients} (seed {seed:#x}) got no error frame: {out:?}");
        }
        clients += 1;
    }
    // Every connection was closed: once their work leaves the device, nothing is held.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while h.core().sessions() > 0 && std::time::Instant::now() < deadline {
        let _ = h.connection(&[]);
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(host_regions > 0, "no host region was ever attached: the host copies went untested");
    assert_eq!(h.core().memory_held(), 0, "gone clients' memory is freed");
    assert_eq!(h.core().host_memory_held(), 0, "gone clients' host regions are unpinned");

    // A good client still works.
    let alloc = frame(2, Request::Alloc { bytes: 4096 });
    let memset = frame(
        3,
        Request::Memset {
            dst: BufferSlice { buffer: BufferId(1), offset: 0 },
            value: 7,
            bytes: 4096,
            stream: StreamId(0),
        },
    );
    let sync = frame(4, Request::SyncStream(StreamId(0)));
    let out = h.connection(&[&hello(), &alloc, &memset, &sync]).expect("core works");
    let replies: Vec<_> = out
        .iter()
        .filter_map(|f| match f {
            ServerFrame::Reply { id, result } => Some((*id, result.is_ok())),
            _ => None,
        })
        .collect();
    assert_eq!(&replies[..3], &[(1, true), (2, true), (3, true)], "{out:?}");
    eprintln!("{frames} frames from {clients} clients; {host_regions} host regions attached");
}
