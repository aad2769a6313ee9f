//! `gpumux ps` and `gpumux top`: the daemon's clients, once or live.
//!
//! Both connect to gpumuxd as a client without a shared region (they move
//! no data) and ask `Status`, which the daemon answers for any allowed uid;
//! the asking connection shows up in its own table.

use anyhow::{bail, Context, Result};
use gpumux_client::{Client, ConnectOptions, Status};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

/// Options shared by `ps` and `top`.
#[derive(clap::Args, Debug)]
pub struct PsArgs {
    /// The daemon's socket (default: $GPUMUX_SOCKET, else $XDG_RUNTIME_DIR/gpumux.sock or /run/gpumux/gpumux.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// JSON instead of a table (`top`: one line per refresh).
    #[arg(long)]
    json: bool,
}

/// `top` only.
#[derive(clap::Args, Debug)]
pub struct TopArgs {
    #[command(flatten)]
    common: PsArgs,
    /// Stop after this many refreshes (default: until `q` or Ctrl-C).
    #[arg(long, short = 'n')]
    iterations: Option<u64>,
}

fn connect(socket: Option<PathBuf>, name: &str) -> Result<Client> {
    let options = ConnectOptions { socket, shm_bytes: 0, ..ConnectOptions::named(name) };
    Ok(Client::connect(options)?)
}

/// `gpumux ps`.
pub fn ps(args: PsArgs) -> Result<()> {
    let client = connect(args.socket, "gpumux ps")?;
    let status = printable(client.status()?);
    if args.json {
        write_out(&format!("{}\n", serde_json::to_string_pretty(&status)?))
    } else {
        write_out(&render(&status))
    }
}

/// Writes `text` to standard output and flushes it: a full disk or a closed
/// file is an error with a message and exit status 1 (`gpumux ps >
/// /dev/full` panicked in `println!`, issue 36, case 9).
fn write_out(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).context("writing to standard output")
}

/// `status` with every client's name printable
/// ([`gpumux_client::printable_name`]). The daemon stores names that way
/// since issue 36 (case 6); this keeps a row from an older daemon from
/// moving the cursor or faking rows too, in the table and in `--json`.
fn printable(mut status: Status) -> Status {
    for c in &mut status.clients {
        c.name = gpumux_client::printable_name(&c.name);
    }
    status
}

/// `gpumux top`.
pub fn top(args: TopArgs) -> Result<()> {
    let client = connect(args.common.socket, "gpumux top")?;
    let mut refreshes = 0u64;
    let more = |n: u64| args.iterations.is_none_or(|max| n < max);
    if args.common.json {
        while more(refreshes) {
            write_out(&format!("{}\n", serde_json::to_string(&printable(client.status()?))?))?;
            refreshes += 1;
            if more(refreshes) {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        return Ok(());
    }
    let terminal = Terminal::enter()?;
    while more(refreshes) {
        let frame = render(&printable(client.status()?));
        terminal.draw(&frame)?;
        refreshes += 1;
        if more(refreshes) && terminal.quit_within(Duration::from_secs(1))? {
            break;
        }
    }
    Ok(())
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// The table: device, policy and totals, a row per GPU where there are
/// several, then one row per client (with its GPU where there are several).
pub fn render(s: &Status) -> String {
    let mut out = String::new();
    let queued: u32 = s.clients.iter().map(|c| c.ops_queued).sum();
    let running: u32 = s.clients.iter().map(|c| c.ops_running).sum();
    let held: u32 = s.clients.iter().map(|c| c.sms_held).sum();
    let _ = writeln!(
        out,
        "device {}   policy {}   up {:.0} s   context rebuilds {}",
        s.device, s.policy, s.uptime_s, s.context_rebuilds
    );
    let _ = writeln!(
        out,
        "{} clients   memory {} / {}   pinned host {}   ops {} queued, {} running   SMs {} / {} held",
        s.clients.len(),
        bytes(s.memory_used),
        bytes(s.memory_total),
        bytes(s.host_memory_used),
        queued,
        running,
        held,
        s.sms
    );
    // Memory no row holds: clients that have left, whose buffers are freed
    // once their last launches and copies leave the device (a kernel's
    // blocks in flight run to their end). A client killed mid-kernel showed
    // its memory here, with no row and no word, until then (issue 36, case 9).
    let listed: u64 = s.clients.iter().map(|c| c.memory_used).sum();
    let leaving = s.memory_used.saturating_sub(listed);
    if leaving > 0 {
        let _ = writeln!(
            out,
            "{} of that memory is held for clients that have left, until their work still on the device ends",
            bytes(leaving)
        );
    }
    // Oversubscription (docs/daemon.md, "Memory oversubscription").
    if s.memory_evicted > 0 {
        let _ = writeln!(
            out,
            "{} of that memory is evicted to host memory (the daemon may use {} for it; {} evictions, {} restores)",
            bytes(s.memory_evicted),
            bytes(s.swap_memory),
            s.evictions,
            s.restores
        );
    }
    // Several GPUs: a row each, and each client's GPU (docs/multi-gpu.md).
    let several = s.gpus.len() > 1;
    if several {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:>3} {:>7} {:>5} {:>11} {:>21} {:>8}  DEVICE",
            "GPU", "CLIENTS", "OPS", "SMS BUSY", "MEMORY", "REBUILDS"
        );
        for g in &s.gpus {
            let _ = writeln!(
                out,
                "{:>3} {:>7} {:>5} {:>11} {:>21} {:>8}  {}",
                g.gpu,
                g.clients,
                g.ops,
                format!("{} / {}", g.sms_busy, g.sms),
                format!("{} / {}", bytes(g.memory_used), bytes(g.memory_total)),
                g.context_rebuilds,
                g.device
            );
        }
    }
    let _ = writeln!(out);
    let gpu_head = if several { format!("{:>3} ", "GPU") } else { String::new() };
    let _ = writeln!(
        out,
        "{gpu_head}{:>4} {:>8} {:>6} {:<20} {:>4} {:>6} {:>21} {:>10} {:>10} {:>6} {:>5} {:>4} {:>8} {:>8}",
        "ID",
        "PID",
        "UID",
        "NAME",
        "PRIO",
        "WEIGHT",
        "MEMORY / QUOTA",
        "EVICTED",
        "PINNED",
        "QUEUED",
        "RUN",
        "SMS",
        "PREEMPT",
        "KERNELS"
    );
    for c in &s.clients {
        // Printable already (`printable`); cut to the column.
        let name: String = c.name.chars().take(20).collect();
        let memory = format!("{} / {}", bytes(c.memory_used), bytes(c.memory_quota));
        let gpu = if several { format!("{:>3} ", c.gpu) } else { String::new() };
        let _ = writeln!(
            out,
            "{gpu}{:>4} {:>8} {:>6} {:<20} {:>4} {:>6.2} {:>21} {:>10} {:>10} {:>6} {:>5} {:>4} {:>8} {:>8}",
            c.client,
            c.pid,
            c.uid,
            name,
            c.priority,
            c.weight,
            memory,
            bytes(c.memory_evicted),
            bytes(c.host_memory_used),
            c.ops_queued,
            c.ops_running,
            c.sms_held,
            c.preemptions,
            c.kernels_done
        );
    }
    out
}

/// The terminal while `top` runs: alternate screen, no echo, keys read one
/// by one (Ctrl-C arrives as a byte, so the screen is always restored).
/// Plain ANSI and termios: a crate for this would be bigger than the view.
struct Terminal {
    saved: libc::termios,
}

impl Terminal {
    fn enter() -> Result<Terminal> {
        // SAFETY: isatty only inspects the descriptors.
        if unsafe { libc::isatty(0) != 1 || libc::isatty(1) != 1 } {
            bail!("gpumux top needs a terminal; use `gpumux top --json` or `gpumux ps` in scripts");
        }
        // SAFETY: tcgetattr fills a zeroed termios for stdin, a terminal (checked).
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        if unsafe { libc::tcgetattr(0, &mut saved) } != 0 {
            return Err(std::io::Error::last_os_error()).context("reading the terminal's settings");
        }
        let mut raw = saved;
        raw.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG);
        raw.c_cc[libc::VMIN] = 1;
        raw.c_cc[libc::VTIME] = 0;
        // SAFETY: sets settings derived from the terminal's own.
        if unsafe { libc::tcsetattr(0, libc::TCSANOW, &raw) } != 0 {
            return Err(std::io::Error::last_os_error()).context("setting the terminal up");
        }
        let mut stdout = std::io::stdout().lock();
        write!(stdout, "\x1b[?1049h\x1b[?25l")?;
        stdout.flush()?;
        Ok(Terminal { saved })
    }

    fn draw(&self, frame: &str) -> Result<()> {
        let mut stdout = std::io::stdout().lock();
        write!(stdout, "\x1b[H\x1b[2J{}\r\n(q quits)", frame.replace('\n', "\r\n"))?;
        stdout.flush()?;
        Ok(())
    }

    /// Waits up to `timeout` for a key; true if it was `q`, `Q` or Ctrl-C.
    fn quit_within(&self, timeout: Duration) -> Result<bool> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let mut fds = libc::pollfd { fd: 0, events: libc::POLLIN, revents: 0 };
            // SAFETY: polls one descriptor, described by a live pollfd.
            let ready = unsafe { libc::poll(&mut fds, 1, left.as_millis().min(i32::MAX as u128) as i32) };
            if ready <= 0 {
                continue;
            }
            let mut key = [0u8; 1];
            // SAFETY: reads at most one byte into a live buffer.
            let n = unsafe { libc::read(0, key.as_mut_ptr().cast(), 1) };
            if n <= 0 || matches!(key[0], b'q' | b'Q' | 3) {
                return Ok(true);
            }
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let mut stdout = std::io::stdout().lock();
        let _ = write!(stdout, "\x1b[?25h\x1b[?1049l");
        let _ = stdout.flush();
        // SAFETY: restores the settings read in `enter`.
        unsafe {
            libc::tcsetattr(0, libc::TCSANOW, &self.saved);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumux_client::ClientStatus;

    #[test]
    fn the_table_shows_totals_and_one_row_per_client() {
        let row = |client, name: &str, used, queued, running, sms| ClientStatus {
            client,
            gpu: 0,
            pid: 4242,
            uid: 1000,
            gid: 1000,
            name: name.into(),
            priority: 2,
            weight: 1.5,
            memory_used: used,
            memory_evicted: used / 2,
            memory_quota: 1 << 30,
            host_memory_used: 512 << 20,
            host_memory_quota: 4 << 30,
            ops_queued: queued,
            ops_running: running,
            sms_held: sms,
            preemptions: 7,
            kernels_done: 12,
        };
        let status = Status {
            device: "sim:h100".into(),
            policy: "dss-cs".into(),
            sms: 132,
            memory_used: 3 << 20,
            memory_total: 80 << 30,
            memory_evicted: 0,
            swap_memory: 8 << 30,
            evictions: 0,
            restores: 0,
            host_memory_used: 1 << 30,
            uptime_s: 12.4,
            context_rebuilds: 0,
            clients: vec![row(1, "vector_add", 1 << 20, 2, 1, 66), row(2, "matmul", 2 << 20, 0, 1, 66)],
            gpus: Vec::new(),
        };
        let text = render(&status);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "device sim:h100   policy dss-cs   up 12 s   context rebuilds 0");
        assert_eq!(
            lines[1],
            "2 clients   memory 3.0 MiB / 80.0 GiB   pinned host 1.0 GiB   ops 2 queued, 2 running   SMs 132 / 132 held"
        );
        assert!(lines[3].split_whitespace().eq([
            "ID", "PID", "UID", "NAME", "PRIO", "WEIGHT", "MEMORY", "/", "QUOTA", "EVICTED", "PINNED", "QUEUED", "RUN",
            "SMS", "PREEMPT", "KERNELS"
        ]));
        assert!(lines[4].split_whitespace().eq([
            "1",
            "4242",
            "1000",
            "vector_add",
            "2",
            "1.50",
            "1.0",
            "MiB",
            "/",
            "1.0",
            "GiB",
            "512.0",
            "KiB",
            "512.0",
            "MiB",
            "2",
            "1",
            "66",
            "7",
            "12"
        ]));
        assert_eq!(lines.len(), 6);
    }

    fn one_client(name: &str, memory_used: u64) -> ClientStatus {
        ClientStatus {
            client: 1,
            gpu: 0,
            pid: 1,
            uid: 1000,
            gid: 1000,
            name: name.into(),
            priority: 0,
            weight: 1.0,
            memory_used,
            memory_evicted: 0,
            memory_quota: 1 << 30,
            host_memory_used: 0,
            host_memory_quota: 0,
            ops_queued: 0,
            ops_running: 0,
            sms_held: 0,
            preemptions: 0,
            kernels_done: 0,
        }
    }

    fn status_of(memory_used: u64, clients: Vec<ClientStatus>) -> Status {
        Status {
            device: "sim:h100".into(),
            policy: "fcfs".into(),
            sms: 132,
            memory_used,
            memory_total: 80 << 30,
            memory_evicted: 0,
            swap_memory: 0,
            evictions: 0,
            restores: 0,
            host_memory_used: 0,
            uptime_s: 1.0,
            context_rebuilds: 0,
            clients,
            gpus: Vec::new(),
        }
    }

    /// Several GPUs: a row per GPU with its busy SMs and memory, and each client's GPU.
    #[test]
    fn several_gpus_show_a_row_each_and_each_clients_gpu() {
        let gpu = |gpu, clients, sms_busy, memory_used| gpumux_client::GpuStatus {
            gpu,
            device: format!("sim:h100 #{gpu}"),
            sms: 132,
            sms_busy,
            memory_used,
            memory_total: 80 << 30,
            clients,
            ops: 3,
            context_rebuilds: gpu,
        };
        let mut a = one_client("a", 1 << 20);
        let mut b = one_client("b", 2 << 20);
        (a.client, a.gpu, b.client, b.gpu) = (1, 1, 2, 0);
        let mut status = status_of(3 << 20, vec![a, b]);
        status.gpus = vec![gpu(0, 1, 66, 2 << 20), gpu(1, 1, 132, 1 << 20)];
        let text = render(&status);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[3].split_whitespace().eq(["GPU", "CLIENTS", "OPS", "SMS", "BUSY", "MEMORY", "REBUILDS", "DEVICE"]),
            "{text}"
        );
        assert!(
            lines[4]
                .split_whitespace()
                .eq(["0", "1", "3", "66", "/", "132", "2.0", "MiB", "/", "80.0", "GiB", "0", "sim:h100", "#0"]),
            "{text}"
        );
        assert!(
            lines[5]
                .split_whitespace()
                .eq(["1", "1", "3", "132", "/", "132", "1.0", "MiB", "/", "80.0", "GiB", "1", "sim:h100", "#1"]),
            "{text}"
        );
        assert_eq!(lines[7].split_whitespace().take(2).collect::<Vec<_>>(), ["GPU", "ID"], "{text}");
        let rows: Vec<Vec<&str>> = lines[8..].iter().map(|l| l.split_whitespace().take(5).collect()).collect();
        assert_eq!(rows, [vec!["1", "1", "1", "1000", "a"], vec!["0", "2", "1", "1000", "b"]], "{text}");
        // One GPU: the table of old, no GPU column.
        status.gpus.truncate(1);
        assert!(render(&status).lines().nth(3).is_some_and(|l| l.trim_start().starts_with("ID")));
    }

    /// Issue 36, case 6: on 717b546 this name printed a line of its own
    /// that looked like another client's row, and cleared the screen.
    #[test]
    fn a_name_cannot_fake_rows_or_move_the_cursor_in_the_table_or_the_json() {
        let evil = "a\n   2        1      0 root-job             9\x1b[2J\x1b[H\u{202e}";
        let status = printable(status_of(0, vec![one_client(evil, 0)]));
        let text = render(&status);
        assert_eq!(text.lines().count(), 5, "one row for one client:\n{text}");
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text:?}");
        assert!(text.lines().nth(4).unwrap().contains("a\\n   2        1"), "{text}");
        // What a script reading `--json` gets, and may print.
        let back: Status = serde_json::from_str(&serde_json::to_string(&status).unwrap()).unwrap();
        assert!(!back.clients[0].name.chars().any(char::is_control), "{:?}", back.clients[0].name);
    }

    /// Issue 36, case 9: memory of clients that left (their kernels still
    /// running out) was in the total with no row and no word on 717b546.
    #[test]
    fn memory_no_row_holds_is_explained() {
        let text = render(&status_of(3 << 20, vec![one_client("stays", 2 << 20)]));
        assert_eq!(
            text.lines().nth(2),
            Some(
                "1.0 MiB of that memory is held for clients that have left, until their work still on the device ends"
            ),
            "{text}"
        );
        let text = render(&status_of(2 << 20, vec![one_client("stays", 2 << 20)]));
        assert!(!text.contains("have left"), "{text}");
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(80 << 30), "80.0 GiB");
    }
}
