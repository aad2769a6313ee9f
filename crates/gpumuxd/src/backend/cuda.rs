//! The CUDA device behind the daemon (to be written).
