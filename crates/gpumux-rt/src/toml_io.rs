//! TOML reading and writing of task sets.
//!
//! The file is parsed into a generic `toml::Table` and validated by hand (rather than with
//! `#[derive(Deserialize)]`) so that every error names the exact field path and a reason a
//! real-time engineer can act on, and so that integers and floats are both accepted as times.
//!
//! ```toml
//! [platform]            # optional; default 4 CPUs, 1 PCI bus, 4 GPUs (paper IV-D)
//! cpus = 4
//! pci = 1
//! gpus = 4
//!
//! [[task]]
//! name = "knn"          # optional, default "task<i>"; must be unique
//! period = 200          # T_i > 0
//! deadline = 200        # optional, default = period; 0 < D_i <= T_i
//! priority = 1          # optional, all tasks or none; smaller = higher; default DM
//! data_dependency = false
//! mode = "single"       # optional: the mode `rt analyze` uses
//! subtasks = [
//!   { resource = "cpu", single = 1, multi = 2 },
//!   { resource = "gpu", single = 100, multi = 50, chunk = 8 },  # chunk: optional longest
//!                                                             # non-preemptive section
//! ]                     # `multi` on all subtasks of a task or on none (then derived)
//! ```

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::Path;

use gpumux_files::text::{check_name, number, quote, toml_error};
use toml::{Table, Value};

use crate::cost::MultiCostModel;
use crate::model::{Mode, Platform, Resource, Subtask, Task, TaskSet};

/// Most tasks in a set (files, `rt generate --tasks`, `rt bench --sizes`).
pub const MAX_TASKS: usize = 1000;
/// Most subtasks in one task's pipeline.
pub const MAX_SUBTASKS: usize = 100;
/// Largest time (period, deadline, WCET, chunk) in the file's unit: with
/// milliseconds about 31 years; larger values only break tables.
pub const MAX_TIME: f64 = 1e12;

/// Task sets to and from their files (here rather than in `model.rs`, so the
/// model does not depend on its file format).
impl TaskSet {
    /// Loads and validates a TOML task-set file.
    pub fn from_file(path: &Path) -> Result<TaskSet, ModelError> {
        let file = path.display().to_string();
        let text = gpumux_files::read_text(path, gpumux_files::MAX_FILE_BYTES, "a task-set file")
            .map_err(|reason| ModelError::Io { file: file.clone(), reason })?;
        TaskSet::from_toml_str(&text, &file)
    }

    /// Parses and validates TOML text; `file` is only used in error messages.
    pub fn from_toml_str(text: &str, file: &str) -> Result<TaskSet, ModelError> {
        parse(text, file)
    }

    /// Serialises to the TOML format that [`TaskSet::from_toml_str`] reads (tasks in
    /// priority order, with explicit priorities so a round trip is exact).
    pub fn to_toml(&self) -> String {
        write(self)
    }
}

/// A bad task-set file: always names the file, and the field when there is one.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ModelError {
    /// The file could not be read.
    #[error("{file}: cannot read file: {reason}")]
    Io {
        /// File name.
        file: String,
        /// OS error.
        reason: String,
    },
    /// The text is not TOML.
    #[error("{file}: malformed TOML: {reason}")]
    Syntax {
        /// File name.
        file: String,
        /// Parser message (with line and column).
        reason: String,
    },
    /// A field is missing, of the wrong type, or out of range.
    #[error("{file}: field `{field}`: {reason}")]
    Field {
        /// File name.
        file: String,
        /// Path of the field, e.g. `task[1].subtasks[0].single`.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

impl ModelError {
    /// The offending field path, when the error is about one.
    pub fn field(&self) -> Option<&str> {
        match self {
            ModelError::Field { field, .. } => Some(field),
            _ => None,
        }
    }
}

struct Ctx<'a> {
    file: &'a str,
}

/// Short plain text (at most 40 printable ASCII characters, spaces allowed):
/// safe to print as written.
fn plain(s: &str) -> bool {
    s.len() <= 40 && s.chars().all(|c| c.is_ascii_graphic() || c == ' ')
}

/// A key as part of a field path: as written when plain, else quoted
/// (escaped, cut short).
fn key_shown(key: &str) -> String {
    if plain(key) && !key.contains(' ') {
        key.to_string()
    } else {
        quote(key)
    }
}

/// A user's value in a message: `in backticks` when plain, else quoted.
fn code(s: &str) -> String {
    if plain(s) {
        format!("`{s}`")
    } else {
        quote(s)
    }
}

impl Ctx<'_> {
    fn err(&self, field: impl Into<String>, reason: impl Into<String>) -> ModelError {
        ModelError::Field { file: self.file.to_string(), field: field.into(), reason: reason.into() }
    }

    fn check_keys(&self, table: &Table, path: &str, allowed: &[&str]) -> Result<(), ModelError> {
        for key in table.keys() {
            if !allowed.contains(&key.as_str()) {
                let key = key_shown(key);
                let field = if path.is_empty() { key } else { format!("{path}.{key}") };
                return Err(self.err(field, format!("unknown field (expected one of: {})", allowed.join(", "))));
            }
        }
        Ok(())
    }

    fn number(&self, v: &Value, field: &str) -> Result<f64, ModelError> {
        let x = match v {
            Value::Integer(i) => *i as f64,
            Value::Float(f) => *f,
            other => return Err(self.err(field, format!("expected a number, found {}", other.type_str()))),
        };
        if !x.is_finite() {
            return Err(self.err(field, "must be a finite number"));
        }
        if x.abs() > MAX_TIME {
            return Err(self.err(field, format!("must be at most {} (got {})", number(MAX_TIME), number(x))));
        }
        Ok(x)
    }

    fn time(&self, v: &Value, field: &str, allow_zero: bool) -> Result<f64, ModelError> {
        let x = self.number(v, field)?;
        if x < 0.0 {
            return Err(self.err(field, format!("must not be negative (got {})", number(x))));
        }
        if !allow_zero && x == 0.0 {
            return Err(self.err(field, "must be greater than zero"));
        }
        Ok(x)
    }

    fn units(&self, t: &Table, key: &str, default: u32) -> Result<u32, ModelError> {
        let field = format!("platform.{key}");
        match t.get(key) {
            None => Ok(default),
            Some(Value::Integer(i)) if *i >= 1 && *i <= 1_000_000 => Ok(*i as u32),
            Some(Value::Integer(i)) => Err(self.err(field, format!("must be a whole number of units >= 1 (got {i})"))),
            Some(other) => Err(self.err(field, format!("expected an integer, found {}", other.type_str()))),
        }
    }

    fn string<'v>(&self, v: &'v Value, field: &str) -> Result<&'v str, ModelError> {
        v.as_str().ok_or_else(|| self.err(field, format!("expected a string, found {}", v.type_str())))
    }
}

/// Parses and validates a task-set file's text.
pub fn parse(text: &str, file: &str) -> Result<TaskSet, ModelError> {
    let root: Table = text.parse::<Table>().map_err(|e| {
        // The message only, never the offending line: it can be 100,000 characters long.
        let (line, column, message) = toml_error(text, &e);
        ModelError::Syntax { file: file.to_string(), reason: format!("line {line}, column {column}: {message}") }
    })?;
    let cx = Ctx { file };
    cx.check_keys(&root, "", &["platform", "task"])?;

    let platform = match root.get("platform") {
        None => Platform::default(),
        Some(Value::Table(t)) => {
            cx.check_keys(t, "platform", &["cpus", "pci", "gpus"])?;
            let d = Platform::default();
            Platform {
                cpus: cx.units(t, "cpus", d.cpus)?,
                pci: cx.units(t, "pci", d.pci)?,
                gpus: cx.units(t, "gpus", d.gpus)?,
            }
        }
        Some(other) => return Err(cx.err("platform", format!("expected a table, found {}", other.type_str()))),
    };

    let raw_tasks = match root.get("task") {
        None => return Err(cx.err("task", "missing: a task set needs at least one [[task]]")),
        Some(Value::Array(a)) if a.is_empty() => return Err(cx.err("task", "a task set needs at least one [[task]]")),
        Some(Value::Array(a)) if a.len() > MAX_TASKS => {
            return Err(cx.err("task", format!("has {} tasks, more than the {MAX_TASKS} a set may have", a.len())))
        }
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(cx.err("task", format!("expected an array of tables ([[task]]), found {}", other.type_str())))
        }
    };

    let cost_model = MultiCostModel::default();
    let mut tasks = Vec::with_capacity(raw_tasks.len());
    let mut priorities: Vec<Option<i64>> = Vec::with_capacity(raw_tasks.len());
    let mut names = HashSet::new();
    for (i, raw) in raw_tasks.iter().enumerate() {
        let path = format!("task[{i}]");
        let t = raw.as_table().ok_or_else(|| cx.err(&path, format!("expected a table, found {}", raw.type_str())))?;
        cx.check_keys(t, &path, &["name", "period", "deadline", "priority", "data_dependency", "mode", "subtasks"])?;
        let name = match t.get("name") {
            None => format!("task{i}"),
            Some(v) => {
                let n = cx.string(v, &format!("{path}.name"))?;
                check_name(n).map_err(|reason| cx.err(format!("{path}.name"), reason))?;
                n.to_string()
            }
        };
        if !names.insert(name.clone()) {
            return Err(cx.err(format!("{path}.name"), format!("duplicate task name {}", code(&name))));
        }
        let period = match t.get("period") {
            None => return Err(cx.err(format!("{path}.period"), "missing (required)")),
            Some(v) => cx.time(v, &format!("{path}.period"), false)?,
        };
        let deadline = match t.get("deadline") {
            None => period,
            Some(v) => cx.time(v, &format!("{path}.deadline"), false)?,
        };
        if deadline > period {
            return Err(cx.err(
                format!("{path}.deadline"),
                format!(
                    "deadline {} exceeds period {}: the holistic analysis assumes \
                     constrained deadlines (D <= T)",
                    number(deadline),
                    number(period)
                ),
            ));
        }
        let priority = match t.get("priority") {
            None => None,
            Some(Value::Integer(p)) => Some(*p),
            Some(other) => {
                return Err(
                    cx.err(format!("{path}.priority"), format!("expected an integer, found {}", other.type_str()))
                )
            }
        };
        priorities.push(priority);
        let data_dependency = match t.get("data_dependency") {
            None => false,
            Some(Value::Boolean(b)) => *b,
            Some(other) => {
                return Err(cx.err(
                    format!("{path}.data_dependency"),
                    format!("expected true or false, found {}", other.type_str()),
                ))
            }
        };
        let mode = match t.get("mode") {
            None => Mode::Single,
            Some(v) => {
                let s = cx.string(v, &format!("{path}.mode"))?;
                Mode::parse(s).ok_or_else(|| {
                    cx.err(format!("{path}.mode"), format!("unknown mode {} (expected `single` or `multi`)", code(s)))
                })?
            }
        };
        if mode == Mode::Multi && !platform.allows_multi() {
            return Err(cx.err(format!("{path}.mode"), "multi-GPU mode needs platform.gpus >= 2"));
        }
        let subs = match t.get("subtasks") {
            None => return Err(cx.err(format!("{path}.subtasks"), "missing (required)")),
            Some(Value::Array(a)) if a.is_empty() => {
                return Err(cx.err(format!("{path}.subtasks"), "a task needs at least one subtask"))
            }
            Some(Value::Array(a)) if a.len() > MAX_SUBTASKS => {
                return Err(cx.err(
                    format!("{path}.subtasks"),
                    format!("has {} subtasks, more than the {MAX_SUBTASKS} a task may have", a.len()),
                ))
            }
            Some(Value::Array(a)) => a,
            Some(other) => {
                return Err(cx.err(format!("{path}.subtasks"), format!("expected an array, found {}", other.type_str())))
            }
        };
        let mut subtasks = Vec::with_capacity(subs.len());
        let mut with_multi = 0usize;
        for (j, s) in subs.iter().enumerate() {
            let sp = format!("{path}.subtasks[{j}]");
            let st = s.as_table().ok_or_else(|| cx.err(&sp, format!("expected a table, found {}", s.type_str())))?;
            cx.check_keys(st, &sp, &["resource", "single", "multi", "chunk"])?;
            let resource = match st.get("resource") {
                None => return Err(cx.err(format!("{sp}.resource"), "missing (required)")),
                Some(v) => {
                    let r = cx.string(v, &format!("{sp}.resource"))?;
                    Resource::parse(r).ok_or_else(|| {
                        cx.err(
                            format!("{sp}.resource"),
                            format!("unknown resource {} (expected `cpu`, `pci` or `gpu`)", code(r)),
                        )
                    })?
                }
            };
            let single = match st.get("single") {
                None => return Err(cx.err(format!("{sp}.single"), "missing (required)")),
                Some(v) => cx.time(v, &format!("{sp}.single"), true)?,
            };
            let multi = match st.get("multi") {
                None => f64::NAN,
                Some(v) => {
                    with_multi += 1;
                    cx.time(v, &format!("{sp}.multi"), true)?
                }
            };
            let chunk = match st.get("chunk") {
                None => None,
                Some(v) => Some(cx.time(v, &format!("{sp}.chunk"), false)?),
            };
            subtasks.push(Subtask { resource, single, multi, chunk });
        }
        let mut task = Task { name, period, deadline, data_dependency, subtasks, mode };
        if with_multi == 0 {
            cost_model.apply(&mut task);
        } else if with_multi != task.subtasks.len() {
            let missing = task.subtasks.iter().position(|s| s.multi.is_nan()).unwrap_or(0);
            return Err(cx.err(
                format!("{path}.subtasks[{missing}].multi"),
                "give `multi` on every subtask of the task or on none (then it is derived \
                 from the cost model)",
            ));
        }
        tasks.push(task);
    }

    let given = priorities.iter().filter(|p| p.is_some()).count();
    if given == 0 {
        return Ok(TaskSet::deadline_monotonic(platform, tasks));
    }
    if given != tasks.len() {
        let i = priorities.iter().position(|p| p.is_none()).unwrap_or(0);
        return Err(cx.err(
            format!("task[{i}].priority"),
            "missing: give `priority` on every task or on none (then Deadline-Monotonic)",
        ));
    }
    let mut seen = HashSet::new();
    for (i, p) in priorities.iter().enumerate() {
        if let Some(p) = p {
            if !seen.insert(*p) {
                return Err(cx.err(
                    format!("task[{i}].priority"),
                    format!("duplicate priority {p}: priorities must be distinct"),
                ));
            }
        }
    }
    let mut indexed: Vec<(i64, Task)> = priorities.into_iter().map(|p| p.unwrap_or(i64::MAX)).zip(tasks).collect();
    indexed.sort_by_key(|(p, _)| *p);
    Ok(TaskSet { platform, tasks: indexed.into_iter().map(|(_, t)| t).collect() })
}

fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        // Shortest representation that round-trips exactly.
        format!("{x:?}")
    }
}

/// Writes a set in the file format, with explicit priorities (1 = highest).
pub fn write(set: &TaskSet) -> String {
    let mut s = String::new();
    let p = set.platform;
    let _ = writeln!(s, "[platform]\ncpus = {}\npci = {}\ngpus = {}\n", p.cpus, p.pci, p.gpus);
    for (i, t) in set.tasks.iter().enumerate() {
        let _ = writeln!(s, "[[task]]");
        let _ = writeln!(s, "name = {:?}", t.name);
        let _ = writeln!(s, "period = {}", num(t.period));
        let _ = writeln!(s, "deadline = {}", num(t.deadline));
        let _ = writeln!(s, "priority = {}", i + 1);
        let _ = writeln!(s, "data_dependency = {}", t.data_dependency);
        let _ = writeln!(s, "mode = \"{}\"", t.mode);
        let _ = writeln!(s, "subtasks = [");
        for st in &t.subtasks {
            let chunk = st.chunk.map_or_else(String::new, |k| format!(", chunk = {}", num(k)));
            let _ = writeln!(
                s,
                "  {{ resource = \"{}\", single = {}, multi = {}{chunk} }},",
                st.resource,
                num(st.single),
                num(st.multi)
            );
        }
        let _ = writeln!(s, "]\n");
    }
    s
}
