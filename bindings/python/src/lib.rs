//! The `throttlegate._native` extension module behind the Python package
//! `throttlegate`. It converts Python values to core types and core errors to
//! Python exceptions; every decision is the core's.

mod convert;
mod errors;
mod limiter;
mod runtime;
mod types;

use pyo3::prelude::*;

/// The extension module; `throttlegate/__init__.py` re-exports it.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", throttlegate::VERSION)?;
    m.add("DEFAULT_PREFIX", throttlegate::DEFAULT_PREFIX)?;
    m.add("MAX_KEY_LEN", throttlegate::MAX_KEY_LEN)?;
    m.add_class::<types::Policy>()?;
    m.add_class::<types::ManualClock>()?;
    m.add_class::<types::Decision>()?;
    m.add_class::<types::RuleResult>()?;
    m.add_class::<types::ClientIp>()?;
    m.add_class::<limiter::Limiter>()?;
    Ok(())
}
