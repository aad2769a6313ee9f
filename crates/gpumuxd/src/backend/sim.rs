//! The simulated device behind the daemon (to be written).
