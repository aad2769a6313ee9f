//! What gpumux checks before the work, so that a mistake costs a second, not
//! a whole run: output paths (every subcommand that writes files), and for
//! `run` the policy list, kernels the device cannot hold, and suite kernels
//! no GPU can run.

use crate::devices::DeviceSpec;
use anyhow::{anyhow, bail, Context, Result};
use gpumux_engine::model::{Op, Workload};
use gpumux_engine::policies;
use std::collections::BTreeMap;
use std::path::Path;

/// The file that `flag` names can be written.
pub fn output_file(flag: &str, path: Option<&Path>) -> Result<()> {
    match path {
        Some(p) => gpumux_files::output::check_file(p).map_err(|why| anyhow!("{flag} {}: {why}", p.display())),
        None => Ok(()),
    }
}

/// The folder that `flag` names exists (it is created) and can be written.
pub fn output_dir(flag: &str, dir: Option<&Path>) -> Result<()> {
    match dir {
        Some(d) => gpumux_files::output::check_dir(d).map_err(|why| anyhow!("{flag} {}: {why}", d.display())),
        None => Ok(()),
    }
}

/// Splits `--policy`, builds each policy once to reject bad names, and
/// refuses a policy named twice (also under two spellings, `ppq-cs` and
/// `ppq-excl-cs`): it would print the same row twice.
pub fn policy_list(arg: &str) -> Result<Vec<String>> {
    let names: Vec<String> = arg.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
    if names.is_empty() {
        bail!("--policy names no policy");
    }
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    for n in &names {
        let canonical = policies::by_name(n)?.name();
        if let Some(first) = seen.insert(canonical.clone(), n) {
            let how = if first == n { String::new() } else { format!(" (as `{first}` and `{n}`)") };
            bail!("--policy names `{canonical}` twice{how}: give each policy once");
        }
    }
    Ok(names)
}

/// Every kernel fits one block on an SM of the device (the engine refuses it
/// later too, but without naming the workload or the process), and, on the
/// simulator, a warning for each suite kernel that no GPU can run.
pub fn workload(origin: &str, w: &Workload, device: &DeviceSpec) -> Result<()> {
    let info = device.info()?;
    for p in &w.processes {
        let mut warned = std::collections::HashSet::new();
        for op in &p.ops {
            let Op::Kernel(k) = op else { continue };
            info.blocks_per_sm(k).with_context(|| format!("{origin}: process {:?}", p.name))?;
            let Some(suite) = &k.suite else { continue };
            if matches!(device, DeviceSpec::Sim(..)) && warned.insert(suite.to_string()) {
                if let Err(e) = gpumux_cuda::device::SuiteTarget::resolve(suite) {
                    eprintln!(
                        "warning: {origin}: process {:?}, kernel `{}`: {e}; the simulator runs it from its \
                         description, but no GPU can",
                        p.name, k.name
                    );
                }
            }
        }
    }
    Ok(())
}
