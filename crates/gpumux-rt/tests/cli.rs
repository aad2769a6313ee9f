//! The `RtCommand` subcommand parses with clap and `run_to` produces the documented output.

use clap::Parser;
use gpumux_rt::cli::{run_to, RtCommand};

#[derive(Parser, Debug)]
struct Wrapper {
    #[command(subcommand)]
    cmd: RtCommand,
}

fn example(name: &str) -> String {
    format!("{}/../../examples/rt/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn parses_analyze_with_json() {
    let w = Wrapper::try_parse_from(["x", "analyze", "file.toml", "--json"]).expect("parses");
    match w.cmd {
        RtCommand::Analyze { file, json, method, .. } => {
            assert_eq!(file.to_str(), Some("file.toml"));
            assert!(json);
            assert!(method.is_none());
        }
        other => panic!("wrong command {other:?}"),
    }
}

#[test]
fn parses_assign_and_experiment() {
    let w = Wrapper::try_parse_from(["x", "assign", "f.toml", "--method", "gema-ls"]).expect("parses");
    assert!(matches!(w.cmd, RtCommand::Assign { method: gpumux_rt::Method::GemaLs, .. }));
    let w = Wrapper::try_parse_from(["x", "experiment", "fig8", "--sets", "10", "--seed", "3"]).expect("parses");
    assert!(matches!(w.cmd, RtCommand::Experiment { sets: Some(10), seed: 3, .. }));
    assert!(Wrapper::try_parse_from(["x", "assign", "f.toml", "--method", "bogus"]).is_err());
    assert!(Wrapper::try_parse_from(["x", "experiment", "fig9"]).is_err());
}

#[test]
fn analyze_table4_single_gpu_matches_the_paper_observation() {
    // Paper V-A(i): under Single-GPU, P1 and P2 meet their deadlines, P3 misses.
    let w = Wrapper::try_parse_from(["x", "analyze", &example("table4-chunked.toml"), "--json"]).expect("parses");
    let mut out = String::new();
    run_to(w.cmd, &mut out).expect("runs");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let tasks = v["analysis"]["tasks"].as_array().expect("tasks");
    let status: Vec<&str> = tasks.iter().map(|t| t["status"].as_str().unwrap_or("")).collect();
    assert_eq!(status, vec!["meets", "meets", "misses"]);
    assert_eq!(v["analysis"]["schedulable"], false);
}

#[test]
fn assign_all_prints_every_method() {
    let w = Wrapper::try_parse_from(["x", "assign", &example("table4.toml"), "--all"]).expect("parses");
    let mut out = String::new();
    run_to(w.cmd, &mut out).expect("runs");
    for m in ["single", "local", "gema", "gema-ls", "global"] {
        assert!(out.contains(&format!("method {m}:")), "{m} missing in\n{out}");
    }
    assert!(out.contains("verdict:"));
}

#[test]
fn bad_file_is_an_error_not_a_panic() {
    let dir = tempfile::Builder::new().prefix("gpumux-rt-cli-").tempdir().expect("a temporary directory");
    let f = dir.path().join("bad.toml");
    std::fs::write(&f, "[[task]]\nperiod = 10\nsubtasks = [{ resource = \"tpu\", single = 1 }]\n").expect("write");
    let w = Wrapper::try_parse_from(["x", "analyze", f.to_str().expect("utf8")]).expect("parses");
    let e = run_to(w.cmd, &mut String::new()).unwrap_err().to_string();
    assert!(e.contains("bad.toml") && e.contains("task[0].subtasks[0].resource") && e.contains("tpu"), "{e}");
}

#[test]
fn quick_experiments_write_svg_and_json() {
    let dir = tempfile::Builder::new().prefix("gpumux-rt-exp-").tempdir().expect("a temporary directory");
    for fig in ["fig7", "fig8"] {
        let out_dir = dir.path().join(fig);
        let w = Wrapper::try_parse_from([
            "x",
            "experiment",
            fig,
            "--sets",
            "40",
            "--seed",
            "5",
            "--quiet",
            "--jobs",
            "2",
            "--out",
            out_dir.to_str().expect("utf8"),
        ])
        .expect("parses");
        let mut out = String::new();
        run_to(w.cmd, &mut out).expect("runs");
        assert!(out.contains("must be 0"), "{out}");
        assert!(out.contains("(must be 0)") && out.contains(": 0 (must be 0)"), "violations: {out}");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out_dir.join(format!("{fig}.json"))).expect("json written"))
                .expect("valid json");
        assert_eq!(json["violations"], 0);
        let svg = std::fs::read_to_string(out_dir.join(format!("{fig}.svg"))).expect("svg written");
        assert!(svg.starts_with("<svg") || svg.contains("<svg"));
    }
}

#[test]
fn experiment_results_do_not_depend_on_thread_count() {
    let dir = tempfile::Builder::new().prefix("gpumux-rt-det-").tempdir().expect("a temporary directory");
    let mut bins = Vec::new();
    for jobs in ["1", "2"] {
        let out_dir = dir.path().join(jobs);
        let w = Wrapper::try_parse_from([
            "x",
            "experiment",
            "fig7",
            "--sets",
            "300",
            "--quiet",
            "--jobs",
            jobs,
            "--chunk",
            "5",
            "--out",
            out_dir.to_str().expect("utf8"),
        ])
        .expect("parses");
        run_to(w.cmd, &mut String::new()).expect("runs");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out_dir.join("fig7.json")).expect("json")).expect("json");
        bins.push(v["bins"].clone());
    }
    assert_eq!(bins[0], bins[1]);
}

#[test]
fn generate_writes_a_parsable_set() {
    let w = Wrapper::try_parse_from(["x", "generate", "--tasks", "4", "--ug", "1.5", "--seed", "9"]).expect("parses");
    let mut out = String::new();
    run_to(w.cmd, &mut out).expect("runs");
    let s = gpumux_rt::TaskSet::from_toml_str(&out, "generated.toml").expect("parses back");
    assert_eq!(s.len(), 4);
    assert!((s.gpu_utilisation() - 1.5).abs() < 1e-6);
}

#[test]
fn bench_and_generate_refuse_empty_and_huge_sets() {
    for args in [
        &["x", "bench", "--sizes", "0", "--sets", "3"][..],
        &["x", "bench", "--sizes", "5,100000", "--sets", "3"][..],
        &["x", "generate", "--tasks", "100000"][..],
    ] {
        let w = Wrapper::try_parse_from(args).expect("parses");
        let mut out = String::new();
        let e = run_to(w.cmd, &mut out).expect_err("a 0-task or oversized set must be refused");
        assert!(e.to_string().contains("1 to 1000"), "{args:?}: {e}");
        assert!(out.is_empty(), "{args:?} printed {out}");
    }
}

#[test]
fn analyze_says_the_unit_and_what_a_verdict_means() {
    let w = Wrapper::try_parse_from(["x", "analyze", &example("table4.toml")]).expect("parses");
    let mut out = String::new();
    run_to(w.cmd, &mut out).expect("analyze");
    for want in ["file's unit", "R: upper bound", "D: deadline", "slack = D - R", "sufficient, not exact", "docs/rt.md"]
    {
        assert!(out.contains(want), "`{want}` missing from:\n{out}");
    }
}

#[test]
fn analyze_shows_each_verdict_kind_in_the_table_and_the_json() {
    // "slow" converges at 6000 (15 deadlines; before issue 42 it was called unbounded), "hog"
    // diverges (the GPU above it is 111.5 % busy), "below" is under it; two iterations leave
    // "slow" with its closed-form bound.
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("kinds.toml");
    std::fs::write(
        &file,
        r#"
[platform]
gpus = 1
[[task]]
name = "busy"
period = 100
subtasks = [{ resource = "gpu", single = 99, multi = 99 }]
[[task]]
name = "slow"
period = 400
subtasks = [{ resource = "gpu", single = 50, multi = 50 }]
[[task]]
name = "hog"
period = 500
subtasks = [{ resource = "cpu", single = 1, multi = 1 }, { resource = "gpu", single = 10, multi = 10 }]
[[task]]
name = "below"
period = 1000
subtasks = [{ resource = "cpu", single = 7, multi = 7 }]
"#,
    )
    .expect("write");
    let f = file.to_str().expect("utf-8");
    let run = |args: &[&str]| {
        let mut argv = vec!["x", "analyze", f];
        argv.extend_from_slice(args);
        let w = Wrapper::try_parse_from(argv).expect("parses");
        let mut out = String::new();
        run_to(w.cmd, &mut out).expect("runs");
        out
    };
    let table = run(&[]);
    let line = |name: &str| table.lines().find(|l| l.contains(name)).unwrap_or_default().to_string();
    assert!(line("busy").contains("MISSES"), "{table}");
    assert!(line("slow").contains("6000.00") && line("slow").contains("MISSES"), "{table}");
    assert!(line("hog").contains("DIVERGES") && line("hog").contains("1.1150 >= 1"), "{table}");
    assert!(line("below").contains("NOT ANALYSED"), "{table}");
    assert!(table.contains("NOT CONVERGED:"), "the legend explains every kind:\n{table}");
    let few = run(&["--max-iterations", "3"]);
    assert!(few.lines().any(|l| l.contains("slow") && l.contains("NOT CONVERGED")), "{few}");
    let json: serde_json::Value = serde_json::from_str(&run(&["--json"])).expect("JSON");
    let status: Vec<&str> = json["analysis"]["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| t["status"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(status, ["misses", "misses", "diverges", "not_analysed"]);
    assert!(Wrapper::try_parse_from(["x", "analyze", f, "--max-iterations", "0"]).is_err());
}
