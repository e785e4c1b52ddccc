//! `throttlegate.Limiter`: the core limiter behind a Python handle that
//! survives `os.fork()`.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;
use pyo3::types::{PyDict, PyString};
use throttlegate as core;

use crate::convert;
use crate::errors::{core_to_py, guard, invalid_type, make};
use crate::runtime::{self, Value};
use crate::types::{Decision, ManualClock, Policy};

struct State {
    /// The fork generation `core` belongs to.
    generation: u64,
    core: Option<core::Limiter>,
}

/// A rate limiter: a policy bound to Redis or to the embedded backend.
///
/// Safe to share between threads and asyncio tasks. After `os.fork()` the
/// child rebuilds its runtime and connections on first use (the embedded
/// backend starts empty in the child).
#[pyclass(module = "throttlegate._native", frozen)]
pub struct Limiter {
    builder: core::LimiterBuilder,
    policy: core::Policy,
    backend: &'static str,
    // Locked only while the GIL is held: `os.fork()` runs with the GIL, so
    // the lock is never held by another thread at a fork.
    state: Mutex<State>,
}

impl Limiter {
    /// The core limiter for this process, rebuilt in a forked child.
    fn core(&self, py: Python<'_>) -> PyResult<core::Limiter> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let generation = runtime::generation();
        let Some(current) = state.core.as_ref() else {
            return Err(make(py, core::ErrorKind::Closed.as_str(), "the limiter is closed", false));
        };
        if state.generation == generation {
            return Ok(current.clone());
        }
        // The parent's connections and tasks belong to a runtime whose
        // threads are gone: leak them rather than run their destructors.
        std::mem::forget(state.core.take());
        let fresh = self.builder.clone().build().map_err(|e| core_to_py(py, &e))?;
        state.core = Some(fresh.clone());
        state.generation = generation;
        Ok(fresh)
    }

    fn block_on<T: Send>(
        &self,
        py: Python<'_>,
        f: impl std::future::Future<Output = core::Result<T>> + Send,
    ) -> PyResult<T> {
        let rt = runtime::get(py)?;
        py.detach(|| rt.block_on(f)).map_err(|e| core_to_py(py, &e))
    }

    /// A decision answered in place, as a Python object.
    fn answer(py: Python<'_>, answer: core::Result<core::Decision>) -> PyResult<Decision> {
        answer.map(Decision::from).map_err(|e| core_to_py(py, &e))
    }
}

fn options(cost: u64, call_id: Option<String>) -> core::CheckOptions {
    core::CheckOptions { cost, call_id }
}

#[pymethods]
impl Limiter {
    /// Bind `policy` (a `Policy`, a path to a TOML/JSON file, or plain dicts)
    /// to a backend: `url` is `redis://...`, `rediss://...` (TLS),
    /// `redis+cluster://host:port,host:port` (Redis Cluster), `memory://`, or
    /// None (embedded).
    ///
    /// For TLS URLs, `tls_root_cert` is a CA certificate to trust instead of
    /// the system's roots (a private CA), and `tls_client_cert` a
    /// `(certificate, key)` pair presented for mutual TLS. Each PEM document
    /// is given as bytes (the data) or as a str / `os.PathLike` (a file path,
    /// read when the limiter is made).
    ///
    /// `deny_cache=True` remembers Redis's denials in process: the same keys
    /// are then denied without a round trip for exactly as long as Redis would
    /// deny them (see the README's "Remembered denials").
    #[new]
    #[pyo3(signature = (policy, url = None, *, timeout = None, on_backend_error = None, prefix = None, clock = None, key_secret = None, tls_root_cert = None, tls_client_cert = None, deny_cache = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        policy: &Bound<'_, PyAny>,
        url: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
        on_backend_error: Option<&Bound<'_, PyAny>>,
        prefix: Option<&Bound<'_, PyAny>>,
        clock: Option<&Bound<'_, PyAny>>,
        key_secret: Option<&Bound<'_, PyAny>>,
        tls_root_cert: Option<&Bound<'_, PyAny>>,
        tls_client_cert: Option<&Bound<'_, PyAny>>,
        deny_cache: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        guard(py, || {
            let policy = Policy::resolve(policy)?;
            let mut builder = core::Limiter::builder(policy);
            if let Some(u) = convert::opt_text(url, "url")? {
                builder = builder.url(u);
            }
            if let Some(t) = timeout.filter(|o| !o.is_none()) {
                builder = builder.timeout(convert::seconds(t, "timeout")?);
            }
            if let Some(m) = convert::opt_text(on_backend_error, "on_backend_error")? {
                let mode = core::FailureMode::parse(&m).map_err(|e| core_to_py(py, &e))?;
                builder = builder.on_backend_error(mode);
            }
            if let Some(p) = convert::opt_text(prefix, "prefix")? {
                builder = builder.prefix(p);
            }
            if let Some(c) = clock.filter(|o| !o.is_none()) {
                builder = builder.clock(resolve_clock(c)?);
            }
            if let Some(s) = key_secret.filter(|o| !o.is_none()) {
                let bytes: Vec<u8> = if s.is_instance_of::<PyString>() {
                    convert::text(s, "key_secret")?.into_bytes()
                } else if let Ok(b) = s.cast::<pyo3::types::PyBytes>() {
                    b.as_bytes().to_vec()
                } else {
                    return Err(invalid_type(py, "key_secret: expected str or bytes"));
                };
                builder = builder.key_secret(bytes);
            }
            if let Some(ca) = tls_root_cert.filter(|o| !o.is_none()) {
                builder = builder.tls_root_cert(convert::pem(ca, "tls_root_cert")?);
            }
            if let Some(pair) = tls_client_cert.filter(|o| !o.is_none()) {
                let (cert, key) = client_cert_pair(pair)?;
                builder = builder.tls_client_cert(
                    convert::pem(&cert, "tls_client_cert: the certificate")?,
                    convert::pem(&key, "tls_client_cert: the key")?,
                );
            }
            if let Some(on) = deny_cache.filter(|o| !o.is_none()) {
                match on.cast::<pyo3::types::PyBool>() {
                    Ok(on) => builder = builder.deny_cache(on.is_true()),
                    Err(_) => return Err(invalid_type(py, "deny_cache: expected a bool")),
                }
            }
            let limiter = builder.clone().build().map_err(|e| core_to_py(py, &e))?;
            Ok(Limiter {
                builder,
                policy: limiter.policy().clone(),
                backend: limiter.backend_name(),
                state: Mutex::new(State { generation: runtime::generation(), core: Some(limiter) }),
            })
        })
    }

    /// Check a request: consume from every applicable rule if all admit it,
    /// nothing otherwise. Releases the GIL while it waits.
    #[pyo3(signature = (attributes, cost = None, *, call_id = None))]
    fn check(
        &self,
        py: Python<'_>,
        attributes: &Bound<'_, PyAny>,
        cost: Option<&Bound<'_, PyAny>>,
        call_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Decision> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            let opts = options(convert::opt_cost(cost)?, convert::opt_text(call_id, "call_id")?);
            let limiter = self.core(py)?;
            // The embedded backend answers at once: no runtime, no GIL release.
            if let Some(answer) = limiter.check_in_process(&attrs, &opts) {
                attrs.recycle();
                return Limiter::answer(py, answer);
            }
            self.block_on(py, async move { limiter.check_with(&attrs, &opts).await })
                .map(Decision::from)
        })
    }

    /// `check` as an awaitable, driven by the limiter's runtime.
    #[pyo3(signature = (attributes, cost = None, *, call_id = None))]
    fn check_async<'py>(
        &self,
        py: Python<'py>,
        attributes: &Bound<'py, PyAny>,
        cost: Option<&Bound<'py, PyAny>>,
        call_id: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            let opts = options(convert::opt_cost(cost)?, convert::opt_text(call_id, "call_id")?);
            let limiter = self.core(py)?;
            let ctx = runtime::LoopCtx::current(py)?;
            let fut = ctx.create_future(py)?;
            if let Some(answer) = limiter.check_in_process(&attrs, &opts) {
                attrs.recycle();
                runtime::settle(py, &fut, answer.map(Value::Decision).into());
                return Ok(fut);
            }
            ctx.spawn(py, &fut, async move { limiter.check_with(&attrs, &opts).await.map(Value::Decision) })?;
            Ok(fut)
        })
    }

    /// The decision a check of this cost would get now, consuming nothing.
    #[pyo3(signature = (attributes, cost = None))]
    fn peek(&self, py: Python<'_>, attributes: &Bound<'_, PyAny>, cost: Option<&Bound<'_, PyAny>>) -> PyResult<Decision> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            let cost = convert::opt_cost(cost)?;
            let limiter = self.core(py)?;
            if let Some(answer) = limiter.peek_in_process(&attrs, cost) {
                attrs.recycle();
                return Limiter::answer(py, answer);
            }
            self.block_on(py, async move { limiter.peek(&attrs, cost).await }).map(Decision::from)
        })
    }

    /// `peek` as an awaitable.
    #[pyo3(signature = (attributes, cost = None))]
    fn peek_async<'py>(
        &self,
        py: Python<'py>,
        attributes: &Bound<'py, PyAny>,
        cost: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            let cost = convert::opt_cost(cost)?;
            let limiter = self.core(py)?;
            let ctx = runtime::LoopCtx::current(py)?;
            let fut = ctx.create_future(py)?;
            if let Some(answer) = limiter.peek_in_process(&attrs, cost) {
                attrs.recycle();
                runtime::settle(py, &fut, answer.map(Value::Decision).into());
                return Ok(fut);
            }
            ctx.spawn(py, &fut, async move { limiter.peek(&attrs, cost).await.map(Value::Decision) })?;
            Ok(fut)
        })
    }

    /// Forget the state of every rule that applies to this request; returns
    /// how many keys existed.
    fn reset(&self, py: Python<'_>, attributes: &Bound<'_, PyAny>) -> PyResult<u64> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            let limiter = self.core(py)?;
            self.block_on(py, async move { limiter.reset(&attrs).await })
        })
    }

    /// `reset` as an awaitable.
    fn reset_async<'py>(&self, py: Python<'py>, attributes: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            let limiter = self.core(py)?;
            runtime::future_into_py(py, async move { limiter.reset(&attrs).await.map(Value::Count) })
        })
    }

    /// The backend keys this request touches, one per applicable rule.
    fn keys(&self, py: Python<'_>, attributes: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            Ok(self.core(py)?.keys(&attrs))
        })
    }

    /// Check that the backend answers within the timeout.
    fn ping(&self, py: Python<'_>) -> PyResult<()> {
        guard(py, || {
            let limiter = self.core(py)?;
            self.block_on(py, async move { limiter.ping().await })
        })
    }

    /// `ping` as an awaitable.
    fn ping_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let limiter = self.core(py)?;
            runtime::future_into_py(py, async move { limiter.ping().await.map(|()| Value::Nothing) })
        })
    }

    /// Counters since the limiter was made (in this process).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        guard(py, || {
            let s = self.core(py)?.stats();
            let d = PyDict::new(py);
            d.set_item("calls", s.calls)?;
            d.set_item("allowed", s.allowed)?;
            d.set_item("denied", s.denied)?;
            d.set_item("degraded_allowed", s.degraded_allowed)?;
            d.set_item("degraded_denied", s.degraded_denied)?;
            d.set_item("backend_errors", s.backend_errors)?;
            d.set_item("timeouts", s.timeouts)?;
            Ok(d)
        })
    }

    /// Close the limiter: every later call raises `ClosedError`. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        guard(py, || {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(limiter) = state.core.take() {
                if state.generation == runtime::generation() {
                    limiter.close();
                } else {
                    std::mem::forget(limiter);
                }
            }
            Ok(())
        })
    }

    /// True after `close()`.
    #[getter]
    fn closed(&self) -> bool {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).core.is_none()
    }

    /// `"memory"`, `"redis"` or `"cluster"`.
    #[getter]
    fn backend(&self) -> &'static str {
        self.backend
    }

    /// The policy, with the limiter's overrides applied.
    #[getter]
    fn policy(&self) -> Policy {
        Policy { inner: self.policy.clone() }
    }

    /// `with Limiter(...) as limiter:` yields the limiter itself.
    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Leaving a `with` block closes the limiter; exceptions propagate.
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    /// `async with Limiter(...) as limiter:` yields the limiter itself.
    fn __aenter__<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        runtime::ready(py, slf.into_any())
    }

    /// Leaving an `async with` block closes the limiter; exceptions propagate.
    #[pyo3(signature = (*_args))]
    fn __aexit__<'py>(&self, py: Python<'py>, _args: &Bound<'py, pyo3::types::PyTuple>) -> PyResult<Bound<'py, PyAny>> {
        self.close(py)?;
        runtime::ready(py, false.into_bound_py_any(py)?)
    }

    /// A readable summary for logs and the REPL.
    fn __repr__(&self) -> String {
        format!(
            "Limiter(backend={:?}, rules={:?}, closed={})",
            self.backend(),
            self.policy.rules().iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
            if self.closed() { "True" } else { "False" }
        )
    }
}

fn resolve_clock(obj: &Bound<'_, PyAny>) -> PyResult<core::Clock> {
    let py = obj.py();
    if let Ok(m) = obj.cast::<ManualClock>() {
        return Ok(core::Clock::Manual(m.get().inner.clone()));
    }
    if obj.is_instance_of::<PyString>() {
        return match convert::text(obj, "clock")?.as_str() {
            "backend" => Ok(core::Clock::Backend),
            "system" => Ok(core::Clock::System),
            other => Err(crate::errors::invalid_argument(
                py,
                format!("clock: {other:?} is not \"backend\", \"system\" or a ManualClock"),
            )),
        };
    }
    Err(invalid_type(py, "clock: expected \"backend\", \"system\" or a ManualClock"))
}

/// The `tls_client_cert` argument: a `(certificate, key)` tuple, like the
/// `cert` argument of `requests`.
fn client_cert_pair<'py>(obj: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let py = obj.py();
    let wrong = || invalid_type(py, "tls_client_cert: expected a (certificate, key) tuple");
    let pair = obj.cast::<pyo3::types::PyTuple>().map_err(|_| wrong())?;
    if pair.len() != 2 {
        return Err(wrong());
    }
    Ok((pair.get_item(0)?, pair.get_item(1)?))
}
