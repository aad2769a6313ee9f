//! How far the GPU runs ahead of the engine (issue 35): at each poll that
//! finds kernels queued natively ahead ([`super::ahead`], "Deep"), how many
//! are still queued on the GPU and not seen ended (the GPU's own backlog: at
//! 0 it idles until the next kernel is queued), and how many it ran that the
//! engine has not launched yet (how far the engine trails). Printed as
//! min / p50 / max with the queue-ahead line when the device closes.

/// Counts above this are counted as this (the bounds keep them below:
/// `DEEP_MAX` a stream, `ENDED_WAITING_MAX` in all).
const MOST: usize = 512;

/// How many times each count was seen.
#[derive(Clone, Debug)]
struct Spread {
    seen: Vec<u64>,
}

impl Default for Spread {
    fn default() -> Spread {
        Spread { seen: vec![0; MOST + 1] }
    }
}

impl Spread {
    fn note(&mut self, n: usize) {
        self.seen[n.min(MOST)] += 1;
    }

    /// (min, p50, max) of the counts noted; `None` before any.
    fn min_p50_max(&self) -> Option<(usize, usize, usize)> {
        let total: u64 = self.seen.iter().sum();
        if total == 0 {
            return None;
        }
        let min = self.seen.iter().position(|&c| c > 0)?;
        let max = self.seen.iter().rposition(|&c| c > 0)?;
        let (mut below, half) = (0u64, total.div_ceil(2));
        let p50 = self
            .seen
            .iter()
            .position(|&c| {
                below += c;
                below >= half
            })
            .unwrap_or(max);
        Some((min, p50, max))
    }
}

/// The GPU's lead over the engine at the polls that found a run queued natively.
#[derive(Clone, Debug, Default)]
pub(super) struct Lead {
    polls: u64,
    queued: Spread,
    ended: Spread,
}

impl Lead {
    /// A poll found `queued` kernels queued natively and not seen ended, and
    /// `ended` seen ended and not launched by the engine.
    pub(super) fn note(&mut self, queued: usize, ended: usize) {
        self.polls += 1;
        self.queued.note(queued);
        self.ended.note(ended);
    }

    /// In words, for the queue-ahead line; `None` if no poll found a run.
    pub(super) fn words(&self) -> Option<String> {
        let (q, e) = (self.queued.min_p50_max()?, self.ended.min_p50_max()?);
        Some(format!(
            "at the {} polls that found kernels queued natively, min / p50 / max: {} / {} / {} still queued on the \
             GPU, {} / {} / {} run and not launched by the engine yet",
            self.polls, q.0, q.1, q.2, e.0, e.1, e.2
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_median_and_max_of_what_the_polls_saw() {
        let mut lead = Lead::default();
        assert!(lead.words().is_none(), "nothing before a poll");
        for (q, e) in [(0, 3), (4, 9), (2, 1), (9, 0), (3, 700)] {
            lead.note(q, e);
        }
        let words = lead.words().expect("five polls");
        assert!(words.starts_with("at the 5 polls"), "{words}");
        assert!(words.contains("0 / 3 / 9 still queued"), "{words}");
        // 700 counts as the most kept (512).
        assert!(words.contains("0 / 3 / 512 run and not launched"), "{words}");
    }
}
