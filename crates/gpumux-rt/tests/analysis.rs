//! Hand-computed response times (seed 004, IV-B equations) on small sets.

use gpumux_rt::analysis::{Analyzer, Status, MAX_ITERATIONS};
use gpumux_rt::model::{Mode, TaskSet};

fn set(text: &str) -> TaskSet {
    TaskSet::from_toml_str(text, "test.toml").expect("valid test set")
}

fn responses(s: &TaskSet, modes: &[Mode]) -> Vec<Option<f64>> {
    Analyzer::new().analyze(s, modes, MAX_ITERATIONS).tasks.iter().map(|t| t.response).collect()
}

#[test]
fn lone_task_response_is_its_wcet() {
    let s = set(r#"
        [[task]]
        period = 100
        subtasks = [{ resource = "cpu", single = 3, multi = 3 },
                    { resource = "pci", single = 2, multi = 4 },
                    { resource = "gpu", single = 40, multi = 20 }]
    "#);
    assert_eq!(responses(&s, &[Mode::Single]), vec![Some(45.0)]);
    assert_eq!(responses(&s, &[Mode::Multi]), vec![Some(27.0)]);
}

#[test]
fn non_preemptive_blocking_and_interference_on_one_gpu() {
    // τ1 (T=10, GPU 3) is blocked by τ2's kernel (5): R1 = 3 + 5 = 8.
    // τ2 (T=20, GPU 5): w = 5 + ⌈⌈w/10⌉·3 / 1⌉: 5 → 8 → 8.  R2 = 8.
    let s = set(r#"
        [platform]
        gpus = 1
        [[task]]
        name = "hi"
        period = 10
        subtasks = [{ resource = "gpu", single = 3, multi = 3 }]
        [[task]]
        name = "lo"
        period = 20
        subtasks = [{ resource = "gpu", single = 5, multi = 5 }]
    "#);
    let a = Analyzer::new().analyze(&s, &[Mode::Single; 2], MAX_ITERATIONS);
    assert_eq!(a.tasks[0].response, Some(8.0));
    assert_eq!(a.tasks[0].subtasks[0].blocking, 5.0);
    assert_eq!(a.tasks[1].response, Some(8.0));
    assert_eq!(a.tasks[1].subtasks[0].blocking, 0.0);
    assert!(a.schedulable);
}

#[test]
fn release_jitter_from_preceding_subtasks() {
    // Platform: 1 CPU, 1 PCI, 1 GPU.
    // τ1 (T=20): PCI 2, GPU 3.  τ2 (T=100): GPU 16 in chunks of 4.  τ3 (T=200): PCI 5.
    // τ1: PCI w = 2 + B(5) = 7;  J_12 = 7 − 2 = 5;  GPU w = 3 + B(chunk 4) = 7;  R1 = 14.
    // τ2: GPU w = 16 + ⌈⌈(5 + w)/20⌉·3⌉: 16 → ⌈21/20⌉=2 → 22 → ⌈27/20⌉=2 → 22.  R2 = 22
    //     (without the jitter it would be 16 + 3 = 19).
    // τ3: PCI w = 5 + ⌈⌈(0 + w)/20⌉·2⌉: 5 → 7 → 7.  R3 = 7.
    let s = set(r#"
        [platform]
        cpus = 1
        pci = 1
        gpus = 1
        [[task]]
        name = "t1"
        period = 20
        subtasks = [{ resource = "pci", single = 2, multi = 2 },
                    { resource = "gpu", single = 3, multi = 3 }]
        [[task]]
        name = "t2"
        period = 100
        subtasks = [{ resource = "gpu", single = 16, multi = 16, chunk = 4 }]
        [[task]]
        name = "t3"
        period = 200
        subtasks = [{ resource = "pci", single = 5, multi = 5 }]
    "#);
    let a = Analyzer::new().analyze(&s, &[Mode::Single; 3], MAX_ITERATIONS);
    let t1 = &a.tasks[0];
    assert_eq!(t1.subtasks[0].w, 7.0);
    assert_eq!(t1.subtasks[1].jitter, 5.0);
    assert_eq!(t1.subtasks[1].blocking, 4.0);
    assert_eq!(t1.response, Some(14.0));
    assert_eq!(a.tasks[1].response, Some(22.0));
    assert_eq!(a.tasks[2].response, Some(7.0));
    assert!(a.schedulable);
}

#[test]
fn gpu_interference_uses_single_mode_time_divided_by_units() {
    // 2 GPUs. τ1 multi: GPU C^S = 8, C^M = 4.  τ2 single: GPU 6.
    // R1 = 4 + B(6) = 10.  τ2: w = 6 + ⌈⌈w/20⌉·α/2⌉ with α = C^S = 8 → 6 + 4 = 10.
    // (Had α been C^M = 4 it would be 8.)
    let s = set(r#"
        [platform]
        gpus = 2
        [[task]]
        period = 20
        subtasks = [{ resource = "gpu", single = 8, multi = 4 }]
        [[task]]
        period = 50
        subtasks = [{ resource = "gpu", single = 6, multi = 3 }]
    "#);
    assert_eq!(responses(&s, &[Mode::Multi, Mode::Single]), vec![Some(10.0), Some(10.0)]);
}

#[test]
fn pci_interference_uses_the_interferers_mode() {
    // 1 PCI bus. τ1 multi copies 4 (single 2); τ2 copies 3.
    // R1 = 4 + B(3) = 7.  τ2: w = 3 + ⌈w/20⌉·4 = 7.
    let s = set(r#"
        [[task]]
        period = 20
        subtasks = [{ resource = "pci", single = 2, multi = 4 }]
        [[task]]
        period = 50
        subtasks = [{ resource = "pci", single = 3, multi = 3 }]
    "#);
    assert_eq!(responses(&s, &[Mode::Multi, Mode::Single]), vec![Some(7.0), Some(7.0)]);
    assert_eq!(responses(&s, &[Mode::Single, Mode::Single]), vec![Some(5.0), Some(5.0)]);
}

#[test]
fn cpu_is_preemptive_and_shared_by_its_cores() {
    // 2 CPUs: τ2's interference is ⌈⌈w/10⌉·4 / 2⌉ = 2; no blocking on the CPU.
    let s = set(r#"
        [platform]
        cpus = 2
        [[task]]
        period = 10
        subtasks = [{ resource = "cpu", single = 4, multi = 4 }]
        [[task]]
        period = 30
        subtasks = [{ resource = "cpu", single = 9, multi = 9 }]
    "#);
    // τ2: 9 → 9 + ⌈1·4/2⌉ = 11 → ⌈11/10⌉ = 2 → 9 + 4 = 13 → ⌈13/10⌉ = 2 → 13.
    assert_eq!(responses(&s, &[Mode::Single; 2]), vec![Some(4.0), Some(13.0)]);
}

#[test]
fn overload_is_reported_unschedulable_and_terminates() {
    // τ1 alone fills the GPU (utilisation 1): τ2's w = 50 + 10⌈w/10⌉ has no fixed point; the
    // analysis proves it from U >= 1 without iterating, and τ3 below it is not analysed.
    let s = set(r#"
        [platform]
        gpus = 1
        [[task]]
        period = 10
        subtasks = [{ resource = "gpu", single = 10, multi = 10 }]
        [[task]]
        period = 100
        subtasks = [{ resource = "gpu", single = 50, multi = 50 }]
        [[task]]
        period = 1000
        subtasks = [{ resource = "cpu", single = 1, multi = 1 }]
    "#);
    let mut an = Analyzer::new();
    let a = an.analyze(&s, &[Mode::Single; 3], MAX_ITERATIONS);
    assert!(!a.schedulable);
    assert_eq!(a.tasks[0].status, Status::Misses); // 10 + 50 blocking > 10
    assert_eq!(a.tasks[1].status, Status::Diverges);
    assert_eq!(a.tasks[1].response, None);
    assert!(a.tasks[1].note.as_deref().is_some_and(|n| n.contains("utilisation 1.0000")), "{:?}", a.tasks[1].note);
    assert_eq!(a.tasks[2].status, Status::NotAnalysed);
    assert!(!an.schedulable(&s, &[Mode::Single; 3]));
    assert_eq!(an.max_ratio(&s, &[Mode::Single; 3], 1.0), f64::INFINITY);
}

#[test]
fn deadline_shorter_than_period_sets_dm_priority() {
    // Same periods; the task with the shorter deadline gets the higher priority.
    let s = set(r#"
        [platform]
        gpus = 1
        [[task]]
        name = "a"
        period = 100
        subtasks = [{ resource = "cpu", single = 1, multi = 1 }]
        [[task]]
        name = "b"
        period = 100
        deadline = 50
        subtasks = [{ resource = "cpu", single = 1, multi = 1 }]
    "#);
    assert_eq!(s.tasks[0].name, "b");
    assert_eq!(s.tasks[0].deadline, 50.0);
}

#[test]
fn explicit_priorities_override_dm() {
    let s = set(r#"
        [[task]]
        name = "a"
        period = 10
        priority = 2
        subtasks = [{ resource = "cpu", single = 1, multi = 1 }]
        [[task]]
        name = "b"
        period = 100
        priority = 1
        subtasks = [{ resource = "cpu", single = 1, multi = 1 }]
    "#);
    assert_eq!(s.tasks[0].name, "b");
}
