//! TOML text → validated `Workload`.

use crate::error::WorkloadError;
use crate::raw::{RawFile, RawKernel, RawOp, RawProcess, RawSuite};
use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming, SuiteKernelRef};
use gpumux_engine::model::{Op, ProcessSpec, Workload};
use gpumux_engine::time::us_to_ns;
use gpumux_files::text::{check_name, number, quote};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;

/// Most operations a workload may expand to (loops, `launches`), summed over
/// its processes.
pub const MAX_EXPANDED_OPS: u64 = 10_000_000;
/// Most blocks in one kernel's grid.
pub const MAX_BLOCKS: u64 = 1 << 40;
/// Most threads in one block (every NVIDIA GPU since Fermi).
pub const MAX_THREADS_PER_BLOCK: u64 = 1024;
/// Most registers per thread (every NVIDIA GPU since Kepler GK110).
pub const MAX_REGS_PER_THREAD: i64 = 255;
/// Most shared memory per block we accept (far above any GPU's).
pub const MAX_SMEM_PER_BLOCK: i64 = 1 << 20;
/// Most bytes in one copy (1 PiB).
pub const MAX_COPY_BYTES: i64 = 1 << 50;
/// Largest time in microseconds (about 11.6 days).
pub const MAX_US: f64 = 1e12;
/// Largest mean block time in microseconds.
pub const MAX_BLOCK_US: f64 = 1e9;
/// Deepest nesting of `loop` ops.
pub const MAX_LOOP_DEPTH: usize = 16;
/// Largest `repetitions`, `replay_min_runs`, `async_depth`.
pub const MAX_COUNT: i64 = 1_000_000;

/// The longest event name (`record`, `wait_event`).
const MAX_EVENT_NAME: usize = 256;
const KINDS: &str = "h2d, d2h, cpu, sync, record, wait_event, kernel, loop";

/// Where we are, for messages.
struct Ctx<'a> {
    origin: &'a str,
    at: String,
}

impl Ctx<'_> {
    fn err(&self, field: &str, reason: impl Into<String>) -> WorkloadError {
        WorkloadError::Invalid {
            origin: self.origin.to_string(),
            at: self.at.clone(),
            field: field.to_string(),
            reason: reason.into(),
        }
    }

    fn sub(&self, at: String) -> Ctx<'_> {
        let at = if self.at.is_empty() { at } else { format!("{} {}", self.at, at) };
        Ctx { origin: self.origin, at }
    }

    fn int(&self, field: &str, v: i64, lo: i64, hi: i64) -> Result<i64, WorkloadError> {
        if v < lo {
            let what = if lo == 1 { "must be >= 1".to_string() } else { format!("must be >= {lo}") };
            return Err(self.err(field, format!("{what}, got {v}")));
        }
        if v > hi {
            return Err(self.err(field, format!("must be <= {hi}, got {v}")));
        }
        Ok(v)
    }

    fn finite(&self, field: &str, v: f64) -> Result<f64, WorkloadError> {
        if v.is_finite() {
            Ok(v)
        } else {
            Err(self.err(field, format!("must be a finite number, got {}", number(v))))
        }
    }

    /// lo <= v <= hi (or < hi when `hi_open`).
    fn real(&self, field: &str, v: f64, lo: f64, hi: f64, hi_open: bool) -> Result<f64, WorkloadError> {
        let v = self.finite(field, v)?;
        if v < lo {
            return Err(self.err(field, format!("must be >= {}, got {}", number(lo), number(v))));
        }
        if v > hi || (hi_open && v == hi) {
            let op = if hi_open { "<" } else { "<=" };
            return Err(self.err(field, format!("must be {op} {}, got {}", number(hi), number(v))));
        }
        Ok(v)
    }

    fn positive(&self, field: &str, v: f64, hi: f64) -> Result<f64, WorkloadError> {
        let v = self.finite(field, v)?;
        if v <= 0.0 {
            return Err(self.err(field, format!("must be > 0, got {}", number(v))));
        }
        if v > hi {
            return Err(self.err(field, format!("must be <= {}, got {}", number(hi), number(v))));
        }
        Ok(v)
    }

    /// The checks every name gets, shared with the task-set parser of gpumux-rt.
    fn name(&self, field: &str, v: &str) -> Result<String, WorkloadError> {
        check_name(v).map_err(|reason| self.err(field, reason))?;
        Ok(v.to_string())
    }

    fn required<T>(&self, field: &str, v: Option<T>, what: &str) -> Result<T, WorkloadError> {
        v.ok_or_else(|| self.err(field, format!("is required ({what})")))
    }

    /// `grid`/`block`: an integer or an array of 1 to 3 integers, each >= 1;
    /// returns the product.
    fn dims(&self, field: &str, v: &toml::Value, max: u64) -> Result<u64, WorkloadError> {
        let shape = "an integer or an array of 1 to 3 integers";
        let dims: Vec<i64> = match v {
            toml::Value::Integer(i) => vec![*i],
            toml::Value::Array(a) if (1..=3).contains(&a.len()) => a
                .iter()
                .map(|x| x.as_integer().ok_or_else(|| self.err(field, format!("must be {shape}, got {v}"))))
                .collect::<Result<_, _>>()?,
            _ => return Err(self.err(field, format!("must be {shape}, got {v}"))),
        };
        let mut prod: u64 = 1;
        for d in dims {
            if d < 1 {
                return Err(self.err(field, format!("dimensions must be > 0, got {v}")));
            }
            prod = prod
                .checked_mul(d as u64)
                .filter(|p| *p <= max)
                .ok_or_else(|| self.err(field, format!("product must be <= {max}, got {v}")))?;
        }
        Ok(prod)
    }
}

/// Parses and validates workload text. `origin` names it in messages (a path,
/// or `<string>`); the workload's name defaults to its file stem.
pub fn parse_str(text: &str, origin: &str) -> Result<Workload, WorkloadError> {
    let raw: RawFile = toml::from_str(text).map_err(|e| WorkloadError::toml(origin, text, &e))?;
    let top = Ctx { origin, at: String::new() };

    let name = match &raw.name {
        Some(n) => top.name("name", n)?,
        None => default_name(origin),
    };
    let replay_min_runs = match raw.replay_min_runs {
        Some(r) => Some(top.int("replay_min_runs", r, 1, MAX_COUNT)? as u32),
        None => None,
    };

    // Templates: check the fields they have, before any op uses them.
    for (key, k) in &raw.kernels {
        let c = top.sub(format!("kernels.{key}"));
        check_name(key).map_err(|reason| c.err("kernels", format!("template name {reason}")))?;
        check_kernel_fields(&c, k)?;
    }

    if raw.process.is_empty() {
        return Err(top.err("process", "is required: a workload needs at least one [[process]]"));
    }
    let mut budget = MAX_EXPANDED_OPS;
    let mut seen = HashSet::new();
    let mut processes = Vec::with_capacity(raw.process.len());
    for (i, p) in raw.process.iter().enumerate() {
        let spec = process(&top, i, p, &raw.kernels, &mut budget)?;
        if !seen.insert(spec.name.clone()) {
            let c = top.sub(format!("process {} (\"{}\")", i + 1, spec.name));
            return Err(
                c.err("name", format!("must be unique, but {} is used by an earlier process", quote(&spec.name)))
            );
        }
        processes.push(spec);
    }
    // A wait for an event nobody records is a typo: it would order nothing.
    let recorded: HashSet<&str> = processes
        .iter()
        .flat_map(|p| &p.ops)
        .filter_map(|op| match op {
            Op::Record { event } => Some(event.as_str()),
            _ => None,
        })
        .collect();
    for (i, p) in processes.iter().enumerate() {
        let unknown = p.ops.iter().find_map(|op| match op {
            Op::WaitEvent { event } if !recorded.contains(event.as_str()) => Some(event),
            _ => None,
        });
        if let Some(event) = unknown {
            let c = top.sub(format!("process {} (\"{}\")", i + 1, p.name));
            return Err(c.err("op", format!("waits for event {} which no process records", quote(event))));
        }
    }
    Ok(Workload { name, processes, replay_min_runs })
}

fn default_name(origin: &str) -> String {
    Path::new(origin)
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| !s.trim().is_empty() && !s.starts_with('<'))
        .unwrap_or("workload")
        .to_string()
}

fn process(
    top: &Ctx,
    i: usize,
    p: &RawProcess,
    templates: &BTreeMap<String, RawKernel>,
    budget: &mut u64,
) -> Result<ProcessSpec, WorkloadError> {
    let c0 = top.sub(format!("process {}", i + 1));
    let name = c0.name("name", c0.required("name", p.name.as_deref(), "every process needs a unique name")?)?;
    let c = top.sub(format!("process {name:?}"));
    let priority = c.int("priority", p.priority.unwrap_or(0), i32::MIN as i64, i32::MAX as i64)? as i32;
    let weight = c.positive("weight", p.weight.unwrap_or(1.0), 1e6)?;
    let arrival_us = c.real("arrival_us", p.arrival_us.unwrap_or(0.0), 0.0, MAX_US, false)?;
    let repetitions = c.int("repetitions", p.repetitions.unwrap_or(1), 1, MAX_COUNT)? as u32;
    let async_depth = c.int("async_depth", p.async_depth.unwrap_or(0), 0, MAX_COUNT)? as u32;
    if p.op.is_empty() {
        return Err(c.err("op", "is required: a process needs at least one [[process.op]]"));
    }
    let plan = ops(&c, &p.op, templates, 0)?;
    let n = count(&plan);
    if n > *budget {
        return Err(c.err(
            "op",
            format!(
                "expands to {} operations (loops × launches), more than the {} a workload may have{}",
                if n == u64::MAX { "too many".to_string() } else { n.to_string() },
                MAX_EXPANDED_OPS,
                if *budget < MAX_EXPANDED_OPS { " in all (earlier processes used some)" } else { "" }
            ),
        ));
    }
    *budget -= n;
    let mut out = Vec::with_capacity(n as usize);
    expand(&plan, &mut out);
    check_suite_instances(&c, &out)?;
    Ok(ProcessSpec { name, priority, weight, arrival_ns: us_to_ns(arrival_us), repetitions, async_depth, ops: out })
}

/// Validated ops before loops and launches are unrolled.
enum Plan {
    Op(Op, u64),
    Loop(u64, Vec<Plan>),
}

fn count(plan: &[Plan]) -> u64 {
    plan.iter().fold(0u64, |acc, p| {
        acc.saturating_add(match p {
            Plan::Op(_, n) => *n,
            Plan::Loop(t, body) => t.saturating_mul(count(body)),
        })
    })
}

fn expand(plan: &[Plan], out: &mut Vec<Op>) {
    for p in plan {
        match p {
            Plan::Op(op, n) => out.extend((0..*n).map(|_| op.clone())),
            Plan::Loop(t, body) => {
                for _ in 0..*t {
                    expand(body, out);
                }
            }
        }
    }
}

fn ops(
    c: &Ctx,
    raw: &[RawOp],
    templates: &BTreeMap<String, RawKernel>,
    depth: usize,
) -> Result<Vec<Plan>, WorkloadError> {
    raw.iter().enumerate().map(|(i, o)| op(c, i, o, templates, depth)).collect()
}

fn op(
    pc: &Ctx,
    i: usize,
    o: &RawOp,
    templates: &BTreeMap<String, RawKernel>,
    depth: usize,
) -> Result<Plan, WorkloadError> {
    let n = i + 1;
    let c = pc.sub(format!("op {n}"));
    let kind = c.required("kind", o.kind.as_deref(), &format!("one of {KINDS}"))?;
    let allowed: &[&str] = match kind {
        "h2d" | "d2h" => &["bytes", "kb", "mb"],
        "cpu" => &["us"],
        "sync" => &[],
        "record" | "wait_event" => &["event"],
        "loop" => &["times", "op"],
        "kernel" => &[
            "kernel",
            "name",
            "grid",
            "block",
            "regs_per_thread",
            "smem_per_block",
            "block_time_us",
            "block_time_spread",
            "mem_intensity",
            "idempotent",
            "max_blocks_per_sm",
            "launches",
            "suite",
        ],
        other => return Err(c.err("kind", format!("must be one of {KINDS}, got {}", quote(other)))),
    };
    // Name the kernel in the location when we know it.
    let c = if kind == "kernel" {
        let kname = o.name.clone().or_else(|| {
            o.kernel.as_ref().map(|t| templates.get(t).and_then(|k| k.name.clone()).unwrap_or_else(|| t.clone()))
        });
        match kname {
            Some(k) => pc.sub(format!("op {n} (kernel {k:?})")),
            None => pc.sub(format!("op {n} (kernel)")),
        }
    } else {
        pc.sub(format!("op {n} ({kind})"))
    };
    if let Some(f) = o.present().into_iter().find(|f| !allowed.contains(f)) {
        return Err(c.err(f, format!("does not apply to kind = {kind:?} (its fields: {})", allowed.join(", "))));
    }
    match kind {
        "h2d" | "d2h" => {
            let bytes = copy_bytes(&c, o)?;
            Ok(Plan::Op(if kind == "h2d" { Op::CopyToDevice { bytes } } else { Op::CopyToHost { bytes } }, 1))
        }
        "sync" => Ok(Plan::Op(Op::Sync, 1)),
        "record" | "wait_event" => {
            let event = c.required("event", o.event.as_deref(), "the event's name")?;
            if event.is_empty() || event.len() > MAX_EVENT_NAME {
                return Err(c.err("event", format!("must be a name of 1 to {MAX_EVENT_NAME} bytes")));
            }
            let event = event.to_owned();
            Ok(Plan::Op(if kind == "record" { Op::Record { event } } else { Op::WaitEvent { event } }, 1))
        }
        "cpu" => {
            let us = c.required("us", o.us, "microseconds of host computation")?;
            let us = c.real("us", us, 0.0, MAX_US, false)?;
            Ok(Plan::Op(Op::Cpu { ns: us_to_ns(us) }, 1))
        }
        "loop" => {
            if depth >= MAX_LOOP_DEPTH {
                return Err(c.err("op", format!("loops nest deeper than {MAX_LOOP_DEPTH}")));
            }
            let times = c.required("times", o.times, "how many times the loop body runs")?;
            let times = c.int("times", times, 1, MAX_EXPANDED_OPS as i64)? as u64;
            let body = c.required("op", o.op.as_ref(), "the loop body: a list of ops")?;
            if body.is_empty() {
                return Err(c.err("op", "must hold at least one op"));
            }
            Ok(Plan::Loop(times, ops(&c, body, templates, depth + 1)?))
        }
        _ => {
            let base = match &o.kernel {
                Some(t) => match templates.get(t) {
                    Some(k) => k.clone(),
                    None => {
                        let known: Vec<&str> = templates.keys().map(String::as_str).collect();
                        let known = if known.is_empty() {
                            "the file has no [kernels.NAME] tables".to_string()
                        } else {
                            format!("known: {}", known.join(", "))
                        };
                        return Err(
                            c.err("kernel", format!("refers to an unknown kernel template {} ({known})", quote(t)))
                        );
                    }
                },
                None => RawKernel::default(),
            };
            let mut k = o.kernel_over(&base);
            if k.name.is_none() {
                k.name = o.kernel.clone();
            }
            let (desc, launches) = kernel(&c, &k)?;
            Ok(Plan::Op(Op::Kernel(Arc::new(desc)), launches))
        }
    }
}

fn copy_bytes(c: &Ctx, o: &RawOp) -> Result<u64, WorkloadError> {
    let given = [o.bytes.is_some(), o.kb.is_some(), o.mb.is_some()].iter().filter(|b| **b).count();
    if given != 1 {
        let why = if given == 0 { "is required" } else { "must be given once" };
        return Err(c.err("bytes", format!("{why}: give exactly one of bytes, kb (KiB) or mb (MiB)")));
    }
    let bytes = if let Some(b) = o.bytes {
        c.int("bytes", b, 1, MAX_COPY_BYTES)?
    } else {
        let (field, v, unit) = match o.kb {
            Some(kb) => ("kb", kb, 1024.0),
            None => ("mb", o.mb.unwrap_or(0.0), 1024.0 * 1024.0),
        };
        let v = c.positive(field, v, MAX_COPY_BYTES as f64 / unit)?;
        let b = (v * unit).round();
        if b < 1.0 {
            return Err(c.err(field, format!("must be at least 1 byte, got {}", number(v))));
        }
        b as i64
    };
    Ok(bytes as u64)
}

/// Range checks of the fields that are present (templates and ops alike).
fn check_kernel_fields(c: &Ctx, k: &RawKernel) -> Result<(), WorkloadError> {
    if let Some(n) = &k.name {
        c.name("name", n)?;
    }
    if let Some(g) = &k.grid {
        c.dims("grid", g, MAX_BLOCKS)?;
    }
    if let Some(b) = &k.block {
        c.dims("block", b, MAX_THREADS_PER_BLOCK)?;
    }
    if let Some(r) = k.regs_per_thread {
        c.int("regs_per_thread", r, 1, MAX_REGS_PER_THREAD)?;
    }
    if let Some(s) = k.smem_per_block {
        c.int("smem_per_block", s, 0, MAX_SMEM_PER_BLOCK)?;
    }
    if let Some(t) = k.block_time_us {
        let t = c.positive("block_time_us", t, MAX_BLOCK_US)?;
        if us_to_ns(t) == 0 {
            return Err(c.err("block_time_us", format!("must be at least 0.001 (1 ns), got {}", number(t))));
        }
    }
    if let Some(s) = k.block_time_spread {
        c.real("block_time_spread", s, 0.0, 1.0, true)?;
    }
    if let Some(m) = k.mem_intensity {
        c.real("mem_intensity", m, 0.0, 1.0, false)?;
    }
    if let Some(m) = k.max_blocks_per_sm {
        c.int("max_blocks_per_sm", m, 1, 65536)?;
    }
    if let Some(l) = k.launches {
        c.int("launches", l, 1, MAX_EXPANDED_OPS as i64)?;
    }
    if let Some(s) = &k.suite {
        suite(c, s)?;
    }
    Ok(())
}

/// `suite = { name, kernel, params }`, read once into its parts: the app and,
/// for one kernel of a multi-kernel app, the kernel (`name = "kmeans", kernel =
/// "assign"`, or the same as `name = "kmeans.assign"`). Whether the app, the
/// kernel and the params exist is the CUDA backend's to say.
fn suite(c: &Ctx, s: &RawSuite) -> Result<SuiteKernelRef, WorkloadError> {
    let name = c.required("suite.name", s.name.as_deref(), "the CUDA suite kernel's name")?;
    let name = c.name("suite.name", name)?;
    let kernel = match &s.kernel {
        Some(k) => {
            let k = c.name("suite.kernel", k)?;
            if k.contains('.') {
                return Err(c.err("suite.kernel", format!("must not contain '.', got {}", quote(&k))));
            }
            if name.contains('.') {
                return Err(c.err(
                    "suite.kernel",
                    format!("is given twice: suite.name {} already names a kernel after its '.'", quote(&name)),
                ));
            }
            Some(k)
        }
        None => None,
    };
    let (app, kernel) = match (name.split_once('.'), kernel) {
        (Some((app, k)), _) => {
            if app.trim().is_empty() || k.trim().is_empty() || k.contains('.') {
                return Err(c.err(
                    "suite.name",
                    format!("must be APP or APP.KERNEL (one '.', both parts named), got {}", quote(&name)),
                ));
            }
            (app.to_string(), Some(k.to_string()))
        }
        (None, kernel) => (name, kernel),
    };
    for (k, v) in &s.params {
        c.finite(&format!("suite.params.{k}"), *v)?;
    }
    Ok(SuiteKernelRef { app, kernel, params: s.params.clone() })
}

/// The kernels of a multi-kernel suite app that one process names (with a
/// kernel part, `APP.KERNEL`) share one instance of the app, so they must agree on its
/// size parameters.
fn check_suite_instances(c: &Ctx, ops: &[Op]) -> Result<(), WorkloadError> {
    let mut first: BTreeMap<&str, &KernelDesc> = BTreeMap::new();
    for op in ops {
        let Op::Kernel(k) = op else { continue };
        let Some(s) = &k.suite else { continue };
        if s.kernel.is_none() {
            continue;
        }
        let app = s.app.as_str();
        match first.get(app) {
            None => {
                first.insert(app, k);
            }
            Some(f) if std::ptr::eq(*f, &**k) => {}
            Some(f) => {
                if let Some(fs) = f.suite.as_ref().filter(|fs| fs.params != s.params) {
                    return Err(c.err(
                        "suite.params",
                        format!(
                            "kernel {:?} ({s}) has {}, but kernel {:?} ({fs}) has {}: the kernels of \
                             suite app {app:?} in one process share one instance and must have the same params",
                            k.name,
                            show_params(&s.params),
                            f.name,
                            show_params(&fs.params)
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

fn show_params(p: &BTreeMap<String, f64>) -> String {
    let v: Vec<String> = p.iter().map(|(k, v)| format!("{k} = {v}")).collect();
    format!("{{ {} }}", v.join(", "))
}

fn kernel(c: &Ctx, k: &RawKernel) -> Result<(KernelDesc, u64), WorkloadError> {
    check_kernel_fields(c, k)?;
    let name = c.required("name", k.name.as_deref(), "give name, or kernel = \"TEMPLATE\"")?;
    let name = c.name("name", name)?;
    let blocks = c.dims("grid", c.required("grid", k.grid.as_ref(), "number of blocks")?, MAX_BLOCKS)?;
    let threads =
        c.dims("block", c.required("block", k.block.as_ref(), "threads per block")?, MAX_THREADS_PER_BLOCK)?;
    let regs = c.required("regs_per_thread", k.regs_per_thread, "registers per thread")?;
    let t = c.required("block_time_us", k.block_time_us, "mean time of one block, microseconds")?;
    let suite = match &k.suite {
        Some(s) => Some(suite(c, s)?),
        None => None,
    };
    let desc = KernelDesc {
        name,
        shape: KernelShape {
            blocks,
            threads_per_block: threads as u32,
            regs_per_thread: regs as u32,
            smem_per_block: k.smem_per_block.unwrap_or(0) as u32,
            max_blocks_per_sm: k.max_blocks_per_sm.map(|m| m as u32),
        },
        idempotent: k.idempotent.unwrap_or(true),
        sim_timing: Some(SimTiming {
            block_time_ns: us_to_ns(t),
            block_time_spread: k.block_time_spread.unwrap_or(0.0),
            mem_intensity: k.mem_intensity.unwrap_or(0.0),
        }),
        suite,
    };
    Ok((desc, k.launches.unwrap_or(1) as u64))
}
