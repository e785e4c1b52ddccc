//! Core errors as Python exceptions, and the guard that keeps Rust panics
//! from reaching Python.
//!
//! The exception classes live in `throttlegate/_errors.py` so that they can
//! inherit from the matching built-in exceptions as well as from
//! `ThrottlegateError`; this module only looks them up by kind id.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;
use throttlegate::{Error, ErrorKind};

/// Kind id of the `TypeError` flavour of `InvalidArgumentError`, raised when
/// a Python value has the wrong type rather than a wrong value.
pub const INVALID_TYPE: &str = "invalid_argument:type";

static CLASSES: PyOnceLock<Py<PyDict>> = PyOnceLock::new();

fn class_for<'py>(py: Python<'py>, kind: &str) -> PyResult<Bound<'py, PyAny>> {
    let table = CLASSES.get_or_try_init(py, || -> PyResult<Py<PyDict>> {
        let module = py.import("throttlegate._errors")?;
        Ok(module.getattr("_BY_KIND")?.cast_into::<PyDict>()?.unbind())
    })?;
    match table.bind(py).get_item(kind)? {
        Some(cls) => Ok(cls),
        None => Err(PyRuntimeError::new_err(format!("throttlegate: no exception class for kind {kind:?}"))),
    }
}

/// An exception of the class registered for `kind`, with `message`.
pub fn make(py: Python<'_>, kind: &str, message: &str, temporary: bool) -> PyErr {
    let built = (|| -> PyResult<PyErr> {
        let cls = class_for(py, kind)?;
        let value = cls.call1((message,))?;
        value.setattr("temporary", temporary)?;
        Ok(PyErr::from_value(value))
    })();
    built.unwrap_or_else(|e| e)
}

/// A core error as the matching `ThrottlegateError` subclass.
pub fn core_to_py(py: Python<'_>, err: &Error) -> PyErr {
    let kind = if err.is_wrong_type() { INVALID_TYPE } else { err.kind().as_str() };
    make(py, kind, &err.to_string(), err.is_temporary())
}

/// `InvalidArgumentError` (a `ValueError`) naming what is wrong.
pub fn invalid_argument(py: Python<'_>, message: impl AsRef<str>) -> PyErr {
    make(py, ErrorKind::InvalidArgument.as_str(), message.as_ref(), false)
}

/// `InvalidArgumentTypeError` (an `InvalidArgumentError` and a `TypeError`).
pub fn invalid_type(py: Python<'_>, message: impl AsRef<str>) -> PyErr {
    make(py, INVALID_TYPE, message.as_ref(), false)
}

/// `InternalError`, for a caught panic.
pub fn internal(py: Python<'_>, message: impl AsRef<str>) -> PyErr {
    make(py, ErrorKind::Internal.as_str(), message.as_ref(), false)
}

/// Run an entry point, turning a panic into `InternalError` so that PyO3's
/// `PanicException` (a `BaseException`, which ordinary `except Exception`
/// handlers miss) never reaches the caller.
pub fn guard<T>(py: Python<'_>, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => Err(core_to_py(py, &Error::from_panic(payload.as_ref()))),
    }
}
