//! The GPUs this process has opened, each lent to one device at a time.
//!
//! A GPU's [`GpuState`] outlives the devices that use it, so a kernel
//! compiled and checked for one run is ready for the next. `gpumux run` runs
//! policies and isolated runs in parallel threads; their devices on one GPU
//! take turns (a [`Lease`] waits while another device holds the GPU) instead
//! of interfering with each other's timings.

use super::state::GpuState;
use crate::error::CudaError;
use gpumux_engine::kernel::DeviceInfo;
use std::ops::{Deref, DerefMut};
use std::sync::{Condvar, Mutex};

/// Per GPU ordinal: its state, or `None` while a lease holds it.
static SLOTS: Mutex<Vec<(u32, Option<Box<GpuState>>)>> = Mutex::new(Vec::new());
/// Signalled whenever a lease gives a GPU back.
static FREED: Condvar = Condvar::new();

/// GPU `ordinal`'s state, held by one device until the lease is dropped.
pub(crate) struct Lease {
    ordinal: u32,
    /// `Some` from `take` until `drop` gives it back.
    state: Option<Box<GpuState>>,
}

impl Lease {
    /// Takes GPU `ordinal`'s state, opening the GPU on its first use; waits
    /// while another device holds it.
    pub fn take(ordinal: u32) -> Result<Lease, CudaError> {
        let poisoned = |_| CudaError::Poisoned("the device registry");
        let mut slots = SLOTS.lock().map_err(poisoned)?;
        loop {
            match slots.iter().position(|(o, _)| *o == ordinal) {
                None => {
                    // Opened with the registry locked: a second open of the same GPU waits for this one.
                    let state = GpuState::open(ordinal)?;
                    slots.push((ordinal, None));
                    return Ok(Lease { ordinal, state: Some(Box::new(state)) });
                }
                Some(i) => {
                    if let Some(state) = slots[i].1.take() {
                        return Ok(Lease { ordinal, state: Some(state) });
                    }
                    slots = FREED.wait(slots).map_err(poisoned)?;
                }
            }
        }
    }
}

impl Deref for Lease {
    type Target = GpuState;

    fn deref(&self) -> &GpuState {
        self.state.as_deref().expect("a lease holds its GPU state until it is dropped")
    }
}

impl DerefMut for Lease {
    fn deref_mut(&mut self) -> &mut GpuState {
        self.state.as_deref_mut().expect("a lease holds its GPU state until it is dropped")
    }
}

impl Drop for Lease {
    /// Gives the GPU back and wakes the devices waiting for it.
    fn drop(&mut self) {
        let Some(state) = self.state.take() else { return };
        if let Ok(mut slots) = SLOTS.lock() {
            if let Some(slot) = slots.iter_mut().find(|(o, _)| *o == self.ordinal) {
                slot.1 = Some(state);
            }
            FREED.notify_all();
        }
    }
}

/// What the engine needs to know about GPU `ordinal` (opens it on first use;
/// later calls answer from a cache, without waiting for the GPU).
pub fn device_info(ordinal: u32) -> Result<DeviceInfo, CudaError> {
    static INFOS: Mutex<Vec<(u32, DeviceInfo)>> = Mutex::new(Vec::new());
    let cached = INFOS.lock().ok().and_then(|v| v.iter().find(|(o, _)| *o == ordinal).map(|(_, i)| i.clone()));
    if let Some(i) = cached {
        return Ok(i);
    }
    let info = Lease::take(ordinal)?.info()?;
    if let Ok(mut v) = INFOS.lock() {
        v.push((ordinal, info.clone()));
    }
    Ok(info)
}
