//! A [`ClientError`] as a Python exception of the package's hierarchy
//! (python/gpumux/_errors.py): the class is chosen there from a name given
//! here, so the classes can inherit from Python's own (`MemoryError`,
//! `ValueError`, `ConnectionError`), which exceptions made in Rust under the
//! stable ABI cannot.

use gpumux_client::{ClientError, ErrorKind};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// `gpumux._errors._from_native`, looked up once.
static FROM_NATIVE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The name `_errors.py` knows the error by: the daemon's kind for errors
/// the daemon sent, else the client library's variant.
fn name_of(e: &ClientError) -> &'static str {
    if let Some(kind) = e.kind() {
        return match kind {
            ErrorKind::BadFrame => "BadFrame",
            ErrorKind::Protocol => "Protocol",
            ErrorKind::Version { .. } => "Version",
            ErrorKind::NotPermitted => "NotPermitted",
            ErrorKind::Quota => "Quota",
            ErrorKind::OutOfMemory => "OutOfMemory",
            ErrorKind::NoSuchHandle => "NoSuchHandle",
            ErrorKind::OutOfRange => "OutOfRange",
            ErrorKind::Invalid => "Invalid",
            ErrorKind::Compile => "Compile",
            ErrorKind::Transform { .. } => "Transform",
            ErrorKind::KernelFault => "KernelFault",
            ErrorKind::ContextLost => "ContextLost",
            ErrorKind::Device => "Device",
            ErrorKind::ShuttingDown => "ShuttingDown",
            ErrorKind::NotReady => "NotReady",
        };
    }
    match e {
        ClientError::NoDaemon { .. } => "NoDaemon",
        ClientError::Connect { .. } => "Connect",
        ClientError::Io(_) | ClientError::DaemonGone | ClientError::Closed { .. } => "DaemonGone",
        ClientError::Frame(_) | ClientError::Protocol { .. } => "Mismatch",
        ClientError::Shm { .. } => "Shm",
        ClientError::NoSuchKernel { .. } => "NoSuchKernel",
        ClientError::Invalid(_) | ClientError::Daemon { .. } => "InvalidArgument",
    }
}

/// The failed request's name, where the daemon answered one.
fn request_of(e: &ClientError) -> Option<&'static str> {
    match e {
        ClientError::Daemon { request, .. } | ClientError::Protocol { request, .. } => Some(request),
        _ => None,
    }
}

/// `e` as the package's exception.
pub fn to_py(e: ClientError) -> PyErr {
    let line = match e.kind() {
        Some(ErrorKind::Transform { line }) => Some(*line),
        _ => None,
    };
    make(name_of(&e), &e.to_string(), request_of(&e), e.is_fatal(), line)
}

/// The package's exception `name` (a kind `_errors.py` knows) with `message`.
pub fn raise(name: &str, message: &str, fatal: bool) -> PyErr {
    make(name, message, None, fatal, None)
}

/// The exception `_errors._from_native` makes (a plain `RuntimeError` if
/// the package's error module cannot be imported, which only a broken
/// install does).
fn make(name: &str, message: &str, request: Option<&str>, fatal: bool, line: Option<u32>) -> PyErr {
    Python::attach(|py| {
        let made = FROM_NATIVE
            .get_or_try_init(py, || -> PyResult<Py<PyAny>> {
                Ok(py.import("gpumux._errors")?.getattr("_from_native")?.unbind())
            })
            .and_then(|f| f.bind(py).call1((name, message, request, fatal, line)));
        match made {
            Ok(exc) => PyErr::from_value(exc),
            Err(import) => {
                let err = pyo3::exceptions::PyRuntimeError::new_err(message.to_owned());
                err.set_cause(py, Some(import));
                err
            }
        }
    })
}

/// `gpumux.InvalidArgument` (a `ValueError`) with `message`: a call wrong
/// before anything is sent.
pub fn invalid(message: impl Into<String>) -> PyErr {
    to_py(ClientError::Invalid(message.into()))
}

/// `r`'s error as the package's exception.
pub trait IntoPy<T> {
    /// As above.
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for gpumux_client::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
