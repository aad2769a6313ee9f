//! SM partitioning heuristics of Adriaens (thesis, ch. 6), each a pure
//! function: the applications' characteristics and N SMs in, SM counts per
//! application out (same order). `spatial.rs` applies them to a running GPU.
//!
//! Counts always sum to at most N; every application gets at least one SM
//! when there are at least as many SMs as applications (the thesis never
//! leaves an application without SMs).

/// What a heuristic may know about one application (thesis Table 6.1 plus
/// the isolated-scaling profile of Fig. 6.1).
#[derive(Clone, Debug, PartialEq)]
pub struct AppChar {
    /// Thread blocks of a kernel (a weighted mean over kernels, Eq. 6.3).
    pub blocks: f64,
    /// Threads per block.
    pub threads_per_block: f64,
    /// Blocks one SM runs at once (the occupancy the GPU gives this kernel).
    pub blocks_per_sm: u32,
    /// Speedup on j SMs, `speedup[j - 1]`, relative to any fixed base
    /// (only ratios matter). Profile and Fair use it; may be empty for others.
    pub speedup: Vec<f64>,
}

impl AppChar {
    /// A characterisation without a measured profile: the speedup is
    /// predicted by counting rounds (waves) of blocks, the model behind Rounds.
    pub fn predicted(blocks: f64, threads_per_block: f64, blocks_per_sm: u32, sms: u32) -> Self {
        let speedup = (1..=sms.max(1)).map(|j| predicted_speedup(blocks, blocks_per_sm, j)).collect();
        AppChar { blocks, threads_per_block, blocks_per_sm, speedup }
    }

    fn speedup_on(&self, j: u32) -> f64 {
        if j == 0 {
            return 0.0;
        }
        self.speedup.get(j as usize - 1).or(self.speedup.last()).copied().unwrap_or(j as f64)
    }
}

/// Speedup on `j` SMs relative to one SM if every round of blocks takes the
/// same time: rounds(1) / rounds(j).
pub fn predicted_speedup(blocks: f64, blocks_per_sm: u32, j: u32) -> f64 {
    let b = blocks.max(1.0).ceil() as u64;
    rounds(b, blocks_per_sm, 1) as f64 / rounds(b, blocks_per_sm, j.max(1)) as f64
}

/// Rounds (waves) a kernel of `blocks` blocks takes on `sms` SMs that each
/// run `per_sm` blocks at once (thesis: ceil(256 / (15 × 8)) = 3).
pub fn rounds(blocks: u64, per_sm: u32, sms: u32) -> u64 {
    let slots = per_sm.max(1) as u64 * sms as u64;
    if slots == 0 {
        return u64::MAX;
    }
    blocks.div_ceil(slots)
}

/// Fewest SMs that still finish `blocks` in `r` rounds.
pub fn min_sms_for_rounds(blocks: u64, per_sm: u32, r: u64) -> u32 {
    if r == 0 {
        return u32::MAX;
    }
    blocks.div_ceil(r * per_sm.max(1) as u64).max(1).min(u32::MAX as u64) as u32
}

/// Even: as even as possible; the first `N mod n` applications get one more
/// (thesis: four applications on 30 SMs get 8, 8, 7, 7).
pub fn even(n: usize, sms: u32) -> Vec<u32> {
    if n == 0 {
        return vec![];
    }
    let (q, r) = (sms / n as u32, sms as usize % n);
    (0..n).map(|i| q + u32::from(i < r)).collect()
}

/// Even with a cap per application; what a capped application cannot use is
/// split evenly among the others (water filling).
pub fn even_capped(caps: &[u32], sms: u32) -> Vec<u32> {
    let mut out = Vec::new();
    even_capped_into(caps, sms, &mut out, &mut Vec::new(), &mut Vec::new());
    out
}

/// [`even_capped`] into `out`, with `open` and `next` as scratch: a policy
/// that runs at every launch keeps them instead of allocating three vectors
/// a round (issue 35, the core's work per kernel).
pub fn even_capped_into(caps: &[u32], sms: u32, out: &mut Vec<u32>, open: &mut Vec<usize>, next: &mut Vec<usize>) {
    let n = caps.len();
    out.clear();
    // Room for every cap: each gets its cap, as the water filling below
    // would give after a pass per distinct cap (a policy round's usual
    // case: short kernels of a few clients, far fewer SMs than the GPU's).
    // Except where the passes stop at once: fewer SMs than applications,
    // and the first pass's one-SM parts all fall on caps of 0 (it gives
    // nothing, and the SMs stay unshared).
    let first_pass_gives = sms as usize >= n || caps[..sms as usize].iter().any(|&c| c > 0);
    if first_pass_gives && caps.iter().map(|&c| u64::from(c)).sum::<u64>() <= u64::from(sms) {
        out.extend_from_slice(caps);
        return;
    }
    water_fill(caps, sms, out, open, next);
}

/// [`even_capped_into`]'s passes: each open application gets an even part
/// of what is left, up to its cap, until the SMs or the open ones run out.
fn water_fill(caps: &[u32], sms: u32, out: &mut Vec<u32>, open: &mut Vec<usize>, next: &mut Vec<usize>) {
    let n = caps.len();
    out.clear();
    out.resize(n, 0);
    let mut left = sms;
    open.clear();
    open.extend(0..n);
    while left > 0 && !open.is_empty() {
        // `even(open.len(), left)`, one share at a time.
        let (q, r) = (left / open.len() as u32, left as usize % open.len());
        next.clear();
        let mut given = 0;
        for (slot, &i) in open.iter().enumerate() {
            let share = q + u32::from(slot < r);
            let g = share.min(caps[i] - out[i]);
            out[i] += g;
            given += g;
            if out[i] < caps[i] {
                next.push(i);
            }
        }
        left -= given;
        if given == 0 {
            break;
        }
        std::mem::swap(open, next);
    }
}

/// Smart Even: Even, but no application gets more SMs than it has blocks
/// (thesis: RSA, 4 blocks, gets 4 SMs).
pub fn smart_even(apps: &[AppChar], sms: u32) -> Vec<u32> {
    let caps: Vec<u32> = apps.iter().map(|a| (a.blocks.ceil().max(1.0) as u64).min(sms as u64) as u32).collect();
    even_capped(&caps, sms)
}

/// Packed: Even, but no application gets more SMs than it needs to have all
/// its blocks in flight at once (thesis: RSA's 4 blocks fit one SM).
pub fn packed(apps: &[AppChar], sms: u32) -> Vec<u32> {
    let caps: Vec<u32> =
        apps.iter().map(|a| min_sms_for_rounds(a.blocks.ceil().max(1.0) as u64, a.blocks_per_sm, 1).min(sms)).collect();
    even_capped(&caps, sms)
}

/// Every way to give `total` SMs to `n` applications with at least `min[i]`
/// each (all SMs handed out), visited in lexicographic order.
pub fn for_each_composition(min: &[u32], total: u32, f: &mut dyn FnMut(&[u32])) {
    fn rec(i: usize, min: &[u32], left: u32, cur: &mut Vec<u32>, f: &mut dyn FnMut(&[u32])) {
        if i + 1 == min.len() {
            if left >= min[i] {
                cur.push(left);
                f(cur);
                cur.pop();
            }
            return;
        }
        let rest_min: u32 = min[i + 1..].iter().sum();
        let mut j = min[i];
        while j + rest_min <= left {
            cur.push(j);
            rec(i + 1, min, left - j, cur, f);
            cur.pop();
            j += 1;
        }
    }
    if min.is_empty() || min.iter().sum::<u32>() > total {
        return;
    }
    rec(0, min, total, &mut Vec::with_capacity(min.len()), f);
}

/// Splits that [`for_each_composition`] visits, as a float (C(free + n − 1, n − 1)).
pub fn composition_count(min: &[u32], total: u32) -> f64 {
    let n = min.len();
    let need: u64 = min.iter().map(|&m| m as u64).sum();
    if n == 0 || need > total as u64 {
        return 0.0;
    }
    let free = (total as u64 - need) as f64;
    (1..n).fold(1.0, |acc, k| acc * (free + k as f64) / k as f64)
}

/// Beyond this many splits the heuristics that search every split search
/// locally instead: 8 processes on 132 SMs have ~4e11 splits, and a
/// spatial-profile run on `scripts/cuda-small.toml` did not end in 10 minutes.
pub const EXHAUSTIVE_SPLITS: f64 = 2e6;

/// Best split by `better(candidate, incumbent)` when there are too many to
/// visit and the score is not separable (Fair): from Even (raised to `min`),
/// move one SM from one application to another while that improves the split.
/// It stops at a local optimum, which need not be the global one.
fn local_search(min: &[u32], sms: u32, better: &dyn Fn(&[u32], &[u32]) -> bool) -> Vec<u32> {
    let n = min.len();
    let mut cur: Vec<u32> = even(n, sms).iter().zip(min).map(|(&e, &m)| e.max(m)).collect();
    // Raising to `min` may overshoot: take the excess from the largest shares.
    while cur.iter().sum::<u32>() > sms {
        let Some(i) = (0..n).filter(|&i| cur[i] > min[i]).max_by_key(|&i| cur[i]) else { break };
        cur[i] -= 1;
    }
    // Each accepted move strictly improves the split, so this ends; the bound is a guard.
    for _ in 0..(sms as usize * n * 4).max(1) {
        let mut best: Option<Vec<u32>> = None;
        for from in 0..n {
            if cur[from] <= min[from] {
                continue;
            }
            for to in 0..n {
                if to == from {
                    continue;
                }
                let mut cand = cur.clone();
                cand[from] -= 1;
                cand[to] += 1;
                if better(&cand, best.as_deref().unwrap_or(&cur)) {
                    best = Some(cand);
                }
            }
        }
        match best {
            Some(b) => cur = b,
            None => break,
        }
    }
    cur
}

/// Best split for a separable score Σ value(i, j_i) (higher is better; ties:
/// closest to Even), by dynamic programming over applications and SMs used:
/// exact, O(n · sms²), for when there are too many splits to visit.
fn best_separable(min: &[u32], sms: u32, value: &dyn Fn(usize, u32) -> f64) -> Vec<u32> {
    let n = min.len();
    let ev = even(n, sms);
    let s = sms as usize;
    // best[i][t]: (score, distance, SMs of app i) over apps 0..=i using t SMs.
    let mut best: Vec<Vec<Option<(f64, u32, u32)>>> = vec![vec![None; s + 1]; n];
    let better = |a: (f64, u32), b: (f64, u32)| {
        let tol = 1e-9 * b.0.abs().max(1.0);
        a.0 > b.0 + tol || ((a.0 - b.0).abs() <= tol && a.1 < b.1)
    };
    for i in 0..n {
        for t in 0..=s {
            for j in min[i]..=t as u32 {
                let (prev_score, prev_dist) = if i == 0 {
                    if j as usize != t {
                        continue;
                    }
                    (0.0, 0)
                } else {
                    match best[i - 1][t - j as usize] {
                        Some((sc, d, _)) => (sc, d),
                        None => continue,
                    }
                };
                let cand = (prev_score + value(i, j), prev_dist + ev[i].abs_diff(j));
                if best[i][t].is_none_or(|(sc, d, _)| better(cand, (sc, d))) {
                    best[i][t] = Some((cand.0, cand.1, j));
                }
            }
        }
    }
    let mut out = vec![0; n];
    let mut t = s;
    for i in (0..n).rev() {
        let Some((_, _, j)) = best[i][t] else { return ev };
        out[i] = j;
        t -= j as usize;
    }
    out
}

fn distance_to_even(p: &[u32], sms: u32) -> u32 {
    even(p.len(), sms).iter().zip(p).map(|(e, x)| e.abs_diff(*x)).sum()
}

/// Rounds: start from Even; find each application's fewest SMs that keep its
/// Even round count; hand the spare SMs out so that the total rounds is
/// least, ties going to the split closest to Even. No application takes more
/// rounds than under Even.
pub fn rounds_heuristic(apps: &[AppChar], sms: u32) -> Vec<u32> {
    let n = apps.len();
    if n == 0 || (sms as usize) < n {
        return even(n, sms);
    }
    let ev = even(n, sms);
    let blocks: Vec<u64> = apps.iter().map(|a| a.blocks.ceil().max(1.0) as u64).collect();
    let min: Vec<u32> = (0..n)
        .map(|i| {
            min_sms_for_rounds(blocks[i], apps[i].blocks_per_sm, rounds(blocks[i], apps[i].blocks_per_sm, ev[i]))
                .min(ev[i])
        })
        .collect();
    if composition_count(&min, sms) > EXHAUSTIVE_SPLITS {
        // Fewest total rounds is a separable score (as a negative sum).
        return best_separable(&min, sms, &|i, j| -(rounds(blocks[i], apps[i].blocks_per_sm, j) as f64));
    }
    let mut best: Option<(u64, u32, Vec<u32>)> = None;
    for_each_composition(&min, sms, &mut |p| {
        let total: u64 = (0..n).map(|i| rounds(blocks[i], apps[i].blocks_per_sm, p[i])).sum();
        let d = distance_to_even(p, sms);
        if best.as_ref().is_none_or(|(t, bd, _)| (total, d) < (*t, *bd)) {
            best = Some((total, d, p.to_vec()));
        }
    });
    best.map_or(ev, |b| b.2)
}

/// Eq. 6.2: SMs proportional to a weight, rounded towards zero, at least one
/// each; the last application gets what is left.
pub fn proportional(weights: &[f64], sms: u32) -> Vec<u32> {
    let n = weights.len();
    if n == 0 || (sms as usize) < n {
        return even(n, sms);
    }
    let sum: f64 = weights.iter().map(|w| w.max(0.0)).sum();
    let mut out: Vec<u32> = weights
        .iter()
        .map(|w| if sum > 0.0 { ((sms as f64 * w.max(0.0) / sum).floor() as u32).max(1) } else { 1 })
        .collect();
    // Everyone else keeps at least one SM for the last one: trim the largest if needed.
    let reserve = |out: &Vec<u32>| out[..n - 1].iter().sum::<u32>();
    while reserve(&out) > sms - 1 {
        let Some(i) = (0..n - 1).max_by_key(|&i| out[i]) else { break };
        out[i] -= 1;
    }
    out[n - 1] = sms - reserve(&out);
    out
}

/// Blocks: proportional to thread blocks per kernel (Eq. 6.2).
pub fn blocks(apps: &[AppChar], sms: u32) -> Vec<u32> {
    proportional(&apps.iter().map(|a| a.blocks).collect::<Vec<_>>(), sms)
}

/// Threads per block: Eq. 6.2 with threads per block as the weight.
pub fn threads_per_block(apps: &[AppChar], sms: u32) -> Vec<u32> {
    proportional(&apps.iter().map(|a| a.threads_per_block).collect::<Vec<_>>(), sms)
}

/// Threads: Eq. 6.2 with blocks × threads per block as the weight.
pub fn threads(apps: &[AppChar], sms: u32) -> Vec<u32> {
    proportional(&apps.iter().map(|a| a.blocks * a.threads_per_block).collect::<Vec<_>>(), sms)
}

/// Profile (Eq. 6.1): the split that maximises Σ_i S(i, j_i)^(1/N), over
/// every split with at least one SM each; ties go to the one closest to Even.
pub fn profile(apps: &[AppChar], sms: u32) -> Vec<u32> {
    let n = apps.len();
    if n == 0 || (sms as usize) < n {
        return even(n, sms);
    }
    let exp = 1.0 / n as f64;
    let value = |i: usize, j: u32| apps[i].speedup_on(j).max(0.0).powf(exp);
    if composition_count(&vec![1; n], sms) > EXHAUSTIVE_SPLITS {
        return best_separable(&vec![1; n], sms, &value);
    }
    best_split(apps, sms, |p| p.iter().enumerate().map(|(i, &j)| value(i, j)).sum())
}

/// Fair (profile version): equalise the predicted loss against running alone
/// on all SMs: minimise max_i − min_i of S(i, j_i) / S(i, N).
pub fn fair(apps: &[AppChar], sms: u32) -> Vec<u32> {
    let n = apps.len();
    if n == 0 || (sms as usize) < n {
        return even(n, sms);
    }
    best_split(apps, sms, |p| {
        let rel: Vec<f64> = p.iter().zip(apps).map(|(&j, a)| a.speedup_on(j) / a.speedup_on(sms).max(1e-12)).collect();
        let hi = rel.iter().cloned().fold(f64::MIN, f64::max);
        let lo = rel.iter().cloned().fold(f64::MAX, f64::min);
        -(hi - lo)
    })
}

/// The split with the highest score (ties: closest to Even, then first).
fn best_split(apps: &[AppChar], sms: u32, score: impl Fn(&[u32]) -> f64) -> Vec<u32> {
    let ones = vec![1; apps.len()];
    if composition_count(&ones, sms) > EXHAUSTIVE_SPLITS {
        let better = |a: &[u32], b: &[u32]| {
            let (sa, sb) = (score(a), score(b));
            let tol = 1e-9 * sb.abs().max(1.0);
            sa > sb + tol || ((sa - sb).abs() <= tol && distance_to_even(a, sms) < distance_to_even(b, sms))
        };
        return local_search(&ones, sms, &better);
    }
    let mut best: Option<(f64, u32, Vec<u32>)> = None;
    for_each_composition(&vec![1; apps.len()], sms, &mut |p| {
        let s = score(p);
        let d = distance_to_even(p, sms);
        let better = match &best {
            None => true,
            // A relative epsilon, so float noise never decides a tie.
            Some((bs, bd, _)) => {
                s > bs + 1e-9 * bs.abs().max(1.0) || ((s - bs).abs() <= 1e-9 * bs.abs().max(1.0) && d < *bd)
            }
        };
        if better {
            best = Some((s, d, p.to_vec()));
        }
    });
    best.map_or_else(|| even(apps.len(), sms), |b| b.2)
}

/// Smallest SM count whose speedup reaches `target` × the speedup on all
/// SMs (QoS, thesis ch. 7: e.g. 75 % of the performance alone).
pub fn qos_reservation(speedup: &[f64], target: f64) -> Option<u32> {
    let full = *speedup.last()?;
    speedup.iter().position(|&s| s >= target * full - 1e-12).map(|i| i as u32 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `even_capped_into` hands out the caps at once when they fit: the
    /// same as the passes give, for every cap vector of up to four entries
    /// of 0-6 and every budget up to ten more than their sum.
    #[test]
    fn caps_that_fit_are_what_the_water_filling_gives() {
        let (mut out, mut open, mut next) = (Vec::new(), Vec::new(), Vec::new());
        let (mut checked, mut at_once) = (0, 0);
        for n in 0..=4u32 {
            for code in 0..7u32.pow(n) {
                let caps: Vec<u32> = (0..n).map(|i| code / 7u32.pow(i) % 7).collect();
                let sum: u32 = caps.iter().sum();
                for sms in 0..=sum + 10 {
                    water_fill(&caps, sms, &mut out, &mut open, &mut next);
                    assert_eq!(even_capped(&caps, sms), out, "{sms} SMs for caps {caps:?}");
                    checked += 1;
                    at_once += u32::from(sms >= sum && out == caps);
                }
            }
        }
        assert!(at_once > checked / 3, "{at_once} of {checked} fit");
        // The passes' one quirk kept: 1 SM for caps 0 and 1 stays unshared.
        assert_eq!(even_capped(&[0, 1], 1), vec![0, 0]);
        assert_eq!(even_capped(&[0, 1], 2), vec![0, 1]);
        // Caps that do not fit go through the passes.
        assert_eq!(even_capped(&[5, 1, 5], 8), vec![4, 1, 3]);
    }

    fn app(blocks: f64, tpb: f64, bps: u32) -> AppChar {
        AppChar::predicted(blocks, tpb, bps, 30)
    }

    /// The thesis's RSA: 4 blocks of 32 threads; 8 fit one GT200 SM.
    fn rsa() -> AppChar {
        app(4.0, 32.0, 8)
    }

    #[test]
    fn even_splits_thirty_sms() {
        assert_eq!(even(4, 30), vec![8, 8, 7, 7]);
        assert_eq!(even(2, 30), vec![15, 15]);
        assert_eq!(even(0, 30), Vec::<u32>::new());
    }

    #[test]
    fn smart_even_gives_rsa_four_sms_and_packed_one() {
        let big = app(4097.0, 256.0, 3);
        assert_eq!(smart_even(&[rsa(), big.clone()], 30), vec![4, 26]);
        assert_eq!(packed(&[rsa(), big.clone()], 30), vec![1, 29]);
        // Three applications: RSA's unused 6 SMs go evenly to the other two.
        assert_eq!(smart_even(&[rsa(), big.clone(), big.clone()], 30), vec![4, 13, 13]);
        // Nobody capped: same as Even.
        assert_eq!(smart_even(&[big.clone(), big], 30), vec![15, 15]);
    }

    #[test]
    fn rounds_example_256_blocks_8_per_sm() {
        // Thesis: 15 SMs × 8 = 120 at once, ceil(256 / 120) = 3 rounds; 14 SMs still 3.
        assert_eq!(rounds(256, 8, 15), 3);
        assert_eq!(rounds(256, 8, 14), 3);
        assert_eq!(min_sms_for_rounds(256, 8, 3), 11);
        // Against a 4097-block app (3 per SM): the 256-block one keeps its 3
        // rounds on 11 SMs; the 4 spare SMs go to the other (46 → 36 rounds
        // on 19 SMs? ceil(4097/57)=72 vs ceil(4097/45)=92): least total rounds.
        let p = rounds_heuristic(&[app(256.0, 128.0, 8), app(4097.0, 256.0, 3)], 30);
        assert_eq!(p, vec![11, 19]);
        assert_eq!(rounds(4097, 3, 19) + 3, 72 + 3);
        // Two identical apps: 16 SMs (128 slots) finish in 2 rounds, so 14/16
        // takes 3 + 2 = 5 rounds against 6 for 15/15; of the 5-round splits,
        // 14/16 and 16/14 are closest to even and the first found wins.
        assert_eq!(rounds_heuristic(&[app(256.0, 128.0, 8), app(256.0, 128.0, 8)], 30), vec![14, 16]);
    }

    #[test]
    fn blocks_threads_proportional_eq_6_2() {
        // 100 vs 200 blocks on 30 SMs: 10 and the rest (20).
        let a = app(100.0, 64.0, 8);
        let b = app(200.0, 256.0, 8);
        assert_eq!(blocks(&[a.clone(), b.clone()], 30), vec![10, 20]);
        // 64 vs 256 threads per block: floor(30 × 0.2) = 6, then 24.
        assert_eq!(threads_per_block(&[a.clone(), b.clone()], 30), vec![6, 24]);
        // 6400 vs 51200 threads: floor(3.33) = 3, then 27.
        assert_eq!(threads(&[a, b], 30), vec![3, 27]);
        // RSA's 4 blocks against 110592: rounds to 0, raised to 1.
        assert_eq!(blocks(&[rsa(), app(110592.0, 64.0, 8)], 30), vec![1, 29]);
    }

    #[test]
    fn many_processes_split_in_bounded_time_and_as_well_as_a_full_search_where_one_is_possible() {
        assert_eq!(composition_count(&[1, 1], 4), 3.0);
        assert_eq!(composition_count(&[1, 1, 1], 132), 8515.0);
        assert!(composition_count(&[1; 8], 132) > EXHAUSTIVE_SPLITS);
        // 12 processes on 132 SMs: ~1e14 splits; the local search answers at once.
        let apps: Vec<AppChar> = (0..12).map(|i| AppChar::predicted(((i + 1) * 200) as f64, 256.0, 8, 132)).collect();
        let t = std::time::Instant::now();
        for f in [profile, fair, rounds_heuristic] {
            let p = f(&apps, 132);
            assert_eq!(p.iter().sum::<u32>(), 132);
            assert!(p.iter().all(|&x| x >= 1), "{p:?}");
        }
        assert!(t.elapsed().as_secs() < 20, "took {:?}", t.elapsed());
        // Where both can run, the dynamic programme finds the exhaustive optimum (profile, rounds).
        for blocks in [[300.0, 40.0, 2000.0], [5000.0, 5000.0, 17.0], [1.0, 900.0, 64.0]] {
            let few: Vec<AppChar> = blocks.iter().map(|&b| AppChar::predicted(b, 256.0, 8, 60)).collect();
            let value = |i: usize, j: u32| few[i].speedup_on(j).powf(1.0 / 3.0);
            // Same score and distance to Even (exact ties may pick a different, equal split).
            let key = |p: &[u32], v: &dyn Fn(usize, u32) -> f64| {
                ((p.iter().enumerate().map(|(i, &j)| v(i, j)).sum::<f64>() * 1e6).round(), distance_to_even(p, 60))
            };
            let dp = best_separable(&[1, 1, 1], 60, &value);
            assert_eq!(key(&dp, &value), key(&profile(&few, 60), &value), "{blocks:?}");
            let b = |i: usize| few[i].blocks.ceil() as u64;
            let r = |i: usize, j: u32| -(rounds(b(i), few[i].blocks_per_sm, j) as f64);
            let ev = even(3, 60);
            let rmin: Vec<u32> = (0..3)
                .map(|i| {
                    let bps = few[i].blocks_per_sm;
                    min_sms_for_rounds(b(i), bps, rounds(b(i), bps, ev[i])).min(ev[i])
                })
                .collect();
            assert_eq!(key(&best_separable(&rmin, 60, &r), &r), key(&rounds_heuristic(&few, 60), &r), "{blocks:?}");
        }
    }

    #[test]
    fn profile_and_fair_use_the_speedup_curves() {
        // A saturates at 4 SMs; B scales linearly.
        let mut a = rsa();
        a.speedup = (1..=30).map(|j: u32| j.min(4) as f64).collect();
        let mut b = app(4097.0, 256.0, 3);
        b.speedup = (1..=30).map(|j| j as f64).collect();
        let p = profile(&[a.clone(), b.clone()], 30);
        assert_eq!(p, vec![4, 26]);
        // Fair: A on 4 SMs keeps 100 %, B on 26 keeps 87 % (gap 0.13); A on 3
        // keeps 75 % and B 90 % (gap 0.15): 4/26 is the fairest split.
        assert_eq!(fair(&[a, b], 30), vec![4, 26]);
    }

    #[test]
    fn compositions_cover_all_splits() {
        let mut n = 0;
        for_each_composition(&[1, 1], 30, &mut |p| {
            assert_eq!(p.iter().sum::<u32>(), 30);
            n += 1;
        });
        assert_eq!(n, 29);
        let mut m = 0;
        for_each_composition(&[1, 1, 1], 6, &mut |_| m += 1);
        assert_eq!(m, 10);
    }

    #[test]
    fn qos_reservation_smallest_count_meeting_the_target() {
        let s: Vec<f64> = (1..=30).map(|j| j as f64).collect();
        assert_eq!(qos_reservation(&s, 0.75), Some(23)); // thesis Table 7.3: 23 SMs for linear apps
        let flat: Vec<f64> = (1..=30).map(|j: u32| j.min(4) as f64).collect();
        assert_eq!(qos_reservation(&flat, 0.75), Some(3));
        assert_eq!(qos_reservation(&[], 0.75), None);
    }

    #[test]
    fn more_apps_than_sms_does_not_panic() {
        let apps = vec![rsa(); 5];
        for f in [smart_even, packed, rounds_heuristic, blocks, threads, threads_per_block, profile, fair] {
            assert!(f(&apps, 3).iter().sum::<u32>() <= 3);
        }
    }
}
