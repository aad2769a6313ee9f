//! One step of an engine driving the simulated GPU by hand, for the tests
//! that submit work between steps (arrivals, rounds, copies) and so cannot
//! use `gpumux_engine::driver`.

use gpumux_engine::device::{Device, Event};
use gpumux_engine::time::Nanos;
use gpumux_engine::Engine;
use gpumux_sim::SimGpu;

/// Runs `gpu` until `deadline` (or its next event before it), hands its
/// events to `engine`, then the engine's timeout if `deadline` has passed;
/// returns the device's time. `events` is scratch space, kept between steps.
pub fn step(engine: &mut Engine, gpu: &mut SimGpu, deadline: Option<Nanos>, events: &mut Vec<Event>) -> Nanos {
    events.clear();
    let now = gpu.advance(deadline, events).expect("the device runs");
    for ev in events.drain(..) {
        engine.handle_event(now, ev).expect("the engine accepts device events");
    }
    if deadline.is_some_and(|d| d <= now) {
        engine.handle_timeout(now);
    }
    now
}
