//! Every kind of malformed input gets a message naming the file, the field
//! and the reason.

use gpumux_engine::model::Op;
use gpumux_workload::{load_file, parse_str, resolve, WorkloadError};

const KERNEL: &str = r#"
[[process]]
name = "lbm"
[[process.op]]
kind = "kernel"
name = "StreamCollide"
grid = 18000
block = 120
regs_per_thread = 36
block_time_us = 31.2
"#;

fn err(text: &str) -> String {
    match parse_str(text, "workload.toml") {
        Ok(w) => panic!("expected an error, got {w:?}"),
        Err(e) => e.to_string(),
    }
}

/// Replaces `from` (which must occur) in the valid kernel workload.
fn edit(from: &str, to: &str) -> String {
    assert!(KERNEL.contains(from), "{from}");
    KERNEL.replacen(from, to, 1)
}

fn assert_has(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} lacks {p:?}");
    }
}

#[test]
fn valid_base_parses() {
    let w = parse_str(KERNEL, "workload.toml").unwrap();
    assert_eq!(w.name, "workload");
    assert_eq!(w.processes.len(), 1);
    let Op::Kernel(k) = &w.processes[0].ops[0] else { panic!() };
    assert_eq!((k.shape.blocks, k.shape.threads_per_block), (18000, 120));
    assert_eq!(k.sim_timing.map(|t| t.block_time_ns), Some(31_200));
    assert!(k.idempotent);
}

#[test]
fn syntax_error_has_line_and_column() {
    let m = err("[[process]]\nname = \"a\"\nweight = = 2\n");
    assert!(m.starts_with("workload.toml:3:"), "{m}");
}

#[test]
fn unknown_field_is_an_error() {
    let m = err(&edit("block = 120", "blok = 120"));
    assert_has(&m, &["workload.toml:", "unknown field", "blok"]);
    let m = err("nme = \"x\"\n[[process]]\nname=\"a\"\n");
    assert_has(&m, &["workload.toml:1:1", "nme"]);
}

#[test]
fn wrong_type() {
    let m = err(&edit("regs_per_thread = 36", "regs_per_thread = \"36\""));
    assert_has(&m, &["workload.toml:", "invalid type"]);
}

#[test]
fn missing_process_name() {
    let m = err(&edit("name = \"lbm\"\n", ""));
    assert_has(&m, &["workload.toml: process 1: name is required"]);
}

#[test]
fn empty_name() {
    let m = err(&edit("name = \"lbm\"", "name = \"  \""));
    assert_has(&m, &["process 1: name must not be empty"]);
}

#[test]
fn duplicate_process_name() {
    let text = format!("{KERNEL}{}", KERNEL.replace("StreamCollide", "X"));
    let m = err(&text);
    assert_has(&m, &["process 2 (\"lbm\")", "name must be unique"]);
}

#[test]
fn negative_block_time() {
    let m = err(&edit("block_time_us = 31.2", "block_time_us = -2"));
    assert_eq!(m, "workload.toml: process \"lbm\" op 1 (kernel \"StreamCollide\"): block_time_us must be > 0, got -2");
}

#[test]
fn block_time_below_resolution() {
    let m = err(&edit("block_time_us = 31.2", "block_time_us = 0.0001"));
    assert_has(&m, &["block_time_us must be at least 0.001"]);
}

#[test]
fn nan_and_inf_rejected() {
    let m = err(&edit("block_time_us = 31.2", "block_time_us = nan"));
    assert_has(&m, &["block_time_us must be a finite number"]);
    let m = err(&edit("name = \"lbm\"", "name = \"lbm\"\nweight = inf"));
    assert_has(&m, &["process \"lbm\": weight must be a finite number"]);
}

#[test]
fn zero_grid() {
    let m = err(&edit("grid = 18000", "grid = 0"));
    assert_has(&m, &["op 1 (kernel \"StreamCollide\"): grid dimensions must be > 0, got 0"]);
    let m = err(&edit("grid = 18000", "grid = [10, 0, 2]"));
    assert_has(&m, &["grid dimensions must be > 0"]);
}

#[test]
fn grid_shape() {
    let m = err(&edit("grid = 18000", "grid = [1, 2, 3, 4]"));
    assert_has(&m, &["grid must be an integer or an array of 1 to 3 integers"]);
    let m = err(&edit("grid = 18000", "grid = 1.5"));
    assert_has(&m, &["grid must be an integer or an array"]);
}

#[test]
fn absurd_grid() {
    let m = err(&edit("grid = 18000", "grid = [1048576, 1048576, 2]"));
    assert_has(&m, &["grid product must be <= 1099511627776"]);
    let m = err(&edit("grid = 18000", "grid = [9223372036854775807, 9223372036854775807]"));
    assert_has(&m, &["grid product must be <="]);
}

#[test]
fn block_too_big() {
    let m = err(&edit("block = 120", "block = [32, 64]"));
    assert_has(&m, &["block product must be <= 1024, got [32, 64]"]);
}

#[test]
fn spread_out_of_range() {
    let m = err(&edit("block_time_us = 31.2", "block_time_us = 31.2\nblock_time_spread = 1.5"));
    assert_has(&m, &["block_time_spread must be < 1, got 1.5"]);
    let m = err(&edit("block_time_us = 31.2", "block_time_us = 31.2\nmem_intensity = -0.1"));
    assert_has(&m, &["mem_intensity must be >= 0, got -0.1"]);
}

#[test]
fn regs_out_of_range() {
    let m = err(&edit("regs_per_thread = 36", "regs_per_thread = 300"));
    assert_has(&m, &["regs_per_thread must be <= 255, got 300"]);
}

#[test]
fn missing_kernel_field() {
    let m = err(&edit("regs_per_thread = 36\n", ""));
    assert_has(&m, &["(kernel \"StreamCollide\"): regs_per_thread is required"]);
}

#[test]
fn unknown_kernel_reference() {
    let text = "[kernels.a]\ngrid=1\nblock=1\nregs_per_thread=1\nblock_time_us=1\n\
                [[process]]\nname=\"p\"\n[[process.op]]\nkind=\"kernel\"\nkernel=\"b\"\n";
    let m = err(text);
    assert_has(&m, &["kernel refers to an unknown kernel template \"b\"", "known: a"]);
}

#[test]
fn template_errors_name_the_template() {
    let text = "[kernels.a]\ngrid=1\nblock=1\nregs_per_thread=1\nblock_time_us=-1\n\
                [[process]]\nname=\"p\"\n[[process.op]]\nkind=\"cpu\"\nus=1\n";
    let m = err(text);
    assert_has(&m, &["workload.toml: kernels.a: block_time_us must be > 0, got -1"]);
}

#[test]
fn template_and_override() {
    let text = "[kernels.a]\ngrid=10\nblock=32\nregs_per_thread=8\nblock_time_us=5\nlaunches=3\n\
                [[process]]\nname=\"p\"\n[[process.op]]\nkind=\"kernel\"\nkernel=\"a\"\ngrid=20\n";
    let w = parse_str(text, "t.toml").unwrap();
    assert_eq!(w.name, "t");
    assert_eq!(w.processes[0].ops.len(), 3);
    let Op::Kernel(k) = &w.processes[0].ops[0] else { panic!() };
    assert_eq!((k.name.as_str(), k.shape.blocks, k.shape.threads_per_block), ("a", 20, 32));
}

#[test]
fn loop_too_big() {
    let text = r#"
[[process]]
name = "p"
[[process.op]]
kind = "loop"
times = 100000
op = [ { kind = "loop", times = 100000, op = [ { kind = "cpu", us = 1 } ] } ]
"#;
    let m = err(text);
    assert_has(&m, &["process \"p\": op expands to 10000000000 operations", "10000000"]);
}

#[test]
fn launches_overflow_saturates() {
    let text = r#"
[[process]]
name = "p"
[[process.op]]
kind = "loop"
times = 10000000
op = [ { kind = "loop", times = 10000000, op = [ { kind = "loop", times = 10000000, op = [ { kind = "cpu", us = 1 } ] } ] } ]
"#;
    let m = err(text);
    assert_has(&m, &["op expands to"]);
}

#[test]
fn budget_is_per_workload() {
    let p = |n: &str| {
        format!("[[process]]\nname=\"{n}\"\n[[process.op]]\nkind=\"loop\"\ntimes=6000000\nop=[{{kind=\"cpu\",us=1}}]\n")
    };
    let m = err(&format!("{}{}", p("a"), p("b")));
    assert_has(&m, &["process \"b\"", "in all"]);
}

#[test]
fn loop_errors() {
    let base = "[[process]]\nname=\"p\"\n[[process.op]]\nkind=\"loop\"\n";
    assert_has(&err(&format!("{base}op=[{{kind=\"cpu\",us=1}}]\n")), &["op 1 (loop): times is required"]);
    assert_has(&err(&format!("{base}times=0\nop=[{{kind=\"cpu\",us=1}}]\n")), &["times must be >= 1, got 0"]);
    assert_has(&err(&format!("{base}times=2\nop=[]\n")), &["op must hold at least one op"]);
    let m = err(&format!("{base}times=2\nop=[{{kind=\"cpu\",us=-1}}]\n"));
    assert_has(&m, &["process \"p\" op 1 (loop) op 1 (cpu): us must be >= 0, got -1"]);
}

#[test]
fn loop_depth_limited() {
    let mut inner = "{kind=\"cpu\",us=1}".to_string();
    for _ in 0..20 {
        inner = format!("{{kind=\"loop\",times=1,op=[{inner}]}}");
    }
    let text = format!("[[process]]\nname=\"p\"\n[[process.op]]\nkind=\"loop\"\ntimes=1\nop=[{inner}]\n");
    // Either our depth limit or the TOML parser's nesting limit: an error, not a crash.
    assert!(parse_str(&text, "deep.toml").is_err());
}

#[test]
fn unknown_kind() {
    let m = err(&edit("kind = \"kernel\"", "kind = \"kernal\""));
    assert_has(
        &m,
        &["op 1: kind must be one of h2d, d2h, cpu, sync, record, wait_event, kernel, loop, got \"kernal\""],
    );
    let m = err(&edit("kind = \"kernel\"\n", ""));
    assert_has(&m, &["op 1: kind is required"]);
}

#[test]
fn field_of_another_kind() {
    let m = err(&edit("block_time_us = 31.2", "block_time_us = 31.2\nus = 5"));
    assert_has(&m, &["us does not apply to kind = \"kernel\""]);
}

#[test]
fn copy_size_errors() {
    let base = "[[process]]\nname=\"p\"\n[[process.op]]\nkind=\"h2d\"\n";
    assert_has(&err(base), &["op 1 (h2d): bytes is required: give exactly one of bytes, kb (KiB) or mb (MiB)"]);
    assert_has(&err(&format!("{base}bytes=1\nkb=1\n")), &["bytes must be given once"]);
    assert_has(&err(&format!("{base}bytes=0\n")), &["bytes must be >= 1, got 0"]);
    assert_has(&err(&format!("{base}mb=-1\n")), &["mb must be > 0, got -1"]);
    let w = parse_str(&format!("{base}mb=1.5\n"), "x").unwrap();
    assert_eq!(w.processes[0].ops[0], Op::CopyToDevice { bytes: 1_572_864 });
}

#[test]
fn process_field_ranges() {
    let m = err(&edit("name = \"lbm\"", "name = \"lbm\"\nweight = 0"));
    assert_has(&m, &["process \"lbm\": weight must be > 0, got 0"]);
    let m = err(&edit("name = \"lbm\"", "name = \"lbm\"\nrepetitions = 0"));
    assert_has(&m, &["repetitions must be >= 1, got 0"]);
    let m = err(&edit("name = \"lbm\"", "name = \"lbm\"\narrival_us = -5"));
    assert_has(&m, &["arrival_us must be >= 0, got -5"]);
    let m = err(&edit("name = \"lbm\"", "name = \"lbm\"\npriority = 9999999999"));
    assert_has(&m, &["priority must be <= 2147483647"]);
    let m = err(&edit("name = \"lbm\"", "name = \"lbm\"\nasync_depth = -1"));
    assert_has(&m, &["async_depth must be >= 0, got -1"]);
}

#[test]
fn replay_min_runs_at_least_one() {
    let m = err(&format!("replay_min_runs = 0\n{KERNEL}"));
    assert_eq!(m, "workload.toml: replay_min_runs must be >= 1, got 0");
}

#[test]
fn no_process_or_no_op() {
    assert_has(&err("name = \"x\"\n"), &["workload.toml: process is required"]);
    assert_has(&err("[[process]]\nname = \"a\"\n"), &["process \"a\": op is required"]);
}

#[test]
fn suite_errors() {
    let m = err(&edit("block_time_us = 31.2", "block_time_us = 31.2\nsuite = { params = { n = 1 } }"));
    assert_has(&m, &["suite.name is required"]);
    let m = err(&edit("block_time_us = 31.2", "block_time_us = 31.2\nsuite = { name = \"t\", params = { n = nan } }"));
    assert_has(&m, &["suite.params.n must be a finite number"]);
    let m = err(&edit("block_time_us = 31.2", "block_time_us = 31.2\nsuite = { name = \"t\", parms = {} }"));
    assert_has(&m, &["unknown field", "parms"]);
}

#[test]
fn bad_builtin_specs() {
    let cases = [
        ("parboil-k20c:app=foo", "unknown application `foo`"),
        ("parboil-k20c:mix=0,seed=1", "mix must be an integer in 1..=16, got `0`"),
        ("parboil-k20c:mix=17,seed=1", "mix must be an integer in 1..=16"),
        ("parboil-k20c:mix=4,seed=-3", "seed must be an unsigned 64-bit integer, got `-3`"),
        ("parboil-k20c:mix=4", "mix=N needs seed=S"),
        ("parboil-k20c:mix=4,seed=1,hp=4", "hp=4 is out of range: the workload has 4 processes"),
        ("parboil-k20c:mix=4,seed=1,mix=2", "option `mix` is given twice"),
        ("parboil-k20c:app=lbm,mix=2,seed=1", "app and mix exclude each other"),
        ("parboil-k20c:frob=1", "unknown option `frob`"),
        ("parboil-k20c:tb=fast", "tb must be `fit` or `table`"),
        ("parboil-k20c:mix", "option `mix` is not KEY=VALUE"),
    ];
    for (spec, want) in cases {
        let m = resolve(spec).map(|_| ()).unwrap_err().to_string();
        assert!(m.contains(want), "{spec}: {m:?} lacks {want:?}");
        assert!(m.contains(spec), "{spec}: {m:?} does not name the spec");
    }
}

#[test]
fn unreadable_paths() {
    let m = resolve("/nonexistent/dir/w.toml").unwrap_err().to_string();
    assert_has(&m, &["/nonexistent/dir/w.toml", "no such file"]);
    let m = resolve("parboil-k21").unwrap_err().to_string();
    assert_has(&m, &["parboil-k21", "not a built-in"]);
    let m = load_file(std::path::Path::new("/nonexistent/w.toml")).unwrap_err();
    assert!(matches!(m, WorkloadError::Io { .. }));
    let dir = tempfile::Builder::new().prefix("gpumux-wl-test-").tempdir().expect("a temporary directory");
    let m = load_file(dir.path()).unwrap_err().to_string();
    assert_has(&m, &["is a directory"]);
    let bin = dir.path().join("w.toml");
    std::fs::write(&bin, [b'a', 0xff, 0xfe]).unwrap();
    let m = load_file(&bin).unwrap_err().to_string();
    assert_has(&m, &["is not UTF-8"]);
}

#[test]
fn load_file_names_the_file() {
    let dir = tempfile::Builder::new().prefix("gpumux-wl-bad-").tempdir().expect("a temporary directory");
    let path = dir.path().join("w.toml");
    std::fs::write(&path, edit("grid = 18000", "grid = 0")).unwrap();
    let m = load_file(&path).unwrap_err().to_string();
    let ok = resolve(path.to_str().unwrap()).unwrap_err().to_string();
    assert!(m.starts_with(&path.display().to_string()), "{m}");
    assert_eq!(m, ok);
}

// Issue 11: the checks shared with the task-set parser (gpumux-files).

#[test]
fn bidi_overrides_and_overlong_names_are_refused() {
    let m = err(&edit("name = \"lbm\"", "name = \"lbm\\u202Etxt\""));
    assert_has(&m, &["name", "bidirectional", "U+202E"]);
    assert!(!m.contains('\u{202E}'), "the raw override must not be printed: {m:?}");
    let m = err(&edit("name = \"lbm\"", &format!("name = \"{}\"", "p".repeat(5000))));
    assert_has(&m, &["at most 256 characters", "(5000 characters)"]);
    assert!(m.len() < 400, "{} bytes", m.len());
}

#[test]
fn a_syntax_error_on_a_long_line_does_not_echo_the_line() {
    let m = err(&format!("[[process]]\nname = \"{}\" =\n", "a".repeat(100_000)));
    assert!(m.starts_with("workload.toml:2:"), "{}", &m[..m.len().min(200)]);
    assert!(m.len() < 400, "{} bytes", m.len());
}

#[test]
fn huge_numbers_are_printed_briefly() {
    let m = err(&edit("block_time_us = 31.2", "block_time_us = 1e300"));
    assert_has(&m, &["block_time_us", "got 1e300"]);
    assert!(m.len() < 300, "{m}");
}

#[test]
fn events_need_a_name_and_a_recording() {
    let two = |first: &str, second: &str| {
        format!(
            "[[process]]\nname = \"a\"\n[[process.op]]\n{first}\n[[process]]\nname = \"b\"\n[[process.op]]\n{second}\n"
        )
    };
    let ok = parse_str(&two("kind = \"record\"\nevent = \"e\"", "kind = \"wait_event\"\nevent = \"e\""), "w.toml")
        .expect("a wait for a recorded event");
    assert_eq!(ok.processes[1].ops, vec![Op::WaitEvent { event: "e".into() }]);
    let msg = err(&two("kind = \"record\"\nevent = \"e\"", "kind = \"wait_event\"\nevent = \"f\""));
    assert_has(&msg, &["process 2 (\"b\")", "event \"f\"", "no process records"]);
    let msg = err(&two("kind = \"record\"", "kind = \"sync\""));
    assert_has(&msg, &["event", "the event's name"]);
    let msg = err(&two("kind = \"record\"\nevent = \"\"", "kind = \"sync\""));
    assert_has(&msg, &["event", "1 to 256 bytes"]);
    let msg = err(&two("kind = \"h2d\"\nbytes = 4\nevent = \"e\"", "kind = \"sync\""));
    assert_has(&msg, &["event", "does not apply"]);
}
