//! How fast host copies go (issue 35): the client's `memcpy` through the
//! staging region on 1..N threads, and whole copies through gpumuxd from a
//! `Vec` (the staging path) and from a `HostBuffer` (the direct path).
//!
//! ```sh
//! # The client-side memcpy alone (no daemon): 1 GiB in 16 MiB chunks through 4 slots
//! target/release/examples/copy_bench memcpy --mib 1024 --chunk-mib 16 --threads 1,2,4,8
//! # Through a daemon: 1 GiB up and down, 5 timed repetitions after one untimed
//! target/release/gpumuxd --socket /tmp/g.sock --device sim:h100 &
//! target/release/examples/copy_bench daemon --socket /tmp/g.sock --mib 1024 --reps 5
//! # ... with 1 copy thread and the region kept at 8 MiB (the staging path before issue 35)
//! target/release/examples/copy_bench daemon --socket /tmp/g.sock --threads 1 --shm-max-mib 8
//! ```
//!
//! GB/s are 10^9 bytes per second; each line gives the median, min and max
//! of the repetitions. On a simulated device the copies move real bytes (on
//! the daemon's copy-engine thread) and take the modelled PCIe time, so the
//! figure shows the pipeline, not a GPU's bus.

use gpumux_client::{Client, ConnectOptions, Copier, StreamId, Toward};
use std::time::Instant;

struct Args {
    mode: String,
    socket: Option<std::path::PathBuf>,
    mib: usize,
    chunk_mib: usize,
    threads: Vec<usize>,
    reps: usize,
    shm_max_mib: Option<u64>,
    paths: Vec<String>,
    /// memcpy mode: the slots are a shared memfd mapping (as the region is), not a Vec.
    memfd: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: copy_bench memcpy [--mib N] [--chunk-mib C] [--threads T,T..] [--reps R] [--memfd]\n       \
         copy_bench daemon [--socket PATH] [--mib N] [--threads T] [--shm-max-mib M] [--paths vec,host] [--reps R]"
    );
    std::process::exit(2)
}

fn parse() -> Args {
    let mut it = std::env::args().skip(1);
    let mode = it.next().unwrap_or_else(|| usage());
    if mode != "memcpy" && mode != "daemon" {
        usage();
    }
    let mut a = Args {
        mode,
        socket: None,
        mib: 1024,
        chunk_mib: 16,
        threads: Vec::new(),
        reps: 5,
        shm_max_mib: None,
        paths: vec!["vec".into(), "host".into()],
        memfd: false,
    };
    while let Some(flag) = it.next() {
        if flag == "--memfd" {
            a.memfd = true;
            continue;
        }
        let value = it.next().unwrap_or_else(|| usage());
        let num = |v: &str| v.parse::<usize>().unwrap_or_else(|_| usage());
        match flag.as_str() {
            "--socket" => a.socket = Some(value.into()),
            "--mib" => a.mib = num(&value).max(1),
            "--chunk-mib" => a.chunk_mib = num(&value).max(1),
            "--threads" => a.threads = value.split(',').map(num).collect(),
            "--reps" => a.reps = num(&value).max(1),
            "--shm-max-mib" => a.shm_max_mib = Some(num(&value) as u64),
            "--paths" => a.paths = value.split(',').map(str::to_owned).collect(),
            _ => usage(),
        }
    }
    a
}

/// Median, min and max GB/s of `bytes` moved in each of `secs`.
fn figure(bytes: usize, secs: &mut [f64]) -> String {
    secs.sort_by(f64::total_cmp);
    let gbs = |s: f64| bytes as f64 / s / 1e9;
    format!("{:6.1} GB/s (min {:.1}, max {:.1})", gbs(secs[secs.len() / 2]), gbs(secs[secs.len() - 1]), gbs(secs[0]))
}

fn fill(bytes: &mut [u8], seed: u32) {
    for (i, w) in bytes.chunks_mut(4).enumerate() {
        let v = (i as u32).wrapping_mul(2_654_435_761) ^ seed;
        w.copy_from_slice(&v.to_le_bytes()[..w.len()]);
    }
}

/// The client's side of the staging path alone: `mib` MiB copied chunk by
/// chunk into (and out of) four slots of `chunk_mib` MiB, as a copy through
/// a region of four slots does, on each thread count.
fn memcpy(a: &Args) {
    let total = a.mib << 20;
    let chunk = a.chunk_mib << 20;
    let mut user = vec![0u8; total];
    fill(&mut user, 1);
    let mut anon;
    let mut shared;
    let slots: &mut [u8] = if a.memfd {
        shared = Memfd::new(4 * chunk);
        shared.bytes()
    } else {
        anon = vec![0u8; 4 * chunk];
        &mut anon
    };
    let threads = if a.threads.is_empty() { vec![1, 2, 4, 8] } else { a.threads.clone() };
    println!(
        "memcpy: {} MiB in {} MiB chunks through 4 slots ({}); {} hardware threads",
        a.mib,
        a.chunk_mib,
        if a.memfd { "a shared memfd mapping, as the region" } else { "a Vec" },
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for t in threads {
        let copier = Copier::new(t);
        let (mut up, mut down) = (Vec::new(), Vec::new());
        for rep in 0..=a.reps {
            let start = Instant::now();
            for (i, c) in user.chunks(chunk).enumerate() {
                let at = (i % 4) * chunk;
                copier.copy(Toward::Region, &mut slots[at..at + c.len()], c);
            }
            let mid = Instant::now();
            for (i, c) in user.chunks_mut(chunk).enumerate() {
                let at = (i % 4) * chunk;
                copier.copy(Toward::Caller, c, &slots[at..at + c.len()]);
            }
            if rep > 0 {
                up.push(mid.duration_since(start).as_secs_f64());
                down.push(mid.elapsed().as_secs_f64());
            }
        }
        println!("  {t:2} threads: into the region {}; out of it {}", figure(total, &mut up), figure(total, &mut down));
    }
}

/// A shared memfd mapping populated up front, as the client's region is.
struct Memfd {
    ptr: *mut u8,
    len: usize,
}

impl Memfd {
    fn new(len: usize) -> Memfd {
        // SAFETY: plain syscalls; results checked.
        unsafe {
            let fd = libc::memfd_create(c"copy_bench".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0 && libc::ftruncate(fd, len as libc::off_t) == 0, "memfd");
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                0,
            );
            assert!(p != libc::MAP_FAILED, "mmap");
            libc::close(fd);
            Memfd { ptr: p.cast(), len }
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: a live mapping of `len` bytes, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Memfd {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Whole copies through gpumuxd.
fn daemon(a: &Args) -> gpumux_client::Result<()> {
    let mut options = ConnectOptions { socket: a.socket.clone(), ..ConnectOptions::named("copy_bench") };
    if let Some(&t) = a.threads.first() {
        options.copy_threads = t;
    }
    if let Some(m) = a.shm_max_mib {
        options.shm_max_bytes = m << 20;
    }
    let client = Client::connect(options)?;
    let total = a.mib << 20;
    let buf = client.alloc(total as u64)?;
    let stream = StreamId::DEFAULT;
    println!(
        "through gpumuxd ({}): {} MiB each way, {} copy threads, region {} MiB (grows to {} MiB)",
        client.welcome().device,
        a.mib,
        client.copy_threads(),
        client.shm_bytes() >> 20,
        a.shm_max_mib
            .unwrap_or(gpumux_client::DEFAULT_SHM_MAX_BYTES >> 20)
            .min(client.welcome().limits.shm_bytes >> 20)
    );
    for path in &a.paths {
        let mut vec_mem;
        let mut host_mem;
        let mem: &mut [u8] = match path.as_str() {
            "vec" => {
                vec_mem = vec![0u8; total];
                &mut vec_mem
            }
            "host" => {
                let start = Instant::now();
                host_mem = client.alloc_host(total as u64)?;
                println!(
                    "  a HostBuffer of {} MiB: allocated and pinned in {:.1} ms",
                    a.mib,
                    start.elapsed().as_secs_f64() * 1e3
                );
                &mut host_mem
            }
            other => {
                eprintln!("unknown path `{other}` (vec, host)");
                std::process::exit(2)
            }
        };
        let (mut up, mut down) = (Vec::new(), Vec::new());
        for rep in 0..=a.reps {
            fill(mem, rep as u32);
            let want = mem.to_vec();
            let start = Instant::now();
            client.copy_to_device(&buf, 0, mem, stream)?;
            let mid = Instant::now();
            mem.fill(0);
            let mid2 = Instant::now();
            client.copy_to_host(&buf, 0, mem, stream)?;
            let end = Instant::now();
            assert!(*mem == want[..], "{path}: the bytes did not round-trip in repetition {rep}");
            if rep > 0 {
                up.push(mid.duration_since(start).as_secs_f64());
                down.push(end.duration_since(mid2).as_secs_f64());
            }
        }
        let name = if path == "vec" { "from a Vec (staging)" } else { "from a HostBuffer (direct)" };
        println!("  {name:27} up {}; down {}", figure(total, &mut up), figure(total, &mut down));
    }
    println!("  region after: {} MiB", client.shm_bytes() >> 20);
    client.close()
}

fn main() {
    let a = parse();
    if a.mode == "memcpy" {
        memcpy(&a);
    } else if let Err(e) = daemon(&a) {
        eprintln!("copy_bench: {e}");
        std::process::exit(1);
    }
}
