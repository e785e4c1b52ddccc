//! The `throttlegate._native` extension module behind the Python package
//! `throttlegate`. It converts Python values to core types and core errors to
//! Python exceptions; every decision is the core's.

mod clock;
mod convert;
mod errors;
mod http;
mod limiter;
mod runtime;
mod types;

use pyo3::prelude::*;

/// Panics on purpose, behind the same guard as every entry point: the tests
/// use it to prove that a panic reaches Python as `InternalError`. Only in
/// builds with the `test-hooks` feature, never in a release.
#[cfg(feature = "test-hooks")]
#[pyfunction]
fn _panic_for_tests(py: Python<'_>, message: String) -> PyResult<()> {
    errors::guard(py, || panic!("{message}"))
}

/// Like `_panic_for_tests`, inside a future awaited from asyncio.
#[cfg(feature = "test-hooks")]
#[pyfunction]
fn _panic_async_for_tests(py: Python<'_>, message: String) -> PyResult<Bound<'_, PyAny>> {
    runtime::future_into_py(py, async move {
        if !message.is_empty() {
            panic!("{message}");
        }
        Ok(runtime::Value::Nothing)
    })
}

/// The core's metric families, as a tuple of dicts `{"name", "help", "type",
/// "labels", "unit"}` (`unit` None when the name carries none).
fn metric_families(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyTuple>> {
    let mut out = Vec::with_capacity(throttlegate::METRIC_FAMILIES.len());
    for f in &throttlegate::METRIC_FAMILIES {
        let d = pyo3::types::PyDict::new(py);
        d.set_item("name", f.name)?;
        d.set_item("help", f.help)?;
        d.set_item("type", f.kind.as_str())?;
        d.set_item("labels", pyo3::types::PyTuple::new(py, f.labels)?)?;
        d.set_item("unit", f.unit)?;
        out.push(d);
    }
    pyo3::types::PyTuple::new(py, out)
}

/// The extension module; `throttlegate/__init__.py` re-exports it.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", throttlegate::VERSION)?;
    m.add("DEFAULT_PREFIX", throttlegate::DEFAULT_PREFIX)?;
    m.add("MAX_KEY_LEN", throttlegate::MAX_KEY_LEN)?;
    m.add("METRICS_CONTENT_TYPE", throttlegate::METRICS_CONTENT_TYPE)?;
    m.add("METRIC_FAMILIES", metric_families(m.py())?)?;
    m.add("OUTCOMES", pyo3::types::PyTuple::new(m.py(), throttlegate::OUTCOMES)?)?;
    m.add("REQUEST_MODEL", pyo3::types::PyTuple::new(m.py(), throttlegate::REQUEST_MODEL)?)?;
    m.add_function(wrap_pyfunction!(http::parse_rate, m)?)?;
    m.add_class::<types::Policy>()?;
    m.add_class::<clock::ManualClock>()?;
    m.add_class::<types::Decision>()?;
    m.add_class::<types::RuleResult>()?;
    m.add_class::<types::ClientIp>()?;
    m.add_class::<limiter::Limiter>()?;
    #[cfg(feature = "test-hooks")]
    {
        m.add_function(wrap_pyfunction!(_panic_for_tests, m)?)?;
        m.add_function(wrap_pyfunction!(_panic_async_for_tests, m)?)?;
    }
    Ok(())
}
