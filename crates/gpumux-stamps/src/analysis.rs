//! Joins the stamps of every process in a folder per kernel, and says which
//! stage paces a program of launches (`gpumux stamps DIR`).
//!
//! **Joining.** A kernel is an engine operation (the core's `core_read`
//! makes it, carrying the client's pid and frame id, which key the client's
//! own stamps in its file `<pid>.stamps`; a client's frame ids start again
//! on each connection, so a client stamp joins the first read of its frame id
//! after it). The core's `core_launch` carries
//! the launch id, which keys the device's `end_seen` and the core's
//! `core_end`. A stage stamped twice for one kernel (a launch's workers
//! started again after a retreat) counts its first time.
//!
//! **Runs.** A client's kernels in `core_read` order are cut into runs where
//! the client's launch calls pause for more than [`RUN_GAP_NS`]; runs of
//! fewer than `min_run` kernels (a stencil, a copy) are left out, and so is
//! the first run left when there are several (a warm-up).
//!
//! **Reading it.** Each stage's p50 gap between consecutive kernels of a run
//! is the rate that stage moves at: in a chain every stage moves at the pace
//! of the slowest, and the stage whose lag behind the one before grows is
//! where kernels wait. `exchanges` are the core's lockstep polls of its
//! device process in the runs' time; `the GPU idle` counts kernels whose
//! `cuLaunchKernel` returned after the kernel before them was seen ended
//! (the GPU had nothing queued: at least that long idle).

use crate::Stage;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

/// A pause in a client's launch calls longer than this ends a run.
pub const RUN_GAP_NS: u64 = 1_000_000;

/// The stages of a kernel's way, in causal order along its main path
/// (each one's p50 lag is against the one before it).
pub const PATH: [Stage; 9] = [
    Stage::ClientCall,
    Stage::ClientWrite,
    Stage::CoreRead,
    Stage::CoreBind,
    Stage::HostBind,
    Stage::LaunchStart,
    Stage::LaunchReturn,
    Stage::EndSeen,
    Stage::CoreEnd,
];

/// The engine's side path: its launch command, after the bind.
pub const COMMAND: [Stage; 2] = [Stage::CoreLaunch, Stage::HostLaunch];

/// One stamp as read from a file.
#[derive(Clone, Copy, Debug)]
pub struct Line {
    /// The process (its file).
    pub pid: u32,
    /// Its parent, from the file's header (0: not said): a device process's
    /// stamps join its daemon's.
    pub ppid: u32,
    /// ns.
    pub ns: u64,
    /// The stage.
    pub stage: Stage,
    /// Its key.
    pub key: u64,
    /// Its second number.
    pub aux: u64,
}

/// Why a folder could not be read.
#[derive(Debug)]
pub struct ReadError(pub String);

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ReadError {}

/// Every `*.stamps` file in `dir`.
pub fn read_dir(dir: &Path) -> Result<Vec<Line>, ReadError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ReadError(format!("{}: {e}", dir.display())))?;
    let mut lines = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| ReadError(format!("{}: {e}", dir.display())))?.path();
        if path.extension().is_none_or(|x| x != "stamps") {
            continue;
        }
        let pid: u32 = path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ReadError(format!("{}: not named <pid>.stamps", path.display())))?;
        let text = std::fs::read_to_string(&path).map_err(|e| ReadError(format!("{}: {e}", path.display())))?;
        parse(pid, &text, &mut lines).map_err(|e| ReadError(format!("{}: {e}", path.display())))?;
    }
    Ok(lines)
}

/// The records of one file's `text` (process `pid`), appended to `out`.
pub fn parse(pid: u32, text: &str, out: &mut Vec<Line>) -> Result<(), String> {
    let mut ppid = 0;
    for (i, line) in text.lines().enumerate() {
        if let Some(header) = line.strip_prefix("# gpumux stamps ") {
            let field = header.split_ascii_whitespace().find_map(|f| f.strip_prefix("ppid="));
            ppid = field.and_then(|p| p.parse().ok()).unwrap_or(0);
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let bad = || format!("line {}: `{line}` is not `ns stage key aux tid`", i + 1);
        let mut f = line.split_ascii_whitespace();
        let ns = f.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
        let stage = f.next().and_then(Stage::from_name).ok_or_else(bad)?;
        let key = f.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
        let aux = f.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
        out.push(Line { pid, ppid, ns, stage, key, aux });
    }
    Ok(())
}

/// One kernel's stamps, joined.
#[derive(Clone, Debug, Default)]
pub struct Kernel {
    /// The engine's operation.
    pub op: u64,
    /// The client's pid.
    pub client: u32,
    /// Each stage's first time, by `Stage as usize`.
    pub at: [Option<u64>; Stage::ALL.len()],
}

impl Kernel {
    /// The stage's time.
    pub fn t(&self, s: Stage) -> Option<u64> {
        self.at[s as usize]
    }

    fn set(&mut self, s: Stage, ns: u64) {
        let slot = &mut self.at[s as usize];
        *slot = Some(slot.map_or(ns, |t| t.min(ns)));
    }

    /// The stages of [`PATH`] and [`COMMAND`] it has no stamp of.
    pub fn missing(&self) -> Vec<Stage> {
        PATH.iter().chain(COMMAND.iter()).copied().filter(|s| self.t(*s).is_none()).collect()
    }

    /// The first pair of stages along its causal order (see [`PATH`]; the
    /// command after the bind, its receipt after it; the core's end after
    /// the command) stamped out of order.
    pub fn out_of_order(&self) -> Option<(Stage, Stage)> {
        let mut pairs: Vec<(Stage, Stage)> = PATH.windows(2).map(|w| (w[0], w[1])).collect();
        pairs.extend([
            (Stage::CoreBind, Stage::CoreLaunch),
            (Stage::CoreLaunch, Stage::HostLaunch),
            (Stage::CoreLaunch, Stage::CoreEnd),
        ]);
        pairs.into_iter().find(|(a, b)| matches!((self.t(*a), self.t(*b)), (Some(x), Some(y)) if y < x))
    }
}

/// A client frame's read by a core: when, the daemon's pid, the operation.
type FrameRead = (u64, u32, u64);

/// Every kernel a `core_read` names, in `core_read` order, with the
/// exchanges' stamps left aside.
pub fn join(lines: &[Line]) -> Vec<Kernel> {
    // Operations and launches are numbered per daemon: keyed by the daemon's
    // pid (a device process's parent), so that several daemon starts in one
    // folder do not mix.
    let daemons: std::collections::HashSet<u32> =
        lines.iter().filter(|l| l.stage == Stage::CoreRead).map(|l| l.pid).collect();
    let daemon_of = |l: &Line| if daemons.contains(&l.pid) { l.pid } else { l.ppid };
    let mut kernels: HashMap<(u32, u64), Kernel> = HashMap::new();
    // A client's frame ids start again on each connection: a frame's reads,
    // each (read, daemon, operation).
    let mut frames: HashMap<(u32, u64), Vec<FrameRead>> = HashMap::new();
    let mut launches: HashMap<(u32, u64), u64> = HashMap::new();
    for l in lines {
        match l.stage {
            Stage::CoreRead => {
                let (client, frame) = ((l.aux >> 40) as u32, l.aux & ((1 << 40) - 1));
                frames.entry((client, frame)).or_default().push((l.ns, l.pid, l.key));
                let k =
                    kernels.entry((l.pid, l.key)).or_insert_with(|| Kernel { op: l.key, client, ..Kernel::default() });
                k.client = client;
                k.set(Stage::CoreRead, l.ns);
            }
            Stage::CoreLaunch => {
                launches.insert((l.pid, l.aux), l.key);
            }
            _ => {}
        }
    }
    for l in lines {
        let d = daemon_of(l);
        let op = match l.stage {
            // The first read of that frame id after the client's stamp.
            Stage::ClientCall | Stage::ClientWrite => frames
                .get(&(l.pid, l.key))
                .and_then(|reads| reads.iter().filter(|(read, ..)| *read >= l.ns).min())
                .map(|&(_, d, op)| (d, op)),
            // The daemon's reader, keyed by the client's pid and frame id as `core_read`'s aux.
            Stage::ReaderRead => frames
                .get(&((l.key >> 40) as u32, l.key & ((1 << 40) - 1)))
                .and_then(|reads| reads.iter().filter(|(read, d, _)| *read >= l.ns && *d == l.pid).min())
                .map(|&(_, d, op)| (d, op)),
            Stage::CoreBind
            | Stage::CoreLaunch
            | Stage::HostBind
            | Stage::HostLaunch
            | Stage::LaunchPosted
            | Stage::LaunchStart
            | Stage::LaunchReturn
            | Stage::EndSeenAhead => Some((d, l.key)),
            Stage::EndSeen | Stage::CoreEnd => launches.get(&(d, l.key)).map(|op| (d, *op)),
            _ => None,
        };
        let Some(k) = op.and_then(|op| kernels.get_mut(&op)) else { continue };
        // An end seen ahead is the end seen, earlier.
        let stage = if l.stage == Stage::EndSeenAhead { Stage::EndSeen } else { l.stage };
        k.set(stage, l.ns);
    }
    let mut v: Vec<Kernel> = kernels.into_values().collect();
    v.sort_by_key(|k| (k.t(Stage::CoreRead), k.op));
    v
}

/// The runs of at least `min_run` kernels ([module doc](self)), the first
/// dropped when there are several.
pub fn runs(kernels: &[Kernel], min_run: usize) -> Vec<Vec<Kernel>> {
    let mut by_client: HashMap<u32, Vec<&Kernel>> = HashMap::new();
    for k in kernels {
        by_client.entry(k.client).or_default().push(k);
    }
    let mut runs: Vec<Vec<Kernel>> = Vec::new();
    let mut clients: Vec<_> = by_client.into_iter().collect();
    clients.sort_by_key(|(c, _)| *c);
    for (_, ks) in clients {
        let mut run: Vec<Kernel> = Vec::new();
        let mut last: Option<u64> = None;
        for k in ks {
            let t = k.t(Stage::ClientCall).or(k.t(Stage::CoreRead)).unwrap_or(0);
            if last.is_some_and(|l| t.saturating_sub(l) > RUN_GAP_NS) {
                runs.push(std::mem::take(&mut run));
            }
            last = Some(t);
            run.push(k.clone());
        }
        runs.push(run);
    }
    runs.retain(|r| r.len() >= min_run);
    if runs.len() > 1 {
        runs.remove(0);
    }
    runs
}

fn p50(v: &mut [i64]) -> Option<i64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    Some(v[v.len() / 2])
}

fn us(ns: Option<i64>) -> String {
    ns.map_or_else(|| "-".into(), |n| format!("{:.2}", n as f64 / 1000.0))
}

/// The exchanges' figures over the given windows.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Exchanges {
    /// Core exchanges started in the windows.
    pub count: usize,
    /// Their p50 length (sent to answer read), ns.
    pub p50_ns: Option<i64>,
    /// The core's time blocked on answers in them, ns.
    pub waited_ns: u64,
    /// Device-process polls answered in the windows.
    pub host_polls: usize,
    /// Their p50 time in the device process (received to answered), ns.
    pub host_p50_ns: Option<i64>,
}

/// The core's exchanges within `windows` (`[start, end]` ns).
pub fn exchanges(lines: &[Line], windows: &[(u64, u64)]) -> Exchanges {
    let inside = |t: u64| windows.iter().any(|(a, b)| t >= *a && t <= *b);
    let mut by_key: HashMap<(u32, u64), [Option<u64>; 3]> = HashMap::new();
    let mut host: HashMap<u64, [Option<u64>; 2]> = HashMap::new();
    for l in lines {
        let i = match l.stage {
            Stage::ExchangeStart => 0,
            Stage::WaitStart => 1,
            Stage::ExchangeEnd => 2,
            // Keyed by the device process's pid already.
            Stage::HostPoll => {
                host.entry(l.key).or_default()[0] = Some(l.ns);
                continue;
            }
            Stage::HostAnswer => {
                host.entry(l.key).or_default()[1] = Some(l.ns);
                continue;
            }
            _ => continue,
        };
        by_key.entry((l.pid, l.key)).or_default()[i] = Some(l.ns);
    }
    let mut host_lens: Vec<i64> = host
        .values()
        .filter_map(|[a, b]| a.zip(*b))
        .filter(|(a, _)| inside(*a))
        .map(|(a, b)| b.saturating_sub(a) as i64)
        .collect();
    let host_polls = host_lens.len();
    let mut lens = Vec::new();
    let mut waited = 0u64;
    for [s, w, e] in by_key.values() {
        let Some(s) = *s else { continue };
        if !inside(s) {
            continue;
        }
        if let Some(e) = *e {
            lens.push(e.saturating_sub(s) as i64);
            if let Some(w) = *w {
                waited += e.saturating_sub(w);
            }
        }
    }
    let count = lens.len();
    Exchanges { count, p50_ns: p50(&mut lens), waited_ns: waited, host_polls, host_p50_ns: p50(&mut host_lens) }
}

/// The report `gpumux stamps DIR` prints.
pub fn report(lines: &[Line], min_run: usize) -> String {
    let all = join(lines);
    let runs = runs(&all, min_run);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "stamps: {} records, {} kernels joined, {} run(s) of >= {min_run} kernels analysed",
        lines.len(),
        all.len(),
        runs.len()
    );
    if runs.is_empty() {
        return s;
    }
    let kernels: Vec<&Kernel> = runs.iter().flatten().collect();
    let complete = kernels.iter().filter(|k| k.missing().is_empty()).count();
    let mut missing: HashMap<Stage, usize> = HashMap::new();
    for k in &kernels {
        for m in k.missing() {
            *missing.entry(m).or_default() += 1;
        }
    }
    let _ = write!(s, "kernels: {} in the runs, {complete} with every stage", kernels.len());
    let mut m: Vec<_> = missing.into_iter().collect();
    m.sort();
    for (st, n) in m {
        let _ = write!(s, "; {n} without {}", st.name());
    }
    let _ = writeln!(s);
    let mut windows = Vec::new();
    let mut lens = Vec::new();
    for r in &runs {
        // From the first stamp of the run's kernels to the last (its last end
        // read, unless that stage is missing).
        let first = r.iter().filter_map(|k| k.at.iter().flatten().min().copied()).min();
        let last = r.iter().filter_map(|k| k.at.iter().flatten().max().copied()).max();
        if let (Some(a), Some(b)) = (first, last) {
            windows.push((a, b));
            lens.push(b.saturating_sub(a) as i64);
        }
    }
    let per_run = p50(&mut lens.clone());
    let _ = writeln!(
        s,
        "runs: p50 {} ms from the first launch call to the last end read (or the last stamp) ({} kernels a run)",
        per_run.map_or_else(|| "-".into(), |n| format!("{:.3}", n as f64 / 1e6)),
        kernels.len() / runs.len()
    );
    let _ = writeln!(s, "{:<16} {:>12} {:>13} {:>14}", "stage", "p50 gap µs", "mean gap µs", "p50 lag µs");
    let mut order: Vec<(Stage, Option<Stage>)> =
        PATH.iter().enumerate().map(|(i, st)| (*st, (i > 0).then(|| PATH[i - 1]))).collect();
    // Stamped only for launches made on the launcher thread: its lags then
    // split the device's part (bind to post) from the launcher's (post to call).
    if kernels.iter().any(|k| k.t(Stage::LaunchPosted).is_some()) {
        order.push((Stage::LaunchPosted, Some(Stage::HostBind)));
        order.push((Stage::LaunchStart, Some(Stage::LaunchPosted)));
    }
    order.push((Stage::CoreLaunch, Some(Stage::CoreBind)));
    order.push((Stage::HostLaunch, Some(Stage::CoreLaunch)));
    let mut pacer: Option<(Stage, i64)> = None;
    for (st, before) in order {
        let mut gaps = Vec::new();
        for r in &runs {
            for w in r.windows(2) {
                if let (Some(a), Some(b)) = (w[0].t(st), w[1].t(st)) {
                    gaps.push(b as i64 - a as i64);
                }
            }
        }
        let mut lags = Vec::new();
        if let Some(b) = before {
            for k in &kernels {
                if let (Some(x), Some(y)) = (k.t(b), k.t(st)) {
                    lags.push(y as i64 - x as i64);
                }
            }
        }
        let mean = (!gaps.is_empty()).then(|| gaps.iter().sum::<i64>() / gaps.len() as i64);
        let g = p50(&mut gaps);
        if let Some(g) = g {
            if pacer.is_none_or(|(_, p)| g > p) {
                pacer = Some((st, g));
            }
        }
        let lag = if before.is_some() { us(p50(&mut lags)) } else { String::new() };
        let _ = writeln!(s, "{:<16} {:>12} {:>13} {:>14}", st.name(), us(g), us(mean), lag);
    }
    if let Some((st, g)) = pacer {
        let _ = writeln!(
            s,
            "pacer: {} (the largest p50 gap, {:.2} µs a kernel; a mean gap well above a stage's p50 gap says it moves in bursts)",
            st.name(),
            g as f64 / 1000.0
        );
    }
    let x = exchanges(lines, &windows);
    let n = kernels.len().max(1) as f64;
    let _ = writeln!(
        s,
        "exchanges: {} core polls of the device process in the runs ({:.2} a kernel; {} answered by it, p50 {} µs \
         from its receipt to its answer), p50 {} µs each, the core blocked {:.2} µs a kernel waiting for answers",
        x.count,
        x.count as f64 / n,
        x.host_polls,
        us(x.host_p50_ns),
        us(x.p50_ns),
        x.waited_ns as f64 / n / 1000.0
    );
    let mut idle = Vec::new();
    for r in &runs {
        for w in r.windows(2) {
            if let (Some(end), Some(next)) = (w[0].t(Stage::EndSeen), w[1].t(Stage::LaunchReturn)) {
                if next > end {
                    idle.push((next - end) as i64);
                }
            }
        }
    }
    let idle_n = idle.len();
    let idle_sum: i64 = idle.iter().sum();
    let _ = writeln!(
        s,
        "the GPU idle: {idle_n} of {} kernels launched after the one before was seen ended, p50 {} µs, {:.2} µs a kernel at least",
        kernels.len(),
        us(p50(&mut idle)),
        idle_sum as f64 / n / 1000.0
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain of `n` kernels whose stages are `step` ns apart, kernel k
    /// starting at `k * gap`; one exchange per kernel.
    fn chain(n: u64, gap: u64, step: u64) -> Vec<Line> {
        let mut v = Vec::new();
        let client = 7u32;
        for k in 0..n {
            let t0 = 1_000_000 + k * gap;
            let op = 100 + k;
            let frame = 10 + k;
            let launch = 500 + k;
            // The daemon is process 1, its device process 2.
            let mut push = |pid: u32, i: u64, stage: Stage, key: u64, aux: u64| {
                let ppid = if pid == 2 { 1 } else { 0 };
                v.push(Line { pid, ppid, ns: t0 + i * step, stage, key, aux })
            };
            push(client, 0, Stage::ClientCall, frame, 0);
            push(client, 1, Stage::ClientWrite, frame, 0);
            push(1, 2, Stage::CoreRead, op, (u64::from(client) << 40) | frame);
            push(1, 3, Stage::CoreBind, op, 0);
            push(2, 4, Stage::HostBind, op, 0);
            push(2, 5, Stage::LaunchStart, op, 0);
            push(2, 6, Stage::LaunchReturn, op, 0);
            push(1, 6, Stage::CoreLaunch, op, launch);
            push(2, 7, Stage::HostLaunch, op, launch);
            push(2, 8, Stage::EndSeen, launch, 0);
            push(1, 9, Stage::CoreEnd, launch, 0);
            push(1, 7, Stage::ExchangeStart, k, 0);
            push(1, 7, Stage::WaitStart, k, 0);
            push(1, 8, Stage::ExchangeEnd, k, 0);
        }
        v
    }

    #[test]
    fn a_chain_joins_every_stage_by_frame_operation_and_launch() {
        let lines = chain(50, 10_000, 100);
        let ks = join(&lines);
        assert_eq!(ks.len(), 50);
        for k in &ks {
            assert!(k.missing().is_empty(), "kernel {} lacks {:?}", k.op, k.missing());
            assert_eq!(k.out_of_order(), None);
            assert_eq!(k.t(Stage::CoreEnd).zip(k.t(Stage::ClientCall)).map(|(e, c)| e - c), Some(900));
        }
    }

    #[test]
    fn the_report_names_the_gap_of_a_chain_and_one_exchange_a_kernel() {
        let lines = chain(200, 12_000, 100);
        let r = report(&lines, 100);
        assert!(r.contains("200 in the runs, 200 with every stage"), "{r}");
        assert!(r.contains("exchanges: 200 core polls"), "{r}");
        assert!(r.contains("(1.00 a kernel"), "{r}");
        assert!(r.contains("the core blocked 0.10 µs a kernel"), "{r}");
        assert!(r.contains("client_call             12.00         12.00"), "{r}");
    }

    #[test]
    fn a_stage_late_on_one_kernel_paces_and_an_out_of_order_pair_is_found() {
        let mut lines = chain(120, 10_000, 100);
        // The end read of every kernel lags further: its gap grows to 10.5 µs.
        for l in lines.iter_mut().filter(|l| l.stage == Stage::CoreEnd) {
            l.ns += (l.key - 500) * 500;
        }
        let r = report(&lines, 100);
        assert!(r.contains("pacer: core_end (the largest p50 gap, 10.50 µs"), "{r}");
        let mut lines = chain(3, 10_000, 100);
        let end = lines.iter_mut().find(|l| l.stage == Stage::CoreEnd).map(|l| l.ns = 0);
        assert!(end.is_some());
        let ks = join(&lines);
        assert_eq!(ks[0].out_of_order(), Some((Stage::EndSeen, Stage::CoreEnd)));
    }

    #[test]
    fn runs_split_at_a_pause_and_the_first_is_left_out_as_a_warm_up() {
        let mut lines = chain(100, 10_000, 100);
        let mut later = chain(100, 10_000, 100);
        for l in later.iter_mut() {
            l.ns += 50_000_000;
            if matches!(
                l.stage,
                Stage::CoreRead
                    | Stage::CoreBind
                    | Stage::HostBind
                    | Stage::LaunchStart
                    | Stage::LaunchReturn
                    | Stage::CoreLaunch
                    | Stage::HostLaunch
            ) {
                l.key += 1000;
            }
            if l.stage == Stage::CoreRead {
                l.aux += 1000;
            }
            if matches!(l.stage, Stage::ClientCall | Stage::ClientWrite) {
                l.key += 1000;
            }
            if matches!(l.stage, Stage::CoreLaunch | Stage::HostLaunch) {
                l.aux += 1000;
            }
            if matches!(l.stage, Stage::EndSeen | Stage::CoreEnd) {
                l.key += 1000;
            }
        }
        lines.extend(later);
        let ks = join(&lines);
        assert_eq!(ks.len(), 200);
        let rs = runs(&ks, 50);
        assert_eq!(rs.len(), 1, "two runs, the first a warm-up");
        assert!(rs[0].iter().all(|k| k.op >= 1100));
    }

    #[test]
    fn two_daemons_numbering_their_operations_alike_do_not_mix() {
        let mut lines = chain(20, 10_000, 100);
        // A second daemon (pid 3, device process 4) later, with the same numbers, and client 8.
        let mut other = chain(20, 10_000, 100);
        for l in other.iter_mut() {
            crate::test_lines::as_second_daemon(l);
            if l.stage == Stage::CoreRead {
                l.aux = (8u64 << 40) | (l.aux & ((1 << 40) - 1));
            }
        }
        lines.extend(other);
        let ks = join(&lines);
        assert_eq!(ks.len(), 40);
        for k in &ks {
            assert!(k.missing().is_empty(), "kernel {} lacks {:?}", k.op, k.missing());
            let span = k.t(Stage::CoreEnd).zip(k.t(Stage::ClientCall)).map(|(e, c)| e - c);
            assert_eq!(span, Some(900), "kernel {} of client {} joined across daemons", k.op, k.client);
        }
    }

    #[test]
    fn a_file_line_that_is_not_a_record_is_an_error_naming_it() {
        let mut out = Vec::new();
        assert!(parse(1, "# gpumux stamps pid=1 ppid=9\n5 core_read 1 2 3\n", &mut out).is_ok());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].ppid, 9, "the header names the parent");
        let e = parse(1, "5 nonsense 1 2 3\n", &mut out).expect_err("an unknown stage");
        assert!(e.contains("line 1"), "{e}");
    }
}
