//! The links of a simulated machine of several GPUs (issue 38, item 5;
//! docs/multi-gpu.md, "The simulated links"): each GPU's host link (PCIe)
//! and the peer link between any two GPUs (NVLink through the board's
//! switches, so every pair is alike), each a latency and a bandwidth.
//!
//! A copy of B bytes over a link takes `latency + B / bandwidth`: the shape
//! `gpumux-cuda-check links` fits to its measured copies (the time of a
//! small copy, then the rate of a large one), so the model's parameters come
//! from that measurement and the check prints how close the model is at
//! every size it timed. Between two GPUs without a peer link the driver
//! stages the copy through host memory: the source GPU's host link, then the
//! destination's, one after the other.
//!
//! A pure model, as the rest of the simulator: nothing here waits. The
//! simulated daemon's moves between GPUs (`gpumuxd --rebalance` on
//! `sim:h100x2`) go through the host, at each GPU's host link (the preset's
//! `pcie_*`); a split in the daemon replicating and merging over the peer
//! link asks [`Links::copy_ns`] for its copies' time.

use gpumux_engine::kernel::DeviceInfo;
use gpumux_engine::time::Nanos;

/// One link: a copy over it takes `latency_ns + bytes / bandwidth`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// A copy's fixed cost (the call, the DMA's start, the completion seen), ns.
    pub latency_ns: Nanos,
    /// Bytes per second once a copy streams.
    pub bandwidth: f64,
}

impl Link {
    /// The time of a copy of `bytes` over the link, ns (rounded up).
    pub fn copy_ns(&self, bytes: u64) -> Nanos {
        if self.bandwidth <= 0.0 {
            return Nanos::MAX;
        }
        self.latency_ns.saturating_add((bytes as f64 * 1e9 / self.bandwidth).ceil() as Nanos)
    }

    /// The link through two points measured on it: the time of a copy of
    /// `small` bytes and of `large` bytes, ns. The bandwidth is the slope
    /// between them, the latency what is left of the small copy's time.
    /// `None`: the points do not make a link (sizes not increasing, or a
    /// larger copy no slower than the smaller one).
    pub fn fit(small: (u64, f64), large: (u64, f64)) -> Option<Link> {
        let ((b0, t0), (b1, t1)) = (small, large);
        if b1 <= b0 || t1 <= t0 || t0 < 0.0 {
            return None;
        }
        let bandwidth = (b1 - b0) as f64 * 1e9 / (t1 - t0);
        let latency = (t0 - b0 as f64 * 1e9 / bandwidth).max(0.0);
        Some(Link { latency_ns: latency.round() as Nanos, bandwidth })
    }
}

/// One end of a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Host memory (pinned).
    Host,
    /// GPU `i`'s memory.
    Gpu(usize),
}

/// A copy the links cannot carry.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LinkError {
    /// A GPU the machine does not have.
    #[error("no GPU {gpu}: this machine has {gpus}")]
    NoGpu {
        /// The GPU named.
        gpu: usize,
        /// How many there are.
        gpus: usize,
    },
    /// Both ends in one place: not a link's copy (a device copy runs at the
    /// GPU's own memory bandwidth; host to host is a memcpy).
    #[error("a copy from {0:?} to itself crosses no link")]
    Same(End),
}

/// The links of a machine of several GPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct Links {
    /// Each GPU's link to host memory.
    pub host: Vec<Link>,
    /// The link between any two GPUs; `None`: no peer access, copies between
    /// GPUs are staged through the host.
    pub peer: Option<Link>,
}

/// The H200 pair's peer link: NVLink 4, 18 links (`nvidia-smi topo -m`:
/// NV18). Measured by `gpumux-cuda-check links` on two H200s
/// (`nvidia-h200-x2`, 2026-11-28): 9.7-9.9 µs and 396.8-396.9 GB/s each way,
/// the model within 2.4 % of every copy from 4 KiB to 1 GiB (docs/multi-gpu.md,
/// "The simulated links").
pub const NV18: Link = Link { latency_ns: 10_000, bandwidth: 397e9 };

/// An H200's host link, pinned memory both ways, measured the same run:
/// 7.2-8.2 µs and 54.0-55.5 GB/s over the four directions of GPUs 0 and 1.
/// The H200 preset's `pcie_*` (5 µs, 55 GB/s: the vendor's figure, which
/// the simulated device's eviction uses) is left as it is; the links use this.
pub const H200_HOST: Link = Link { latency_ns: 7_500, bandwidth: 55e9 };

impl Links {
    /// `gpus` GPUs of preset `info`: each GPU's host link is the measured
    /// [`H200_HOST`] for the H200, else the preset's (`pcie_bandwidth`,
    /// `pcie_latency_ns`), and the peer link the preset's ([`peer_link`]).
    pub fn of_preset(info: &DeviceInfo, gpus: usize) -> Links {
        let host = match info.name.strip_prefix("sim:").unwrap_or(&info.name) {
            "h200" => H200_HOST,
            _ => Link { latency_ns: info.pcie_latency_ns, bandwidth: info.pcie_bandwidth },
        };
        Links { host: vec![host; gpus], peer: peer_link(info) }
    }

    /// How many GPUs.
    pub fn gpus(&self) -> usize {
        self.host.len()
    }

    fn host_of(&self, gpu: usize) -> Result<&Link, LinkError> {
        self.host.get(gpu).ok_or(LinkError::NoGpu { gpu, gpus: self.host.len() })
    }

    /// The time of a copy of `bytes` from `from` to `to`, ns: over the host
    /// link of the GPU involved; between GPUs over the peer link, or without
    /// one through the host (both GPUs' host links in turn).
    pub fn copy_ns(&self, from: End, to: End, bytes: u64) -> Result<Nanos, LinkError> {
        match (from, to) {
            (End::Host, End::Gpu(g)) | (End::Gpu(g), End::Host) => Ok(self.host_of(g)?.copy_ns(bytes)),
            (End::Gpu(a), End::Gpu(b)) if a == b => Err(LinkError::Same(from)),
            (End::Gpu(a), End::Gpu(b)) => {
                let (ha, hb) = (self.host_of(a)?, self.host_of(b)?);
                Ok(match &self.peer {
                    Some(p) => p.copy_ns(bytes),
                    None => ha.copy_ns(bytes).saturating_add(hb.copy_ns(bytes)),
                })
            }
            (End::Host, End::Host) => Err(LinkError::Same(End::Host)),
        }
    }
}

/// The peer link between two GPUs of preset `info`: the H100 and H200 SXM
/// boards' NVLink ([`NV18`]: the H100 SXM has the same 18 NVLink 4 links,
/// so the H200's measurement stands for both); none for others (the K20c's
/// peers went over PCIe: staged through the host here).
pub fn peer_link(info: &DeviceInfo) -> Option<Link> {
    match info.name.strip_prefix("sim:").unwrap_or(&info.name) {
        "h100" | "h200" => Some(NV18),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;

    #[test]
    fn a_copy_takes_the_latency_plus_the_bytes_over_the_bandwidth() {
        let l = Link { latency_ns: 10_000, bandwidth: 400e9 };
        assert_eq!(l.copy_ns(0), 10_000);
        assert_eq!(l.copy_ns(400_000_000), 10_000 + 1_000_000, "400 MB at 400 GB/s: 1 ms");
        assert_eq!(l.copy_ns(1), 10_001, "rounded up");
        // Twice the bytes: twice the streaming part, the same latency.
        assert_eq!(l.copy_ns(2 << 30) - l.latency_ns, 2 * (l.copy_ns(1 << 30) - l.latency_ns));
        assert_eq!(Link { latency_ns: 1, bandwidth: 0.0 }.copy_ns(5), Nanos::MAX);
    }

    #[test]
    fn peer_copies_follow_the_peer_link_and_without_one_go_through_the_host() {
        let h100 = presets::h100();
        let links = Links::of_preset(&h100, 2);
        let gib = 1u64 << 30;
        let peer = links.copy_ns(End::Gpu(0), End::Gpu(1), gib);
        assert_eq!(peer, Ok(NV18.copy_ns(gib)));
        assert_eq!(links.copy_ns(End::Gpu(1), End::Gpu(0), gib), peer, "both ways alike");
        let up = links.copy_ns(End::Host, End::Gpu(1), gib);
        assert_eq!(up, Ok(h100.pcie_latency_ns + (gib as f64 * 1e9 / h100.pcie_bandwidth).ceil() as Nanos));
        assert_eq!(links.copy_ns(End::Gpu(1), End::Host, gib), up);
        // NVLink is ~7x the host link: the peer copy is that much faster.
        let (p, h) = (peer.unwrap_or(0) as f64, up.unwrap_or(0) as f64);
        assert!(h / p > 6.0 && h / p < 8.0, "host {h} ns against peer {p} ns");
        // Changing the parameters changes the time as the model says.
        let faster = Links { peer: Some(Link { latency_ns: 2_000, bandwidth: 800e9 }), ..links.clone() };
        assert_eq!(faster.copy_ns(End::Gpu(0), End::Gpu(1), 800_000_000), Ok(2_000 + 1_000_000));
        // No peer link (the K20c): both host links in turn.
        let k20c = presets::k20c();
        let staged = Links::of_preset(&k20c, 2);
        assert_eq!(staged.peer, None);
        let hop = staged.host[0].copy_ns(gib);
        assert_eq!(staged.copy_ns(End::Gpu(0), End::Gpu(1), gib), Ok(2 * hop));
    }

    #[test]
    fn copies_the_links_cannot_carry_are_refused_naming_why() {
        let links = Links::of_preset(&presets::h200(), 2);
        assert_eq!(links.gpus(), 2);
        assert_eq!((links.host[1], links.peer), (H200_HOST, Some(NV18)), "the H200's measured links");
        assert_eq!(links.copy_ns(End::Gpu(0), End::Gpu(2), 1), Err(LinkError::NoGpu { gpu: 2, gpus: 2 }));
        assert_eq!(links.copy_ns(End::Host, End::Gpu(5), 1), Err(LinkError::NoGpu { gpu: 5, gpus: 2 }));
        assert_eq!(links.copy_ns(End::Gpu(1), End::Gpu(1), 1), Err(LinkError::Same(End::Gpu(1))));
        assert_eq!(links.copy_ns(End::Host, End::Host, 1), Err(LinkError::Same(End::Host)));
        let msg = LinkError::NoGpu { gpu: 2, gpus: 2 }.to_string();
        assert!(msg.contains("no GPU 2") && msg.contains("has 2"), "{msg}");
    }

    #[test]
    fn a_link_fitted_to_two_measured_copies_gives_their_times_back() {
        // 4 KiB in 12 µs, 1 GiB in 2.74 ms: the line through both.
        let (small, large) = ((4096u64, 12_000.0), (1u64 << 30, 2_740_000.0));
        let l = Link::fit(small, large).unwrap_or(Link { latency_ns: 0, bandwidth: 1.0 });
        assert!((l.copy_ns(small.0) as f64 - small.1).abs() <= 2.0, "{l:?}");
        assert!((l.copy_ns(large.0) as f64 - large.1).abs() <= 2.0, "{l:?}");
        assert!(l.bandwidth > 390e9 && l.bandwidth < 400e9, "{l:?}");
        assert_eq!(Link::fit(large, small), None, "sizes must increase");
        assert_eq!(Link::fit((1, 10.0), (2, 10.0)), None, "a larger copy no slower is no link");
    }
}
