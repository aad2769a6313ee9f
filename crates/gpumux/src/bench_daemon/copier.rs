//! The copying client of the copy-beside experiment
//! (`experiments/copy_beside.rs`): one device buffer and two host buffers
//! of a [`HostMemory`] kind; round after round, all of the first uploaded
//! and downloaded into the second, each with its sync, until told to stop.
//!
//! Each round is checked without reading the whole buffer (that would
//! leave the copy engines idle for a tenth of a second a round): before it,
//! [`SAMPLES`] words spread over the source get values of this round, and
//! the same words of the destination a value that no round writes, so a
//! lost upload or a lost download shows in the sampled words. After the
//! last round the whole destination is compared with the source.

use super::gpu::{HostMemory, JobGpu};
use super::programs::{compare, fill_hashes, hash, Check};
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Words of each round's check, spread evenly (the first and last included).
const SAMPLES: u64 = 64;
/// The source's seed, and the sampled words' (mixed with the round).
const SEED: u32 = 0x5eed_0004;
const SEED_ROUND: u32 = 0x5eed_0005;
/// What the destination's sampled words hold before a download: `hash`
/// never gives it for the sampled words' seed in the rounds a run has (and
/// a clash would only hide one round's loss, never fail a good round).
const POISON: u32 = 0xdead_beef;

/// A copier's buffers, ready to run.
pub struct Copier {
    bytes: u64,
    dev: usize,
    src: usize,
    dst: usize,
}

/// What a copier measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CopierResult {
    /// Bytes each way a round.
    pub bytes: u64,
    /// Each round's upload and download (each with its sync), ns.
    pub upload_ns: Vec<u64>,
    pub download_ns: Vec<u64>,
    /// Every round's sampled words and the last round's whole destination.
    pub check: Check,
}

/// Buffers of `bytes` (a positive multiple of 4) and host memory `host`,
/// the source filled, and one untimed round (pins pages, warms the path).
pub fn prepare(gpu: &mut dyn JobGpu, host: HostMemory, bytes: u64) -> Result<Copier> {
    if bytes == 0 || !bytes.is_multiple_of(4) {
        bail!("a copier of {bytes} bytes: expected a positive multiple of 4");
    }
    let c =
        Copier { bytes, dev: gpu.alloc(bytes)?, src: gpu.host_alloc(host, bytes)?, dst: gpu.host_alloc(host, bytes)? };
    fill_hashes(gpu.host(c.src)?, SEED);
    round(gpu, &c, u32::MAX)?;
    Ok(c)
}

/// Rounds until `stop` (at least one), each checked (module doc).
pub fn run(gpu: &mut dyn JobGpu, c: Copier, stop: &AtomicBool) -> Result<CopierResult> {
    let mut out = CopierResult { bytes: c.bytes, upload_ns: Vec::new(), download_ns: Vec::new(), check: Check::Ok };
    let mut n = 0u32;
    loop {
        let (up, down, check) = round(gpu, &c, n)?;
        out.upload_ns.push(up);
        out.download_ns.push(down);
        if let (Check::Ok, Check::Failed(why)) = (&out.check, check) {
            out.check = Check::Failed(format!("round {}: {why}", n + 1));
        }
        n += 1;
        if stop.load(Ordering::Relaxed) {
            break;
        }
    }
    if out.check == Check::Ok {
        // The whole of the last download: the source as filled, but for
        // the words the last round wrote.
        let last = n - 1;
        let words = c.bytes / 4;
        let sampled: std::collections::HashMap<u64, u32> = sample_words(words).map(|w| (w, stamp(w, last))).collect();
        let got = gpu.host(c.dst)?;
        if let Check::Failed(why) =
            compare(got, |i| Some(sampled.get(&(i as u64)).copied().unwrap_or_else(|| hash(i as u32, SEED))), 0)
        {
            out.check = Check::Failed(format!("the last round's whole download: {why}"));
        }
    }
    Ok(out)
}

/// The sampled word indices of a buffer of `words` words.
fn sample_words(words: u64) -> impl Iterator<Item = u64> {
    let n = SAMPLES.min(words);
    (0..n).map(move |k| if n > 1 { k * (words - 1) / (n - 1) } else { 0 })
}

/// Round `n`'s value of sampled word `w`.
fn stamp(w: u64, n: u32) -> u32 {
    hash(w as u32 ^ n.rotate_left(16), SEED_ROUND)
}

/// One round: stamp and poison, upload, download, the sampled words' check.
fn round(gpu: &mut dyn JobGpu, c: &Copier, n: u32) -> Result<(u64, u64, Check)> {
    let words = c.bytes / 4;
    let put = |b: &mut [u8], w: u64, v: u32| b[w as usize * 4..w as usize * 4 + 4].copy_from_slice(&v.to_le_bytes());
    let src = gpu.host(c.src)?;
    sample_words(words).for_each(|w| put(src, w, stamp(w, n)));
    let dst = gpu.host(c.dst)?;
    sample_words(words).for_each(|w| put(dst, w, POISON));
    let t0 = Instant::now();
    gpu.upload(c.dev, c.src)?;
    gpu.sync()?;
    let t1 = Instant::now();
    gpu.download_into(c.dev, c.dst)?;
    gpu.sync()?;
    let t2 = Instant::now();
    let dst = gpu.host(c.dst)?;
    let mut check = Check::Ok;
    for w in sample_words(words) {
        let i = w as usize * 4;
        let got = u32::from_le_bytes([dst[i], dst[i + 1], dst[i + 2], dst[i + 3]]);
        let want = stamp(w, n);
        if got != want {
            let what = if got == POISON { "not downloaded".to_owned() } else { format!("{got}") };
            check = Check::Failed(format!("word {w}: {what}, expected {want}"));
            break;
        }
    }
    let ns = |a: Instant, b: Instant| b.duration_since(a).as_nanos() as u64;
    Ok((ns(t0, t1), ns(t1, t2), check))
}

#[cfg(test)]
mod tests {
    use super::super::gpu::KArg;
    use super::*;
    use std::sync::Arc;

    /// Host memory standing in for a device: copies move bytes, and one
    /// upload or download (by its number, from 0) can be lost.
    #[derive(Default)]
    struct Copies {
        dev: Vec<Vec<u8>>,
        hosts: Vec<Vec<u8>>,
        lose_upload: Option<usize>,
        lose_download: Option<usize>,
        /// A word every download garbles.
        flip_word: Option<usize>,
        /// Set the flag after this many downloads.
        stop_after: Option<(usize, Arc<AtomicBool>)>,
        uploads: usize,
        downloads: usize,
    }

    impl JobGpu for Copies {
        fn alloc(&mut self, bytes: u64) -> Result<usize> {
            self.dev.push(vec![0; bytes as usize]);
            Ok(self.dev.len() - 1)
        }
        fn launch(&mut self, kernel: &str, _: [u32; 3], _: [u32; 3], _: &[KArg], _: u64) -> Result<()> {
            bail!("the copier launched {kernel}")
        }
        fn mark(&mut self) -> Result<()> {
            Ok(())
        }
        fn wait_marks(&mut self, _: usize) -> Result<()> {
            Ok(())
        }
        fn sync(&mut self) -> Result<()> {
            Ok(())
        }
        fn download(&mut self, buf: usize, bytes: u64) -> Result<Vec<u8>> {
            Ok(self.dev[buf][..bytes as usize].to_vec())
        }
        fn shape(&mut self, _: &str, _: u32) -> Result<(u32, u32)> {
            Ok((1, 1))
        }
        fn simulated(&self) -> bool {
            false
        }
        fn memset(&mut self, buf: usize, byte: u8) -> Result<()> {
            self.dev[buf].fill(byte);
            Ok(())
        }
        fn host_alloc(&mut self, _: HostMemory, bytes: u64) -> Result<usize> {
            self.hosts.push(vec![0; bytes as usize]);
            Ok(self.hosts.len() - 1)
        }
        fn host(&mut self, host: usize) -> Result<&mut [u8]> {
            Ok(&mut self.hosts[host])
        }
        fn upload(&mut self, buf: usize, host: usize) -> Result<()> {
            self.uploads += 1;
            if self.lose_upload != Some(self.uploads - 1) {
                let h = &self.hosts[host];
                self.dev[buf][..h.len()].copy_from_slice(h);
            }
            Ok(())
        }
        fn download_into(&mut self, buf: usize, host: usize) -> Result<()> {
            self.downloads += 1;
            if self.lose_download != Some(self.downloads - 1) {
                let n = self.hosts[host].len();
                self.hosts[host].copy_from_slice(&self.dev[buf][..n]);
            }
            if let Some(w) = self.flip_word {
                self.hosts[host][4 * w] ^= 0xff;
            }
            if let Some((n, stop)) = &self.stop_after {
                stop.store(self.downloads >= *n, Ordering::Relaxed);
            }
            Ok(())
        }
    }

    /// A copier on `gpu` stopped after `rounds` timed rounds (the stop is seen after each).
    fn rounds(gpu: &mut Copies, bytes: u64, rounds: usize) -> CopierResult {
        let stop = Arc::new(AtomicBool::new(false));
        // Download 0 is the warm-up's.
        gpu.stop_after = Some((rounds + 1, stop.clone()));
        let c = prepare(gpu, HostMemory::Pageable, bytes).unwrap();
        run(gpu, c, &stop).unwrap()
    }

    #[test]
    fn rounds_run_until_the_stop_each_timed_and_checked() {
        let r = rounds(&mut Copies::default(), 4096, 3);
        assert_eq!(r.check, Check::Ok);
        assert_eq!((r.bytes, r.upload_ns.len(), r.download_ns.len()), (4096, 3, 3));
        // A buffer of fewer words than samples: each word sampled once.
        assert_eq!(rounds(&mut Copies::default(), 8, 1).check, Check::Ok);
        assert_eq!(sample_words(2).collect::<Vec<_>>(), vec![0, 1]);
        let spread: Vec<u64> = sample_words(1 << 20).collect();
        assert_eq!((spread.len(), spread[0], spread[63]), (64, 0, (1 << 20) - 1));
    }

    #[test]
    fn a_lost_upload_or_download_fails_its_round_and_says_which() {
        // Upload 0 and download 0 are the warm-up's; 2 is the second timed round's.
        let r = rounds(&mut Copies { lose_download: Some(2), ..Copies::default() }, 4096, 3);
        let Check::Failed(why) = r.check else { panic!("a lost download passed") };
        assert!(why.starts_with("round 2: word 0: not downloaded, expected "), "{why}");
        let r = rounds(&mut Copies { lose_upload: Some(3), ..Copies::default() }, 4096, 4);
        let Check::Failed(why) = r.check else { panic!("a lost upload passed") };
        assert!(why.starts_with("round 3: word 0: ") && !why.contains("not downloaded"), "{why}");
        assert_eq!(r.upload_ns.len(), 4, "a failed round does not end the run");
    }

    #[test]
    fn the_last_rounds_whole_download_is_compared() {
        // A device that garbles one word between the sampled ones on every
        // download: each round's samples pass, the final comparison does not.
        let r = rounds(&mut Copies { flip_word: Some(33), ..Copies::default() }, 4096, 2);
        let Check::Failed(why) = r.check else { panic!("a garbled word passed") };
        let want = "the last round's whole download: 1 of 1024 values differ; the first at word 33: ";
        assert!(why.starts_with(want), "{why}");
        assert_eq!(r.upload_ns.len(), 2);
    }

    #[test]
    fn bad_sizes_are_refused() {
        for bytes in [0, 6] {
            let e = prepare(&mut Copies::default(), HostMemory::Pinned, bytes).err().unwrap().to_string();
            assert!(e.contains(&format!("a copier of {bytes} bytes")), "{e}");
        }
    }
}
