//! Who may connect, and with which limits (docs/daemon.md, "Configure").
//!
//! ```toml
//! [daemon]                  # optional; the command line wins over it
//! socket = "/run/gpumux/gpumux.sock"
//! device = "cuda:0"
//! policy = "ppq-even-drain"
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
//! ```
//!
//! An entry matches by exactly one of `uid`, `gid` or `any = true`. Limits an
//! entry leaves out take the defaults of [`ClientLimits::default`]. Without a
//! config file only the daemon's own uid and root may connect, with the
//! default limits. Unknown keys and bad values are errors that name the line.

use serde::de::{self, Deserializer};
use serde::Deserialize;
use std::path::{Path, PathBuf};

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
}

/// The whole config.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `[daemon]`.
    pub daemon: DaemonDefaults,
    /// `[[allow]]`, in file order.
    pub allow: Vec<AllowEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    daemon: DaemonDefaults,
    #[serde(default)]
    allow: Vec<RawAllow>,
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
struct Bytes(u64);

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
        Config { daemon: DaemonDefaults::default(), allow }
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
            allow.push(AllowEntry { matcher, limits });
        }
        Ok(Config { daemon: raw.daemon, allow })
    }

    /// The limits of a peer with `uid` and `gid`: the first entry that matches
    /// wins; `None` if none does (the peer is refused).
    pub fn limits_for(&self, uid: u32, gid: u32) -> Option<&ClientLimits> {
        self.allow.iter().find(|e| e.matcher.matches(uid, gid)).map(|e| &e.limits)
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
    fn the_daemon_table_gives_defaults() {
        let c = parse("[daemon]\nsocket = \"/tmp/g.sock\"\ndevice = \"sim:h100\"\npolicy = \"fcfs\"\n").unwrap();
        assert_eq!(c.daemon.device.as_deref(), Some("sim:h100"));
        assert_eq!(c.daemon.policy.as_deref(), Some("fcfs"));
        assert!(c.allow.is_empty());
    }
}
