//! A launch + sync, stage by stage on one clock, client to GPU and back
//! (`gpumux stamps DIR --syncs`; issue 35's "empty launch + sync" goals).
//!
//! **Why.** The daemon's own stages of a lone launch + sync (its log's
//! `wait`, `decide`, `run`, `finish`, `sync`) added up to about half of what
//! the client measured 2 ms after its last; the rest lay before the
//! connection's reader decoded the request or after the core wrote the reply:
//! a wake-up on the client's side or the reader's, never placed. Here every
//! thread on that way stamps it (the client's launch and its waiting call,
//! both readers, the core, the device process), and one trip is one sync
//! with the launch before it.
//!
//! **Joining.** A trip starts at the core's `core_sync` (key: the client's
//! pid and frame id). Its launch is the kernel the core read last from that
//! client before it ([`crate::analysis::join`]); the client's own stamps of
//! the sync's frame are the latest `wait_call` of that frame id before the
//! core took it, then the first of each later stage; the daemon's are the
//! latest `reader_read` of the frame's key before `core_sync` and the first
//! `core_reply` after it.
//!
//! **Reading it.** Trips are split by how long the client was away before
//! the launch: back to back (the launch called within [`PAUSE_NS`] of the
//! last sync's return) and after a pause. For each, every stage's p50 time
//! after the launch's call, in that order, and the p50 of each stage's lag
//! behind the stage listed before it (per trip): where the trip's time goes.
//! Below them, how often a thread on the way slept: the waiting call (its
//! poll window passed), the library's reader thread (woken by a doorbell),
//! the daemon's reader (woken by a doorbell).

use crate::analysis::{join, Kernel, Line};
use crate::Stage;
use std::collections::HashMap;
use std::fmt::Write as _;

/// A client away longer than this before its launch: the trip counts as
/// after a pause (the bench's idle case is 2 ms).
pub const PAUSE_NS: u64 = 1_000_000;

/// The stages of a trip, the launch's first (its stamps from
/// [`crate::analysis::join`]), then the sync's.
pub const TRIP: [TripStage; 17] = [
    TripStage::Launch(Stage::ClientCall),
    TripStage::Launch(Stage::ClientWrite),
    TripStage::Launch(Stage::ReaderRead),
    TripStage::Launch(Stage::CoreRead),
    TripStage::Launch(Stage::CoreLaunch),
    TripStage::Launch(Stage::HostLaunch),
    TripStage::Launch(Stage::LaunchStart),
    TripStage::Launch(Stage::LaunchReturn),
    TripStage::Launch(Stage::EndSeen),
    TripStage::Launch(Stage::CoreEnd),
    TripStage::Sync(Stage::WaitCall),
    TripStage::Sync(Stage::ReaderRead),
    TripStage::Sync(Stage::CoreSync),
    TripStage::Sync(Stage::CoreReply),
    TripStage::Sync(Stage::ReplySeen),
    TripStage::Sync(Stage::WaitPoll),
    TripStage::Sync(Stage::WaitReturn),
];

/// A stage of a trip: of its launch, or of its sync's request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TripStage {
    /// A stage of the launch (keyed as [`crate::analysis`] joins kernels).
    Launch(Stage),
    /// A stage of the sync's frame.
    Sync(Stage),
}

impl TripStage {
    /// Its name in the report (`sync:` before a sync's stage).
    pub fn name(self) -> String {
        match self {
            TripStage::Launch(s) => s.name().to_string(),
            TripStage::Sync(s) => format!("sync:{}", s.name()),
        }
    }
}

/// One launch + sync.
#[derive(Clone, Debug)]
pub struct Trip {
    /// The daemon's pid (whose core took the sync).
    pub daemon: u32,
    /// The client's pid.
    pub client: u32,
    /// The sync's frame id.
    pub frame: u64,
    /// Each of [`TRIP`]'s stages, by its index there.
    pub at: [Option<u64>; TRIP.len()],
    /// The call slept after its poll window (`wait_sleep`).
    pub call_slept: bool,
    /// The library's reader thread read the reply (not the waiting call).
    pub reader_read_reply: bool,
    /// The library's reader thread woke from the socket during the trip.
    pub client_reader_woke: bool,
    /// The daemon's reader of this client woke from the socket during the trip.
    pub daemon_reader_woke: bool,
    /// ns from the last trip's return to this launch's call (None: the first).
    pub away_ns: Option<u64>,
}

impl Trip {
    /// The stage's time.
    pub fn t(&self, s: TripStage) -> Option<u64> {
        TRIP.iter().position(|x| *x == s).and_then(|i| self.at[i])
    }

    /// From the launch's call to the sync's return, ns.
    pub fn total(&self) -> Option<u64> {
        let (a, b) = (self.t(TripStage::Launch(Stage::ClientCall))?, self.t(TripStage::Sync(Stage::WaitReturn))?);
        b.checked_sub(a)
    }
}

/// Each (process, stage, key)'s times, sorted: lookups by time; and the
/// daemon readers' wake-ups by key across processes ([`Index::within_any`]).
struct Index {
    by_pid: HashMap<(u32, Stage, u64), Vec<(u64, u64)>>,
    wakes: HashMap<u64, Vec<u64>>,
}

impl Index {
    fn new(lines: &[Line]) -> Index {
        let mut by_pid: HashMap<(u32, Stage, u64), Vec<(u64, u64)>> = HashMap::new();
        let mut wakes: HashMap<u64, Vec<u64>> = HashMap::new();
        for l in lines {
            by_pid.entry((l.pid, l.stage, l.key)).or_default().push((l.ns, l.aux));
            if l.stage == Stage::ReaderWake {
                wakes.entry(l.key).or_default().push(l.ns);
            }
        }
        for v in by_pid.values_mut() {
            v.sort_unstable();
        }
        for v in wakes.values_mut() {
            v.sort_unstable();
        }
        Index { by_pid, wakes }
    }

    /// The latest (ns, aux) at or before `t`.
    fn before(&self, pid: u32, stage: Stage, key: u64, t: u64) -> Option<(u64, u64)> {
        let v = self.by_pid.get(&(pid, stage, key))?;
        let i = v.partition_point(|(ns, _)| *ns <= t);
        i.checked_sub(1).map(|i| v[i])
    }

    /// The first (ns, aux) at or after `t`.
    fn after(&self, pid: u32, stage: Stage, key: u64, t: u64) -> Option<(u64, u64)> {
        let v = self.by_pid.get(&(pid, stage, key))?;
        v.get(v.partition_point(|(ns, _)| *ns < t)).copied()
    }

    /// Whether `stage` of `key` in `pid` has a stamp within `[a, b]`.
    fn within(&self, pid: u32, stage: Stage, key: u64, a: u64, b: u64) -> bool {
        self.after(pid, stage, key, a).is_some_and(|(t, _)| t <= b)
    }

    /// Whether a daemon's reader of the client `pid` woke within `[a, b]`
    /// (the daemon's process is not known here; a lookup, not a scan: a GPU
    /// run's folder holds millions of stamps and thousands of trips).
    fn reader_woke(&self, pid: u64, a: u64, b: u64) -> bool {
        self.wakes.get(&pid).is_some_and(|v| v.get(v.partition_point(|ns| *ns < a)).is_some_and(|t| *t <= b))
    }
}

/// Every sync the cores took, with its launch and every stamp found, in
/// the order the cores took them.
pub fn trips(lines: &[Line]) -> Vec<Trip> {
    let kernels = join(lines);
    let mut by_client: HashMap<u32, Vec<&Kernel>> = HashMap::new();
    for k in &kernels {
        by_client.entry(k.client).or_default().push(k);
    }
    let index = Index::new(lines);
    let mut syncs: Vec<&Line> = lines.iter().filter(|l| l.stage == Stage::CoreSync).collect();
    syncs.sort_by_key(|l| l.ns);
    let mut out: Vec<Trip> = Vec::with_capacity(syncs.len());
    let mut last_return: HashMap<u32, u64> = HashMap::new();
    for s in syncs {
        let (client, frame) = ((s.key >> 40) as u32, s.key & ((1 << 40) - 1));
        let mut at = [None; TRIP.len()];
        // The launch: the last kernel of the client the core read before the sync.
        // (`join` gives them in `core_read` order: a binary search.)
        let launch = by_client.get(&client).and_then(|ks| {
            let i = ks.partition_point(|k| k.t(Stage::CoreRead).is_some_and(|t| t <= s.ns));
            i.checked_sub(1).map(|i| ks[i])
        });
        let call = index.before(client, Stage::WaitCall, frame, s.ns).map(|(t, _)| t);
        for (i, st) in TRIP.iter().enumerate() {
            at[i] = match *st {
                TripStage::Launch(stage) => launch.and_then(|k| k.t(stage)),
                TripStage::Sync(Stage::WaitCall) => call,
                TripStage::Sync(Stage::ReaderRead) => index.before(s.pid, Stage::ReaderRead, s.key, s.ns).map(|x| x.0),
                TripStage::Sync(Stage::CoreSync) => Some(s.ns),
                TripStage::Sync(Stage::CoreReply) => index.after(s.pid, Stage::CoreReply, s.key, s.ns).map(|x| x.0),
                TripStage::Sync(stage) => call.and_then(|c| index.after(client, stage, frame, c)).map(|x| x.0),
            };
        }
        let mut trip = Trip {
            daemon: s.pid,
            client,
            frame,
            at,
            call_slept: false,
            reader_read_reply: false,
            client_reader_woke: false,
            daemon_reader_woke: false,
            away_ns: None,
        };
        let start = trip.t(TripStage::Launch(Stage::ClientCall)).or(call);
        let end = trip.t(TripStage::Sync(Stage::WaitReturn));
        if let (Some(a), Some(b)) = (start, end) {
            trip.call_slept = call.is_some_and(|c| index.within(client, Stage::WaitSleep, frame, c, b));
            trip.reader_read_reply = call
                .and_then(|c| index.after(client, Stage::ReplySeen, frame, c))
                .is_some_and(|(t, aux)| t <= b && aux == 1);
            trip.client_reader_woke = index.within(client, Stage::ClientReaderWake, 0, a, b);
            trip.daemon_reader_woke = index.reader_woke(u64::from(client), a, b);
            trip.away_ns = last_return.get(&client).map(|r| a.saturating_sub(*r));
            last_return.insert(client, b);
        }
        out.push(trip);
    }
    out
}

fn pct(v: &mut [i64], p: usize) -> Option<i64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    Some(v[((v.len() - 1) * p / 100).min(v.len() - 1)])
}

fn us(ns: Option<i64>) -> String {
    ns.map_or_else(|| "-".into(), |n| format!("{:.2}", n as f64 / 1000.0))
}

/// The report of one class of trips.
fn class(s: &mut String, title: &str, trips: &[&Trip]) {
    let _ = writeln!(s, "{title}: {} launch + sync", trips.len());
    if trips.is_empty() {
        return;
    }
    let mut totals: Vec<i64> = trips.iter().filter_map(|t| t.total()).map(|n| n as i64).collect();
    let _ = writeln!(
        s,
        "  from the launch's call to the sync's return: p50 {} µs, p99 {} µs ({} trips with both)",
        us(pct(&mut totals.clone(), 50)),
        us(pct(&mut totals, 99)),
        trips.iter().filter(|t| t.total().is_some()).count()
    );
    // Each stage's p50 time after the launch's call, the stages in that order.
    let origin = TripStage::Launch(Stage::ClientCall);
    let mut order: Vec<(TripStage, i64, usize)> = Vec::new();
    for st in TRIP {
        let mut v: Vec<i64> = trips.iter().filter_map(|t| Some(t.t(st)? as i64 - t.t(origin)? as i64)).collect();
        let n = v.len();
        if let Some(p) = pct(&mut v, 50) {
            order.push((st, p, n));
        }
    }
    order.sort_by_key(|(_, p, _)| *p);
    let _ = writeln!(s, "  {:<24} {:>8} {:>14} {:>14}", "stage", "trips", "p50 at µs", "p50 lag µs");
    for (i, (st, p, n)) in order.iter().enumerate() {
        let lag = if i == 0 {
            String::new()
        } else {
            let before = order[i - 1].0;
            let mut v: Vec<i64> = trips.iter().filter_map(|t| Some(t.t(*st)? as i64 - t.t(before)? as i64)).collect();
            us(pct(&mut v, 50))
        };
        let _ = writeln!(s, "  {:<24} {:>8} {:>14} {:>14}", st.name(), n, us(Some(*p)), lag);
    }
    let n = trips.len();
    let count = |f: fn(&Trip) -> bool| trips.iter().filter(|t| f(t)).count();
    let _ = writeln!(
        s,
        "  slept on the way: the waiting call {} of {n} (its poll window passed), the reply read by the library's \
         reader thread {}, the library's reader woken {}, the daemon's reader woken {}",
        count(|t| t.call_slept),
        count(|t| t.reader_read_reply),
        count(|t| t.client_reader_woke),
        count(|t| t.daemon_reader_woke),
    );
}

/// The report `gpumux stamps DIR --syncs` prints.
///
/// Each daemon's trips are reported apart, in the order of its first sync: a
/// bench starts one daemon per configuration (the default, the simulated
/// device, clients on sockets...), whose trips must not be mixed.
pub fn report(lines: &[Line]) -> String {
    let all = trips(lines);
    let mut s = String::new();
    let _ = writeln!(s, "stamps: {} records, {} syncs taken by a core", lines.len(), all.len());
    let mut daemons: Vec<u32> = Vec::new();
    for t in &all {
        if !daemons.contains(&t.daemon) {
            daemons.push(t.daemon);
        }
    }
    for (i, d) in daemons.iter().enumerate() {
        let mine: Vec<&Trip> = all.iter().filter(|t| t.daemon == *d).collect();
        let _ = writeln!(s, "== daemon {} of {} (pid {d}): {} syncs", i + 1, daemons.len(), mine.len());
        // The first trip of each client (no `away`) is a warm-up: left out.
        let back: Vec<&Trip> = mine.iter().copied().filter(|t| t.away_ns.is_some_and(|a| a < PAUSE_NS)).collect();
        let paused: Vec<&Trip> = mine.iter().copied().filter(|t| t.away_ns.is_some_and(|a| a >= PAUSE_NS)).collect();
        class(&mut s, "back to back", &back);
        class(&mut s, &format!("after a pause of at least {} ms", PAUSE_NS / 1_000_000), &paused);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` launch + sync trips of client 7 through daemon 1 (device
    /// process 2), `away` ns apart, each stage `step` ns after the one
    /// before; the waiting call sleeps on every `sleep_every`th.
    fn trips_of(n: u64, away: u64, step: u64, sleep_every: u64) -> Vec<Line> {
        let mut v = Vec::new();
        let client = 7u32;
        let mut t0 = 1_000_000u64;
        for k in 0..n {
            let (lf, sf) = (10 + 2 * k, 11 + 2 * k);
            let (op, launch) = (100 + k, 500 + k);
            let key = |f: u64| crate::frame_key(u64::from(client), f);
            let mut push = |pid: u32, i: u64, stage: Stage, key: u64, aux: u64| {
                let ppid = if pid == 2 { 1 } else { 0 };
                v.push(Line { pid, ppid, ns: t0 + i * step, stage, key, aux })
            };
            push(client, 0, Stage::ClientCall, lf, 0);
            push(client, 1, Stage::ClientWrite, lf, 0);
            push(client, 2, Stage::WaitCall, sf, 0);
            push(client, 3, Stage::WaitPoll, sf, 0);
            push(1, 4, Stage::ReaderRead, key(lf), 0);
            push(1, 5, Stage::CoreRead, op, key(lf));
            push(1, 6, Stage::CoreBind, op, 0);
            push(1, 7, Stage::ReaderRead, key(sf), 0);
            push(1, 8, Stage::CoreLaunch, op, launch);
            push(1, 9, Stage::CoreSync, key(sf), 0);
            push(2, 10, Stage::HostLaunch, op, launch);
            push(2, 11, Stage::LaunchStart, op, 0);
            push(2, 12, Stage::LaunchReturn, op, 0);
            push(2, 13, Stage::EndSeen, launch, 0);
            push(1, 14, Stage::CoreEnd, launch, 0);
            push(1, 15, Stage::CoreReply, key(sf), 0);
            let slept = sleep_every > 0 && k % sleep_every == 0;
            if slept {
                push(client, 15, Stage::WaitSleep, sf, 0);
                push(client, 16, Stage::ClientReaderWake, 0, 0);
            }
            push(client, 17, Stage::ReplySeen, sf, u64::from(slept));
            push(client, 18, Stage::WaitReturn, sf, 0);
            t0 += 18 * step + away;
        }
        v
    }

    #[test]
    fn a_sync_joins_its_launch_and_every_stage_of_both_frames() {
        let lines = trips_of(20, 50_000, 1_000, 0);
        let ts = trips(&lines);
        assert_eq!(ts.len(), 20);
        for t in &ts {
            for (i, st) in TRIP.iter().enumerate() {
                assert!(t.at[i].is_some(), "trip {} lacks {}", t.frame, st.name());
            }
            assert_eq!(t.total(), Some(18_000));
            assert!(!t.call_slept && !t.reader_read_reply && !t.client_reader_woke && !t.daemon_reader_woke);
            // The launch is the one just before the sync, not an earlier one.
            let lag = t.t(TripStage::Sync(Stage::CoreSync)).zip(t.t(TripStage::Launch(Stage::CoreRead)));
            assert_eq!(lag.map(|(s, r)| s - r), Some(4_000), "trip {}", t.frame);
        }
        assert_eq!(ts[0].away_ns, None, "the first trip has no trip before it");
        assert_eq!(ts[1].away_ns, Some(50_000));
    }

    #[test]
    fn each_daemons_trips_are_reported_apart() {
        let mut lines = trips_of(6, 50_000, 1_000, 0);
        // A second daemon (pid 3, device process 4) later, 2x slower, with client 8.
        let mut other = trips_of(6, 50_000, 2_000, 0);
        for l in other.iter_mut() {
            crate::test_lines::as_second_daemon(l);
            let retag = |k: u64| crate::frame_key(8, k & ((1 << 40) - 1));
            match l.stage {
                Stage::CoreRead => l.aux = retag(l.aux),
                Stage::ReaderRead | Stage::CoreSync | Stage::CoreReply => l.key = retag(l.key),
                _ => {}
            }
        }
        lines.extend(other);
        let ts = trips(&lines);
        assert_eq!(ts.len(), 12);
        assert!(ts.iter().all(|t| (t.daemon == 1) == (t.client == 7)), "each trip with its own daemon");
        let r = report(&lines);
        assert!(r.contains("== daemon 1 of 2 (pid 1): 6 syncs"), "{r}");
        assert!(r.contains("== daemon 2 of 2 (pid 3): 6 syncs"), "{r}");
        assert!(r.contains("p50 18.00 µs") && r.contains("p50 36.00 µs"), "each daemon's own figures: {r}");
    }

    #[test]
    fn trips_split_by_the_pause_before_them_and_sleeps_are_counted() {
        let mut lines = trips_of(11, 50_000, 1_000, 0);
        // The same client later, 2 ms apart, its call sleeping every second trip.
        let mut later = trips_of(10, 2_000_000, 1_000, 2);
        for l in later.iter_mut() {
            l.ns += 1_000_000_000;
            match l.stage {
                Stage::CoreRead => l.key += 1000,
                Stage::CoreBind | Stage::HostLaunch | Stage::LaunchStart | Stage::LaunchReturn => l.key += 1000,
                Stage::CoreLaunch => {
                    l.key += 1000;
                    l.aux += 1000;
                }
                Stage::EndSeen | Stage::CoreEnd => l.key += 1000,
                _ => {}
            }
        }
        lines.extend(later);
        let r = report(&lines);
        assert!(r.contains("21 syncs taken"), "{r}");
        assert!(r.contains("back to back: 10 launch + sync"), "{r}");
        // The later run's first trip came 1 s after the first run: a pause too.
        assert!(r.contains("after a pause of at least 1 ms: 10 launch + sync"), "{r}");
        assert!(r.contains("the waiting call 5 of 10"), "{r}");
        assert!(r.contains("the library's reader woken 5"), "{r}");
        assert!(r.contains("p50 18.00 µs"), "{r}");
        // The reply's way back: written at 15 µs, seen at 17.
        let seen = r.lines().find(|l| l.contains("sync:reply_seen")).unwrap_or_default().to_string();
        assert!(seen.contains("17.00"), "{seen}");
        assert!(seen.trim_end().ends_with("2.00"), "{seen}");
    }
}
