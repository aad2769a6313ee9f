//! CPU references: what each app's outputs must hold after its launches.
//! Floating-point work runs in f64 (or mirrors the kernel's f32 fused
//! multiply-adds) and is compared with a tolerance.

use super::{App, Arg, HostData, Init, Workload};

fn f32_input(w: &Workload, i: usize) -> &[f32] {
    match &w.buffers[i].init {
        Init::Data(HostData::F32(v)) => v,
        _ => &[],
    }
}

fn u32_input(w: &Workload, i: usize) -> &[u32] {
    match &w.buffers[i].init {
        Init::Data(HostData::U32(v)) => v,
        _ => &[],
    }
}

fn arg_f32(w: &Workload, launch: usize, i: usize) -> f32 {
    match w.launches.get(launch).and_then(|l| l.args.get(i)) {
        Some(Arg::F32(x)) => *x,
        _ => 0.0,
    }
}

pub fn compute(w: &Workload) -> Vec<HostData> {
    let n = w.size as usize;
    let reps = w.launches.len();
    match w.app {
        App::Triad => {
            let (b, c) = (f32_input(w, 1), f32_input(w, 2));
            let s = arg_f32(w, 0, 3);
            vec![HostData::F32(b.iter().zip(c).map(|(&b, &c)| s.mul_add(c, b)).collect())]
        }
        App::Transpose => {
            let input = f32_input(w, 1);
            let batch = input.len() / (n * n).max(1);
            let mut out = vec![0f32; input.len()];
            for m in 0..batch {
                let base = m * n * n;
                for r in 0..n {
                    for c in 0..n {
                        out[base + c * n + r] = input[base + r * n + c];
                    }
                }
            }
            vec![HostData::F32(out)]
        }
        App::Spmv => {
            let (rowptr, cols, vals, x) = (u32_input(w, 1), u32_input(w, 2), f32_input(w, 3), f32_input(w, 4));
            let y = (0..n)
                .map(|r| {
                    (rowptr[r] as usize..rowptr[r + 1] as usize)
                        .map(|k| vals[k] as f64 * x[cols[k] as usize] as f64)
                        .sum::<f64>() as f32
                })
                .collect();
            vec![HostData::F32(y)]
        }
        App::Sgemm => {
            let (a, b) = (f32_input(w, 1), f32_input(w, 2));
            let side = (a.len() as f64).sqrt() as usize;
            let mut c = vec![0f64; side * side];
            for i in 0..side {
                for k in 0..side {
                    let aik = a[i * side + k] as f64;
                    let row = &b[k * side..(k + 1) * side];
                    for (cj, bkj) in c[i * side..(i + 1) * side].iter_mut().zip(row) {
                        *cj += aik * *bkj as f64;
                    }
                }
            }
            vec![HostData::F32(c.into_iter().map(|x| x as f32).collect())]
        }
        App::Nbody => {
            let pos = f32_input(w, 1);
            let soft2 = arg_f32(w, 0, 3) as f64;
            let mut acc = vec![0f32; n * 4];
            for i in 0..n {
                let (mut ax, mut ay, mut az) = (0f64, 0f64, 0f64);
                for j in 0..n {
                    let dx = pos[j * 4] as f64 - pos[i * 4] as f64;
                    let dy = pos[j * 4 + 1] as f64 - pos[i * 4 + 1] as f64;
                    let dz = pos[j * 4 + 2] as f64 - pos[i * 4 + 2] as f64;
                    let r2 = dx * dx + dy * dy + dz * dz + soft2;
                    let s = pos[j * 4 + 3] as f64 / (r2 * r2.sqrt());
                    ax += dx * s;
                    ay += dy * s;
                    az += dz * s;
                }
                acc[i * 4] = ax as f32;
                acc[i * 4 + 1] = ay as f32;
                acc[i * 4 + 2] = az as f32;
            }
            vec![HostData::F32(acc)]
        }
        App::Histogram => {
            let mut h = vec![0u32; 256];
            for &wd in u32_input(w, 1) {
                for s in [0, 8, 16, 24] {
                    h[((wd >> s) & 0xff) as usize] += 1;
                }
            }
            vec![HostData::U32(h.into_iter().map(|c| c * reps as u32).collect())]
        }
        App::Stencil => {
            // Ping-pong: each launch reads one buffer and writes the other,
            // as its arguments say; the outputs name which buffer is checked.
            let mut a: Vec<f32> = f32_input(w, 0).to_vec();
            let mut b = vec![f32::NAN; n * n];
            let at = |v: &[f32], y: i64, x: i64| -> f32 {
                if x < 0 || y < 0 || x >= n as i64 || y >= n as i64 {
                    0.0
                } else {
                    v[y as usize * n + x as usize]
                }
            };
            for l in &w.launches {
                match (l.args.first(), l.args.get(1)) {
                    (Some(Arg::Buf(1)), Some(Arg::Buf(0))) => step(&a, &mut b, n, at),
                    (Some(Arg::Buf(0)), Some(Arg::Buf(1))) => step(&b, &mut a, n, at),
                    _ => {}
                }
            }
            w.outputs.iter().map(|o| HostData::F32(if o.buffer == 0 { a.clone() } else { b.clone() })).collect()
        }
        App::Reduction => {
            let input = f32_input(w, 2);
            let per_block = 8192usize;
            let mut partial: Vec<f64> = Vec::new();
            let mut total = f64::NAN;
            for l in &w.launches {
                match l.kernel {
                    "reduce_partial" => {
                        partial = input.chunks(per_block).map(|c| c.iter().map(|&x| x as f64).sum()).collect();
                    }
                    "reduce_final" => total = partial.iter().sum(),
                    _ => {}
                }
            }
            w.outputs
                .iter()
                .map(|o| {
                    HostData::F32(if o.buffer == 0 {
                        vec![total as f32]
                    } else {
                        partial.iter().map(|&x| x as f32).collect()
                    })
                })
                .collect()
        }
        App::Bfs => {
            let (rowptr, cols) = (u32_input(w, 1), u32_input(w, 2));
            let mut level = u32_input(w, 0).to_vec();
            // Same level-synchronous steps as the launches: a vertex labelled
            // during step `cur` gets cur + 1 whatever the order.
            for cur in 0..reps as u32 {
                let frontier: Vec<usize> = (0..n).filter(|&v| level[v] == cur).collect();
                for v in frontier {
                    for &u in &cols[rowptr[v] as usize..rowptr[v + 1] as usize] {
                        let u = u as usize;
                        if level[u] == u32::MAX {
                            level[u] = cur + 1;
                        }
                    }
                }
            }
            vec![HostData::U32(level)]
        }
        App::Kmeans => {
            // Launch by launch: assign labels, then recompute centroids from them.
            let pts = f32_input(w, 2);
            let mut cent: Vec<f64> = f32_input(w, 0).iter().map(|&x| x as f64).collect();
            let k = cent.len() / 4;
            let mut label = vec![u32::MAX; n];
            for l in &w.launches {
                match l.kernel {
                    "kmeans_assign" => {
                        for (p, lab) in pts.chunks_exact(4).zip(label.iter_mut()) {
                            let dist =
                                |c: usize| -> f64 { (0..4).map(|d| (p[d] as f64 - cent[c * 4 + d]).powi(2)).sum() };
                            // The first of equally near centroids, as the kernel picks.
                            *lab = (0..k).min_by(|&a, &b| dist(a).total_cmp(&dist(b))).unwrap_or(0) as u32;
                        }
                    }
                    "kmeans_update" => {
                        let mut sum = vec![0f64; k * 5];
                        for (p, &lab) in pts.chunks_exact(4).zip(&label) {
                            let c = lab as usize;
                            if c < k {
                                for d in 0..4 {
                                    sum[c * 5 + d] += p[d] as f64;
                                }
                                sum[c * 5 + 4] += 1.0;
                            }
                        }
                        for c in 0..k {
                            if sum[c * 5 + 4] > 0.0 {
                                for d in 0..4 {
                                    cent[c * 4 + d] = sum[c * 5 + d] / sum[c * 5 + 4];
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
            w.outputs
                .iter()
                .map(|o| {
                    if o.buffer == 1 {
                        HostData::U32(label.clone())
                    } else {
                        HostData::F32(cent.iter().map(|&x| x as f32).collect())
                    }
                })
                .collect()
        }
    }
}

fn step(src: &[f32], dst: &mut [f32], n: usize, at: impl Fn(&[f32], i64, i64) -> f32) {
    for y in 0..n as i64 {
        for x in 0..n as i64 {
            let s = at(src, y, x) + at(src, y, x - 1) + at(src, y, x + 1) + at(src, y - 1, x) + at(src, y + 1, x);
            dst[y as usize * n + x as usize] = 0.2 * s;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::suite::{build, compare, App, HostData, Scale, Tolerance};

    #[test]
    fn every_app_has_a_reference_for_each_output() {
        for app in App::ALL {
            let w = build(app, Scale::Check, 1);
            let r = w.reference();
            assert_eq!(r.len(), w.outputs.len(), "{app:?}");
            for (o, want) in w.outputs.iter().zip(&r) {
                let bytes = w.buffers[o.buffer].init.byte_len();
                assert_eq!(want.byte_len(), bytes, "{app:?} output {} size", w.buffers[o.buffer].name);
            }
            assert!(!w.launches.is_empty() && w.total_blocks() > 0);
        }
    }

    #[test]
    fn references_are_plausible() {
        // Histogram: 4 bytes per word, counted once per repetition.
        let w = build(App::Histogram, Scale::Check, 3);
        let Some(HostData::U32(h)) = w.reference().into_iter().next() else { panic!("histogram output") };
        assert_eq!(h.iter().map(|&c| c as u64).sum::<u64>(), w.size * 4 * w.launches.len() as u64);
        // BFS: the source is at level 0 and some vertex got level 1.
        let w = build(App::Bfs, Scale::Check, 3);
        let Some(HostData::U32(l)) = w.reference().into_iter().next() else { panic!("bfs output") };
        assert_eq!(l[0], 0);
        assert!(l.contains(&1) && l.iter().filter(|&&x| x != u32::MAX).count() > l.len() / 2);
    }

    #[test]
    fn compare_catches_nan_and_mismatch() {
        let want = HostData::F32(vec![1.0, 2.0]);
        assert!(compare(&HostData::F32(vec![1.0, f32::NAN]), &want, Tolerance::RelL2(1.0)).is_err());
        assert!(compare(&HostData::F32(vec![1.0, 2.0001]), &want, Tolerance::RelL2(1e-3)).is_ok());
        assert!(compare(&HostData::F32(vec![1.0, 2.0001]), &want, Tolerance::Exact).is_err());
        assert!(compare(&HostData::U32(vec![1]), &HostData::U32(vec![2]), Tolerance::Exact).is_err());
    }
}
