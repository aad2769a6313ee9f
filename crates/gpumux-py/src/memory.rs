//! [`Memory`]: one device buffer, owned by Python. Freed by `free()` or when
//! Python collects it, whichever comes first; a buffer of a client that was
//! closed is the daemon's to free (it frees a client's memory when it goes).

use crate::client::Shared;
use gpumux_client::Buffer;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Device memory of a client (what a `gpumux.ndarray` lies in).
#[pyclass(module = "gpumux._native", frozen)]
pub struct Memory {
    shared: Arc<Shared>,
    buffer: Buffer,
    /// `free()` ran, or it is running: the buffer must not be used or freed again.
    freed: AtomicBool,
}

impl Memory {
    pub fn new(shared: Arc<Shared>, buffer: Buffer) -> Memory {
        Memory { shared, buffer, freed: AtomicBool::new(false) }
    }

    /// The buffer, or an error if it was freed (the daemon would answer
    /// `NoSuchHandle`, or worse, name a buffer allocated since).
    pub fn buffer(&self) -> PyResult<Buffer> {
        if self.freed.load(Ordering::Acquire) {
            return Err(crate::errors::invalid(format!(
                "device memory {} was freed (free() was called on it or an array over it)",
                self.buffer.id().0
            )));
        }
        Ok(self.buffer)
    }

    /// Whether `other` is of the same client (a launch or copy with another
    /// client's memory would name a handle the daemon does not know).
    pub fn same_client(&self, shared: &Arc<Shared>) -> bool {
        Arc::ptr_eq(&self.shared, shared)
    }
}

#[pymethods]
impl Memory {
    /// Its size, bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.buffer.len()
    }

    /// The daemon's handle for it (what `ContextLost.buffers` lists).
    #[getter]
    fn handle(&self) -> u64 {
        self.buffer.id().0
    }

    /// Whether it was freed.
    #[getter]
    fn freed(&self) -> bool {
        self.freed.load(Ordering::Acquire)
    }

    /// Frees it once the work queued before now is done. A second call, or a
    /// call after the client was closed, does nothing.
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        if self.freed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let buffer = self.buffer;
        self.shared.call_if_open(py, move |c| c.free(buffer))
    }

    fn __repr__(&self) -> String {
        format!(
            "<gpumux._native.Memory handle={} nbytes={}{}>",
            self.buffer.id().0,
            self.buffer.len(),
            if self.freed() { " freed" } else { "" }
        )
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // Collected by Python: free it, without raising (there is nobody to
        // raise to). The GIL stays held for the round trip: releasing it in a
        // destructor, maybe during interpreter shutdown, is not safe.
        if !self.freed.swap(true, Ordering::AcqRel) {
            self.shared.free_quietly(self.buffer);
        }
    }
}
