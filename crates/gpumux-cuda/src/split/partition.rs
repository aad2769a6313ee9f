//! Which blocks of a launch each GPU runs: one contiguous range of the
//! launch's linear block index per GPU, in GPU order, sized by SM count.
//!
//! Why contiguous: a worker launch runs a range `[begin, begin + count)` of
//! the linear index ([`crate::preempt::LaunchDesc`]), so one range per GPU is
//! one worker launch per GPU, and a kernel whose blocks write consecutive
//! slices of an output ([`super::merge::BlockSlices`]) then writes one
//! contiguous slice per GPU, which is one copy to merge.

use super::SplitError;
use std::ops::Range;

/// Cuts `total` blocks into one range per GPU, the GPUs having `sms[g]` SMs.
///
/// The blocks are cut in units of `granule` blocks (the last unit may be
/// short), so that no unit is shared by two GPUs (a declared write set names
/// units: [`super::merge::BlockSlices::granule_blocks`]). GPU `g` gets
/// `⌊units × sms[g] / Σ sms⌋` units; the units left over (fewer than the
/// GPUs) go one each to the GPUs with the largest remainders, the lower
/// index first among equal ones (the home GPU, index 0, takes the first odd
/// unit between equal GPUs). Equal GPUs thus get equal shares, ±1 unit.
/// A GPU may get an empty range when there are fewer units than GPUs.
pub fn partition(total: u32, sms: &[u32], granule: u32) -> Result<Vec<Range<u32>>, SplitError> {
    if sms.is_empty() {
        return Err(SplitError::Invalid("a split over no GPU".into()));
    }
    if let Some(g) = sms.iter().position(|&s| s == 0) {
        return Err(SplitError::Invalid(format!("GPU {g} of the split has no SM")));
    }
    if granule == 0 {
        return Err(SplitError::Invalid("a block granule of 0".into()));
    }
    let units = total.div_ceil(granule) as u64;
    let sum: u64 = sms.iter().map(|&s| s as u64).sum();
    let mut share: Vec<u64> = sms.iter().map(|&s| units * s as u64 / sum).collect();
    let left = units - share.iter().sum::<u64>();
    // Largest remainder first; `sort_by_key` is stable, so ties keep GPU order.
    let mut order: Vec<usize> = (0..sms.len()).collect();
    order.sort_by_key(|&g| std::cmp::Reverse(units * sms[g] as u64 % sum));
    for &g in order.iter().take(left as usize) {
        share[g] += 1;
    }
    let mut ranges = Vec::with_capacity(sms.len());
    let mut unit = 0u64;
    for s in share {
        let lo = (unit * granule as u64).min(total as u64) as u32;
        unit += s;
        let hi = (unit * granule as u64).min(total as u64) as u32;
        ranges.push(lo..hi);
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ranges cover 0..total in order, without gap or overlap.
    fn assert_cover(r: &[Range<u32>], total: u32) {
        let mut at = 0;
        for x in r {
            assert_eq!(x.start, at, "{r:?}");
            assert!(x.end >= x.start, "{r:?}");
            at = x.end;
        }
        assert_eq!(at, total, "{r:?}");
    }

    #[test]
    fn equal_gpus_get_equal_shares() {
        let r = partition(1000, &[132, 132], 1).unwrap();
        assert_eq!(r, vec![0..500, 500..1000]);
        let r = partition(1024, &[132; 4], 1).unwrap();
        assert_eq!(r, vec![0..256, 256..512, 512..768, 768..1024]);
    }

    #[test]
    fn odd_blocks_go_to_the_lower_index_first() {
        assert_eq!(partition(5, &[132, 132], 1).unwrap(), vec![0..3, 3..5]);
        let r = partition(7, &[132; 4], 1).unwrap();
        assert_eq!(r, vec![0..2, 2..4, 4..6, 6..7]);
    }

    #[test]
    fn shares_follow_sm_counts() {
        // 100 SMs against 50: two thirds and one third.
        let r = partition(300, &[100, 50], 1).unwrap();
        assert_eq!(r, vec![0..200, 200..300]);
        // The remainder goes to the larger fraction: 10 × 100/150 = 6.67, 10 × 50/150 = 3.33.
        let r = partition(10, &[100, 50], 1).unwrap();
        assert_eq!(r, vec![0..7, 7..10]);
        // 4 units: 2.67 and 1.33; the one left over goes to the larger remainder (0.67).
        let r = partition(4, &[100, 50], 1).unwrap();
        assert_eq!(r, vec![0..3, 3..4]);
    }

    #[test]
    fn granules_are_never_shared_and_the_last_may_be_short() {
        // 10 units of 64 blocks, the last of 40: 5 units each.
        let r = partition(9 * 64 + 40, &[132, 132], 64).unwrap();
        assert_eq!(r, vec![0..320, 320..616]);
        for x in &r {
            assert_eq!(x.start % 64, 0);
        }
        for total in [1u32, 2, 3, 63, 64, 65, 1000, 4097] {
            for gpus in 1..=4usize {
                for granule in [1u32, 3, 64] {
                    let r = partition(total, &vec![132; gpus], granule).unwrap();
                    assert_eq!(r.len(), gpus);
                    assert_cover(&r, total);
                    for x in r.iter().filter(|x| !x.is_empty()) {
                        assert!(x.start % granule == 0, "{total} {gpus} {granule}: {r:?}");
                    }
                    let units =
                        |x: &Range<u32>| if x.is_empty() { 0 } else { x.end.div_ceil(granule) - x.start / granule };
                    let sizes: Vec<u32> = r.iter().map(units).collect();
                    let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                    assert!(hi - lo <= 1, "{total} {gpus} {granule}: {r:?}");
                }
            }
        }
    }

    #[test]
    fn fewer_units_than_gpus_leave_some_empty() {
        let r = partition(2, &[132; 4], 1).unwrap();
        assert_eq!(r, vec![0..1, 1..2, 2..2, 2..2]);
        assert_eq!(partition(0, &[132, 132], 1).unwrap(), vec![0..0, 0..0]);
    }

    #[test]
    fn nonsense_is_refused() {
        assert!(partition(10, &[], 1).is_err());
        assert!(partition(10, &[132, 0], 1).is_err());
        assert!(partition(10, &[132], 0).is_err());
    }
}
