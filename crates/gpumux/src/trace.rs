//! Chrome Trace Event Format output (loads in Perfetto and chrome://tracing).
//!
//! Layout: one trace "process" per policy, one "thread" per device lane
//! (SMs first, then the H2D and D2H copy engines), one complete event ("X")
//! per span. Times are microseconds as floats, which the format expects,
//! keeping nanosecond precision in the fraction.
//!
//! The file is streamed event by event through a `BufWriter` because a trace
//! can hold millions of spans; serialising a `Vec` of events first would
//! double the peak memory. Every event is a struct with a fixed field order
//! (no hash maps), so the same input gives a byte-identical file.

use anyhow::{Context, Result};
use gpumux_engine::device::TraceSpan;
use serde::Serialize;
use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

/// One policy's timeline: policy name, number of SMs, spans.
pub type TraceRun = (String, u16, Vec<TraceSpan>);

#[derive(Serialize)]
struct NameArgs<'a> {
    name: &'a str,
}

#[derive(Serialize)]
struct SortArgs {
    sort_index: i64,
}

/// A metadata event ("M"): names and orders processes and threads.
#[derive(Serialize)]
struct Meta<A: Serialize> {
    name: &'static str,
    ph: &'static str,
    pid: u32,
    tid: u32,
    args: A,
}

#[derive(Serialize)]
struct SpanArgs {
    process: u32,
}

/// A complete event ("X").
#[derive(Serialize)]
struct Complete<'a> {
    name: &'a str,
    cat: &'a str,
    ph: &'static str,
    ts: f64,
    dur: f64,
    pid: u32,
    tid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<SpanArgs>,
}

/// Human name of a lane: SMs, then the copy engines the device numbers after
/// them; anything beyond is shown by number rather than rejected.
pub fn lane_name(lane: u32, num_sms: u16) -> String {
    let sms = u32::from(num_sms);
    match lane {
        l if l < sms => format!("SM {l}"),
        l if l == sms => "copy H2D".to_string(),
        l if l == sms + 1 => "copy D2H".to_string(),
        l if l == sms + 2 => "copy D2D".to_string(),
        l => format!("lane {l}"),
    }
}

/// Trace viewers treat pid/tid 0 specially (idle/swapper), so ids start at 1.
fn pid_of(run_index: usize) -> u32 {
    u32::try_from(run_index).map_or(u32::MAX, |i| i.saturating_add(1))
}

fn tid_of(lane: u32) -> u32 {
    lane.saturating_add(1)
}

fn ns_to_us(ns: u64) -> f64 {
    ns as f64 / 1_000.0
}

/// Writes `runs` as a Chrome trace JSON file at `path`.
pub fn write_chrome_trace(path: &Path, runs: &[TraceRun]) -> Result<()> {
    let file = File::create(path).with_context(|| format!("creating trace file {}", path.display()))?;
    let mut out = BufWriter::new(file);
    write_events(&mut out, runs).with_context(|| format!("writing trace file {}", path.display()))?;
    // Flush explicitly: dropping a BufWriter swallows the final write error.
    out.flush().with_context(|| format!("writing trace file {}", path.display()))?;
    Ok(())
}

/// Writes events separated by commas; tracks whether one was written yet.
struct EventSink<'w, W: Write> {
    out: &'w mut W,
    first: bool,
}

impl<W: Write> EventSink<'_, W> {
    fn emit<T: Serialize>(&mut self, event: &T) -> Result<()> {
        if !self.first {
            self.out.write_all(b",\n")?;
        }
        self.first = false;
        serde_json::to_writer(&mut *self.out, event)?;
        Ok(())
    }
}

fn write_events<W: Write>(out: &mut W, runs: &[TraceRun]) -> Result<()> {
    out.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
    let mut sink = EventSink { out, first: true };
    for (index, (policy, num_sms, spans)) in runs.iter().enumerate() {
        let pid = pid_of(index);
        sink.emit(&Meta { name: "process_name", ph: "M", pid, tid: 0, args: NameArgs { name: policy } })?;
        // Keep policies in the order given rather than the viewer's pid order.
        sink.emit(&Meta {
            name: "process_sort_index",
            ph: "M",
            pid,
            tid: 0,
            args: SortArgs { sort_index: i64::try_from(index).unwrap_or(i64::MAX) },
        })?;
        // Every SM and both copy engines get a named row even when idle, so
        // the layout is the same across policies; stray lanes are added too.
        let mut lanes: BTreeSet<u32> = (0..u32::from(*num_sms) + 2).collect();
        lanes.extend(spans.iter().map(|s| s.lane));
        for &lane in &lanes {
            let tid = tid_of(lane);
            let name = lane_name(lane, *num_sms);
            sink.emit(&Meta { name: "thread_name", ph: "M", pid, tid, args: NameArgs { name: &name } })?;
            sink.emit(&Meta {
                name: "thread_sort_index",
                ph: "M",
                pid,
                tid,
                args: SortArgs { sort_index: i64::from(lane) },
            })?;
        }
        for span in spans {
            sink.emit(&Complete {
                name: &span.name,
                cat: &span.category,
                ph: "X",
                ts: ns_to_us(span.start_ns),
                dur: ns_to_us(span.end_ns.saturating_sub(span.start_ns)),
                pid,
                tid: tid_of(span.lane),
                args: span.process.map(|p| SpanArgs { process: p.0 }),
            })?;
        }
    }
    sink.out.write_all(b"\n]}\n")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumux_engine::ids::ProcessId;
    use serde_json::Value;
    use std::path::PathBuf;

    fn span(lane: u32, name: &str, cat: &str, start_ns: u64, end_ns: u64, process: Option<u32>) -> TraceSpan {
        TraceSpan {
            lane,
            name: name.to_string(),
            category: cat.to_string(),
            start_ns,
            end_ns,
            process: process.map(ProcessId),
        }
    }

    /// A path for a trace in a new temporary directory, and the directory:
    /// the test holds it, and dropping it removes both, pass or fail.
    fn temp_path(tag: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::Builder::new().prefix("gpumux-trace-").tempdir().expect("a temporary directory");
        let path = dir.path().join(format!("{tag}.json"));
        (dir, path)
    }

    fn sample() -> Vec<TraceRun> {
        vec![
            (
                "fifo".to_string(),
                2,
                vec![
                    span(0, "gemm", "kernel", 1_500, 4_250, Some(0)),
                    span(1, "gemm", "kernel", 1_500, 3_001, Some(1)),
                    span(2, "h2d", "copy", 0, 1_000, Some(0)),
                ],
            ),
            (
                "preempt".to_string(),
                2,
                vec![
                    span(0, "conv", "kernel", 0, 2_000, Some(1)),
                    span(0, "save", "preempt", 2_000, 2_300, None),
                    span(3, "d2h", "copy", 5_000, 6_000, Some(1)),
                ],
            ),
        ]
    }

    #[test]
    fn round_trips_through_json() {
        let (_dir, path) = temp_path("rt");
        write_chrome_trace(&path, &sample()).expect("write trace");
        let text = std::fs::read_to_string(&path).expect("read trace");
        let json: Value = serde_json::from_str(&text).expect("valid json");
        let events = json["traceEvents"].as_array().expect("traceEvents array");

        let of = |ph: &str, name: Option<&str>| -> Vec<&Value> {
            events
                .iter()
                .filter(|e| {
                    e["ph"] == ph
                        && match name {
                            None => true,
                            Some(n) => e["name"] == n,
                        }
                })
                .collect()
        };
        // 2 policies; 2 SMs + 2 copy engines = 4 lanes each.
        assert_eq!(of("M", Some("process_name")).len(), 2);
        assert_eq!(of("M", Some("process_sort_index")).len(), 2);
        assert_eq!(of("M", Some("thread_name")).len(), 8);
        assert_eq!(of("M", Some("thread_sort_index")).len(), 8);
        assert_eq!(of("X", None).len(), 6);

        let procs: Vec<&str> =
            of("M", Some("process_name")).iter().filter_map(|e| e["args"]["name"].as_str()).collect();
        assert_eq!(procs, ["fifo", "preempt"]);
        let threads: Vec<&str> = of("M", Some("thread_name"))
            .iter()
            .filter(|e| e["pid"] == 1)
            .filter_map(|e| e["args"]["name"].as_str())
            .collect();
        assert_eq!(threads, ["SM 0", "SM 1", "copy H2D", "copy D2H"]);

        let gemm = of("X", Some("gemm"));
        assert_eq!(gemm[0]["ts"].as_f64(), Some(1.5));
        assert_eq!(gemm[0]["dur"].as_f64(), Some(2.75));
        assert_eq!(gemm[1]["dur"].as_f64(), Some(1.501));
        assert_eq!(gemm[0]["cat"], "kernel");
        assert_eq!(gemm[1]["args"]["process"], 1);
        let save = &of("X", Some("save"))[0];
        assert_eq!(save["cat"], "preempt");
        assert_eq!(save["pid"], 2);
        assert!(save.get("args").is_none());
        let h2d = &of("X", Some("h2d"))[0];
        let h2d_row = of("M", Some("thread_name"))
            .into_iter()
            .find(|e| e["pid"] == h2d["pid"] && e["tid"] == h2d["tid"])
            .expect("h2d lane is named");
        assert_eq!(h2d_row["args"]["name"], "copy H2D");

        // Deterministic: a second write is byte-identical.
        let (_dir2, path2) = temp_path("rt2");
        write_chrome_trace(&path2, &sample()).expect("write trace again");
        assert_eq!(std::fs::read(&path2).expect("read"), text.as_bytes());
    }

    #[test]
    fn empty_input_is_valid_json() {
        let (_dir, path) = temp_path("empty");
        write_chrome_trace(&path, &[]).expect("write trace");
        let json: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
        assert_eq!(json["traceEvents"].as_array().map(Vec::len), Some(0));
    }

    #[test]
    fn error_names_the_path() {
        let path = std::env::temp_dir().join("gpumux-no-such-dir-for-trace").join("x.json");
        let err = write_chrome_trace(&path, &sample()).expect_err("missing directory");
        assert!(format!("{err:#}").contains("gpumux-no-such-dir-for-trace"), "{err:#}");
    }
}
