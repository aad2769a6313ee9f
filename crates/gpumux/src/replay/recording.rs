//! Reading a `gpumuxd --record` file: every line parsed and checked, the
//! clients and their operations gathered. A malformed file is refused with
//! the line number and what is wrong with it.

use gpumuxd::recording::{Line, OpLine, What, FORMAT};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

/// Largest recording read: a day of a busy daemon is far less; an endless
/// pipe stops here instead of filling memory.
const MAX_BYTES: u64 = 1 << 30;

/// Why a recording cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    /// The file could not be read.
    #[error("{file}: {why}")]
    Read { file: String, why: String },
    /// A line is malformed or contradicts an earlier one.
    #[error("{file}:{line}: {why}")]
    Line { file: String, line: usize, why: String },
    /// Nothing to replay.
    #[error("{file}: {why}")]
    Empty { file: String, why: String },
}

/// One client as recorded.
#[derive(Clone, Debug)]
pub struct ClientRec {
    pub id: u64,
    pub name: String,
    pub priority: i32,
    pub weight: f64,
    /// It changed its priority during the run (not replayed).
    pub reprioritised: bool,
    /// Its operations, in submission order (completed and dropped).
    pub ops: Vec<OpLine>,
}

impl ClientRec {
    /// Its completed operations, in submission order.
    pub fn completed(&self) -> impl Iterator<Item = &OpLine> {
        self.ops.iter().filter(|o| o.completed)
    }

    /// When its first operation was submitted.
    pub fn first_submitted(&self) -> Option<u64> {
        self.completed().map(|o| o.submitted_ns).min()
    }

    /// From its first submission to the end of its last operation: its turnaround.
    pub fn turnaround_ns(&self) -> Option<u64> {
        let last = self.completed().map(|o| o.ended_ns).max()?;
        Some(last - self.first_submitted()?)
    }
}

/// A whole recording.
#[derive(Clone, Debug)]
pub struct Recording {
    pub file: String,
    pub device: String,
    pub policy: String,
    pub sms: u32,
    /// Clients with at least one completed operation, in order of their first submission.
    pub clients: Vec<ClientRec>,
}

impl Recording {
    pub fn load(path: &Path) -> Result<Recording, RecordingError> {
        let file = path.display().to_string();
        let text = gpumux_files::read::read_text(path, MAX_BYTES, "recording")
            .map_err(|e| RecordingError::Read { file: file.clone(), why: e.to_string() })?;
        Recording::parse(&text, &file)
    }

    /// Parses `text`; `file` names it in messages.
    pub fn parse(text: &str, file: &str) -> Result<Recording, RecordingError> {
        let bad = |line: usize, why: String| RecordingError::Line { file: file.to_string(), line, why };
        let mut header: Option<(String, String, u32)> = None;
        let mut clients: BTreeMap<u64, ClientRec> = BTreeMap::new();
        let mut gone: HashSet<u64> = HashSet::new();
        let mut ops_seen: HashSet<u64> = HashSet::new();
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            if raw.trim().is_empty() {
                continue;
            }
            let line: Line = serde_json::from_str(raw).map_err(|e| bad(n, format!("not a recording line: {e}")))?;
            match (line, &header) {
                (Line::Daemon { format, device, policy, sms, .. }, None) => {
                    if format != FORMAT {
                        return Err(bad(n, format!("recording format {format}; this gpumux reads {FORMAT}")));
                    }
                    if sms == 0 {
                        return Err(bad(n, "a device of 0 SMs".into()));
                    }
                    header = Some((device, policy, sms));
                }
                (Line::Daemon { .. }, Some(_)) => {
                    return Err(bad(
                        n,
                        "a second recording starts here (the daemon appends to its file): keep one daemon run per file"
                            .into(),
                    ))
                }
                (_, None) => return Err(bad(n, "the first line must be the daemon's (`\"kind\":\"daemon\"`)".into())),
                (Line::Hello { client, name, priority, weight, .. }, Some(_)) => {
                    if clients.contains_key(&client) {
                        return Err(bad(n, format!("client {client} says hello twice")));
                    }
                    if !(weight.is_finite() && weight > 0.0) {
                        return Err(bad(n, format!("client {client}: weight {weight} is not a number > 0")));
                    }
                    gpumux_files::text::check_name(&name)
                        .map_err(|e| bad(n, format!("client {client}: its name {e}")))?;
                    clients.insert(
                        client,
                        ClientRec { id: client, name, priority, weight, reprioritised: false, ops: Vec::new() },
                    );
                }
                (Line::Priority { client, priority, .. }, Some(_)) => match clients.get_mut(&client) {
                    Some(c) => c.reprioritised |= c.priority != priority,
                    None => return Err(bad(n, format!("client {client} changes priority before its hello"))),
                },
                (Line::Gone { client, .. }, Some(_)) => {
                    if !clients.contains_key(&client) {
                        return Err(bad(n, format!("client {client} leaves without a hello")));
                    }
                    if !gone.insert(client) {
                        return Err(bad(n, format!("client {client} leaves twice")));
                    }
                }
                (Line::Op(op), Some(_)) => {
                    check_op(&op)
                        .map_err(|why| bad(n, format!("operation {} of client {}: {why}", op.op, op.client)))?;
                    if !ops_seen.insert(op.op) {
                        return Err(bad(n, format!("operation {} recorded twice", op.op)));
                    }
                    match clients.get_mut(&op.client) {
                        Some(c) => c.ops.push(op),
                        None => {
                            return Err(bad(
                                n,
                                format!("operation {} of client {}, which never said hello", op.op, op.client),
                            ))
                        }
                    }
                }
            }
        }
        let Some((device, policy, sms)) = header else {
            return Err(RecordingError::Empty { file: file.to_string(), why: "an empty recording".into() });
        };
        let mut clients: Vec<ClientRec> = clients.into_values().filter(|c| c.completed().next().is_some()).collect();
        if clients.is_empty() {
            return Err(RecordingError::Empty {
                file: file.to_string(),
                why: "no client completed an operation in this recording".into(),
            });
        }
        for c in &mut clients {
            c.ops.sort_by_key(|o| o.op);
        }
        clients.sort_by_key(|c| (c.first_submitted(), c.id));
        Ok(Recording { file: file.to_string(), device, policy, sms, clients })
    }
}

/// One operation's own consistency.
fn check_op(op: &OpLine) -> Result<(), String> {
    if op.ended_ns < op.submitted_ns {
        return Err(format!("ended at {} ns, before it was submitted at {} ns", op.ended_ns, op.submitted_ns));
    }
    if let Some(s) = op.started_ns {
        if s < op.submitted_ns || s > op.ended_ns {
            return Err(format!(
                "started at {s} ns, outside its submission ({} ns) to its end ({} ns)",
                op.submitted_ns, op.ended_ns
            ));
        }
    }
    if let What::Kernel { name, grid, block, regs_per_thread, .. } = &op.what {
        gpumux_files::text::check_name(name).map_err(|e| format!("kernel name {e}"))?;
        if grid.contains(&0) || block.contains(&0) {
            return Err(format!("kernel `{name}`: grid {grid:?} and block {block:?} must have no zero"));
        }
        let threads = block.iter().map(|&b| u64::from(b)).product::<u64>();
        if threads > 1024 {
            return Err(format!("kernel `{name}`: a block of {threads} threads, over 1024"));
        }
        if !(1..=255).contains(regs_per_thread) {
            return Err(format!("kernel `{name}`: {regs_per_thread} registers per thread, expected 1 to 255"));
        }
        if op.completed && op.started_ns.is_none() {
            return Err(format!("kernel `{name}` completed without ever starting"));
        }
    }
    Ok(())
}
