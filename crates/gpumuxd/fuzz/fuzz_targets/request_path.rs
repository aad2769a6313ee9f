//! Fuzzes the daemon's request path (bytes → frames → core) in-process:
//! the input is split into chunks at 0xA5 bytes, as if the socket delivered
//! them so, and fed to one connection of a core on the simulated device.
#![no_main]

use gpumuxd::config::ClientLimits;
use gpumuxd::harness::Harness;
use libfuzzer_sys::fuzz_target;
use std::sync::Mutex;

static HARNESS: Mutex<Option<Harness>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let mut guard = HARNESS.lock().unwrap_or_else(|p| p.into_inner());
    let h = guard.get_or_insert_with(|| {
        let limits = ClientLimits { memory: 1 << 20, queued_ops: 64, shm: 1 << 20, ..ClientLimits::default() };
        Harness::new(limits).expect("the core starts")
    });
    let chunks: Vec<&[u8]> = data.split(|&b| b == 0xA5).collect();
    h.connection(&chunks).expect("the core never fails on client input");
});
