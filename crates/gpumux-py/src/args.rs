//! Kernel arguments from Python values, converted here (not in Python) since
//! every launch converts them: a launch + sync from Python should cost little
//! more than from Rust (issue 41's goal: 3 µs at the p50).
//!
//! The rules are CuPy's for `RawKernel`: a device array passes a pointer to
//! its first element, a NumPy scalar passes its value as its dtype (so
//! `numpy.float32(2)` for a `float` parameter), a Python `int` passes an
//! `int64` and a `float` a `float64`, a `bool` one byte. Unlike CuPy, a value
//! whose size does not match the kernel's parameter is refused, naming the
//! argument, wherever the daemon knows the parameter sizes (it does for
//! kernels whose parameters are built-in types).

use crate::client::Shared;
use crate::errors::invalid;
use crate::memory::Memory;
use gpumux_client::Arg;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyTuple};
use std::sync::Arc;

/// The attribute a device array (`gpumux.ndarray`) answers with its memory,
/// or `(memory, byte offset)` for a view that does not start at it.
const ARRAY_ATTR: &str = "__gpumux_arg__";

/// A grid or a block (`what`) as CuPy takes it: an int, or a sequence of 1
/// to 3 ints (the rest 1). Converted here rather than in Python, where the
/// tuple it built was most of a launch's cost in the wrapper (issue 41).
pub fn dim3(d: &Bound<'_, PyAny>, what: &str) -> PyResult<[u32; 3]> {
    let wrong = || {
        let shown = d.repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".into());
        pyo3::exceptions::PyValueError::new_err(format!("{what} must be an int or a tuple of 1 to 3 ints, not {shown}"))
    };
    if d.is_exact_instance_of::<PyInt>() {
        return Ok([extent(d, what)?, 1, 1]);
    }
    if let Ok(t) = d.cast::<PyTuple>() {
        let n = t.len();
        if !(1..=3).contains(&n) {
            return Err(wrong());
        }
        let mut out = [1u32; 3];
        for (i, item) in t.iter().enumerate() {
            out[i] = extent(&item, what)?;
        }
        return Ok(out);
    }
    // Anything else int() takes (a NumPy integer), or another sequence.
    if let Ok(i) = d.call_method0(pyo3::intern!(d.py(), "__index__")) {
        return Ok([extent(&i, what)?, 1, 1]);
    }
    let items: Vec<Bound<'_, PyAny>> = d.try_iter().map_err(|_| wrong())?.collect::<PyResult<_>>()?;
    if !(1..=3).contains(&items.len()) {
        return Err(wrong());
    }
    let mut out = [1u32; 3];
    for (i, item) in items.iter().enumerate() {
        out[i] = extent(item, what)?;
    }
    Ok(out)
}

/// One extent of a grid or block: an int of 0 to 2³² - 1 (the daemon
/// checks CUDA's limits, and refuses 0, naming them).
fn extent(v: &Bound<'_, PyAny>, what: &str) -> PyResult<u32> {
    v.extract::<u32>().map_err(|_| {
        let shown = v.repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".into());
        pyo3::exceptions::PyValueError::new_err(format!("{what} extents must be ints of 0 to 4294967295, not {shown}"))
    })
}

/// `args` as the client library's arguments, for a kernel of `shared`'s client.
pub fn convert(shared: &Arc<Shared>, args: &Bound<'_, PyAny>) -> PyResult<Vec<Arg>> {
    let mut out = Vec::new();
    for (i, item) in args.try_iter()?.enumerate() {
        let item = item?;
        out.push(one(shared, &item).map_err(|e| {
            let py = item.py();
            invalid(format!("kernel argument {} ({}): {}", i + 1, type_name(&item), e.value(py)))
        })?);
    }
    Ok(out)
}

fn type_name(item: &Bound<'_, PyAny>) -> String {
    item.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}

fn one(shared: &Arc<Shared>, item: &Bound<'_, PyAny>) -> PyResult<Arg> {
    if let Ok(memory) = item.cast::<Memory>() {
        return memory_arg(shared, memory.get(), 0);
    }
    // bool before int: Python's bool is an int.
    if let Ok(b) = item.cast::<PyBool>() {
        return Ok(Arg::bytes(vec![u8::from(b.is_true())]));
    }
    if item.is_exact_instance_of::<PyInt>() {
        let v: i64 = item.extract().map_err(|_| {
            invalid("an int out of int64's range (pass numpy.uint64(x) for an unsigned 64-bit parameter)")
        })?;
        return Ok(v.into());
    }
    if item.is_exact_instance_of::<PyFloat>() {
        return Ok(item.extract::<f64>()?.into());
    }
    if let Ok(bytes) = item.cast::<PyBytes>() {
        return Ok(Arg::bytes(bytes.as_bytes().to_vec()));
    }
    if let Ok(inner) = item.getattr(intern!(item.py(), ARRAY_ATTR)) {
        return array_arg(shared, &inner);
    }
    if let Ok(dtype) = item.getattr(intern!(item.py(), "dtype")) {
        return scalar_arg(item, &dtype);
    }
    Err(invalid(
        "cannot be passed to a kernel: pass a gpumux array, a NumPy scalar such as numpy.float32(x), \
         an int (int64), a float (float64), a bool or bytes (a struct by value)",
    ))
}

/// A device array's memory, with its offset when it is a view, or None.
fn array_arg(shared: &Arc<Shared>, inner: &Bound<'_, PyAny>) -> PyResult<Arg> {
    // An empty array has no memory: a null pointer, as CuPy passes.
    if inner.is_none() {
        return Ok(0u64.into());
    }
    if let Ok(memory) = inner.cast::<Memory>() {
        return memory_arg(shared, memory.get(), 0);
    }
    let pair =
        inner.cast::<PyTuple>().map_err(|_| invalid(format!("{ARRAY_ATTR} is not memory or (memory, offset)")))?;
    let (memory, offset): (Bound<'_, Memory>, u64) = pair.extract()?;
    memory_arg(shared, memory.get(), offset)
}

fn memory_arg(shared: &Arc<Shared>, memory: &Memory, offset: u64) -> PyResult<Arg> {
    if !memory.same_client(shared) {
        return Err(invalid("the array belongs to another gpumux client than the kernel"));
    }
    Ok(Arg::buffer_at(&memory.buffer()?, offset))
}

/// A NumPy scalar (or a 0-d array): by its dtype's kind and size; any other
/// dtype (float16, int8, complex, a structured dtype) as its raw bytes.
fn scalar_arg(item: &Bound<'_, PyAny>, dtype: &Bound<'_, PyAny>) -> PyResult<Arg> {
    let py = item.py();
    let kind: String = dtype.getattr(intern!(py, "kind"))?.extract()?;
    let size: usize = dtype.getattr(intern!(py, "itemsize"))?.extract()?;
    Ok(match (kind.as_str(), size) {
        ("f", 4) => item.extract::<f32>()?.into(),
        ("f", 8) => item.extract::<f64>()?.into(),
        ("i", 4) => item.extract::<i32>()?.into(),
        ("i", 8) => item.extract::<i64>()?.into(),
        ("u", 4) => item.extract::<u32>()?.into(),
        ("u", 8) => item.extract::<u64>()?.into(),
        _ => {
            let bytes = item.call_method0(intern!(py, "tobytes"))?;
            Arg::bytes(bytes.cast::<PyBytes>()?.as_bytes().to_vec())
        }
    })
}
