//! Who may connect, and with which limits (docs/daemon.md, "Configure").
//!
//! ```toml
//! [daemon]                  # optional; the command line wins over it
//! socket = "/run/gpumux/gpumux.sock"
//! device = "cuda:0"       # cuda:all, cuda:0,1: every GPU, or these (docs/multi-gpu.md)
//! policy = "ppq-even-drain"
//! placement = "pairs"     # which GPU a client goes to, with several (or "least-loaded", "memory")
//! rebalance = false         # move idle clients to a GPU left with none (docs/multi-gpu.md)
//! record = "/var/lib/gpumux/clients.jsonl"   # optional: gpumuxd --record
//! swap_memory = "64 GiB"    # host memory for evicted buffers (default: half the host's; 0: never evict)
//! device_memory = "48 GiB"  # device memory handed out per GPU (default: all of it)
//! oversubscribe = false     # plain device allocations, nothing ever evicted (default: true)
//!
//! [[allow]]                 # entries are tried in order: the FIRST match wins
//! uid = 1000
//! max_priority = 10
//! memory = "8 GiB"
//! host_memory = "16 GiB"    # pinned host memory (Client::alloc_host)
//!
//! [[allow]]
//! any = true                # everyone else
//! memory = "1 GiB"
//!
//! [limits]                  # the daemon's own, for every client (defaults shown)
//! connections = 1024
//! connections_per_uid = 64
//! hello_timeout = "5 s"
//! frame_timeout = "10 s"
//! outstanding = 1024
//! ```
//!
//! An entry matches by exactly one of `uid`, `gid` or `any = true`. Limits an
//! entry leaves out take the defaults of [`ClientLimits::default`]; `[limits]`
//! left out takes those of [`ServerLimits::default`]. Without a config file
//! only the daemon's own uid and root may connect, with the default limits.
//! Unknown keys and bad values are errors that name the line; an entry naming
//! a uid or gid the system does not know is a warning at start, and an error
//! when no entry would then admit anyone ([`Config::check_ids`]).

use serde::de::{self, Deserializer};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why a config was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the config {path}: {cause}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why (in the message, so not also the error's source: printed
        /// with its chain, the cause came twice).
        cause: std::io::Error,
    },
    /// Not valid TOML, an unknown key or a bad value (toml's message names the line).
    #[error("config {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// toml's message, with line and column.
        message: String,
    },
    /// Valid TOML that does not make sense (a message with the entry's number).
    #[error("config {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Every entry names a uid or gid the system does not know: nobody could connect.
    #[error("config {path} admits nobody: {message}")]
    AdmitsNobody {
        /// The file.
        path: PathBuf,
        /// Which entries, and what to do.
        message: String,
    },
}

/// What one client may do (sent back in `Welcome` as [`gpumux_proto::Limits`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ClientLimits {
    /// Highest priority it may ask for.
    pub max_priority: i32,
    /// Largest weight it may ask for.
    pub max_weight: f64,
    /// Device memory it may hold, bytes (`u64::MAX`: as much as the device has).
    pub memory: u64,
    /// Operations queued or running at once.
    pub queued_ops: u32,
    /// Largest shared region, bytes.
    pub shm: u64,
    /// Host regions (`AttachHost`, the client library's `alloc_host`) it may
    /// have attached at once, bytes in all: memory the daemon keeps pinned
    /// (page-locked) for it, which the rest of the machine cannot page.
    pub host_memory: u64,
}

/// [`ClientLimits::host_memory`] by default: room for a 1 GiB buffer each
/// way and more, while a few clients cannot lock most of a machine's RAM.
pub const DEFAULT_HOST_MEMORY: u64 = 4 << 30;

impl Default for ClientLimits {
    /// Priorities 0..=10 (clients start at 0), weights up to 10, all of the
    /// device's memory, 4096 operations in flight, a 1 GiB shared region,
    /// 4 GiB of pinned host memory ([`DEFAULT_HOST_MEMORY`]).
    fn default() -> Self {
        ClientLimits {
            max_priority: 10,
            max_weight: 10.0,
            memory: u64::MAX,
            queued_ops: 4096,
            shm: 1 << 30,
            host_memory: DEFAULT_HOST_MEMORY,
        }
    }
}

impl ClientLimits {
    /// The wire form, with `memory` capped at what the device has.
    pub fn to_proto(&self, device_memory: u64) -> gpumux_proto::Limits {
        gpumux_proto::Limits {
            max_priority: self.max_priority,
            max_weight: self.max_weight,
            memory_bytes: self.memory.min(device_memory),
            queued_ops: self.queued_ops,
            shm_bytes: self.shm,
            host_memory_bytes: self.host_memory,
        }
    }
}

/// The daemon's own limits, the same for every client (`[limits]`): what
/// keeps one client, or many, from taking the daemon down or holding the
/// others up (issue 36, cases 1-3). Each refusal names its key.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerLimits {
    /// Connections at once, in all (`connections`; refused with `Quota`).
    pub connections: u32,
    /// Connections at once of one uid (`connections_per_uid`; refused with `Quota`).
    pub connections_per_uid: u32,
    /// From a connection's accept to its complete `Hello` (`hello_timeout`;
    /// then a `Protocol` error and the connection closes).
    pub hello_timeout: Duration,
    /// From a frame's first byte to its last (`frame_timeout`; then a
    /// `Protocol` error and the connection closes).
    pub frame_timeout: Duration,
    /// Per connection: requests read and not yet taken by the core, plus
    /// replies and notices not yet written to the client, in units
    /// ([`Inbound::cost`](crate::conn::Inbound::cost), [`frame_cost`](crate::outbox::frame_cost): one per
    /// frame, and one more per 4 KiB of a request's payload or per row of a reply's list).
    /// At the limit the daemon stops reading the client until its backlog
    /// goes down (`outstanding`; backpressure, not an error).
    pub outstanding: u64,
}

/// [`ServerLimits::connections`] by default. Each connection costs two
/// threads (its reader and writer) and about four descriptors: 1024 of them
/// are 2048 threads, some 8,000 memory maps, well inside Linux's default
/// `vm.max_map_count` of 65,530, whose exhaustion aborted the daemon at
/// about 7,800 connections (15,600 threads) on 717b546. And 1024 clients
/// are far more than one GPU serves usefully (an H100 has 132 SMs).
pub const DEFAULT_CONNECTIONS: u32 = 1024;
/// [`ServerLimits::connections_per_uid`] by default: a user's job of many
/// processes plus its tools (`gpumux ps`, `top`) rarely needs more than a few
/// tens; 64 keeps one runaway or hostile uid to a sixteenth of
/// [`DEFAULT_CONNECTIONS`], so 15 other users still get in.
pub const DEFAULT_CONNECTIONS_PER_UID: u32 = 64;
/// [`ServerLimits::hello_timeout`] by default: the client library sends
/// `Hello` as soon as it has connected (µs), so 5 s is slack for a machine
/// that is badly overloaded, while a connection that never greets (two
/// threads and a slot of its uid's limit) is let go soon.
pub const DEFAULT_HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// [`ServerLimits::frame_timeout`] by default: the largest frame (8 MiB)
/// crosses a Unix socket in milliseconds, so a frame still incomplete after
/// 10 s comes from a client that stopped mid-frame, holding up to 8 MiB of
/// the daemon's memory; 10 s is also how long the daemon waits for a client
/// to read a reply before it gives up on it.
pub const DEFAULT_FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// [`ServerLimits::outstanding`] by default. A client that reads its replies
/// never reaches it: its requests wait in the daemon only until the core takes
/// them (µs), its replies only until they are written; a burst of launches
/// beyond it is slowed to the core's pace, which it could not beat anyway. A
/// client that does not read holds at most this many requests and replies
/// (a few MiB: small frames, a unit per 4 KiB of bigger ones), where on
/// 717b546 one such client grew the daemon to 3.66 GB; and the core answers
/// at most this many of its requests ahead of a request that came after them
/// (the core serves in arrival order): 1024 `Status` requests are tens of ms
/// of the core's time, where 20 million held everyone up for 11 s.
pub const DEFAULT_OUTSTANDING: u64 = 1024;

impl Default for ServerLimits {
    /// The `DEFAULT_*` constants above (their docs say why each).
    fn default() -> Self {
        ServerLimits {
            connections: DEFAULT_CONNECTIONS,
            connections_per_uid: DEFAULT_CONNECTIONS_PER_UID,
            hello_timeout: DEFAULT_HELLO_TIMEOUT,
            frame_timeout: DEFAULT_FRAME_TIMEOUT,
            outstanding: DEFAULT_OUTSTANDING,
        }
    }
}

/// Whom an `[[allow]]` entry admits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Matcher {
    /// One user id.
    Uid(u32),
    /// Processes whose (primary) group id is this.
    Gid(u32),
    /// Everyone.
    Any,
}

impl Matcher {
    fn matches(&self, uid: u32, gid: u32) -> bool {
        match *self {
            Matcher::Uid(u) => u == uid,
            Matcher::Gid(g) => g == gid,
            Matcher::Any => true,
        }
    }
}

/// One `[[allow]]` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct AllowEntry {
    /// Whom it admits.
    pub matcher: Matcher,
    /// With which limits.
    pub limits: ClientLimits,
}

/// The `[daemon]` table: defaults for the command line's options.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonDefaults {
    /// Socket path.
    pub socket: Option<PathBuf>,
    /// Device (`cuda:0`, `sim:h100`).
    pub device: Option<String>,
    /// Scheduling policy.
    pub policy: Option<String>,
    /// Which GPU a client goes to when the daemon serves several
    /// (`pairs`, `least-loaded`, `memory`; docs/multi-gpu.md, "Placement").
    pub placement: Option<String>,
    /// Record the clients' operations to this file (`--record`).
    pub record: Option<PathBuf>,
    /// Host memory evicted buffers may take in all (docs/daemon.md,
    /// "Memory oversubscription"; default `core::default_swap_memory`).
    pub swap_memory: Option<Bytes>,
    /// Device memory handed out per GPU (`--device-memory`; default: all;
    /// `backend::capped`).
    pub device_memory: Option<Bytes>,
    /// Oversubscription on (the default) or off (`--oversubscribe`;
    /// docs/oversubscription.md, "Turning it off").
    pub oversubscribe: Option<bool>,
    /// Move idle clients to GPUs left with no client (`--rebalance`;
    /// docs/multi-gpu.md, "Moving a client between GPUs").
    pub rebalance: Option<bool>,
}

/// The whole config.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `[daemon]`.
    pub daemon: DaemonDefaults,
    /// `[[allow]]`, in file order.
    pub allow: Vec<AllowEntry>,
    /// `[limits]`.
    pub limits: ServerLimits,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    daemon: DaemonDefaults,
    #[serde(default)]
    allow: Vec<RawAllow>,
    #[serde(default)]
    limits: RawLimits,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    connections: Option<u32>,
    connections_per_uid: Option<u32>,
    hello_timeout: Option<Seconds>,
    frame_timeout: Option<Seconds>,
    outstanding: Option<u64>,
}

/// A duration written as a number of seconds or a string with a unit (`"500 ms"`, `"5 s"`).
struct Seconds(Duration);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Int(i64),
            Float(f64),
            Text(String),
        }
        let parsed = match Either::deserialize(d)
            .map_err(|_| de::Error::custom("expected a duration: seconds, or a string like \"500 ms\" or \"5 s\""))?
        {
            Either::Int(n) => parse_duration(&n.to_string()),
            Either::Float(x) => parse_duration(&x.to_string()),
            Either::Text(s) => parse_duration(&s),
        };
        parsed.map(Seconds).map_err(de::Error::custom)
    }
}

/// Parses `"5 s"`, `"500 ms"`, `"1.5"` (seconds): more than zero, at most a day.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("a duration cannot be negative: `{s}`"));
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = (t[..split].trim(), t[split..].trim());
    let scale = match unit.to_ascii_lowercase().as_str() {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        _ => return Err(format!("unknown unit `{unit}` in `{s}` (use s or ms)")),
    };
    match num.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x * scale <= 86_400.0 => Ok(Duration::from_secs_f64(x * scale)),
        Ok(0.0) => Err(format!("a duration of `{s}` would refuse every client; give more than 0")),
        _ => Err(format!("`{s}` is not a duration of at most a day (e.g. 5, \"500 ms\", \"10 s\")")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAllow {
    uid: Option<u32>,
    gid: Option<u32>,
    any: Option<bool>,
    max_priority: Option<i32>,
    max_weight: Option<f64>,
    memory: Option<Bytes>,
    queued_ops: Option<u32>,
    shm: Option<Bytes>,
    host_memory: Option<Bytes>,
}

/// A byte count written as an integer or a string with a unit (`"8 GiB"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Int(i64),
            Text(String),
        }
        match Either::deserialize(d)
            .map_err(|_| de::Error::custom("expected bytes: an integer or a string like \"8 GiB\""))?
        {
            Either::Int(n) => {
                u64::try_from(n).map(Bytes).map_err(|_| de::Error::custom("a byte count cannot be negative"))
            }
            Either::Text(s) => parse_bytes(&s).map(Bytes).map_err(de::Error::custom),
        }
    }
}

/// Parses `"8 GiB"`, `"512MiB"`, `"1.5 GB"`, `"4096"`: binary (KiB, MiB,
/// GiB, TiB) and decimal (KB, MB, GB, TB) units, `B` or none for bytes.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("a byte count cannot be negative: `{s}`"));
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = (t[..split].trim(), t[split..].trim());
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(format!("unknown unit `{unit}` in `{s}` (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)")),
    };
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(scale).ok_or_else(|| format!("`{s}` is too large"));
    }
    match num.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 && x * (scale as f64) < u64::MAX as f64 => Ok((x * scale as f64) as u64),
        _ => Err(format!("`{s}` is not a byte count (e.g. 4096, \"8 GiB\", \"1.5 GB\")")),
    }
}

impl Config {
    /// The config used without a file: only `own_uid` (and root) may connect, with default limits.
    pub fn own_user_only(own_uid: u32) -> Config {
        let entry = |uid| AllowEntry { matcher: Matcher::Uid(uid), limits: ClientLimits::default() };
        let mut allow = vec![entry(own_uid)];
        if own_uid != 0 {
            allow.push(entry(0));
        }
        Config { daemon: DaemonDefaults::default(), allow, limits: ServerLimits::default() }
    }

    /// Reads and checks a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|cause| ConfigError::Read { path: path.to_path_buf(), cause })?;
        Config::parse(&text, path)
    }

    /// Checks config text; `path` only names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text)
            .map_err(|e| ConfigError::Parse { path: path.to_path_buf(), message: e.to_string() })?;
        let invalid = |message: String| ConfigError::Invalid { path: path.to_path_buf(), message };
        let mut allow = Vec::with_capacity(raw.allow.len());
        for (i, a) in raw.allow.into_iter().enumerate() {
            let n = i + 1;
            let matcher = match (a.uid, a.gid, a.any) {
                (Some(u), None, None) => Matcher::Uid(u),
                (None, Some(g), None) => Matcher::Gid(g),
                (None, None, Some(true)) => Matcher::Any,
                (None, None, Some(false)) => {
                    return Err(invalid(format!("[[allow]] entry {n}: `any = false` admits nobody; remove the entry")))
                }
                _ => {
                    return Err(invalid(format!(
                        "[[allow]] entry {n} must name exactly one of `uid`, `gid` or `any = true`"
                    )))
                }
            };
            let d = ClientLimits::default();
            let limits = ClientLimits {
                max_priority: a.max_priority.unwrap_or(d.max_priority),
                max_weight: a.max_weight.unwrap_or(d.max_weight),
                memory: a.memory.map_or(d.memory, |b| b.0),
                queued_ops: a.queued_ops.unwrap_or(d.queued_ops),
                shm: a.shm.map_or(d.shm, |b| b.0),
                host_memory: a.host_memory.map_or(d.host_memory, |b| b.0),
            };
            if !(limits.max_weight.is_finite() && limits.max_weight > 0.0) {
                return Err(invalid(format!("[[allow]] entry {n}: max_weight must be a number > 0")));
            }
            if limits.queued_ops == 0 {
                return Err(invalid(format!("[[allow]] entry {n}: queued_ops must be at least 1")));
            }
            // A cap below the priority every client asks for unless it says
            // otherwise would refuse each default client at Hello, far from
            // this line; no one means that (a cap cannot make clients ask for
            // less), so it is refused here.
            if limits.max_priority < 0 {
                return Err(invalid(format!(
                    "[[allow]] entry {n}: max_priority = {} is below 0, the priority clients ask for unless \
                     they say otherwise, so this entry's clients would be refused at Hello; the lowest \
                     max_priority is 0 (clients may still ask for a priority below it)",
                    limits.max_priority
                )));
            }
            allow.push(AllowEntry { matcher, limits });
        }
        let d = ServerLimits::default();
        let r = raw.limits;
        let limits = ServerLimits {
            connections: r.connections.unwrap_or(d.connections),
            connections_per_uid: r.connections_per_uid.unwrap_or(d.connections_per_uid),
            hello_timeout: r.hello_timeout.map_or(d.hello_timeout, |t| t.0),
            frame_timeout: r.frame_timeout.map_or(d.frame_timeout, |t| t.0),
            outstanding: r.outstanding.unwrap_or(d.outstanding),
        };
        for (key, value) in [
            ("connections", u64::from(limits.connections)),
            ("connections_per_uid", u64::from(limits.connections_per_uid)),
            ("outstanding", limits.outstanding),
        ] {
            if value == 0 {
                return Err(invalid(format!("[limits] {key} = 0 would refuse every client; give at least 1")));
            }
        }
        Ok(Config { daemon: raw.daemon, allow, limits })
    }

    /// Looks up every uid and gid the entries name (`known_uid`,
    /// `known_gid`: whether the system knows it; [`system_knows_uid`] and
    /// [`system_knows_gid`] in the daemon): one warning per unknown one,
    /// for the log, or [`ConfigError::AdmitsNobody`] when no entry would
    /// then admit anyone (`any = true` admits everyone; an empty list, no one).
    pub fn check_ids(
        &self,
        path: &Path,
        known_uid: impl Fn(u32) -> bool,
        known_gid: impl Fn(u32) -> bool,
    ) -> Result<Vec<String>, ConfigError> {
        let mut warnings = Vec::new();
        let mut admits = false;
        for (i, e) in self.allow.iter().enumerate() {
            let n = i + 1;
            let known = match e.matcher {
                Matcher::Uid(u) => known_uid(u),
                Matcher::Gid(g) => known_gid(g),
                Matcher::Any => true,
            };
            admits |= known;
            if !known {
                let (what, id, db) = match e.matcher {
                    Matcher::Uid(u) => ("uid", u, "passwd"),
                    Matcher::Gid(g) => ("gid", g, "group"),
                    Matcher::Any => unreachable!("any is always known"),
                };
                warnings.push(format!(
                    "config {}: [[allow]] entry {n} names {what} {id}, which this system does not know \
                     (no {db} entry): only a process running as that {what} without one can match it",
                    path.display()
                ));
            }
        }
        if admits {
            return Ok(warnings);
        }
        let message = if self.allow.is_empty() {
            "it has no [[allow]] entry (add one, e.g. `[[allow]]` with `uid = 1000`, or leave --config out \
             to admit only the daemon's own user and root)"
                .to_string()
        } else {
            format!(
                "every [[allow]] entry names a uid or gid this system does not know ({}); name existing ones, \
                 or add `any = true`",
                self.allow
                    .iter()
                    .map(|e| match e.matcher {
                        Matcher::Uid(u) => format!("uid {u}"),
                        Matcher::Gid(g) => format!("gid {g}"),
                        Matcher::Any => "any".into(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        Err(ConfigError::AdmitsNobody { path: path.to_path_buf(), message })
    }

    /// The limits of a peer with `uid` and `gid`: the first entry that matches
    /// wins; `None` if none does (the peer is refused).
    pub fn limits_for(&self, uid: u32, gid: u32) -> Option<&ClientLimits> {
        self.allow.iter().find(|e| e.matcher.matches(uid, gid)).map(|e| &e.limits)
    }
}

/// Whether the system's user database (passwd, through NSS) has `uid`.
pub fn system_knows_uid(uid: u32) -> bool {
    let mut buf = vec![0u8; 16 << 10];
    // SAFETY: a zeroed passwd is valid; getpwuid_r writes into it and `buf`, both live for the call.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut out);
        // An error looking it up (ERANGE, an NSS failure) is not evidence it is missing.
        rc != 0 || !out.is_null()
    }
}

/// Whether the system's group database (through NSS) has `gid`.
pub fn system_knows_gid(gid: u32) -> bool {
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: as in `system_knows_uid`, with getgrgid_r.
    unsafe {
        let mut gr: libc::group = std::mem::zeroed();
        let mut out: *mut libc::group = std::ptr::null_mut();
        let rc = libc::getgrgid_r(gid, &mut gr, buf.as_mut_ptr().cast(), buf.len(), &mut out);
        rc != 0 || !out.is_null()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("test.toml"))
    }

    #[test]
    fn the_first_matching_entry_wins() {
        let c = parse(
            "[[allow]]\nuid = 1000\nmemory = \"8 GiB\"\nmax_priority = 5\n\n[[allow]]\ngid = 50\nqueued_ops = 7\n\n[[allow]]\nany = true\nmemory = 1024\n",
        )
        .unwrap();
        assert_eq!(c.limits_for(1000, 50).map(|l| (l.memory, l.max_priority)), Some((8 << 30, 5)));
        assert_eq!(c.limits_for(1001, 50).map(|l| l.queued_ops), Some(7));
        assert_eq!(c.limits_for(1001, 51).map(|l| l.memory), Some(1024));
    }

    #[test]
    fn host_memory_takes_units_and_defaults_to_4_gib() {
        let c = parse("[[allow]]\nuid = 5\nhost_memory = \"512 MiB\"\n\n[[allow]]\nany = true\n").unwrap();
        assert_eq!(c.limits_for(5, 0).map(|l| l.host_memory), Some(512 << 20));
        assert_eq!(c.limits_for(6, 0).map(|l| l.host_memory), Some(DEFAULT_HOST_MEMORY));
        assert_eq!(DEFAULT_HOST_MEMORY, 4 << 30);
        let e = parse("[[allow]]\nuid = 5\nhost_memory = -1\n").unwrap_err().to_string();
        assert!(e.contains("line 3"), "{e}");
    }

    #[test]
    fn without_a_file_only_the_own_uid_and_root_connect() {
        let c = Config::own_user_only(1234);
        assert!(c.limits_for(1234, 99).is_some());
        assert!(c.limits_for(0, 0).is_some());
        assert!(c.limits_for(1235, 1234).is_none());
        assert_eq!(c.limits_for(1234, 0), Some(&ClientLimits::default()));
    }

    #[test]
    fn no_entry_matches_means_refused() {
        let c = parse("[[allow]]\nuid = 5\n").unwrap();
        assert!(c.limits_for(6, 5).is_none());
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_line() {
        let e = parse("[[allow]]\nuid = 5\nmemroy = 10\n").unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("memroy"), "{e}");
        let e = parse("[[allow]]\nuid = 5\n\nmemory = \"8 GiBs\"\n").unwrap_err().to_string();
        assert!(e.contains("line 4") && e.contains("GiBs"), "{e}");
        let e = parse("[daemon]\nsockett = \"/x\"\n").unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
        let e = parse("[[allow]]\nuid = -1\n").unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn an_entry_names_exactly_one_matcher() {
        let e = parse("[[allow]]\nuid = 5\ngid = 6\n").unwrap_err().to_string();
        assert!(e.contains("entry 1") && e.contains("exactly one"), "{e}");
        assert!(parse("[[allow]]\nmemory = 5\n").is_err());
        assert!(parse("[[allow]]\nany = false\n").is_err());
        assert!(parse("[[allow]]\nany = true\nmax_weight = 0.0\n").is_err());
    }

    #[test]
    fn byte_counts_take_units() {
        assert_eq!(parse_bytes("8 GiB"), Ok(8 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5 GB"), Ok(1_500_000_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("7 B"), Ok(7));
        assert!(parse_bytes("8 GiBs").is_err());
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("99999999999 TiB").is_err());
    }

    #[test]
    fn a_negative_size_says_it_is_negative() {
        for text in ["memory = \"-5 GiB\"", "memory = -5", "shm = \" -1\""] {
            let e = parse(&format!("[[allow]]\nuid = 5\n{text}\n")).unwrap_err().to_string();
            assert!(e.contains("cannot be negative") && !e.contains("unknown unit"), "{text}: {e}");
        }
    }

    #[test]
    fn a_max_priority_below_the_default_priority_is_refused_with_the_reason() {
        let e = parse("[[allow]]\nuid = 5\nmax_priority = -5\n").unwrap_err().to_string();
        assert!(e.contains("entry 1") && e.contains("max_priority = -5") && e.contains("below 0"), "{e}");
        assert_eq!(parse("[[allow]]\nuid = 5\nmax_priority = 0\n").unwrap().allow[0].limits.max_priority, 0);
    }

    #[test]
    fn limits_take_their_defaults_units_and_refuse_what_would_refuse_everyone() {
        let c = parse("[[allow]]\nany = true\n").unwrap();
        assert_eq!(c.limits, ServerLimits::default());
        assert_eq!(
            (c.limits.connections, c.limits.connections_per_uid, c.limits.outstanding),
            (DEFAULT_CONNECTIONS, DEFAULT_CONNECTIONS_PER_UID, DEFAULT_OUTSTANDING)
        );
        let c = parse(
            "[limits]\nconnections = 64\nconnections_per_uid = 16\nhello_timeout = \"500 ms\"\nframe_timeout = 2\noutstanding = 100\n",
        )
        .unwrap();
        assert_eq!(
            c.limits,
            ServerLimits {
                connections: 64,
                connections_per_uid: 16,
                hello_timeout: Duration::from_millis(500),
                frame_timeout: Duration::from_secs(2),
                outstanding: 100,
            }
        );
        assert_eq!(parse("[limits]\nframe_timeout = 1.5\n").unwrap().limits.frame_timeout, Duration::from_millis(1500));
        for (text, says) in [
            ("connections = 0", "connections = 0"),
            ("connections_per_uid = 0", "connections_per_uid = 0"),
            ("outstanding = 0", "outstanding = 0"),
            ("hello_timeout = 0", "refuse every client"),
            ("frame_timeout = \"-2 s\"", "cannot be negative"),
            ("frame_timeout = \"2 h\"", "unknown unit"),
            ("conections = 5", "conections"),
        ] {
            let e = parse(&format!("[limits]\n{text}\n")).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn unknown_ids_are_warnings_unless_nobody_is_left_to_admit() {
        let path = Path::new("test.toml");
        let known = |id: u32| id < 1000;
        let c = parse("[[allow]]\nuid = 5000\n\n[[allow]]\ngid = 7\n").unwrap();
        let w = c.check_ids(path, known, known).unwrap();
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("entry 1") && w[0].contains("uid 5000"), "{w:?}");
        let c = parse("[[allow]]\nuid = 5000\n\n[[allow]]\ngid = 6000\n").unwrap();
        let e = c.check_ids(path, known, known).unwrap_err().to_string();
        assert!(e.contains("admits nobody") && e.contains("uid 5000, gid 6000"), "{e}");
        let c = parse("[[allow]]\nuid = 5000\n\n[[allow]]\nany = true\n").unwrap();
        assert_eq!(c.check_ids(path, known, known).unwrap().len(), 1);
        let e = parse("[daemon]\npolicy = \"fcfs\"\n").unwrap().check_ids(path, known, known).unwrap_err();
        assert!(e.to_string().contains("no [[allow]] entry"), "{e}");
        assert!(system_knows_uid(0) && system_knows_gid(0), "root is known");
    }

    #[test]
    fn the_daemon_table_gives_defaults() {
        let c = parse(
            "[daemon]\nsocket = \"/tmp/g.sock\"\ndevice = \"sim:h100\"\npolicy = \"fcfs\"\nrecord = \"/tmp/r.jsonl\"\nplacement = \"memory\"\n",
        )
        .unwrap();
        assert_eq!(c.daemon.record.as_deref(), Some(std::path::Path::new("/tmp/r.jsonl")));
        assert_eq!(c.daemon.device.as_deref(), Some("sim:h100"));
        assert_eq!(c.daemon.policy.as_deref(), Some("fcfs"));
        assert_eq!(c.daemon.placement.as_deref(), Some("memory"));
        assert!(c.allow.is_empty());
        assert_eq!(c.daemon.swap_memory, None, "left out: the daemon's default");
        let c = parse("[daemon]\nswap_memory = \"2 GiB\"\n").unwrap();
        assert_eq!(c.daemon.swap_memory, Some(Bytes(2 << 30)));
        assert_eq!(c.daemon.oversubscribe, None, "left out: on");
        let c = parse("[daemon]\noversubscribe = false\n").unwrap();
        assert_eq!(c.daemon.oversubscribe, Some(false));
        assert!(parse("[daemon]\noversubscribe = \"off\"\n").is_err(), "a boolean, not a word");
        let e = parse("[daemon]\nswap_memory = \"-1 GiB\"\n").unwrap_err().to_string();
        assert!(e.contains("negative"), "{e}");
    }
}
