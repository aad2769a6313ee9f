//! `gpumux-cuda-check links`: the links the simulator models (issue 38,
//! item 5; docs/multi-gpu.md, "The simulated links"), timed on the GPUs.
//!
//! Peer copies between GPUs 0 and 1 both ways, and copies between pinned
//! host memory and each of them both ways, at sizes from 4 KiB to 1 GiB
//! (medians of `--reps`). Each link gets the simulator's model fitted to it
//! (`gpumux_sim::links::Link::fit`: the latency and bandwidth of the line
//! through its smallest and largest copies), and every size is shown beside
//! that model's time and the preset's (what `sim:h200x2` uses today), with
//! their errors: how close the model is.

use crate::median;
use gpumux_cuda::split::links::{time_host_copies, time_peer_copies};
use gpumux_cuda::split::{LinkKind, SplitGpus};
use gpumux_sim::links::{End, Link, Links};
use serde::Serialize;

/// The copy sizes timed, bytes.
pub const SIZES: [u64; 6] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30];

/// One link at one size.
#[derive(Clone, Debug, Serialize)]
pub struct LinkRow {
    /// `peer 0->1`, `host->0`, `0->host`.
    pub link: String,
    /// The copy's size.
    pub bytes: u64,
    /// Median measured, µs.
    pub measured_us: f64,
    /// The model fitted to this link, µs.
    pub fitted_us: f64,
    /// The preset's model, µs.
    pub preset_us: f64,
}

/// One link's fitted model against the preset's.
#[derive(Clone, Debug, Serialize)]
pub struct LinkFit {
    /// `peer 0->1`, `host->0`, `0->host`.
    pub link: String,
    /// The fitted model's latency, µs.
    pub latency_us: f64,
    /// The fitted model's bandwidth, GB/s.
    pub bandwidth_gb_s: f64,
    /// The preset's latency for this link, µs.
    pub preset_latency_us: f64,
    /// The preset's bandwidth, GB/s.
    pub preset_bandwidth_gb_s: f64,
    /// Largest |fitted model - measured| / measured over the sizes.
    pub max_error_fitted: f64,
    /// The same for the preset's model.
    pub max_error_preset: f64,
}

/// What `links` measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LinksReport {
    /// GPUs 0 and 1, in words.
    pub gpus: Vec<String>,
    /// How GPU 0 reaches GPU 1 (`Peer`: peer access enabled).
    pub peer: Option<LinkKind>,
    /// The preset compared with (`sim:h200`).
    pub preset: String,
    /// Every link at every size.
    pub rows: Vec<LinkRow>,
    /// Each link's fitted model.
    pub fits: Vec<LinkFit>,
}

/// The link between `from` and `to` in the preset's model.
fn preset_link(links: &Links, from: End, to: End) -> Option<Link> {
    match (from, to) {
        // No peer link: staged through the host, two host hops in turn (the same
        // time as `Links::copy_ns`, as one link of twice the latency and half the rate).
        (End::Gpu(a), End::Gpu(_)) => links.peer.or_else(|| {
            let h = links.host.get(a)?;
            Some(Link { latency_ns: 2 * h.latency_ns, bandwidth: h.bandwidth / 2.0 })
        }),
        (End::Host, End::Gpu(g)) | (End::Gpu(g), End::Host) => links.host.get(g).copied(),
        _ => None,
    }
}

/// Times the links of GPUs 0 and 1 (module doc); `reps` copies per size.
pub fn links(reps: u32) -> anyhow::Result<LinksReport> {
    let seen = gpumux_cuda::runtime::gpu_count().max(0);
    if seen < 2 {
        anyhow::bail!("the links check needs 2 GPUs; the driver sees {seen}");
    }
    let gpus = SplitGpus::open(&[0, 1])?;
    let mut rep = LinksReport { peer: gpus.links().get(1).copied(), ..Default::default() };
    for i in 0..gpus.len() {
        if let Some(g) = gpus.gpu(i) {
            rep.gpus.push(format!("{} ({} SMs)", g.summary.name, g.sm_count()));
        }
    }
    let name = rep.gpus.first().cloned().unwrap_or_default();
    let preset_name = if name.contains("H200") { "h200" } else { "h100" };
    let info = gpumux_sim::presets::by_name(preset_name)
        .ok_or_else(|| anyhow::anyhow!("no simulator preset `{preset_name}`"))?;
    rep.preset = format!("sim:{preset_name}");
    let model = Links::of_preset(&info, 2);
    println!("links of GPUs 0 and 1: {}; GPU 0 reaches GPU 1 by {:?}", rep.gpus.join(", "), rep.peer);
    let ends = [
        (End::Gpu(0), End::Gpu(1)),
        (End::Gpu(1), End::Gpu(0)),
        (End::Host, End::Gpu(0)),
        (End::Gpu(0), End::Host),
        (End::Host, End::Gpu(1)),
        (End::Gpu(1), End::Host),
    ];
    let show = |e: End| match e {
        End::Host => "host".to_string(),
        End::Gpu(g) => g.to_string(),
    };
    for (from, to) in ends {
        let link = match (from, to) {
            (End::Gpu(a), End::Gpu(b)) => format!("peer {a}->{b}"),
            _ => format!("{}->{}", show(from), show(to)),
        };
        let mut points = Vec::new();
        for &bytes in &SIZES {
            let mut ns = match (from, to) {
                (End::Gpu(a), End::Gpu(b)) => time_peer_copies(&gpus, a, b, bytes as usize, reps)?,
                (End::Host, End::Gpu(g)) => time_host_copies(&gpus, g, true, bytes as usize, reps)?,
                (End::Gpu(g), End::Host) => time_host_copies(&gpus, g, false, bytes as usize, reps)?,
                _ => continue,
            };
            points.push((bytes, median(&mut ns)));
        }
        let (Some(&small), Some(&large)) = (points.first(), points.last()) else { continue };
        let Some(fit) = Link::fit(small, large) else {
            println!("{link}: no line through {small:?} and {large:?}: not fitted");
            continue;
        };
        let preset = preset_link(&model, from, to).unwrap_or(fit);
        let (mut err_fit, mut err_preset) = (0.0f64, 0.0f64);
        for &(bytes, ns) in &points {
            let row = LinkRow {
                link: link.clone(),
                bytes,
                measured_us: ns / 1e3,
                fitted_us: fit.copy_ns(bytes) as f64 / 1e3,
                preset_us: preset.copy_ns(bytes) as f64 / 1e3,
            };
            err_fit = err_fit.max((row.fitted_us - row.measured_us).abs() / row.measured_us);
            err_preset = err_preset.max((row.preset_us - row.measured_us).abs() / row.measured_us);
            rep.rows.push(row);
        }
        rep.fits.push(LinkFit {
            link,
            latency_us: fit.latency_ns as f64 / 1e3,
            bandwidth_gb_s: fit.bandwidth / 1e9,
            preset_latency_us: preset.latency_ns as f64 / 1e3,
            preset_bandwidth_gb_s: preset.bandwidth / 1e9,
            max_error_fitted: err_fit,
            max_error_preset: err_preset,
        });
    }
    println!("\n{:<12} {:>10} {:>12} {:>12} {:>12}", "link", "bytes", "measured us", "fitted us", "preset us");
    for r in &rep.rows {
        println!("{:<12} {:>10} {:>12.1} {:>12.1} {:>12.1}", r.link, r.bytes, r.measured_us, r.fitted_us, r.preset_us);
    }
    println!(
        "\n{:<12} {:>11} {:>9} {:>16} {:>14} {:>10} {:>11}",
        "link", "latency us", "GB/s", "preset latency", "preset GB/s", "max err", "preset err"
    );
    for f in &rep.fits {
        println!(
            "{:<12} {:>11.1} {:>9.1} {:>16.1} {:>14.1} {:>9.1}% {:>10.1}%",
            f.link,
            f.latency_us,
            f.bandwidth_gb_s,
            f.preset_latency_us,
            f.preset_bandwidth_gb_s,
            100.0 * f.max_error_fitted,
            100.0 * f.max_error_preset
        );
    }
    Ok(rep)
}
