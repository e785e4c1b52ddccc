//! The manual clock's Python class (`ManualClock`), apart from the other
//! value types so that `convert` can read it as an option without
//! depending on them.

use std::time::Duration;

use pyo3::prelude::*;
use throttlegate as core;

use crate::errors::{invalid_argument, invalid_type};

/// A clock that only moves when told to, for tests and simulations.
/// Limiters built with it share its time.
#[pyclass(module = "throttlegate._native", frozen)]
#[derive(Clone)]
pub struct ManualClock {
    pub(crate) inner: core::ManualClock,
}

#[pymethods]
impl ManualClock {
    /// A clock reading `start_us` microseconds.
    #[new]
    #[pyo3(signature = (start_us = None))]
    fn new(py: Python<'_>, start_us: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let start = opt_micros(py, start_us, "start_us")?;
        Ok(ManualClock { inner: core::ManualClock::new(start) })
    }

    /// The current reading in microseconds.
    #[getter]
    fn now_us(&self) -> i64 {
        self.inner.now_us()
    }

    /// Set the reading (it may move backwards).
    fn set_us(&self, py: Python<'_>, now_us: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner.set_us(micros(py, now_us, "now_us")?);
        Ok(())
    }

    /// Move forward by `ms` milliseconds plus `us` microseconds.
    #[pyo3(signature = (ms = None, *, us = None))]
    fn advance(&self, py: Python<'_>, ms: Option<&Bound<'_, PyAny>>, us: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let ms = opt_micros(py, ms, "ms")?;
        let us = opt_micros(py, us, "us")?;
        let total = ms
            .checked_mul(1000)
            .and_then(|m| m.checked_add(us))
            .filter(|t| *t >= 0)
            .ok_or_else(|| invalid_argument(py, "advance: the clock only moves forward by a non-negative amount"))?;
        self.inner.advance(Duration::from_micros(total as u64));
        Ok(())
    }

    /// A readable summary for logs and the REPL.
    fn __repr__(&self) -> String {
        format!("ManualClock(now_us={})", self.inner.now_us())
    }
}

fn opt_micros(py: Python<'_>, obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<i64> {
    match obj {
        Some(o) if !o.is_none() => micros(py, o, what),
        _ => Ok(0),
    }
}

fn micros(py: Python<'_>, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<i64> {
    if !obj.is_instance_of::<pyo3::types::PyInt>() || obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(invalid_type(py, format!("{what}: expected int")));
    }
    obj.extract::<i64>()
        .map_err(|_| invalid_argument(py, format!("{what}: out of range for a 64-bit signed integer")))
}
