use super::*;
use proptest::prelude::*;

/// Both sides of one file in this process: the opener maps a duplicate of the creator's descriptor.
fn pair(capacity: usize) -> (RingPair, RingPair) {
    let creator = RingPair::create(capacity).unwrap();
    let dup = creator.fd().try_clone_to_owned().unwrap();
    let opener = RingPair::open(dup, capacity).unwrap();
    (creator, opener)
}

fn read_all(rx: &mut RingReceiver) -> Vec<u8> {
    let mut out = Vec::new();
    rx.read_into(&mut out, usize::MAX).unwrap();
    out
}

#[test]
fn bytes_go_both_ways_and_a_full_ring_takes_no_more() {
    let (a, b) = pair(MIN_CAPACITY);
    let (mut a_tx, mut a_rx) = a.split();
    let (mut b_tx, mut b_rx) = b.split();
    assert_eq!(a_tx.write(b"to the opener").unwrap(), 13);
    assert_eq!(b_tx.write(b"to the creator").unwrap(), 14);
    assert_eq!(read_all(&mut b_rx), b"to the opener");
    assert_eq!(read_all(&mut a_rx), b"to the creator");
    let big = vec![7u8; MIN_CAPACITY + 100];
    assert_eq!(a_tx.write(&big).unwrap(), MIN_CAPACITY, "a ring takes its capacity");
    assert_eq!(a_tx.write(b"x").unwrap(), 0, "and nothing more until read");
    assert_eq!(a_tx.pending(), MIN_CAPACITY as u64);
    let mut out = Vec::new();
    assert_eq!(b_rx.read_into(&mut out, 10).unwrap(), 10, "a read takes at most what it is asked");
    assert!(!a_tx.try_write_all(&big[..11]).unwrap(), "11 bytes do not fit in 10: none go");
    assert_eq!(a_tx.pending(), MIN_CAPACITY as u64 - 10);
    assert!(a_tx.try_write_all(&big[..10]).unwrap(), "10 do");
    out.clear();
    b_rx.read_into(&mut out, 10).unwrap();
    assert_eq!(a_tx.write(&big).unwrap(), 10, "room read is room again");
}

proptest! {
    /// Any sequence of writes and reads of any sizes, across the wrap point
    /// many times, gives back the bytes written in order.
    #[test]
    fn a_stream_of_pieces_comes_out_as_it_went_in(pieces in proptest::collection::vec((1usize..3000, 0usize..5000), 1..60)) {
        let (a, b) = pair(MIN_CAPACITY);
        let (mut tx, _) = a.split();
        let (_, mut rx) = b.split();
        let mut sent = Vec::new();
        let mut got = Vec::new();
        let mut next = 0u32;
        for (write, read) in pieces {
            let bytes: Vec<u8> = (0..write).map(|i| (next as usize + i) as u8 ^ 0x5a).collect();
            let n = tx.write(&bytes).unwrap();
            next += n as u32;
            sent.extend_from_slice(&bytes[..n]);
            rx.read_into(&mut got, read).unwrap();
        }
        rx.read_into(&mut got, usize::MAX).unwrap();
        prop_assert_eq!(got, sent);
    }
}

#[test]
fn a_peer_index_out_of_range_is_corrupt_not_trusted() {
    let (a, b) = pair(MIN_CAPACITY);
    let (mut tx, _) = a.split();
    let hostile = b.map.clone();
    let (_, mut rx) = b.split();
    // A hostile writer claims more bytes than the ring holds.
    hostile.tail(0).store(MIN_CAPACITY as u64 + 1, Ordering::SeqCst);
    let mut out = Vec::new();
    assert!(matches!(rx.read_into(&mut out, usize::MAX), Err(RingError::Corrupt { index: "tail", .. })));
    // A hostile reader claims to have read bytes never written.
    hostile.head(0).store(5, Ordering::SeqCst);
    assert!(matches!(tx.write(b"x"), Err(RingError::Corrupt { index: "head", .. })));
}

#[test]
fn files_that_could_shrink_or_are_not_rings_are_refused() {
    // Not sealed: an ordinary memfd of the right size.
    let raw = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), file_len(MIN_CAPACITY) as libc::off_t) }, 0);
    let e = RingPair::open(fd, MIN_CAPACITY).unwrap_err().to_string();
    assert!(e.contains("not sealed"), "{e}");
    // Sealed but another capacity than the one agreed.
    let creator = RingPair::create(MIN_CAPACITY).unwrap();
    let e = RingPair::open(creator.fd().try_clone_to_owned().unwrap(), 2 * MIN_CAPACITY).unwrap_err().to_string();
    assert!(e.contains("bytes; rings of"), "{e}");
    // Not a power of two.
    assert!(RingPair::create(5000).is_err());
    // Not a memfd at all.
    let file = std::fs::File::open("/dev/null").unwrap();
    let e = RingPair::open(OwnedFd::from(file), MIN_CAPACITY).unwrap_err().to_string();
    assert!(e.contains("refused"), "{e}");
}

#[test]
fn a_sealed_file_of_the_right_size_without_the_header_is_refused() {
    let raw = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    assert!(raw >= 0);
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), file_len(MIN_CAPACITY) as libc::off_t) }, 0);
    assert_eq!(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) }, 0);
    let e = RingPair::open(fd, MIN_CAPACITY).unwrap_err().to_string();
    assert!(e.contains("header"), "{e}");
}

/// The sleep protocol under contention: a reader that sleeps whenever its
/// ring looks empty, woken only when the writer finds the flag set, must
/// never sleep past a message (the test would hang: it is bounded by a
/// timeout on the wake-up channel and fails instead).
#[test]
fn a_sleeping_reader_is_always_woken_for_what_was_written() {
    use std::sync::mpsc;
    let (a, b) = pair(MIN_CAPACITY);
    let (mut tx, _) = a.split();
    let (_, mut rx) = b.split();
    let (bell_tx, bell_rx) = mpsc::channel::<()>();
    const N: u32 = 20_000;
    let writer = std::thread::spawn(move || {
        for i in 0..N {
            let bytes = i.to_le_bytes();
            let mut done = 0;
            while done < 4 {
                done += tx.write(&bytes[done..]).unwrap();
            }
            if tx.take_sleeper() {
                bell_tx.send(()).unwrap();
            }
            if i % 64 == 0 {
                std::thread::yield_now();
            }
        }
    });
    let mut got = Vec::new();
    let mut sleeps = 0;
    while got.len() < 4 * N as usize {
        if rx.read_into(&mut got, usize::MAX).unwrap() == 0 && rx.prepare_sleep() {
            sleeps += 1;
            bell_rx
                .recv_timeout(std::time::Duration::from_secs(10))
                .expect("a reader slept through bytes written: the doorbell was lost");
            rx.woke();
        }
    }
    writer.join().unwrap();
    let values: Vec<u32> = got.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
    assert!(values.iter().enumerate().all(|(i, &v)| v == i as u32), "in order, none lost");
    eprintln!("the reader slept {sleeps} times");
}

#[test]
fn sleeping_on_the_socket_returns_for_bytes_already_there_a_doorbell_or_the_timeout() {
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};
    let (a, b) = pair(MIN_CAPACITY);
    let (mut tx, _) = a.split();
    let (_, mut rx) = b.split();
    let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    // Nothing comes: the timeout ends the sleep, and the flag is down after.
    let t = Instant::now();
    rx.sleep_on(theirs.as_fd(), Some(Duration::from_millis(20))).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(15));
    assert!(!tx.take_sleeper(), "awake again: no doorbell is owed");
    // Bytes in the ring: no sleep at all.
    tx.write(b"x").unwrap();
    let t = Instant::now();
    rx.sleep_on(theirs.as_fd(), Some(Duration::from_secs(10))).unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    // Emptied again, a doorbell on the socket wakes it.
    assert_eq!(read_all(&mut rx), b"x");
    let ringer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        ours.write_all(&[0]).unwrap();
    });
    let t = Instant::now();
    rx.sleep_on(theirs.as_fd(), Some(Duration::from_secs(10))).unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "the doorbell woke it");
    ringer.join().unwrap();
}
