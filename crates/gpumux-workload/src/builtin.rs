//! Built-in workload specs:
//!
//! ```text
//! parboil-k20c[:OPT[,OPT]...]
//! OPT  = app=NAME        one application alone
//!      | mix=N          N applications (1..=16) drawn at random, with replacement
//!      | seed=S         the draw's seed (u64; required with mix)
//!      | hp=I           the process at index I (0-based) gets priority 1
//!      | tb=fit|table   block times: fitted to Table 1's kernel times (default)
//!                       or Table 1's Time/TB column as printed
//! ```
//! With neither `app` nor `mix`: the ten applications once each.
//! Every form replays until each process has completed 3 runs (Tanasic 4.1).

use crate::error::WorkloadError;
use crate::parboil::{parboil_app, BlockTime, APPS};
use gpumux_engine::model::Workload;

/// The name of the built-in Parboil workload, before its `:` options.
pub const PARBOIL: &str = "parboil-k20c";
/// Most processes in a generated mix.
pub const MAX_MIX: u32 = 16;
/// Runs each process of a Parboil workload completes (Tanasic 4.1).
pub const PARBOIL_REPLAY: u32 = 3;

/// Short grammar, for messages.
pub const GRAMMAR: &str = "parboil-k20c[:app=NAME | :mix=N,seed=S][,hp=I][,tb=fit|table]";

/// Is `spec` meant as a built-in (rather than a path)?
pub fn is_builtin(spec: &str) -> bool {
    spec == PARBOIL || spec.starts_with("parboil-k20c:")
}

/// splitmix64: a tiny, well-mixed generator, so mixes are the same on every
/// platform and Rust version.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
}

/// The applications of a mix of `n` drawn with `seed`, named uniquely
/// (`sad`, `sad#2`, ...).
pub fn parboil_mix_apps(n: u32, seed: u64) -> Vec<(&'static str, String)> {
    let mut rng = SplitMix(seed);
    let mut out: Vec<(&'static str, String)> = Vec::new();
    for _ in 0..n {
        let app = APPS[rng.below(APPS.len() as u64) as usize];
        let k = out.iter().filter(|(a, _)| *a == app).count();
        let name = if k == 0 { app.to_string() } else { format!("{app}#{}", k + 1) };
        out.push((app, name));
    }
    out
}

/// A Tanasic-style multiprogrammed workload: `n` random applications, all
/// arriving at 0, priority 0 but for `hp` (priority 1), replayed until each
/// has completed 3 runs.
pub fn parboil_mix(n: u32, seed: u64, hp: Option<usize>, mode: BlockTime) -> Result<Workload, WorkloadError> {
    let name = format!("{PARBOIL}:mix={n},seed={seed}{}", hp.map(|i| format!(",hp={i}")).unwrap_or_default());
    let spec_err = |reason: String| WorkloadError::Spec { spec: name.clone(), reason };
    if !(1..=MAX_MIX).contains(&n) {
        return Err(spec_err(format!("mix must be in 1..={MAX_MIX}, got {n}")));
    }
    let apps = parboil_mix_apps(n, seed);
    let processes = apps.iter().filter_map(|(app, pname)| parboil_app(app, pname, mode)).collect();
    let mut w = Workload { name: name.clone(), processes, replay_min_runs: Some(PARBOIL_REPLAY) };
    set_hp(&mut w, hp).map_err(spec_err)?;
    Ok(w)
}

fn set_hp(w: &mut Workload, hp: Option<usize>) -> Result<(), String> {
    if let Some(i) = hp {
        let n = w.processes.len();
        let p = w
            .processes
            .get_mut(i)
            .ok_or_else(|| format!("hp={i} is out of range: the workload has {n} processes (hp is 0-based)"))?;
        p.priority = 1;
    }
    Ok(())
}

/// Parses and builds a built-in workload.
pub fn builtin(spec: &str) -> Result<Workload, WorkloadError> {
    let err = |reason: String| WorkloadError::Spec { spec: spec.to_string(), reason };
    let opts = if spec == PARBOIL {
        ""
    } else if let Some(rest) = spec.strip_prefix("parboil-k20c:") {
        rest
    } else {
        return Err(err(format!("unknown built-in workload (known: {GRAMMAR})")));
    };
    let (mut app, mut mix, mut seed, mut hp, mut tb) = (None, None, None, None, None);
    for opt in opts.split(',').filter(|o| !o.trim().is_empty()) {
        let (k, v) =
            opt.split_once('=').ok_or_else(|| err(format!("option `{opt}` is not KEY=VALUE (grammar: {GRAMMAR})")))?;
        let (k, v) = (k.trim(), v.trim());
        let dup = |set: bool| {
            if set {
                Err(err(format!("option `{k}` is given twice")))
            } else {
                Ok(())
            }
        };
        match k {
            "app" => {
                dup(app.is_some())?;
                if !APPS.contains(&v) {
                    return Err(err(format!("unknown application `{v}` (known: {})", APPS.join(", "))));
                }
                app = Some(v);
            }
            "mix" => {
                dup(mix.is_some())?;
                let n: u32 = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_MIX).contains(n))
                    .ok_or_else(|| err(format!("mix must be an integer in 1..={MAX_MIX}, got `{v}`")))?;
                mix = Some(n);
            }
            "seed" => {
                dup(seed.is_some())?;
                let s: u64 =
                    v.parse().map_err(|_| err(format!("seed must be an unsigned 64-bit integer, got `{v}`")))?;
                seed = Some(s);
            }
            "hp" => {
                dup(hp.is_some())?;
                let i: usize = v.parse().map_err(|_| err(format!("hp must be a 0-based process index, got `{v}`")))?;
                hp = Some(i);
            }
            "tb" => {
                dup(tb.is_some())?;
                tb = Some(match v {
                    "fit" => BlockTime::Fit,
                    "table" => BlockTime::Table,
                    _ => return Err(err(format!("tb must be `fit` or `table`, got `{v}`"))),
                });
            }
            _ => return Err(err(format!("unknown option `{k}` (grammar: {GRAMMAR})"))),
        }
    }
    let mode = tb.unwrap_or_default();
    let mut w = match (app, mix, seed) {
        (Some(_), Some(_), _) => return Err(err("app and mix exclude each other".into())),
        (Some(_), None, Some(_)) | (None, None, Some(_)) => {
            return Err(err("seed only applies to mix=N".into()));
        }
        (None, Some(_), None) => return Err(err("mix=N needs seed=S (mixes are drawn deterministically)".into())),
        (None, Some(n), Some(s)) => {
            let mut w = parboil_mix(n, s, None, mode)?;
            w.name = spec.to_string();
            w
        }
        (Some(a), None, None) => Workload {
            name: spec.to_string(),
            processes: parboil_app(a, a, mode).into_iter().collect(),
            replay_min_runs: Some(PARBOIL_REPLAY),
        },
        (None, None, None) => Workload {
            name: spec.to_string(),
            processes: APPS.iter().filter_map(|a| parboil_app(a, a, mode)).collect(),
            replay_min_runs: Some(PARBOIL_REPLAY),
        },
    };
    set_hp(&mut w, hp).map_err(err)?;
    Ok(w)
}
