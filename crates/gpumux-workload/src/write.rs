//! `Workload` → TOML text that `parse_str` reads back to the same workload.

use gpumux_engine::kernel::KernelDesc;
use gpumux_engine::model::{Op, Workload};
use gpumux_engine::time::Nanos;
use std::collections::BTreeMap;
use toml::{Table, Value};

fn us(ns: Nanos) -> Value {
    Value::Float(ns as f64 / 1000.0)
}

fn int(v: u64) -> Value {
    Value::Integer(v.min(i64::MAX as u64) as i64)
}

fn kernel_fields(k: &KernelDesc, t: &mut Table) {
    let shape = &k.shape;
    t.insert("grid".into(), int(shape.blocks));
    t.insert("block".into(), int(shape.threads_per_block as u64));
    t.insert("regs_per_thread".into(), int(shape.regs_per_thread as u64));
    t.insert("smem_per_block".into(), int(shape.smem_per_block as u64));
    // Without timing the file lacks the required `block_time_us`: a
    // description for a real device only is no workload file.
    if let Some(timing) = &k.sim_timing {
        t.insert("block_time_us".into(), us(timing.block_time_ns));
        t.insert("block_time_spread".into(), Value::Float(timing.block_time_spread));
        t.insert("mem_intensity".into(), Value::Float(timing.mem_intensity));
    }
    t.insert("idempotent".into(), Value::Boolean(k.idempotent));
    if let Some(m) = shape.max_blocks_per_sm {
        t.insert("max_blocks_per_sm".into(), int(m as u64));
    }
    if let Some(s) = &k.suite {
        let mut st = Table::new();
        st.insert("name".into(), Value::String(s.app.clone()));
        if let Some(k) = &s.kernel {
            st.insert("kernel".into(), Value::String(k.clone()));
        }
        let params: Table = s.params.iter().map(|(k, v)| (k.clone(), Value::Float(*v))).collect();
        st.insert("params".into(), Value::Table(params));
        t.insert("suite".into(), Value::Table(st));
    }
}

/// Serialises a workload as a workload file. Kernels whose name is used by
/// one description only become `[kernels.NAME]` templates; runs of the same
/// kernel become `launches`. Loops are not recovered.
pub fn to_toml(w: &Workload) -> String {
    // name -> Some(desc) when every use of the name is the same kernel.
    let mut by_name: BTreeMap<&str, Option<&KernelDesc>> = BTreeMap::new();
    for p in &w.processes {
        for op in &p.ops {
            if let Op::Kernel(k) = op {
                by_name
                    .entry(k.name.as_str())
                    .and_modify(|e| {
                        if e.is_some_and(|d| d != &**k) {
                            *e = None;
                        }
                    })
                    .or_insert(Some(&**k));
            }
        }
    }

    let mut root = Table::new();
    root.insert("name".into(), Value::String(w.name.clone()));
    if let Some(r) = w.replay_min_runs {
        root.insert("replay_min_runs".into(), int(r as u64));
    }
    let mut templates = Table::new();
    for (name, d) in &by_name {
        if let Some(d) = d {
            let mut t = Table::new();
            kernel_fields(d, &mut t);
            templates.insert((*name).to_string(), Value::Table(t));
        }
    }
    if !templates.is_empty() {
        root.insert("kernels".into(), Value::Table(templates));
    }

    let mut procs = Vec::new();
    for p in &w.processes {
        let mut pt = Table::new();
        pt.insert("name".into(), Value::String(p.name.clone()));
        pt.insert("priority".into(), Value::Integer(p.priority as i64));
        pt.insert("weight".into(), Value::Float(p.weight));
        pt.insert("arrival_us".into(), us(p.arrival_ns));
        pt.insert("repetitions".into(), int(p.repetitions as u64));
        pt.insert("async_depth".into(), int(p.async_depth as u64));
        let mut ops = Vec::new();
        let mut i = 0;
        while i < p.ops.len() {
            let op = &p.ops[i];
            let mut t = Table::new();
            match op {
                Op::CopyToDevice { bytes } | Op::CopyToHost { bytes } => {
                    let kind = if matches!(op, Op::CopyToDevice { .. }) { "h2d" } else { "d2h" };
                    t.insert("kind".into(), Value::String(kind.into()));
                    t.insert("bytes".into(), int(*bytes));
                    i += 1;
                }
                Op::Cpu { ns } => {
                    t.insert("kind".into(), Value::String("cpu".into()));
                    t.insert("us".into(), us(*ns));
                    i += 1;
                }
                Op::Sync => {
                    t.insert("kind".into(), Value::String("sync".into()));
                    i += 1;
                }
                Op::Record { event } | Op::WaitEvent { event } => {
                    let kind = if matches!(op, Op::Record { .. }) { "record" } else { "wait_event" };
                    t.insert("kind".into(), Value::String(kind.into()));
                    t.insert("event".into(), Value::String(event.clone()));
                    i += 1;
                }
                Op::Kernel(k) => {
                    let mut n = 1;
                    while matches!(p.ops.get(i + n), Some(Op::Kernel(k2)) if k2 == k) {
                        n += 1;
                    }
                    t.insert("kind".into(), Value::String("kernel".into()));
                    if by_name.get(k.name.as_str()).is_some_and(Option::is_some) {
                        t.insert("kernel".into(), Value::String(k.name.clone()));
                    } else {
                        t.insert("name".into(), Value::String(k.name.clone()));
                        kernel_fields(k, &mut t);
                    }
                    if n > 1 {
                        t.insert("launches".into(), int(n as u64));
                    }
                    i += n;
                }
            }
            ops.push(Value::Table(t));
        }
        pt.insert("op".into(), Value::Array(ops));
        procs.push(Value::Table(pt));
    }
    root.insert("process".into(), Value::Array(procs));
    // Serialising a table of plain values cannot fail; fall back to the Debug
    // form rather than panic if it ever does.
    toml::to_string(&root).unwrap_or_else(|e| format!("# cannot serialise: {e}\n"))
}
