//! The built-in Parboil workload against Tanasic Table 1.

use gpumux_engine::kernel::{DeviceInfo, KernelDesc, SmLimits};
use gpumux_engine::model::{Op, Workload};
use gpumux_workload::*;
use std::collections::{BTreeMap, BTreeSet};

fn k20c() -> DeviceInfo {
    DeviceInfo {
        name: "sim:k20c".into(),
        num_sms: 13,
        sm: SmLimits { max_threads: 2048, max_blocks: 16, registers: 65536, smem_bytes: 48 * 1024 },
        mem_bandwidth: 208e9,
        pcie_bandwidth: 6e9,
        pcie_latency_ns: 10_000,
        mem_bytes: 5 << 30,
    }
}

fn kernel_counts(w: &Workload, proc_name: &str) -> BTreeMap<String, u32> {
    let p = w.processes.iter().find(|p| p.name == proc_name).unwrap();
    let mut m = BTreeMap::new();
    for op in &p.ops {
        if let Op::Kernel(k) = op {
            *m.entry(k.name.clone()).or_insert(0) += 1;
        }
    }
    m
}

#[test]
fn twenty_four_kernels_ten_apps() {
    let ks = parboil_kernels(BlockTime::Fit);
    assert_eq!(ks.len(), 24);
    let names: BTreeSet<_> = ks.iter().map(|k| k.name.clone()).collect();
    assert_eq!(names.len(), 24);
    let w = resolve("parboil-k20c").unwrap();
    assert_eq!(w.processes.len(), 10);
    assert_eq!(w.replay_min_runs, Some(3));
    let used: BTreeSet<_> = w
        .processes
        .iter()
        .flat_map(|p| p.ops.iter())
        .filter_map(|o| if let Op::Kernel(k) = o { Some(k.name.clone()) } else { None })
        .collect();
    assert_eq!(used, names);
    let procs: Vec<_> = w.processes.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(procs, PARBOIL_APPS);
}

#[test]
fn launch_counts_match_table() {
    let w = resolve("parboil-k20c").unwrap();
    for row in TABLE1.iter() {
        let counts = kernel_counts(&w, row.app);
        assert_eq!(counts.get(row.kernel).copied(), Some(row.launches), "{} {}", row.app, row.kernel);
    }
    // Ops: cpu, h2d, kernels..., d2h, cpu.
    for p in &w.processes {
        assert!(matches!(p.ops[0], Op::Cpu { .. }));
        assert!(matches!(p.ops[1], Op::CopyToDevice { .. }));
        assert!(matches!(p.ops[p.ops.len() - 2], Op::CopyToHost { .. }));
        assert!(matches!(p.ops[p.ops.len() - 1], Op::Cpu { .. }));
    }
}

#[test]
fn resources_and_occupancy_match_table() {
    let dev = k20c();
    for row in TABLE1.iter() {
        let k = row.desc(BlockTime::Fit);
        let shape = &k.shape;
        assert_eq!(shape.regs_per_block(), row.regs_per_tb as u64, "{}: regs/TB exact", row.kernel);
        assert!(shape.threads_per_block <= 1024 && shape.regs_per_thread <= 255, "{}", row.kernel);
        assert_eq!(shape.smem_per_block, row.smem_per_tb);
        assert_eq!(shape.blocks, row.blocks);
        let occ = k20c_occupancy(row.threads, row.regs_per_tb, row.smem_per_tb);
        assert!(occ >= row.tbs_per_sm, "{}: resources allow {occ} < table {}", row.kernel, row.tbs_per_sm);
        assert_eq!(dev.blocks_per_sm(&k).unwrap(), row.tbs_per_sm, "{}", row.kernel);
        // The cap is set only where resources alone give a different answer.
        assert_eq!(shape.max_blocks_per_sm.is_some(), occ != row.tbs_per_sm, "{}", row.kernel);
    }
}

#[test]
fn table_time_per_tb_is_avg_time_times_occupancy_over_blocks() {
    // The identity that motivates BlockTime::Fit (docs/workloads.md).
    for row in TABLE1.iter() {
        let derived = row.avg_time_us * row.tbs_per_sm as f64 / row.blocks as f64;
        assert!(
            (derived - row.time_per_tb_us).abs() < 0.0051 + 0.015 * row.time_per_tb_us,
            "{}: {derived} vs {}",
            row.kernel,
            row.time_per_tb_us
        );
    }
}

#[test]
fn block_time_modes() {
    let block_time = |k: &KernelDesc| k.sim_timing.map(|t| t.block_time_ns);
    let lbm = TABLE1[0];
    assert_eq!(block_time(&lbm.desc(BlockTime::Table)), Some(2_420));
    // 18000 blocks / (13 × 15) = 92.3 → 93 waves.
    assert_eq!(block_time(&lbm.desc(BlockTime::Fit)), Some((2905.81e3f64 / 93.0).round() as u64));
    let phimag = TABLE1.iter().find(|r| r.kernel == "ComputePhiMag").unwrap();
    assert_eq!(block_time(&phimag.desc(BlockTime::Fit)), Some(4_700));
    let t = resolve("parboil-k20c:app=lbm,tb=table").unwrap();
    let Op::Kernel(k) = &t.processes[0].ops[2] else { panic!() };
    assert_eq!(block_time(k), Some(2_420));
}

#[test]
fn classes() {
    assert_eq!(parboil_class1("lbm"), Some(AppClass::Medium));
    assert_eq!(parboil_class2("lbm"), Some(AppClass::Long));
    assert_eq!(parboil_class1("spmv#3"), Some(AppClass::Short));
    assert_eq!(parboil_class2("mri-q"), Some(AppClass::Short));
    assert_eq!(parboil_class1("tpacf"), Some(AppClass::Long));
    assert_eq!(parboil_class1("nope"), None);
    for a in PARBOIL_APPS {
        assert!(parboil_class1(a).is_some() && parboil_class2(a).is_some());
    }
    assert_eq!(AppClass::Medium.to_string(), "MEDIUM");
}

#[test]
fn single_app() {
    let w = resolve("parboil-k20c:app=histo").unwrap();
    assert_eq!(w.processes.len(), 1);
    assert_eq!(w.processes[0].name, "histo");
    let ks: Vec<_> = w.processes[0]
        .ops
        .iter()
        .filter_map(|o| if let Op::Kernel(k) = o { Some(k.name.as_str()) } else { None })
        .take(5)
        .collect();
    assert_eq!(ks, ["prescan", "intermediates", "main", "final", "prescan"]);
}

#[test]
fn mixes_are_deterministic_and_differ_across_seeds() {
    let a = resolve("parboil-k20c:mix=8,seed=42").unwrap();
    let b = resolve("parboil-k20c:mix=8,seed=42").unwrap();
    assert_eq!(a, b);
    assert_eq!(a.processes.len(), 8);
    assert_eq!(a.replay_min_runs, Some(3));
    let names = |w: &Workload| w.processes.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
    let distinct: BTreeSet<Vec<String>> =
        (0..20u64).map(|s| names(&resolve(&format!("parboil-k20c:mix=8,seed={s}")).unwrap())).collect();
    assert!(distinct.len() >= 15, "only {} distinct mixes of 20 seeds", distinct.len());
    for s in 0..50u64 {
        let w = resolve(&format!("parboil-k20c:mix=16,seed={s}")).unwrap();
        let uniq: BTreeSet<_> = w.processes.iter().map(|p| p.name.clone()).collect();
        assert_eq!(uniq.len(), 16, "names are disambiguated");
        assert!(w.processes.iter().all(|p| p.arrival_ns == 0 && p.priority == 0));
        // Every name is an app, or app#k with k >= 2.
        for p in &w.processes {
            assert!(parboil_class1(&p.name).is_some(), "{}", p.name);
        }
    }
    // The draw itself (names and their order) is pinned, so results stay comparable across versions.
    let pinned: Vec<String> = parboil_mix_apps(6, 1).into_iter().map(|(_, n)| n).collect();
    assert_eq!(pinned, ["sad", "stencil", "mri-gridding", "mri-q", "mri-q#2", "stencil#2"]);
}

#[test]
fn hp_sets_one_priority() {
    let w = resolve("parboil-k20c:mix=4,seed=7,hp=2").unwrap();
    let pr: Vec<_> = w.processes.iter().map(|p| p.priority).collect();
    assert_eq!(pr, [0, 0, 1, 0]);
    let w = resolve("parboil-k20c:hp=9").unwrap();
    assert_eq!(w.processes[9].priority, 1);
    let w = parboil_mix(2, 3, Some(0), BlockTime::Fit).unwrap();
    assert_eq!(w.processes[0].priority, 1);
    assert!(parboil_mix(0, 3, None, BlockTime::Fit).is_err());
}

#[test]
fn builtin_serialises_and_parses_back() {
    let w = resolve("parboil-k20c").unwrap();
    let text = to_toml(&w);
    let back = parse_str(&text, "parboil.toml").unwrap();
    assert_eq!(back, w);
}
