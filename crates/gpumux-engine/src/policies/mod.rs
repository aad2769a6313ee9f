//! Scheduling policies, one file each, and a registry by name.

pub mod coop;
pub mod dss;
pub mod fcfs;
pub mod npq;
mod order;
pub mod partition;
pub mod ppq;
pub mod ppq_even;
pub mod reserve;
pub mod round_robin;
pub mod spatial;

use crate::device::Mechanism;
use crate::policy::Policy;
use crate::time::NS_PER_US;

/// The policy names `by_name` accepts, with one line each for `--help` and errors.
pub const CATALOGUE: &[(&str, &str)] = &[
    ("fcfs", "first come first served, run to completion, back-to-back (today's hardware)"),
    ("npq", "non-preemptive priority queues"),
    ("ppq-excl-cs", "preemptive priority queues, exclusive, context switch (alias ppq-cs)"),
    ("ppq-excl-drain", "preemptive priority queues, exclusive, draining (alias ppq-drain)"),
    ("ppq-excl-flush", "preemptive priority queues, exclusive, flushing (alias ppq-flush)"),
    ("ppq-shared-cs", "preemptive priority queues, low priority uses idle SMs, context switch"),
    ("ppq-shared-drain", "preemptive priority queues, low priority uses idle SMs, draining"),
    ("ppq-shared-flush", "preemptive priority queues, low priority uses idle SMs, flushing"),
    ("ppq-even-cs", "preemptive priority queues; inside a level the SMs split evenly among processes; context switch"),
    ("ppq-even-drain", "preemptive priority queues; inside a level the SMs split evenly among processes; draining"),
    ("ppq-even-flush", "preemptive priority queues; inside a level the SMs split evenly among processes; flushing"),
    ("ppq-even-drain-no-reserve", "ppq-even-drain without reserves for higher levels (to A/B them); any ppq-even-<m>-no-reserve"),
    ("dss-cs", "dynamic spatial sharing by tokens, context switch (alias dss)"),
    ("dss-drain", "dynamic spatial sharing by tokens, draining"),
    ("dss-flush", "dynamic spatial sharing by tokens, flushing"),
    ("rr", "round-robin time slices per process, 1 ms quantum; rr-<N>us sets it"),
    ("coop", "cooperative multitasking: one kernel owns the GPU until it completes; processes take turns at kernel boundaries"),
    ("spatial-even", "static spatial partition, even split of SMs among processes (Adriaens ch. 5)"),
    ("spatial-smart-even", "static spatial, even but no more SMs than a process has blocks"),
    ("spatial-packed", "static spatial, even but no more SMs than needed to hold all blocks at once"),
    ("spatial-rounds", "static spatial, fewest total rounds of blocks, none worse than even"),
    ("spatial-blocks", "static spatial, SMs proportional to blocks per kernel (Eq. 6.2)"),
    ("spatial-tpb", "static spatial, SMs proportional to threads per block"),
    ("spatial-threads", "static spatial, SMs proportional to threads per kernel"),
    ("spatial-profile", "static spatial, maximise sum of speedup^(1/N) (Eq. 6.1; predicted profile unless measured)"),
    ("spatial-fair", "static spatial, equalise predicted slowdowns"),
    ("spatial-even-dyn", "dynamic spatial: re-split among active processes on kernel arrival/finish, context switch; any spatial-<h>-dyn[-drain|-flush]"),
];

/// A policy name `by_name` cannot build: not a policy at all, or a known
/// policy with a bad parameter (then the message says what is wrong with it).
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// No policy has this name.
    #[error("unknown policy `{0}`; known: {known}", known = CATALOGUE.iter().map(|c| c.0).collect::<Vec<_>>().join(", "))]
    Unknown(String),
    /// A known policy with a bad parameter.
    #[error("bad policy `{name}`: {reason}")]
    Bad {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Longest round-robin quantum in microseconds (about 11.6 days, the longest
/// time a workload file may give); also keeps the quantum in nanoseconds far
/// from overflow.
pub const MAX_RR_QUANTUM_US: u64 = 1_000_000_000_000;

fn mechanism(s: &str) -> Option<Mechanism> {
    match s {
        "cs" => Some(Mechanism::ContextSwitch),
        "drain" => Some(Mechanism::Drain),
        "flush" => Some(Mechanism::Flush),
        _ => None,
    }
}

/// Builds a policy from its name, e.g. `ppq-shared-drain` or `rr-500us`.
pub fn by_name(name: &str) -> Result<Box<dyn Policy>, PolicyError> {
    let unknown = || PolicyError::Unknown(name.to_string());
    let bad = |reason: String| PolicyError::Bad { name: name.to_string(), reason };
    let mech = |m: &str| {
        mechanism(m).ok_or_else(|| bad(format!("unknown preemption mechanism `{m}` (known: cs, drain, flush)")))
    };
    if let Some(rest) = name.trim().strip_prefix("spatial-") {
        return spatial_by_name(rest).ok_or_else(unknown);
    }
    let parts: Vec<&str> = name.trim().split('-').collect();
    Ok(match parts.as_slice() {
        ["fcfs"] => Box::new(fcfs::Fcfs),
        ["coop"] => Box::new(coop::Coop::default()),
        ["npq"] => Box::new(npq::Npq),
        ["ppq", m] => Box::new(ppq::Ppq { mechanism: mech(m)?, exclusive: true }),
        ["ppq", "excl", m] => Box::new(ppq::Ppq { mechanism: mech(m)?, exclusive: true }),
        ["ppq", "shared", m] => Box::new(ppq::Ppq { mechanism: mech(m)?, exclusive: false }),
        ["ppq", "even", m] => Box::new(ppq_even::PpqEven::new(mech(m)?)),
        ["ppq", "even", m, "no", "reserve"] => Box::new(ppq_even::PpqEven::without_reserve(mech(m)?)),
        ["dss"] => Box::new(dss::Dss { mechanism: Mechanism::ContextSwitch }),
        ["dss", m] => Box::new(dss::Dss { mechanism: mech(m)? }),
        ["rr"] => Box::new(round_robin::RoundRobin::new(1000 * NS_PER_US)),
        ["rr", q] => Box::new(round_robin::RoundRobin::new(rr_quantum_us(q).map_err(bad)? * NS_PER_US)),
        _ => return Err(unknown()),
    })
}

/// The `<N>us` of `rr-<N>us`: a whole number of microseconds in
/// 1..=[`MAX_RR_QUANTUM_US`]; the error says which of these it is not.
fn rr_quantum_us(q: &str) -> Result<u64, String> {
    let Some(v) = q.strip_suffix("us") else {
        return Err(format!("the quantum `{q}` needs its unit, microseconds: rr-<N>us, e.g. rr-500us"));
    };
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("the quantum must be a whole number of microseconds (rr-<N>us, N >= 1), got `{v}`"));
    }
    let too_long = || format!("the quantum must be at most {MAX_RR_QUANTUM_US}us, got {v}us");
    let us: u64 = v.parse().map_err(|_| too_long())?;
    if us == 0 {
        return Err("the quantum must be at least 1us, got 0us".into());
    }
    if us > MAX_RR_QUANTUM_US {
        return Err(too_long());
    }
    Ok(us)
}

/// `<heuristic>[-dyn[-cs|-drain|-flush]]`, the part after `spatial-`.
fn spatial_by_name(rest: &str) -> Option<Box<dyn Policy>> {
    let (h, dynamic, m) = match rest.split_once("-dyn") {
        Some((h, "")) => (h, true, Mechanism::ContextSwitch),
        Some((h, m)) => (h, true, mechanism(m.strip_prefix('-')?)?),
        None => (rest, false, Mechanism::ContextSwitch),
    };
    let h = spatial::Heuristic::by_name(h)?;
    Some(Box::new(spatial::Spatial::new(h, dynamic, m)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalogued_name_builds_and_round_trips() {
        for (name, _) in CATALOGUE {
            let p = by_name(name).unwrap_or_else(|e| panic!("{e}"));
            // The canonical name parses back to the same policy.
            assert_eq!(by_name(&p.name()).map(|q| q.name()).ok(), Some(p.name()));
        }
        assert_eq!(by_name("ppq-cs").map(|p| p.name()).ok().as_deref(), Some("ppq-excl-cs"));
        assert_eq!(by_name("rr-250us").map(|p| p.name()).ok().as_deref(), Some("rr-250us"));
        assert!(by_name("ppq-excl-teleport").is_err());
        assert_eq!(by_name("ppq-even-cs-no-reserve").map(|p| p.name()).ok().as_deref(), Some("ppq-even-cs-no-reserve"));
        assert!(by_name("ppq-even-drain-no").is_err());
        assert!(by_name("rr-0us").is_err());
        assert_eq!(
            by_name(&format!("rr-{MAX_RR_QUANTUM_US}us")).map(|p| p.name()).ok(),
            Some(format!("rr-{MAX_RR_QUANTUM_US}us"))
        );
        assert!(by_name("").is_err());
        assert_eq!(by_name("spatial-fair-dyn-drain").map(|p| p.name()).ok().as_deref(), Some("spatial-fair-dyn-drain"));
        assert_eq!(by_name("spatial-rounds-dyn-cs").map(|p| p.name()).ok().as_deref(), Some("spatial-rounds-dyn"));
        assert!(by_name("spatial-nope").is_err());
        assert!(by_name("spatial-even-dyn-x").is_err());
    }
}
