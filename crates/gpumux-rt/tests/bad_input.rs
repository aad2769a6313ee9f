//! Every kind of bad task-set file gets an error naming the file, the field and the reason.

use gpumux_rt::{ModelError, TaskSet};

const OK_TASK: &str = r#"
[[task]]
period = 100
subtasks = [{ resource = "gpu", single = 10, multi = 5 }]
"#;

fn err(text: &str) -> ModelError {
    match TaskSet::from_toml_str(text, "bad.toml") {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e,
    }
}

fn assert_field(text: &str, field: &str, reason_part: &str) {
    let e = err(text);
    let msg = e.to_string();
    assert!(msg.starts_with("bad.toml: "), "no file name in `{msg}`");
    assert_eq!(e.field(), Some(field), "wrong field in `{msg}`");
    assert!(msg.contains(reason_part), "reason `{reason_part}` not in `{msg}`");
}

#[test]
fn valid_file_parses() {
    let s = TaskSet::from_toml_str(OK_TASK, "ok.toml").expect("valid");
    assert_eq!(s.len(), 1);
}

#[test]
fn malformed_toml() {
    let e = err("[[task]\nperiod = 1");
    assert!(matches!(e, ModelError::Syntax { .. }));
    assert!(e.to_string().starts_with("bad.toml: malformed TOML"));
}

#[test]
fn missing_file() {
    let e = TaskSet::from_file(std::path::Path::new("/nonexistent/dir/set.toml")).unwrap_err();
    assert!(matches!(e, ModelError::Io { .. }));
    assert!(e.to_string().contains("/nonexistent/dir/set.toml"));
}

#[test]
fn no_tasks() {
    assert_field("[platform]\ngpus = 2\n", "task", "missing");
}

#[test]
fn missing_period() {
    assert_field("[[task]]\nsubtasks = [{ resource = \"gpu\", single = 1, multi = 1 }]\n", "task[0].period", "missing");
}

#[test]
fn missing_subtasks() {
    assert_field("[[task]]\nperiod = 10\n", "task[0].subtasks", "missing");
}

#[test]
fn empty_subtasks() {
    assert_field("[[task]]\nperiod = 10\nsubtasks = []\n", "task[0].subtasks", "at least one");
}

#[test]
fn missing_single_time() {
    assert_field(
        "[[task]]\nperiod = 10\nsubtasks = [{ resource = \"gpu\", multi = 1 }]\n",
        "task[0].subtasks[0].single",
        "missing",
    );
}

#[test]
fn missing_resource() {
    assert_field(
        "[[task]]\nperiod = 10\nsubtasks = [{ single = 1, multi = 1 }]\n",
        "task[0].subtasks[0].resource",
        "missing",
    );
}

#[test]
fn negative_time() {
    assert_field(
        &format!("{OK_TASK}[[task]]\nperiod = 10\nsubtasks = [{{ resource = \"cpu\", single = -1, multi = 1 }}]\n"),
        "task[1].subtasks[0].single",
        "negative",
    );
    assert_field(
        "[[task]]\nperiod = -5\nsubtasks = [{ resource = \"cpu\", single = 1, multi = 1 }]\n",
        "task[0].period",
        "negative",
    );
}

#[test]
fn zero_period() {
    assert_field(
        "[[task]]\nperiod = 0\nsubtasks = [{ resource = \"cpu\", single = 1, multi = 1 }]\n",
        "task[0].period",
        "greater than zero",
    );
}

#[test]
fn non_finite_time() {
    assert_field(
        "[[task]]\nperiod = nan\nsubtasks = [{ resource = \"cpu\", single = 1, multi = 1 }]\n",
        "task[0].period",
        "finite",
    );
}

#[test]
fn zero_units() {
    assert_field(&format!("[platform]\ngpus = 0\n{OK_TASK}"), "platform.gpus", ">= 1");
    assert_field(&format!("[platform]\npci = 0\n{OK_TASK}"), "platform.pci", ">= 1");
    assert_field(&format!("[platform]\ncpus = -2\n{OK_TASK}"), "platform.cpus", ">= 1");
}

#[test]
fn fractional_units() {
    assert_field(&format!("[platform]\ngpus = 1.5\n{OK_TASK}"), "platform.gpus", "integer");
}

#[test]
fn deadline_after_period() {
    assert_field(
        "[[task]]\nperiod = 10\ndeadline = 20\nsubtasks = [{ resource = \"cpu\", single = 1, multi = 1 }]\n",
        "task[0].deadline",
        "exceeds period",
    );
}

#[test]
fn unknown_resource() {
    assert_field(
        "[[task]]\nperiod = 10\nsubtasks = [{ resource = \"tpu\", single = 1, multi = 1 }]\n",
        "task[0].subtasks[0].resource",
        "unknown resource `tpu`",
    );
}

#[test]
fn unknown_field() {
    assert_field(
        "[[task]]\nperiod = 10\nperoid = 3\nsubtasks = [{ resource = \"cpu\", single = 1, multi = 1 }]\n",
        "task[0].peroid",
        "unknown field",
    );
    assert_field(&format!("gpu = 3\n{OK_TASK}"), "gpu", "unknown field");
}

#[test]
fn wrong_types() {
    assert_field(
        "[[task]]\nperiod = \"ten\"\nsubtasks = [{ resource = \"cpu\", single = 1, multi = 1 }]\n",
        "task[0].period",
        "expected a number",
    );
    assert_field(
        "[[task]]\nperiod = 10\ndata_dependency = 1\nsubtasks = [{ resource = \"cpu\", single = 1, multi = 1 }]\n",
        "task[0].data_dependency",
        "true or false",
    );
    assert_field("task = 3\n", "task", "array of tables");
}

#[test]
fn unknown_mode() {
    assert_field(
        "[[task]]\nperiod = 10\nmode = \"dual\"\nsubtasks = [{ resource = \"cpu\", single = 1, multi = 1 }]\n",
        "task[0].mode",
        "unknown mode",
    );
}

#[test]
fn multi_mode_on_one_gpu() {
    assert_field(
        "[platform]\ngpus = 1\n[[task]]\nperiod = 10\nmode = \"multi\"\nsubtasks = [{ resource = \"gpu\", single = 1, multi = 1 }]\n",
        "task[0].mode",
        "gpus >= 2",
    );
}

#[test]
fn multi_on_some_subtasks_only() {
    assert_field(
        "[[task]]\nperiod = 10\nsubtasks = [{ resource = \"gpu\", single = 1, multi = 1 }, { resource = \"pci\", single = 1 }]\n",
        "task[0].subtasks[1].multi",
        "every subtask",
    );
}

#[test]
fn priority_on_some_tasks_only_or_duplicated() {
    let t =
        |p: &str| format!("[[task]]\nperiod = 10\n{p}\nsubtasks = [{{ resource = \"cpu\", single = 1, multi = 1 }}]\n");
    assert_field(&(t("priority = 1") + &t("")), "task[1].priority", "every task");
    assert_field(&(t("priority = 1") + &t("priority = 1")), "task[1].priority", "duplicate");
}

#[test]
fn duplicate_names() {
    let t = "[[task]]\nname = \"x\"\nperiod = 10\nsubtasks = [{ resource = \"cpu\", single = 1, multi = 1 }]\n";
    assert_field(&format!("{t}{t}"), "task[1].name", "duplicate");
}

#[test]
fn zero_chunk() {
    assert_field(
        "[[task]]\nperiod = 10\nsubtasks = [{ resource = \"gpu\", single = 1, multi = 1, chunk = 0 }]\n",
        "task[0].subtasks[0].chunk",
        "greater than zero",
    );
}

#[test]
fn omitted_multi_is_derived_from_the_cost_model() {
    let s = TaskSet::from_toml_str(
        "[[task]]\nperiod = 100\nsubtasks = [{ resource = \"cpu\", single = 1 }, { resource = \"pci\", single = 2 }, { resource = \"gpu\", single = 10 }, { resource = \"pci\", single = 3 }, { resource = \"cpu\", single = 1 }]\n",
        "ok.toml",
    )
    .expect("valid");
    let m: Vec<f64> = s.tasks[0].subtasks.iter().map(|s| s.multi).collect();
    // upload ×2, kernel ×½, download ×2, merge (= download time) on the last CPU stage.
    assert_eq!(m, vec![1.0, 4.0, 5.0, 6.0, 4.0]);
}

// Issue 11: the task-set parser gets the workload parser's checks.

fn named(name: &str) -> String {
    format!("[[task]]\nname = {name}\nperiod = 100\nsubtasks = [{{ resource = \"gpu\", single = 10 }}]\n")
}

#[test]
fn names_are_checked_like_workload_names() {
    assert_field(&named("\"\""), "task[0].name", "must not be empty");
    assert_field(&named("\"  \""), "task[0].name", "must not be empty");
    let e = err(&named("\"red\\u001b[31m\""));
    assert_eq!(e.field(), Some("task[0].name"));
    assert!(e.to_string().contains("control characters") && !e.to_string().contains('\u{1b}'), "{e}");
    let e = err(&named("\"abc\\u202Efed\""));
    assert!(e.to_string().contains("bidirectional") && !e.to_string().contains('\u{202E}'), "{e}");
    let e = err(&named(&format!("\"{}\"", "n".repeat(100_000))));
    assert!(e.to_string().contains("at most 256 characters") && e.to_string().len() < 300, "{}", e.to_string().len());
}

#[test]
fn huge_times_are_refused_in_a_few_characters() {
    let e = err("[[task]]\nperiod = 1e308\nsubtasks = [{ resource = \"gpu\", single = 10 }]\n");
    assert_eq!(e.field(), Some("task[0].period"));
    let msg = e.to_string();
    assert!(msg.contains("must be at most 1000000000000 (got 1e308)") && msg.len() < 200, "{msg}");
    assert_field(
        "[[task]]\nperiod = 100\nsubtasks = [{ resource = \"gpu\", single = 1e13 }]\n",
        "task[0].subtasks[0].single",
        "at most 1000000000000",
    );
}

#[test]
fn sizes_are_bounded() {
    let many = OK_TASK.repeat(gpumux_rt::MAX_TASKS + 1);
    assert_field(&many, "task", "more than the 1000");
    let subs = vec!["{ resource = \"cpu\", single = 1 }"; gpumux_rt::MAX_SUBTASKS + 1].join(", ");
    assert_field(&format!("[[task]]\nperiod = 100\nsubtasks = [{subs}]\n"), "task[0].subtasks", "more than the 100");
}

#[test]
fn a_syntax_error_on_a_long_line_is_reported_briefly_with_its_place() {
    let text = format!("[[task]]\nperiod = 100\nname = \"{}\" x\n", "a".repeat(100_000));
    let e = err(&text);
    let msg = e.to_string();
    assert!(matches!(e, ModelError::Syntax { .. }), "{msg}");
    assert!(msg.contains("line 3, column"), "{msg}");
    assert!(msg.len() < 400, "{} bytes", msg.len());
}

#[test]
fn long_or_odd_user_text_is_quoted_short() {
    let key = "k".repeat(10_000);
    let e = err(&format!("[[task]]\n{key} = 1\nperiod = 100\nsubtasks = [{{ resource = \"gpu\", single = 1 }}]\n"));
    assert!(e.to_string().len() < 300 && e.to_string().contains("unknown field"), "{}", e.to_string().len());
    let e =
        err(&format!("[[task]]\nperiod = 100\nsubtasks = [{{ resource = \"{}\", single = 1 }}]\n", "g".repeat(5000)));
    assert!(e.to_string().len() < 300 && e.to_string().contains("(5000 characters)"), "{e}");
}

#[test]
fn non_utf8_and_endless_files_are_refused_with_the_reason() {
    let dir = tempfile::Builder::new().prefix("gpumux-rt-bad-").tempdir().expect("a temporary directory");
    let p = dir.path().join("latin1.toml");
    std::fs::write(&p, b"[[task]]\nname = \"caf\xe9\"\n").expect("write");
    let e = TaskSet::from_file(&p).expect_err("not UTF-8");
    assert!(matches!(e, ModelError::Io { .. }) && e.to_string().contains("invalid byte at offset 20"), "{e}");
    let e = TaskSet::from_file(std::path::Path::new("/dev/zero")).expect_err("endless");
    assert!(e.to_string().contains("more than the 67108864 bytes"), "{e}");
}
