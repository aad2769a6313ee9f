//! Ends known ahead through a real device process (`backend::ends_ahead`):
//! the simulated device, scripted by `GPUMUX_SIM_ENDS_AHEAD=1`, reports the
//! one-block kernels bound after another as ended ahead; the daemon's side
//! answers their launches without a round trip, the device process retires
//! them with their unbinds (no launch, no event; `GPUMUX_RETIRE_ANSWERED`),
//! and the client's stream completes in order.
//! A file of its own: the variable is set for this process, whose device
//! processes inherit it.

mod chain_core;

use chain_core::{chain_answered_ahead, core_with_empty_kernel, still_in_step};
use gpumuxd::backend::sim::ENDS_AHEAD_VAR;

#[test]
fn launches_of_kernels_the_device_ran_ahead_are_answered_without_a_round_trip_and_the_stream_completes() {
    // Set before any device process starts, in a test binary of one test.
    std::env::set_var(ENDS_AHEAD_VAR, "1");
    let (mut core, rx, launch) = core_with_empty_kernel("ahead");
    let n = 30u64;
    chain_answered_ahead(&mut core, &rx, &launch, n);

    // The device process is still in step: more launches, answered or run, and a sync.
    still_in_step(&mut core, &rx, &launch);
}
