use super::*;
use proptest::prelude::*;

fn hello() -> ClientFrame {
    ClientFrame { id: 1, request: Request::hello("t", 0) }
}

#[test]
fn a_frame_round_trips_through_the_reader_byte_by_byte() {
    let launch = ClientFrame {
        id: 7,
        request: Request::Launch(Launch {
            kernel: KernelId(3),
            grid: [4, 1, 1],
            block: [256, 1, 1],
            shared_bytes: 0,
            args: vec![
                Arg::Buffer(BufferSlice { buffer: BufferId(1), offset: 16 }),
                Arg::F32(2.5),
                Arg::Bytes(vec![1, 2, 3]),
            ],
            stream: StreamId::DEFAULT,
            block_time_ns: Some(1000),
        }),
    };
    let mut bytes = encode_frame(&hello()).unwrap();
    bytes.extend(encode_frame(&launch).unwrap());
    let mut r = FrameReader::new();
    let mut got = Vec::new();
    for b in bytes {
        r.extend(&[b]);
        while let Some(body) = r.next_body().unwrap() {
            got.push(decode_frame_body::<ClientFrame>(&body).unwrap());
        }
    }
    assert_eq!(got, vec![hello(), launch]);
    assert_eq!(r.pending(), 0);
}

#[test]
fn a_zero_or_oversized_length_is_refused_before_the_body() {
    let mut r = FrameReader::new();
    r.extend(&0u32.to_le_bytes());
    assert_eq!(r.next_body(), Err(FrameError::Length { len: 0 }));
    let mut r = FrameReader::new();
    r.extend(&(MAX_FRAME_BYTES + 1).to_le_bytes());
    assert_eq!(r.next_body(), Err(FrameError::Length { len: MAX_FRAME_BYTES + 1 }));
}

#[test]
fn trailing_bytes_are_refused() {
    let mut bytes = encode_frame(&hello()).unwrap();
    bytes.push(0);
    let body = &bytes[4..];
    assert_eq!(decode_frame_body::<ClientFrame>(body), Err(FrameError::Trailing(1)));
}

proptest! {
    /// Random bytes never panic the decoder, and what decodes re-encodes to the same bytes.
    #[test]
    fn garbage_never_panics(body in proptest::collection::vec(any::<u8>(), 1..512)) {
        if let Ok(frame) = decode_frame_body::<ClientFrame>(&body) {
            let again = encode_frame(&frame).unwrap();
            prop_assert_eq!(&again[4..], &body[..]);
        }
        let _ = decode_frame_body::<ServerFrame>(&body);
    }
}

/// Version 4's host-region requests round-trip and were added after every
/// earlier request and reply, so the earlier ones keep their bytes.
#[test]
fn host_region_requests_round_trip_after_the_earlier_ones() {
    let body = |request: Request| encode_frame(&ClientFrame { id: 5, request }).unwrap()[4..].to_vec();
    assert_eq!(body(Request::Status), vec![5, 19]);
    assert_eq!(body(Request::UseRings { capacity: 1 }), vec![5, 21, 1]);
    assert_eq!(body(Request::AttachHost { bytes: 1 }), vec![5, 22, 1]);
    assert_eq!(body(Request::DetachHost(HostRegionId(2))), vec![5, 23, 2]);
    let dst = BufferSlice { buffer: BufferId(1), offset: 0 };
    let host = HostSlice { region: HostRegionId(2), offset: 3 };
    for request in [
        Request::CopyFromHostRegion { dst, src: host, bytes: 4, stream: StreamId(1) },
        Request::CopyToHostRegion { src: dst, dst: host, bytes: 4, stream: StreamId(1) },
        Request::CopyFromHostRegionAsync { dst, src: host, bytes: 4, stream: StreamId(1) },
        Request::CopyToHostRegionAsync { src: dst, dst: host, bytes: 4, stream: StreamId(1) },
        Request::Copy2D {
            src: Place2D::Host { at: host, pitch: 16 },
            dst: Place2D::Device { at: dst, pitch: 32 },
            width: 8,
            height: 3,
            stream: StreamId(1),
            wait: false,
        },
    ] {
        let frame = ClientFrame { id: 9, request };
        let bytes = encode_frame(&frame).unwrap();
        assert_eq!(decode_frame_body::<ClientFrame>(&bytes[4..]).unwrap(), frame);
    }
    let reply = ServerFrame::Reply { id: 3, result: Ok(Reply::HostRegion(HostRegionId(7))) };
    let bytes = encode_frame(&reply).unwrap();
    assert_eq!(decode_frame_body::<ServerFrame>(&bytes[4..]).unwrap(), reply);
}

#[test]
fn printable_names_escape_what_moves_or_hides_text() {
    // A name that would fake a row of someone else's `gpumux ps` and clear
    // their screen (issue 36, case 6).
    let evil = "x\n   9     4242   1000 root-job\x1b[2J\x1b[31m\u{202E}gnp.exe\u{200B}\u{9b}";
    let p = printable_name(evil);
    assert_eq!(p, "x\\n   9     4242   1000 root-job\\u{1b}[2J\\u{1b}[31m\\u{202e}gnp.exe\\u{200b}\\u{9b}");
    assert!(!p.chars().any(|c| c.is_control()), "{p:?}");
    assert_eq!(printable_name("tab\there\r"), "tab\\there\\r");
    // Ordinary names, non-ASCII text included, are kept as they are.
    for ok in ["vector_add", "gpumux ps", "échelle-訓練", "a\\u{1b} written out", ""] {
        assert_eq!(printable_name(ok), ok);
    }
}

proptest! {
    #[test]
    fn printable_names_are_bounded_idempotent_and_control_free(name in ".{0,300}") {
        let p = printable_name(&name);
        prop_assert!(p.len() <= MAX_NAME_BYTES);
        prop_assert!(!p.chars().any(|c| c.is_control()));
        prop_assert_eq!(printable_name(&p), p.clone());
        // Cut between escapes, never inside one: the kept part is a prefix
        // of the whole name's escaping.
        let whole: String = name.chars().map(|c| printable_name(&c.to_string())).collect();
        prop_assert!(whole.starts_with(&p));
    }
}

/// Version 5's requests (issue 40) round-trip and come after every earlier
/// request, reply and error kind, so the earlier ones keep their bytes.
#[test]
fn version_5_requests_and_replies_round_trip_after_the_earlier_ones() {
    let body = |request: Request| encode_frame(&ClientFrame { id: 5, request }).unwrap()[4..].to_vec();
    assert_eq!(body(Request::StreamWaitEvent { stream: StreamId(1), event: EventId(2) }), vec![5, 26, 1, 2]);
    assert_eq!(body(Request::DeviceProperties), vec![5, 28]);
    assert_eq!(body(Request::EndHostFunc { token: 7 }), vec![5, 31, 7]);
    for request in [
        Request::EventElapsed { start: EventId(1), end: EventId(3) },
        Request::Occupancy { kernel: KernelId(4), block_threads: 256, dynamic_shared_bytes: 1024 },
        Request::HostFunc(StreamId(2)),
        Request::Fill {
            dst: BufferSlice { buffer: BufferId(1), offset: 8 },
            value: 0xDEAD_BEEF,
            width: 4,
            count: 3,
            stream: StreamId(1),
        },
    ] {
        let frame = ClientFrame { id: 9, request };
        let bytes = encode_frame(&frame).unwrap();
        assert_eq!(decode_frame_body::<ClientFrame>(&bytes[4..]).unwrap(), frame);
    }
    let properties = DeviceProperties {
        name: "sim:h100".into(),
        simulated: true,
        compute_capability: [9, 0],
        sms: 132,
        memory_bytes: 80 << 30,
        memory_bandwidth: 3.35e12,
        max_threads_per_block: 1024,
        max_block_dims: [1024, 1024, 64],
        max_grid_dims: [i32::MAX as u32, 65535, 65535],
        max_threads_per_sm: 2048,
        max_blocks_per_sm: 32,
        registers_per_sm: 65536,
        shared_bytes_per_sm: 228 << 10,
        warp_size: 32,
    };
    for result in [
        Ok(Reply::Elapsed(-12)),
        Ok(Reply::Properties(properties)),
        Ok(Reply::Occupancy(8)),
        Ok(Reply::HostFunc(11)),
        Ok(Reply::Copied { others: 2 }),
        Err(ErrorReply::new(ErrorKind::NotReady, "not yet")),
    ] {
        let reply = ServerFrame::Reply { id: 3, result };
        let bytes = encode_frame(&reply).unwrap();
        assert_eq!(decode_frame_body::<ServerFrame>(&bytes[4..]).unwrap(), reply);
    }
}

/// A version-6 client's `Hello` (no `gpu` field) does not decode as this
/// version's, yet its version is read, so the daemon can name both.
#[test]
fn an_older_hello_that_does_not_decode_still_states_its_version() {
    #[derive(Serialize)]
    enum OldRequest {
        Hello { magic: [u8; 4], version: u16, name: String, priority: i32, weight: f64 },
    }
    #[derive(Serialize)]
    struct OldFrame {
        id: u64,
        request: OldRequest,
    }
    let old = OldFrame {
        id: 300,
        request: OldRequest::Hello { magic: MAGIC, version: 6, name: "old".into(), priority: 0, weight: 1.0 },
    };
    let bytes = encode_frame(&old).unwrap();
    let body = &bytes[4..];
    assert!(decode_frame_body::<ClientFrame>(body).is_err(), "a v6 Hello lacks the gpu field");
    assert_eq!(hello_version(body), Some(6));
    let current = encode_frame(&hello()).unwrap();
    assert_eq!(hello_version(&current[4..]), Some(VERSION));
    // Not a Hello, or not gpumux's magic: no version to speak of.
    let status = encode_frame(&ClientFrame { id: 2, request: Request::Status }).unwrap();
    assert_eq!(hello_version(&status[4..]), None);
    let mut foreign = body.to_vec();
    foreign[3] ^= 0xff;
    assert_eq!(hello_version(&foreign), None);
    assert_eq!(hello_version(&[]), None);
}

/// Version 9 added `Hello::class`: a version-8 `Hello` (with `gpu`, no
/// `class`) no longer decodes but states its version, and a declared class
/// round trips, as its name does.
#[test]
fn a_hello_with_a_class_round_trips_and_a_version_8_one_states_its_version() {
    #[derive(Serialize)]
    enum V8Request {
        Hello { magic: [u8; 4], version: u16, name: String, priority: i32, weight: f64, gpu: Option<u32> },
    }
    #[derive(Serialize)]
    struct V8Frame {
        id: u64,
        request: V8Request,
    }
    let v8 = V8Frame {
        id: 5,
        request: V8Request::Hello {
            magic: MAGIC,
            version: 8,
            name: "v8".into(),
            priority: 0,
            weight: 1.0,
            gpu: Some(1),
        },
    };
    let bytes = encode_frame(&v8).unwrap();
    assert!(decode_frame_body::<ClientFrame>(&bytes[4..]).is_err(), "a v8 Hello lacks the class field");
    assert_eq!(hello_version(&bytes[4..]), Some(8));
    for class in [ClientClass::Memory, ClientClass::Compute] {
        let mut frame = hello();
        if let Request::Hello { class: c, .. } = &mut frame.request {
            *c = Some(class);
        }
        let bytes = encode_frame(&frame).unwrap();
        assert_eq!(decode_frame_body::<ClientFrame>(&bytes[4..]).ok(), Some(frame));
        assert_eq!(class.name().parse::<ClientClass>(), Ok(class));
        assert_eq!(class.other().other(), class);
        assert_ne!(class.other(), class);
    }
    let e = "disk".parse::<ClientClass>().err().unwrap_or_default();
    assert!(e.contains("`disk`") && e.contains("memory, compute"), "{e}");
}

#[test]
fn a_frame_encoded_into_a_kept_buffer_is_the_same_frame_and_replaces_what_was_there() {
    let mut out = Vec::new();
    encode_frame_into(&hello(), &mut out).unwrap();
    assert_eq!(out, encode_frame(&hello()).unwrap());
    let second = ClientFrame { id: 2, request: Request::SyncStream(StreamId::DEFAULT) };
    let capacity = out.capacity();
    encode_frame_into(&second, &mut out).unwrap();
    assert_eq!(out, encode_frame(&second).unwrap(), "the first frame's bytes are gone");
    assert!(out.capacity() >= capacity, "the buffer is kept, not replaced by a smaller one");
}
