//! The four experiments of `gpumux bench daemon`, as plans of role
//! processes per setting, and the figures drawn from their results.
//!
//! Settings are run grouped by what they need started (native processes,
//! then the MPS daemon once, then one gpumuxd per policy), so each daemon
//! and MPS start once per run.

use super::jobs::{Job, JobResult, LoopKernel};
use super::procs::{run_setting, Daemon, Env, Mps, ProcPlan};
use super::programs::{self, Program, ProgramResult};
use super::report::{
    percentile, stp_fairness, CorunRow, LatencyRow, OverheadReport, PriorityRow, ProgramRow, Report, SoloRow,
};
use super::role::Mode;
use super::DaemonBenchArgs;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

pub mod copy_beside;
pub mod multi_gpu;

/// The co-run pairs.
pub const PAIRS: [(LoopKernel, LoopKernel); 3] = [
    (LoopKernel::Triad, LoopKernel::Fma),
    (LoopKernel::Sgemm, LoopKernel::Histogram),
    (LoopKernel::Sgemm, LoopKernel::Sgemm),
];
/// GPU time each urgent block spins: with the launch, about 15 µs of turnaround alone.
const URGENT_SPIN_NS: u64 = 10_000;
/// Gap before each urgent launch, µs (uniform).
const URGENT_GAP_US: (u64, u64) = (500, 2500);
/// Launches of the empty kernel timed for the latency figures.
const LATENCY_TRIALS: u32 = 2000;
/// Launch + sync after this long idle (the threads on the path have gone to
/// sleep, as between an urgent client's kernels), and how many.
const IDLE_LATENCY_US: u32 = 2000;
const IDLE_LATENCY_TRIALS: u32 = 500;

/// One run's context.
pub struct Bench {
    pub exe: PathBuf,
    pub dir: PathBuf,
    pub device: String,
    /// The CUDA ordinal; `None` on a simulated device (no native baselines).
    pub ordinal: Option<i32>,
    /// The device of every GPU (`--device` as given) and its GPU count, when
    /// it has several; `device` is then its first GPU.
    pub many: Option<(String, usize)>,
    pub args: DaemonBenchArgs,
}

/// A daemon configuration: `policy[+own-sms|+co-locate][+no-ahead|+ahead][+no-refill|+refill-always][+in-process][+sockets][+sim]`:
/// the daemon co-locates launches by default (a launch's share of the SMs
/// becomes that share of every SM its priority level may use), or gives a
/// pair of kernels SMs of their own where that measured better; `+own-sms`
/// serves `cuda:N,own-sms` instead (each launch on SMs of its own),
/// `+co-locate` `cuda:N,co-locate` (always co-located);
/// `+no-ahead` serves `cuda:N,no-queue-ahead` (a stream's next kernel is
/// not queued on the GPU behind the running one; `+ahead`: it is, as by
/// default); `+no-refill` serves `cuda:N,no-refill` (a launch given back SMs
/// it cannot go on in drains and restarts instead of being refilled),
/// `+refill-always` `cuda:N,refill-always` (refilled whenever it is given
/// back SMs its workers had left); `+hw-priority` `cuda:N,hw-priority` (a
/// launch alone at its priority runs natively, the hardware ordering the
/// priorities: the default under PPQ policies) and `+no-hw-priority`;
/// `+in-process` runs the device in the daemon's process
/// (`--device-in-process`) instead of a child; `+sockets` keeps the clients'
/// conversations on the socket (`GPUMUX_RINGS=0`: no shared-memory rings);
/// `+sim` serves the simulated
/// H100 instead of the GPU (the request path without a device: the
/// overhead experiment's breakdown).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct DaemonConfig {
    policy: String,
    own_sms: bool,
    /// Always co-located (`cuda:N,co-locate`), not chosen per pair.
    co_locate: bool,
    /// Queue ahead asked for explicitly (`None`: the daemon's default).
    ahead: Option<bool>,
    /// Refills asked for (`cuda:N,no-refill`, `cuda:N,refill-always`; `None`: the default).
    refill: Option<&'static str>,
    /// Launches alone at their priority run natively (`cuda:N,hw-priority`,
    /// `cuda:N,no-hw-priority`; `None`: the daemon's default for its policy).
    hw_priority: Option<bool>,
    in_process: bool,
    /// The clients keep to the socket (no rings).
    sockets: bool,
    sim: bool,
}

impl DaemonConfig {
    /// A configuration as the bench's options name it (`policy[+option]...`),
    /// its policy checked here: an unknown one would otherwise stop the bench
    /// only when its daemon starts, after minutes of baselines on a GPU.
    fn parse(s: &str) -> Result<DaemonConfig> {
        let mut parts = s.trim().split('+');
        let policy = parts.next().unwrap_or_default().trim().to_owned();
        if policy.is_empty() {
            bail!(
                "bad daemon configuration `{s}`: it names no policy (e.g. `ppq-even-drain`, `ppq-even-drain+own-sms`)"
            );
        }
        if let Err(e) = gpumux_engine::policies::by_name(&policy) {
            bail!("bad daemon configuration `{s}`: {e}");
        }
        let mut c = DaemonConfig {
            policy,
            own_sms: false,
            co_locate: false,
            ahead: None,
            refill: None,
            hw_priority: None,
            in_process: false,
            sockets: false,
            sim: false,
        };
        for p in parts {
            match p.trim() {
                "in-process" => c.in_process = true,
                "sockets" => c.sockets = true,
                "own-sms" => c.own_sms = true,
                "ahead" => c.ahead = Some(true),
                "no-ahead" => c.ahead = Some(false),
                "co-locate" => c.co_locate = true,
                "sim" => c.sim = true,
                "no-refill" => c.refill = Some("no-refill"),
                "refill-always" => c.refill = Some("refill-always"),
                "hw-priority" => c.hw_priority = Some(true),
                "no-hw-priority" => c.hw_priority = Some(false),
                other => {
                    bail!("bad daemon configuration `{s}`: unknown `+{other}` (known: +own-sms, +co-locate, +no-ahead, +ahead, +no-refill, +refill-always, +hw-priority, +no-hw-priority, +in-process, +sockets, +sim)")
                }
            }
        }
        Ok(c)
    }
    fn label(&self) -> String {
        let mut l = format!("gpumux {}", self.policy);
        if self.own_sms {
            l += ", own SMs";
        }
        if self.co_locate {
            l += ", always co-located";
        }
        match self.ahead {
            Some(true) => l += ", queue ahead",
            Some(false) => l += ", no queue ahead",
            None => {}
        }
        match self.refill {
            Some("no-refill") => l += ", no refill",
            Some(_) => l += ", refill always",
            None => {}
        }
        match self.hw_priority {
            Some(true) => l += ", hardware priority",
            Some(false) => l += ", no hardware priority",
            None => {}
        }
        if self.in_process {
            l += ", device in-process";
        }
        if self.sockets {
            l += ", clients on sockets";
        }
        if self.sim {
            l += ", simulated device";
        }
        l
    }
    fn with(&self, in_process: bool, sim: bool) -> DaemonConfig {
        DaemonConfig { in_process, sim, ..self.clone() }
    }
    fn on_sockets(&self) -> DaemonConfig {
        DaemonConfig { sockets: true, ..self.clone() }
    }
}

/// The shapes the plans need: SMs, and resident `spin` blocks per SM.
#[derive(Clone, Copy, Debug)]
struct Shape {
    sms: u32,
    per_sm: u32,
}

/// What a priority setting returned, before the figures.
struct PriorityRaw {
    urgent: Vec<u64>,
    fill_rate: Option<f64>,
    ok: bool,
}

fn urgent_of(r: &JobResult) -> Option<(&[u64], bool)> {
    match r {
        JobResult::Urgent { turnaround_ns, blocks_done, blocks_launched } => {
            Some((turnaround_ns, blocks_done == blocks_launched))
        }
        _ => None,
    }
}

fn fill_of(r: &JobResult) -> Option<(f64, bool)> {
    match r {
        JobResult::Fill { blocks_per_s, blocks_done, blocks_launched, .. } => {
            Some((*blocks_per_s, blocks_done == blocks_launched))
        }
        _ => None,
    }
}

fn priority_raw(results: &[Vec<JobResult>]) -> PriorityRaw {
    let mut raw = PriorityRaw { urgent: Vec::new(), fill_rate: None, ok: true };
    for r in results.iter().flatten() {
        if let Some((t, ok)) = urgent_of(r) {
            raw.urgent.extend_from_slice(t);
            raw.ok &= ok;
        }
        if let Some((rate, ok)) = fill_of(r) {
            raw.fill_rate = Some(rate);
            raw.ok &= ok;
        }
    }
    raw
}

fn loop_of(r: &JobResult) -> Result<(u64, u64)> {
    match r {
        JobResult::Loop { elapsed_ns, checksum } => Ok((*elapsed_ns, *checksum)),
        other => bail!("expected a loop result, got {other:?}"),
    }
}

/// The experiments `--only` may name.
const EXPERIMENTS: [&str; 6] = ["priority", "corun", "overhead", "programs", "copy-beside", "multi-gpu"];

impl Bench {
    fn wants(&self, experiment: &str) -> bool {
        self.args.only.iter().any(|o| o.trim() == experiment)
    }

    fn env(&self, socket: Option<PathBuf>, vars: &[(String, String)]) -> Env {
        Env { socket, vars: vars.to_vec(), ordinal: self.ordinal.unwrap_or(0) }
    }

    fn say(&self, what: &str) {
        eprintln!("[bench daemon] {what}");
    }

    fn setting(
        &self,
        label: &str,
        plans: &[ProcPlan],
        env: &Env,
        stop_after: Option<Duration>,
    ) -> Result<Vec<Vec<JobResult>>> {
        self.say(label);
        run_setting(&self.exe, plans, env, stop_after).with_context(|| format!("setting `{label}`"))
    }

    fn start_daemon(&self, c: &DaemonConfig) -> Result<Daemon> {
        self.start_daemon_on(c, &self.device, "")
    }

    /// A daemon of configuration `c` serving `base` (one GPU or several),
    /// its log named after `c` and `tag`.
    fn start_daemon_on(&self, c: &DaemonConfig, base: &str, tag: &str) -> Result<Daemon> {
        self.start_daemon_with(c, base, tag, &[])
    }

    /// [`Bench::start_daemon_on`] with `more` arguments for the daemon.
    fn start_daemon_with(&self, c: &DaemonConfig, base: &str, tag: &str, more: &[String]) -> Result<Daemon> {
        let mut extra: Vec<String> = self.args.daemon_args.split_whitespace().map(str::to_owned).collect();
        extra.extend(more.iter().cloned());
        if c.in_process && !c.sim && self.ordinal.is_some() {
            extra.push("--device-in-process".into());
        }
        let mut device = if c.sim { "sim:h100".to_owned() } else { base.to_owned() };
        if !c.sim && self.ordinal.is_some() {
            if c.own_sms {
                device += ",own-sms";
            }
            if c.co_locate {
                device += ",co-locate";
            }
            match c.ahead {
                Some(true) => device += ",queue-ahead",
                Some(false) => device += ",no-queue-ahead",
                None => {}
            }
            if let Some(r) = c.refill {
                device += ",";
                device += r;
            }
            match c.hw_priority {
                Some(true) => device += ",hw-priority",
                Some(false) => device += ",no-hw-priority",
                None => {}
            }
        }
        let name: String = format!("{}{tag}", c.label())
            .chars()
            .map(|ch| if ch.is_ascii_alphanumeric() || ch == '-' { ch } else { '_' })
            .collect();
        let log = self.args.logs.join(format!("{name}.log"));
        self.say(&format!("starting {} (log: {})", c.label(), log.display()));
        Daemon::start(&self.exe, &device, &c.policy, &extra, &self.dir, &log)
    }

    fn urgent(&self, shape: Shape, seed: u64) -> Job {
        Job::Urgent {
            launches: self.args.urgent_launches,
            blocks: shape.sms,
            spin_ns: URGENT_SPIN_NS,
            gap_us: URGENT_GAP_US,
            seed,
        }
    }

    /// Low-priority launches of about `--lp-launch-ms` (2 ms: 20 waves of 20
    /// or 100 µs blocks, 2 of 1000 µs), so a stop is seen within a few ms.
    fn fill(&self, shape: Shape, block_us: u64) -> Job {
        let ms = self.args.lp_launch_ms.max(1) as u64;
        let waves = (ms * 1000 / block_us.max(1)).clamp(2, 20 * ms) as u32;
        Job::Fill { block_us, blocks: shape.sms * shape.per_sm * waves, pause_ns: self.args.lp_pause_ns }
    }

    /// `k` daemon clients sharing the launch-rate figures' launches.
    fn rate_plans(&self, k: u32) -> Vec<ProcPlan> {
        (0..k).map(|_| ProcPlan::daemon(vec![Job::Rate { launches: (self.args.rate_launches / k).max(1) }])).collect()
    }

    fn idle_trials(&self) -> u32 {
        if self.args.quick {
            20
        } else {
            IDLE_LATENCY_TRIALS
        }
    }

    fn lp_alone_window(&self) -> Duration {
        if self.args.quick {
            Duration::from_millis(300)
        } else {
            Duration::from_secs(1)
        }
    }

    /// Runs every experiment asked for (module doc).
    pub fn run_all(&self) -> Result<Report> {
        // The arguments first: a bad one must not cost the probe's daemon or any baseline.
        if let Some(o) = self.args.only.iter().find(|o| !EXPERIMENTS.contains(&o.trim())) {
            bail!("unknown experiment `{o}` in --only (known: {})", EXPERIMENTS.join(", "));
        }
        if self.wants("multi-gpu") && self.many.is_none() {
            bail!(
                "the multi-gpu experiment needs a --device of 2 GPUs or more (cuda:0,1, cuda:all, sim:h100x2), not `{}`",
                self.device
            );
        }
        // The co-run loops alone: the co-run pairs' reference and the multi-gpu clients'.
        let loops_alone = self.wants("corun") || self.wants("multi-gpu");
        let default = DaemonConfig::parse(&self.args.policy)?;
        let priority_configs: Vec<DaemonConfig> = std::iter::once(Ok(default.clone()))
            .chain(self.args.priority_policies.iter().filter(|p| !p.trim().is_empty()).map(|p| DaemonConfig::parse(p)))
            .collect::<Result<_>>()?;
        // Empty entries are skipped (`--corun-policies ""` runs the default alone).
        let mut corun_configs: Vec<DaemonConfig> = self
            .args
            .corun_policies
            .iter()
            .filter(|p| !p.trim().is_empty())
            .map(|p| DaemonConfig::parse(p))
            .collect::<Result<_>>()?;
        if corun_configs.is_empty() {
            corun_configs.push(default.clone());
        }
        let mut report =
            Report { device: self.device.clone(), default_policy: self.args.policy.clone(), ..Report::default() };
        let shape = self.probe()?;
        let native = self.ordinal.is_some();
        if !native {
            report.notes.push(format!(
                "{} is simulated: no native, time-slicing or MPS baselines; the daemon rows show the bench works, not GPU figures",
                self.device
            ));
        }
        if self.args.lp_pause_ns != 0 && self.wants("priority") {
            report.notes.push(format!(
                "the low-priority blocks sleep {} ns between reads of the clock they spin on (--lp-pause-ns); \
                 the urgent ones busy-spin",
                self.args.lp_pause_ns
            ));
        }
        let mut configs: BTreeMap<DaemonConfig, ()> = BTreeMap::new();
        if self.wants("priority") {
            priority_configs.iter().for_each(|c| {
                configs.insert(c.clone(), ());
            });
        }
        if self.wants("corun") {
            corun_configs.iter().for_each(|c| {
                configs.insert(c.clone(), ());
            });
        }
        // The overhead's breakdown: the same daemon with its device in-process,
        // serving the simulator, and with its clients on the socket (no rings).
        let breakdown = [default.with(true, false), default.with(false, true), default.on_sockets()];
        if self.wants("programs") || self.wants("copy-beside") {
            configs.insert(default.clone(), ());
        }
        if self.wants("overhead") {
            configs.insert(default.clone(), ());
            if native {
                for c in &breakdown {
                    configs.insert(c.clone(), ());
                }
            }
        }

        // Native settings first (no other daemon running), then MPS, then each gpumuxd.
        let mut prio: BTreeMap<(u64, String), PriorityRaw> = BTreeMap::new();
        let mut lp_alone: BTreeMap<u64, f64> = BTreeMap::new();
        // The low-priority client alone through each daemon configuration.
        let mut lp_alone_daemon: BTreeMap<(u64, String), (f64, bool)> = BTreeMap::new();
        let mut corun: BTreeMap<(usize, String), Vec<(u64, u64)>> = BTreeMap::new();
        let mut alone: BTreeMap<LoopKernel, (u64, u64)> = BTreeMap::new();
        let mut solo: Vec<(LoopKernel, String, (u64, u64))> = Vec::new();
        let mut launches: BTreeMap<LoopKernel, u32> = BTreeMap::new();
        let mut overhead = OverheadReport::default();
        // Each program's rows: (program, its row), native ones first.
        let mut program_rows: Vec<(Program, ProgramRow)> = Vec::new();
        // The copy-beside runs: native ones first.
        let mut beside_rows = Vec::new();
        let kernels: Vec<LoopKernel> = {
            let mut k: Vec<LoopKernel> = PAIRS.iter().flat_map(|&(a, b)| [a, b]).collect();
            k.sort_by_key(|k| k.name());
            k.dedup();
            k
        };
        if native {
            let env = self.env(None, &[]);
            if self.wants("priority") {
                for &b in &self.args.block_us {
                    let raw = self.lp_alone(b, "low priority alone", Mode::Native, shape, &env)?;
                    lp_alone.insert(b, raw.fill_rate.unwrap_or(0.0));
                    let r = self.setting(
                        &format!("priority {b} µs: high priority alone"),
                        &[ProcPlan::native(vec![self.urgent(shape, b)])],
                        &env,
                        None,
                    )?;
                    prio.insert((b, "high priority alone".into()), priority_raw(&r));
                    for (label, together) in [("one process, 2 streams", true), ("time slicing", false)] {
                        prio.insert(
                            (b, label.into()),
                            self.priority_setting(b, label, Mode::Native, together, shape, &env)?,
                        );
                    }
                }
            }
            if loops_alone {
                for &k in &kernels {
                    let n = self.calibrate(k, Mode::Native, &env)?;
                    launches.insert(k, n);
                    let r = self.setting(
                        &format!("co-run: {} alone, {n} launches", k.name()),
                        &[ProcPlan::native(vec![Job::Loop { kernel: k, launches: n }])],
                        &env,
                        None,
                    )?;
                    alone.insert(k, loop_of(first(&r)?)?);
                }
            }
            if self.wants("corun") {
                for i in 0..PAIRS.len() {
                    for (label, together) in [("time slicing", false), ("one process, 2 streams", true)] {
                        corun.insert(
                            (i, label.into()),
                            self.corun_setting(i, label, Mode::Native, together, &launches, &env)?,
                        );
                    }
                }
            }
            if self.wants("overhead") {
                let r = self.setting(
                    "overhead: native launch + sync",
                    &[ProcPlan::native(vec![Job::Latency { trials: LATENCY_TRIALS, idle_us: 0 }])],
                    &env,
                    None,
                )?;
                let ns = latency_of(&r)?;
                overhead.native_p50_us = Some(percentile(&ns, 50.0) as f64 / 1e3);
                overhead.native_p99_us = Some(percentile(&ns, 99.0) as f64 / 1e3);
                let r = self.setting(
                    "overhead: native launch + sync, 2 ms apart",
                    &[ProcPlan::native(vec![Job::Latency { trials: self.idle_trials(), idle_us: IDLE_LATENCY_US }])],
                    &env,
                    None,
                )?;
                let ns = latency_of(&r)?;
                overhead.idle.push(LatencyRow::of(format!("native, {} ms apart", IDLE_LATENCY_US / 1000), &ns));
                let r = self.setting(
                    "overhead: native launch rate",
                    &[ProcPlan::native(vec![Job::Rate { launches: self.args.rate_launches }])],
                    &env,
                    None,
                )?;
                overhead.native_launches_per_s = Some(rate_of(&r)?);
            }
            if self.wants("programs") {
                for p in self.chosen(programs::native_programs(self.program_sizes())) {
                    let r = self.program_setting(p, "native", Mode::Native, &env)?;
                    program_rows.push((p, ProgramRow::of(p.name(), "native".into(), &r)));
                }
            }
            if self.wants("copy-beside") {
                beside_rows.extend(self.copy_beside("native", Mode::Native, &env)?);
            }
            // MPS: both clients of one private control daemon.
            if self.wants("priority") || self.wants("corun") {
                match Mps::start(&self.dir) {
                    Err(e) => report.notes.push(format!("MPS not measured: {e:#}")),
                    Ok(mps) => {
                        let env = self.env(None, mps.vars());
                        if self.wants("priority") {
                            for &b in &self.args.block_us {
                                let raw = self.priority_setting(b, "MPS", Mode::Native, false, shape, &env)?;
                                prio.insert((b, "MPS".into()), raw);
                            }
                        }
                        if self.wants("corun") {
                            for i in 0..PAIRS.len() {
                                let times = self.corun_setting(i, "MPS", Mode::Native, false, &launches, &env)?;
                                corun.insert((i, "MPS".into()), times);
                            }
                        }
                    }
                }
            }
        } else if loops_alone {
            // No native reference on a simulated device: the daemon's own
            // alone runs under the default policy stand in for it.
            let d = self.start_daemon(&default)?;
            let env = self.env(Some(d.socket.clone()), &[]);
            for &k in &kernels {
                // Three launches check the co-run pairs; the multi-gpu STP
                // needs loops long enough that their start costs weigh little.
                let n = if self.wants("multi-gpu") { self.calibrate(k, Mode::Daemon, &env)? } else { 3 };
                launches.insert(k, n);
                let r = self.setting(
                    &format!("co-run: {} alone through gpumuxd", k.name()),
                    &[ProcPlan::daemon(vec![Job::Loop { kernel: k, launches: n }])],
                    &env,
                    None,
                )?;
                alone.insert(k, loop_of(first(&r)?)?);
            }
        }

        for c in configs.keys() {
            let d = self.start_daemon(c)?;
            let no_rings = [("GPUMUX_RINGS".to_owned(), "0".to_owned())];
            let env = self.env(Some(d.socket.clone()), if c.sockets { &no_rings[..] } else { &[] });
            let label = c.label();
            if self.wants("priority") && priority_configs.contains(c) {
                for &b in &self.args.block_us {
                    let what = format!("low priority alone through {label}");
                    let raw = self.lp_alone(b, &what, Mode::Daemon, shape, &env)?;
                    if let Some(rate) = raw.fill_rate {
                        lp_alone_daemon.insert((b, label.clone()), (rate, raw.ok));
                    }
                    prio.insert(
                        (b, label.clone()),
                        self.priority_setting(b, &label, Mode::Daemon, false, shape, &env)?,
                    );
                }
            }
            if self.wants("corun") && corun_configs.contains(c) {
                for i in 0..PAIRS.len() {
                    corun.insert(
                        (i, label.clone()),
                        self.corun_setting(i, &label, Mode::Daemon, false, &launches, &env)?,
                    );
                }
                // The default policy's kernels alone: what the daemon costs each
                // with nobody to share with (on a simulated device the alone
                // times are the daemon's own already).
                if native && c.policy == default.policy {
                    for &k in &kernels {
                        let n = launches.get(&k).copied().unwrap_or(1);
                        let r = self.setting(
                            &format!("co-run: {} alone through {label}, {n} launches", k.name()),
                            &[ProcPlan::daemon(vec![Job::Loop { kernel: k, launches: n }])],
                            &env,
                            None,
                        )?;
                        solo.push((k, label.clone(), loop_of(first(&r)?)?));
                    }
                }
            }
            if self.wants("overhead") && breakdown.contains(c) {
                let r = self.setting(
                    &format!("overhead: launch + sync through {label}"),
                    &[ProcPlan::daemon(vec![Job::Latency { trials: LATENCY_TRIALS, idle_us: 0 }])],
                    &env,
                    None,
                )?;
                let ns = latency_of(&r)?;
                overhead.breakdown.push(LatencyRow::of(label.clone(), &ns));
                // As many clients as the most the launch-rate figures ask for.
                let k = self.args.rate_clients.iter().copied().max().unwrap_or(8).max(1);
                let r = self.setting(
                    &format!("overhead: launch rate, {k} clients of {label}"),
                    &self.rate_plans(k),
                    &env,
                    None,
                )?;
                overhead.breakdown_rates.push((label.clone(), k, rate_of(&r)?));
            }
            if self.wants("programs") && *c == default {
                for p in self.chosen(programs::daemon_programs(self.program_sizes())) {
                    let r = self.program_setting(p, &label, Mode::Daemon, &env)?;
                    program_rows.push((p, ProgramRow::of(p.name(), label.clone(), &r)));
                }
            }
            if self.wants("copy-beside") && *c == default {
                beside_rows.extend(self.copy_beside(&label, Mode::Daemon, &env)?);
            }
            if self.wants("overhead") && *c == default {
                let r = self.setting(
                    &format!("overhead: launch + sync through {label}"),
                    &[ProcPlan::daemon(vec![Job::Latency { trials: LATENCY_TRIALS, idle_us: 0 }])],
                    &env,
                    None,
                )?;
                let ns = latency_of(&r)?;
                overhead.daemon_p50_us = percentile(&ns, 50.0) as f64 / 1e3;
                overhead.daemon_p99_us = percentile(&ns, 99.0) as f64 / 1e3;
                let r = self.setting(
                    &format!("overhead: launch + sync through {label}, 2 ms apart"),
                    &[ProcPlan::daemon(vec![Job::Latency { trials: self.idle_trials(), idle_us: IDLE_LATENCY_US }])],
                    &env,
                    None,
                )?;
                let ns = latency_of(&r)?;
                overhead.idle.push(LatencyRow::of(format!("gpumuxd, {} ms apart", IDLE_LATENCY_US / 1000), &ns));
                for &k in &self.args.rate_clients {
                    let plans = self.rate_plans(k);
                    let r =
                        self.setting(&format!("overhead: launch rate, {k} clients of {label}"), &plans, &env, None)?;
                    overhead.daemon_launches_per_s.push((k, rate_of(&r)?));
                }
            }
        }
        if self.wants("multi-gpu") {
            report.multi_gpu = Some(self.multi_gpu(&default, &launches, &alone)?);
        }

        // Figures.
        for ((b, setting), raw) in &prio {
            let alone = lp_alone.get(b).copied();
            let streams = prio.get(&(*b, "one process, 2 streams".to_owned())).and_then(|r| r.fill_rate);
            let share = match (raw.fill_rate, alone) {
                (Some(r), Some(a)) if a > 0.0 => Some(r / a),
                _ => None,
            };
            let vs_streams = match (raw.fill_rate, streams) {
                (Some(r), Some(s)) if s > 0.0 => Some(r / s),
                _ => None,
            };
            let own_alone = lp_alone_daemon.get(&(*b, setting.clone())).copied();
            let alone_ok = own_alone.is_none_or(|(_, ok)| ok);
            report.priority.push(PriorityRow {
                block_us: *b,
                setting: setting.clone(),
                hp_p50_us: percentile(&raw.urgent, 50.0) as f64 / 1e3,
                hp_p99_us: percentile(&raw.urgent, 99.0) as f64 / 1e3,
                hp_max_us: percentile(&raw.urgent, 100.0) as f64 / 1e3,
                lp_blocks_per_s: raw.fill_rate,
                lp_share_of_alone: share,
                lp_vs_streams: vs_streams,
                lp_alone_share: match (own_alone, alone) {
                    (Some((r, _)), Some(a)) if a > 0.0 => Some(r / a),
                    _ => None,
                },
                no_work_lost: native.then_some(raw.ok && alone_ok),
            });
        }
        for ((i, setting), times) in &corun {
            let (a, b) = PAIRS[*i];
            let mut ntt = Vec::new();
            let mut equal = true;
            for (k, (t, sum)) in [a, b].iter().zip(times) {
                let (ta, sa) = alone.get(k).copied().unwrap_or((0, 0));
                ntt.push(if ta > 0 { *t as f64 / ta as f64 } else { f64::NAN });
                equal &= *sum == sa;
            }
            let (stp, fairness) = stp_fairness(&ntt);
            report.corun.push(CorunRow {
                pair: format!("{}+{}", a.name(), b.name()),
                setting: setting.clone(),
                ntt,
                stp,
                fairness,
                outputs_equal: equal,
            });
        }
        for (k, setting, (t, sum)) in solo {
            let (ta, sa) = alone.get(&k).copied().unwrap_or((0, 0));
            report.solo.push(SoloRow {
                kernel: k.name().into(),
                setting,
                slowdown: if ta > 0 { t as f64 / ta as f64 } else { f64::NAN },
                output_equal: sum == sa,
            });
        }
        for (p, _) in &program_rows {
            let l = p.describe();
            if !report.program_legend.contains(&l) {
                report.program_legend.push(l);
            }
        }
        report.programs = program_figures(program_rows);
        if self.wants("copy-beside") {
            report.copy_beside = Some(copy_beside::CopyBesideReport {
                bytes: self.args.program_copy_mib << 20,
                rounds: self.args.copy_beside_rounds,
                goal: copy_beside::GOAL,
                rows: beside_rows,
            });
        }
        if self.wants("overhead") {
            overhead.added_p50_us = overhead.native_p50_us.map(|n| overhead.daemon_p50_us - n);
            overhead.added_p99_us = overhead.native_p99_us.map(|n| overhead.daemon_p99_us - n);
            report.overhead = Some(overhead);
        }
        Ok(report)
    }

    /// One priority setting: the urgent and the filling job, in one
    /// process (`together`) or in two of `mode`.
    fn priority_setting(
        &self,
        b: u64,
        label: &str,
        mode: Mode,
        together: bool,
        shape: Shape,
        env: &Env,
    ) -> Result<PriorityRaw> {
        let (urgent, fill) = (self.urgent(shape, b), self.fill(shape, b));
        let plans = if together {
            vec![ProcPlan { mode, jobs: vec![urgent, fill], vars: Vec::new() }]
        } else {
            vec![
                ProcPlan { mode, jobs: vec![urgent], vars: Vec::new() },
                ProcPlan { mode, jobs: vec![fill], vars: Vec::new() },
            ]
        };
        let r = self.setting(&format!("priority {b} µs: {label}"), &plans, env, None)?;
        Ok(priority_raw(&r))
    }

    /// The low-priority client of block size `b` alone for the alone window, in `mode`.
    fn lp_alone(&self, b: u64, label: &str, mode: Mode, shape: Shape, env: &Env) -> Result<PriorityRaw> {
        let plans = [ProcPlan { mode, jobs: vec![self.fill(shape, b)], vars: Vec::new() }];
        let r = self.setting(&format!("priority {b} µs: {label}"), &plans, env, Some(self.lp_alone_window()))?;
        Ok(priority_raw(&r))
    }

    /// One co-run setting of pair `i`: its two loops in one process
    /// (`together`) or in two of `mode`; (elapsed, checksum) of each.
    fn corun_setting(
        &self,
        i: usize,
        label: &str,
        mode: Mode,
        together: bool,
        launches: &BTreeMap<LoopKernel, u32>,
        env: &Env,
    ) -> Result<Vec<(u64, u64)>> {
        let (a, b) = PAIRS[i];
        let (ja, jb) = (self.loop_job(a, launches), self.loop_job(b, launches));
        let plans = if together {
            vec![ProcPlan { mode, jobs: vec![ja, jb], vars: Vec::new() }]
        } else {
            vec![
                ProcPlan { mode, jobs: vec![ja], vars: Vec::new() },
                ProcPlan { mode, jobs: vec![jb], vars: Vec::new() },
            ]
        };
        let r = self.setting(&format!("co-run {}+{}: {label}", a.name(), b.name()), &plans, env, None)?;
        loops(&r)
    }

    /// Launches of `k` that run about `--corun-seconds` alone in `mode`, from 20 timed ones.
    fn calibrate(&self, k: LoopKernel, mode: Mode, env: &Env) -> Result<u32> {
        let cal = 20;
        let r = self.setting(
            &format!("co-run: calibrating {}", k.name()),
            &[ProcPlan { mode, jobs: vec![Job::Loop { kernel: k, launches: cal }], vars: Vec::new() }],
            env,
            None,
        )?;
        let (ns, _) = loop_of(first(&r)?)?;
        Ok(((self.args.corun_seconds * 1e9 / (ns.max(1) as f64 / cal as f64)).round() as u32).max(1))
    }

    fn loop_job(&self, k: LoopKernel, launches: &BTreeMap<LoopKernel, u32>) -> Job {
        Job::Loop { kernel: k, launches: launches.get(&k).copied().unwrap_or(1) }
    }

    /// Those of `all` that `--programs` names.
    fn chosen(&self, all: Vec<Program>) -> Vec<Program> {
        all.into_iter().filter(|p| self.args.programs.contains(&p.kind())).collect()
    }

    /// The programs' sizes (`--quick`, `--program-copy-mib`).
    fn program_sizes(&self) -> programs::Sizes {
        programs::Sizes::new(self.args.quick, self.args.program_copy_mib)
    }

    /// One program alone in one process of `mode`, `--program-reps` times.
    fn program_setting(&self, p: Program, label: &str, mode: Mode, env: &Env) -> Result<ProgramResult> {
        let job = Job::Program { program: p, reps: self.args.program_reps };
        let r = self.setting(
            &format!("programs: {} through {label}", p.name()),
            &[ProcPlan { mode, jobs: vec![job], vars: Vec::new() }],
            env,
            None,
        )?;
        match first(&r)? {
            JobResult::Program(r) => Ok(r.clone()),
            other => bail!("expected a program result, got {other:?}"),
        }
    }

    /// SMs and resident `spin` blocks per SM, asked of a role process (the
    /// bench itself never opens the GPU: a context held here would sit beside
    /// the MPS clients). On a simulated device, a daemon's.
    fn probe(&self) -> Result<Shape> {
        let r = match self.ordinal {
            Some(_) => self.setting("probe", &[ProcPlan::native(vec![Job::Probe])], &self.env(None, &[]), None)?,
            None => {
                let d = self.start_daemon(&DaemonConfig::parse(&self.args.policy)?)?;
                self.setting(
                    "probe",
                    &[ProcPlan::daemon(vec![Job::Probe])],
                    &self.env(Some(d.socket.clone()), &[]),
                    None,
                )?
            }
        };
        match first(&r)? {
            JobResult::Probe { sms, per_sm } => {
                self.say(&format!("{sms} SMs, {per_sm} spin blocks of 256 threads per SM"));
                Ok(Shape { sms: *sms, per_sm: *per_sm })
            }
            other => bail!("expected a probe result, got {other:?}"),
        }
    }
}

fn first(r: &[Vec<JobResult>]) -> Result<&JobResult> {
    r.first().and_then(|p| p.first()).context("a role returned no result")
}

/// (elapsed, checksum) of each process's loop job, in plan order (one
/// process with two jobs counts as two).
fn loops(r: &[Vec<JobResult>]) -> Result<Vec<(u64, u64)>> {
    r.iter().flatten().map(loop_of).collect()
}

/// The programs table's rows in order (each program's native row, then
/// its daemon rows; the copy's kinds of host memory after one another),
/// each daemon row with its ratio to the native row of the same program
/// (for a copy, the same kind of host memory).
fn program_figures(mut rows: Vec<(Program, ProgramRow)>) -> Vec<ProgramRow> {
    let native: BTreeMap<Program, f64> =
        rows.iter().filter(|(_, r)| r.setting == "native").map(|(p, r)| (*p, r.median_ms)).collect();
    for (p, r) in rows.iter_mut().filter(|(_, r)| r.setting != "native") {
        r.vs_native = native.get(p).filter(|&&n| n > 0.0).map(|n| r.median_ms / n);
    }
    rows.sort_by_key(|(p, r)| (*p, r.setting != "native"));
    rows.into_iter().map(|(_, r)| r).collect()
}

fn latency_of(r: &[Vec<JobResult>]) -> Result<Vec<u64>> {
    match first(r)? {
        JobResult::Latency { ns } => Ok(ns.clone()),
        other => bail!("expected a latency result, got {other:?}"),
    }
}

/// Aggregate launches per second: all launches over the span from the
/// first process's start to the last one's end.
fn rate_of(r: &[Vec<JobResult>]) -> Result<f64> {
    let (mut lo, mut hi, mut n) = (u64::MAX, 0u64, 0u64);
    for j in r.iter().flatten() {
        match j {
            JobResult::Rate { start_ns, end_ns, launches } => {
                lo = lo.min(*start_ns);
                hi = hi.max(*end_ns);
                n += launches;
            }
            other => bail!("expected a rate result, got {other:?}"),
        }
    }
    if hi <= lo {
        bail!("no launch-rate span measured");
    }
    Ok(n as f64 / ((hi - lo) as f64 / 1e9))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_configurations_parse_with_their_variants_and_bad_ones_say_why() {
        let c = DaemonConfig::parse("spatial-even+own-sms+in-process").unwrap();
        assert_eq!((c.policy.as_str(), c.own_sms, c.in_process, c.sim), ("spatial-even", true, true, false));
        assert_eq!(c.label(), "gpumux spatial-even, own SMs, device in-process");
        let c = DaemonConfig::parse("ppq-even-drain+no-ahead").unwrap();
        assert!(c.ahead == Some(false) && !c.own_sms && c.label().ends_with(", no queue ahead"));
        let c = DaemonConfig::parse("ppq-even-drain+own-sms+ahead").unwrap();
        assert!(c.ahead == Some(true) && c.own_sms && c.label().ends_with(", queue ahead"));
        let c = DaemonConfig::parse("ppq-even-drain+co-locate+sockets").unwrap();
        assert!(c.co_locate && c.sockets && c.label().ends_with(", always co-located, clients on sockets"));
        assert_eq!(
            DaemonConfig::parse("ppq-even-drain+no-refill").unwrap().label(),
            "gpumux ppq-even-drain, no refill"
        );
        let always = DaemonConfig::parse("ppq-even-drain+refill-always").unwrap();
        assert_eq!(always.label(), "gpumux ppq-even-drain, refill always");
        assert_eq!(DaemonConfig::parse(" fcfs ").unwrap().label(), "gpumux fcfs");
        let e = DaemonConfig::parse("fcfs+fast").unwrap_err().to_string();
        assert!(e.contains("unknown `+fast`"), "{e}");
    }

    #[test]
    fn program_rows_go_native_first_and_daemon_rows_compare_with_the_same_programs_native_row() {
        use super::super::gpu::HostMemory;
        use super::super::programs::{Check, ProgramResult};
        let row = |p: Program, setting: &str, ms: u64| {
            let r = ProgramResult {
                total_ns: vec![ms * 1_000_000],
                upload_ns: vec![],
                download_ns: vec![],
                bytes: 0,
                check: Check::Ok,
            };
            (p, ProgramRow::of(p.name(), setting.into(), &r))
        };
        let (pageable, pinned) = (
            Program::Copy { host: HostMemory::Pageable, bytes: 8 },
            Program::Copy { host: HostMemory::Pinned, bytes: 8 },
        );
        let rows = program_figures(vec![
            row(Program::Chain { tiles: 2 }, "native", 3),
            row(pageable, "native", 40),
            row(pinned, "native", 20),
            row(Program::Chain { tiles: 2 }, "gpumux x", 9),
            row(pageable, "gpumux x", 50),
        ]);
        let got: Vec<(String, String, Option<f64>)> =
            rows.iter().map(|r| (r.program.clone(), r.setting.clone(), r.vs_native)).collect();
        let want = [
            ("chain", "native", None),
            ("chain", "gpumux x", Some(3.0)),
            ("copy, pageable", "native", None),
            ("copy, pageable", "gpumux x", Some(1.25)),
            ("copy, pinned", "native", None),
        ];
        assert_eq!(got, want.map(|(p, s, v)| (p.to_owned(), s.to_owned(), v)));
        // Without a native row (a simulated device) there is no ratio.
        assert_eq!(program_figures(vec![row(Program::Chain { tiles: 2 }, "gpumux x", 9)])[0].vs_native, None);
    }

    #[test]
    fn aggregate_launch_rate_spans_the_first_start_to_the_last_end() {
        let r = vec![
            vec![JobResult::Rate { start_ns: 1_000, end_ns: 1_000_001_000, launches: 1000 }],
            vec![JobResult::Rate { start_ns: 500_001_000, end_ns: 2_000_001_000, launches: 2000 }],
        ];
        assert!((rate_of(&r).unwrap() - 1500.0).abs() < 1e-9);
        assert!(rate_of(&[vec![JobResult::Latency { ns: vec![1] }]]).is_err());
    }
}
