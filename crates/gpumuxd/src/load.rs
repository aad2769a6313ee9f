//! Where a serving loop's time goes: for each kind of work, how often it
//! came and how long it took, against the loop's whole life. The core and
//! the device process each keep one and log it when they stop, so a run
//! says which of the two was busy all the time, and on what, without a
//! profiler (docs/daemon.md, "Where the core's and the device process's
//! time goes"). With `gpumuxd::load=debug` each also logs the shares of
//! every quarter second in which it had work: a bench that runs several
//! experiments on one daemon sees each apart.

use std::time::{Duration, Instant};

/// How often [`LoadClock::lap`] gives the last window's shares.
pub const LAP: Duration = Duration::from_millis(250);

/// Counts and times per kind of work since the loop began, and since the last lap.
#[derive(Debug)]
pub struct LoadClock {
    since: Instant,
    lap_since: Instant,
    parts: Vec<Part>,
    lap: Vec<Part>,
}

#[derive(Clone, Debug)]
struct Part {
    name: &'static str,
    count: u64,
    took: Duration,
}

impl LoadClock {
    /// A clock for the kinds of work `names` (indices into it name them in [`LoadClock::add`]).
    pub fn new(names: &[&'static str]) -> LoadClock {
        let parts: Vec<Part> = names.iter().map(|&name| Part { name, count: 0, took: Duration::ZERO }).collect();
        let now = Instant::now();
        LoadClock { since: now, lap_since: now, lap: parts.clone(), parts }
    }

    /// `count` pieces of work of kind `part` took `took` in all.
    pub fn add(&mut self, part: usize, count: u64, took: Duration) {
        for parts in [&mut self.parts, &mut self.lap] {
            if let Some(p) = parts.get_mut(part) {
                p.count += count;
                p.took += took;
            }
        }
    }

    /// The shares in words, over the time since the clock began; `None`
    /// while nothing was counted.
    pub fn summary(&self) -> Option<String> {
        summary_over(&self.parts, self.since.elapsed())
    }

    /// Once [`LAP`] has passed since the last lap: the shares of that
    /// window, if it had work (`None` otherwise, and before), and a new window.
    pub fn lap(&mut self) -> Option<String> {
        let window = self.lap_since.elapsed();
        if window < LAP {
            return None;
        }
        let words = summary_over(&self.lap, window);
        self.lap_since = Instant::now();
        for p in &mut self.lap {
            p.count = 0;
            p.took = Duration::ZERO;
        }
        words
    }
}

fn summary_over(parts: &[Part], life: Duration) -> Option<String> {
    if parts.iter().all(|p| p.count == 0) {
        return None;
    }
    let life_s = life.as_secs_f64().max(1e-9);
    let busy: Duration = parts.iter().map(|p| p.took).sum();
    let mut words = format!("busy {:.1}% of {:.1} s", 100.0 * busy.as_secs_f64() / life_s, life_s);
    for p in parts.iter().filter(|p| p.count > 0) {
        let each_us = p.took.as_secs_f64() * 1e6 / p.count as f64;
        words.push_str(&format!(
            "; {} {}: {:.1}%, {:.2} µs each",
            p.count,
            p.name,
            100.0 * p.took.as_secs_f64() / life_s,
            each_us
        ));
    }
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_of_the_loops_life_and_the_mean_of_each_kind() {
        let mut c = LoadClock::new(&["commands", "polls", "calls"]);
        assert!(c.summary().is_none(), "nothing counted yet");
        c.add(0, 100, Duration::from_millis(300));
        c.add(1, 1000, Duration::from_millis(200));
        c.add(7, 1, Duration::from_secs(5)); // no such kind: ignored
        let s = summary_over(&c.parts, Duration::from_secs(1)).unwrap();
        assert_eq!(s, "busy 50.0% of 1.0 s; 100 commands: 30.0%, 3000.00 µs each; 1000 polls: 20.0%, 200.00 µs each");
        assert!(c.lap().is_none(), "no lap before a window has passed");
        c.lap_since -= LAP;
        let lap = c.lap().expect("a lap with work in it");
        assert!(lap.contains("100 commands") && lap.contains("1000 polls"), "{lap}");
        assert!(c.lap().is_none(), "a fresh window");
        c.lap_since -= LAP;
        assert!(c.lap().is_none(), "a window without work says nothing");
        assert!(c.summary().unwrap().contains("100 commands"), "the totals stay");
    }
}
