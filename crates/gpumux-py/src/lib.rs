//! `gpumux._native`: the Rust client library (`gpumux-client`) as a Python
//! extension module. It is the thin, private layer under the `gpumux`
//! package (python/gpumux/): handles, copies by address, launches with
//! arguments converted here (the hot path), and errors raised as the
//! package's exception classes. Everything a Python user sees (arrays,
//! streams, events, the CuPy-style module) is written in Python on top.
//!
//! Built with the stable ABI (abi3, CPython 3.9 and later): one wheel for
//! every CPython version. Links no CUDA, as the client library does not.

mod args;
mod client;
mod errors;
mod memory;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<client::Client>()?;
    m.add_class::<client::Module>()?;
    m.add_class::<client::Kernel>()?;
    m.add_class::<memory::Memory>()?;
    m.add("SOCKET_ENV", gpumux_client::SOCKET_ENV)?;
    m.add("DEFAULT_SOCKET", gpumux_proto::default_socket_path().to_string_lossy().into_owned())?;
    Ok(())
}
