//! The `throttlegate._native` extension module behind the Python package
//! `throttlegate`. It converts Python values to core types and core errors to
//! Python exceptions; every decision is the core's.

mod convert;
mod errors;
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

/// The extension module; `throttlegate/__init__.py` re-exports it.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", throttlegate::VERSION)?;
    m.add("DEFAULT_PREFIX", throttlegate::DEFAULT_PREFIX)?;
    m.add("MAX_KEY_LEN", throttlegate::MAX_KEY_LEN)?;
    m.add("METRICS_CONTENT_TYPE", throttlegate::METRICS_CONTENT_TYPE)?;
    m.add_class::<types::Policy>()?;
    m.add_class::<types::ManualClock>()?;
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
