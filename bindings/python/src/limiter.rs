//! `throttlegate.Limiter`: the core limiter behind a Python handle.

use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;
use pyo3::types::PyDict;
use throttlegate as core;

use crate::convert;
use crate::errors::{core_to_py, guard};
use crate::runtime::{self, Value};
use crate::types::{Decision, Policy};

/// A rate limiter: a policy bound to Redis or to the embedded backend.
///
/// Safe to share between threads and asyncio tasks. After `os.fork()` the
/// child's limiter keeps working: on Redis it connects anew, and the
/// embedded backend keeps a copy of the state as it was at the fork.
#[pyclass(module = "throttlegate._native", frozen)]
pub struct Limiter {
    inner: core::Limiter,
}

impl Limiter {
    /// The embedded backend's answer, given at once (`None` for Redis).
    fn in_place(&self, attrs: &convert::OwnedAttrs, opts: &core::CheckOptions, peek: bool) -> Option<core::Result<core::Decision>> {
        if peek {
            self.inner.peek_in_process(attrs, opts.cost)
        } else {
            self.inner.check_in_process(attrs, opts)
        }
    }

    /// A check (`peek` false) or peek: answered in place on the embedded
    /// backend (no GIL release), else the core's blocking call with the GIL
    /// released.
    fn decide(&self, py: Python<'_>, attributes: &Bound<'_, PyAny>, cost: Option<&Bound<'_, PyAny>>, call_id: Option<&Bound<'_, PyAny>>, peek: bool) -> PyResult<Decision> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            let opts = core::CheckOptions { cost: convert::opt_cost(cost)?, call_id: convert::opt_text(call_id, "call_id")? };
            let l = &self.inner;
            let answer = match self.in_place(&attrs, &opts, peek) {
                Some(answer) => answer,
                None if peek => py.detach(|| l.peek_blocking(&attrs, opts.cost)),
                None => py.detach(|| l.check_blocking(&attrs, &opts)),
            };
            attrs.recycle();
            answer.map(Decision::from).map_err(|e| core_to_py(py, &e))
        })
    }

    /// `decide` as an awaitable, driven by the core's runtime.
    fn decide_async<'py>(&self, py: Python<'py>, attributes: &Bound<'py, PyAny>, cost: Option<&Bound<'py, PyAny>>, call_id: Option<&Bound<'py, PyAny>>, peek: bool) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            let opts = core::CheckOptions { cost: convert::opt_cost(cost)?, call_id: convert::opt_text(call_id, "call_id")? };
            let ctx = runtime::LoopCtx::current(py)?;
            let fut = ctx.create_future(py)?;
            let l = &self.inner;
            if let Some(answer) = self.in_place(&attrs, &opts, peek) {
                attrs.recycle();
                runtime::settle(py, &fut, answer.map(Value::Decision));
                return Ok(fut);
            }
            let l = l.clone();
            ctx.spawn(py, &fut, async move {
                let d = if peek { l.peek(&attrs, opts.cost).await } else { l.check_with(&attrs, &opts).await };
                d.map(Value::Decision)
            })?;
            Ok(fut)
        })
    }

    fn blocking<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&core::Limiter) -> core::Result<T> + Send) -> PyResult<T> {
        py.detach(|| f(&self.inner)).map_err(|e| core_to_py(py, &e))
    }
}

/// The duration of an `extend` (seconds, or text such as `"30s"`), read
/// and checked by the core.
fn lease_duration(py: Python<'_>, seconds: &Bound<'_, PyAny>) -> PyResult<std::time::Duration> {
    core::extend_duration(convert::option_value(seconds, "duration")?, core::DurationUnit::Seconds).map_err(|e| core_to_py(py, &e))
}

/// A health event to the `logging` logger `"throttlegate"`: an outage as a
/// WARNING, a recovery as INFO, with the cause as `throttlegate_cause`.
/// Called from whichever thread made the call (never holding the GIL);
/// nothing is logged once the interpreter is finalizing.
fn log_health(event: &core::HealthEvent) {
    let _ = Python::try_attach(|py| -> PyResult<()> {
        let logger = py.import("logging")?.call_method1("getLogger", ("throttlegate",))?;
        let level = if event.is_down() { "warning" } else { "info" };
        let extra = pyo3::types::PyDict::new(py);
        extra.set_item("throttlegate_cause", event.cause().as_str())?;
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("extra", extra)?;
        logger.call_method(level, ("%s", event.message()), Some(&kwargs))?;
        Ok(())
    });
}

#[pymethods]
impl Limiter {
    /// Bind `policy` (a `Policy`, a path to a TOML/JSON file, or plain dicts)
    /// to a backend: `url` is `redis://...`, `rediss://...` (TLS),
    /// `redis+cluster://host:port,host:port` (Redis Cluster), `memory://`, or
    /// None (embedded). `timeout` is seconds, or text such as `"250ms"`.
    ///
    /// For TLS URLs, `tls_root_cert` is a CA certificate to trust instead of
    /// the system's roots (a private CA), and `tls_client_cert` a
    /// `(certificate, key)` pair presented for mutual TLS. Each PEM document
    /// is given as bytes (the data) or as a str / `os.PathLike` (a file path,
    /// read when the limiter is made).
    ///
    /// `deny_cache=True` remembers Redis's denials in process: the same keys
    /// are then denied without a round trip for exactly as long as Redis would
    /// deny them (see "Remembered denials" in docs/concepts/failures.md). `metrics=False`
    /// turns the per-rule metrics off (they are on by default).
    ///
    /// `reload_on_change=True` (with a policy read from a file: a path, or
    /// `Policy.from_file`) watches the file and reloads it when it changes
    /// (see `reload`); a file that does not parse leaves the policy in
    /// force and is reported by `reload_status()` and the metrics.
    ///
    /// `strict=True` checks the backend now, within the timeout (`PING`,
    /// then the check script once on no key), and raises instead of
    /// degrading every call: `BackendUnavailableError` for a wrong URL,
    /// `BackendTimeoutError` for a server that does not answer, `BackendError` for
    /// a wrong password or a user without the script's commands.
    ///
    /// Outages are logged to the `logging` logger `"throttlegate"`: one
    /// WARNING when calls start failing, naming the cause (`refused`,
    /// `timeout`, `auth_failed`, `noscript`, `cluster_down`, `unavailable`,
    /// `backend_error`), and one INFO line when a call succeeds again;
    /// never one per call. Each record has the cause as
    /// `record.throttlegate_cause`.
    #[new]
    #[pyo3(signature = (policy, url = None, *, timeout = None, on_backend_error = None, prefix = None, clock = None, key_secret = None, tls_root_cert = None, tls_client_cert = None, deny_cache = None, metrics = None, reload_on_change = None, strict = None))]
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
        metrics: Option<&Bound<'_, PyAny>>,
        reload_on_change: Option<&Bound<'_, PyAny>>,
        strict: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        guard(py, || {
            let policy = Policy::resolve(policy)?;
            let mut o = core::LimiterOptions::default();
            let tls_root_cert = match tls_root_cert.filter(|c| !c.is_none()) {
                Some(ca) => Some(core::OptionValue::Bytes(convert::pem(ca, "tls_root_cert")?)),
                None => None,
            };
            let tls_client_cert = match tls_client_cert.map(|p| (p, p.cast::<pyo3::types::PyTuple>())) {
                Some((_, Ok(pair))) if pair.len() == 2 => Some(core::OptionValue::List(vec![
                    core::OptionValue::Bytes(convert::pem(&pair.get_item(0)?, "tls_client_cert: the certificate")?),
                    core::OptionValue::Bytes(convert::pem(&pair.get_item(1)?, "tls_client_cert: the key")?),
                ])),
                Some((other, _)) => Some(convert::option_value(other, "tls_client_cert")?),
                None => None,
            };
            use core::LimiterOption as O;
            let given = [(O::Url, "url", url), (O::Timeout, "timeout", timeout), (O::OnBackendError, "on_backend_error", on_backend_error), (O::Prefix, "prefix", prefix), (O::Clock, "clock", clock), (O::KeySecret, "key_secret", key_secret), (O::DenyCache, "deny_cache", deny_cache), (O::Metrics, "metrics", metrics), (O::ReloadOnChange, "reload_on_change", reload_on_change), (O::Strict, "strict", strict)];
            for (option, what, value) in given {
                if let Some(value) = value {
                    o.set(option, what, convert::option_value(value, what)?, core::DurationUnit::Seconds).map_err(|e| core_to_py(py, &e))?;
                }
            }
            for (option, what, value) in [(O::TlsRootCert, "tls_root_cert", tls_root_cert), (O::TlsClientCert, "tls_client_cert", tls_client_cert)] {
                if let Some(value) = value {
                    o.set(option, what, value, core::DurationUnit::Seconds).map_err(|e| core_to_py(py, &e))?;
                }
            }
            o.on_health = Some(core::HealthSink::new(log_health));
            // A strict limiter waits for Redis: without holding the GIL.
            let inner = py.detach(|| core::Limiter::with_options(policy, o)).map_err(|e| core_to_py(py, &e))?;
            Ok(Limiter { inner })
        })
    }

    /// Check a request: consume from every applicable rule if all admit it,
    /// nothing otherwise. Releases the GIL while it waits.
    #[pyo3(signature = (attributes, cost = None, *, call_id = None))]
    fn check(&self, py: Python<'_>, attributes: &Bound<'_, PyAny>, cost: Option<&Bound<'_, PyAny>>, call_id: Option<&Bound<'_, PyAny>>) -> PyResult<Decision> {
        self.decide(py, attributes, cost, call_id, false)
    }

    /// `check` as an awaitable, driven by the core's runtime.
    #[pyo3(signature = (attributes, cost = None, *, call_id = None))]
    fn check_async<'py>(&self, py: Python<'py>, attributes: &Bound<'py, PyAny>, cost: Option<&Bound<'py, PyAny>>, call_id: Option<&Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
        self.decide_async(py, attributes, cost, call_id, false)
    }

    /// The decision a check of this cost would get now, consuming nothing.
    #[pyo3(signature = (attributes, cost = None))]
    fn peek(&self, py: Python<'_>, attributes: &Bound<'_, PyAny>, cost: Option<&Bound<'_, PyAny>>) -> PyResult<Decision> {
        self.decide(py, attributes, cost, None, true)
    }

    /// `peek` as an awaitable.
    #[pyo3(signature = (attributes, cost = None))]
    fn peek_async<'py>(&self, py: Python<'py>, attributes: &Bound<'py, PyAny>, cost: Option<&Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
        self.decide_async(py, attributes, cost, None, true)
    }

    /// Forget the state of every rule that applies to this request; returns
    /// how many keys existed.
    fn reset(&self, py: Python<'_>, attributes: &Bound<'_, PyAny>) -> PyResult<u64> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            self.blocking(py, |l| l.reset_blocking(&attrs))
        })
    }

    /// `reset` as an awaitable.
    fn reset_async<'py>(&self, py: Python<'py>, attributes: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            let l = self.inner.clone();
            runtime::future_into_py(py, async move { l.reset(&attrs).await.map(Value::Count) })
        })
    }

    /// Set the limit of one key of `rule` (the key these attributes make;
    /// the rule needs `overrides = true`), stored in the backend until cleared.
    fn set_override(&self, py: Python<'_>, rule: &Bound<'_, PyAny>, attributes: &Bound<'_, PyAny>, limit: &Bound<'_, PyAny>) -> PyResult<()> {
        guard(py, || {
            let (rule, attrs, limit) = (convert::text(rule, "rule")?, convert::attributes(attributes)?, convert::limit(limit)?);
            self.blocking(py, |l| l.set_override_blocking(&rule, &attrs, limit))
        })
    }

    /// `set_override` as an awaitable.
    fn set_override_async<'py>(&self, py: Python<'py>, rule: &Bound<'py, PyAny>, attributes: &Bound<'py, PyAny>, limit: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let (rule, attrs, limit) = (convert::text(rule, "rule")?, convert::attributes(attributes)?, convert::limit(limit)?);
            let l = self.inner.clone();
            runtime::future_into_py(py, async move { l.set_override(&rule, &attrs, limit).await.map(|()| Value::Nothing) })
        })
    }

    /// Clear the override of one key of `rule`; returns whether there was one.
    fn clear_override(&self, py: Python<'_>, rule: &Bound<'_, PyAny>, attributes: &Bound<'_, PyAny>) -> PyResult<bool> {
        guard(py, || {
            let (rule, attrs) = (convert::text(rule, "rule")?, convert::attributes(attributes)?);
            self.blocking(py, |l| l.clear_override_blocking(&rule, &attrs))
        })
    }

    /// `clear_override` as an awaitable.
    fn clear_override_async<'py>(&self, py: Python<'py>, rule: &Bound<'py, PyAny>, attributes: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let (rule, attrs) = (convert::text(rule, "rule")?, convert::attributes(attributes)?);
            let l = self.inner.clone();
            runtime::future_into_py(py, async move { l.clear_override(&rule, &attrs).await.map(Value::Flag) })
        })
    }

    /// The overrides of `rule`: a list of `{"rule", "attributes", "limit"}` dicts, in key order.
    fn overrides<'py>(&self, py: Python<'py>, rule: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let rule = convert::text(rule, "rule")?;
            let list = self.blocking(py, |l| l.overrides_blocking(&rule))?;
            convert::overrides(py, &list)
        })
    }

    /// `overrides` as an awaitable.
    fn overrides_async<'py>(&self, py: Python<'py>, rule: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let rule = convert::text(rule, "rule")?;
            let l = self.inner.clone();
            runtime::future_into_py(py, async move { l.overrides(&rule).await.map(Value::Overrides) })
        })
    }

    /// Settle an admitted check whose real cost is known only now: every
    /// rule the check consumed from gets the difference back, or takes the
    /// excess (even beyond the limit), atomically, once per call id. The
    /// check must have been given a `call_id`. Returns how many rules were
    /// settled (0 for a denied decision or a second settle).
    fn settle(&self, py: Python<'_>, decision: &Bound<'_, Decision>, actual_cost: &Bound<'_, PyAny>) -> PyResult<u32> {
        guard(py, || {
            let actual = convert::count(actual_cost, "actual_cost")?;
            let d = &decision.get().inner;
            self.blocking(py, |l| l.settle_blocking(d, actual))
        })
    }

    /// `settle` as an awaitable.
    fn settle_async<'py>(&self, py: Python<'py>, decision: &Bound<'py, Decision>, actual_cost: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let actual = convert::count(actual_cost, "actual_cost")?;
            let d = decision.get().inner.clone();
            let l = self.inner.clone();
            runtime::future_into_py(py, async move { l.settle(&d, actual).await.map(|n| Value::Count(n.into())) })
        })
    }

    /// `settle` by call id, without the decision (a settle made elsewhere
    /// than the check): the check's attributes, call id and cost, and the
    /// real cost.
    #[pyo3(signature = (attributes, call_id, cost, actual_cost))]
    fn settle_call(&self, py: Python<'_>, attributes: &Bound<'_, PyAny>, call_id: &Bound<'_, PyAny>, cost: &Bound<'_, PyAny>, actual_cost: &Bound<'_, PyAny>) -> PyResult<u32> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            let id = convert::text(call_id, "call_id")?;
            let (cost, actual) = (convert::cost(cost)?, convert::count(actual_cost, "actual_cost")?);
            self.blocking(py, |l| l.settle_call_blocking(&attrs, &id, cost, actual))
        })
    }

    /// `settle_call` as an awaitable.
    #[pyo3(signature = (attributes, call_id, cost, actual_cost))]
    fn settle_call_async<'py>(&self, py: Python<'py>, attributes: &Bound<'py, PyAny>, call_id: &Bound<'py, PyAny>, cost: &Bound<'py, PyAny>, actual_cost: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            let id = convert::text(call_id, "call_id")?;
            let (cost, actual) = (convert::cost(cost)?, convert::count(actual_cost, "actual_cost")?);
            let l = self.inner.clone();
            runtime::future_into_py(py, async move {
                l.settle_call(&attrs, &id, cost, actual).await.map(|n| Value::Count(n.into()))
            })
        })
    }

    /// Release the concurrency slots an admitted decision holds (rules with
    /// `algorithm = "concurrency"`) as soon as the work they guard is done.
    /// Returns how many concurrency rules gave a slot back (0 for a denied
    /// decision, one holding no slot, or a second release: idempotent).
    /// Slots never released come back when their lease ends.
    fn release(&self, py: Python<'_>, decision: &Bound<'_, Decision>) -> PyResult<u32> {
        guard(py, || {
            let d = &decision.get().inner;
            self.blocking(py, |l| l.release_blocking(d))
        })
    }

    /// `release` as an awaitable.
    fn release_async<'py>(&self, py: Python<'py>, decision: &Bound<'py, Decision>) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let d = decision.get().inner.clone();
            let l = self.inner.clone();
            runtime::future_into_py(py, async move { l.release(&d).await.map(|n| Value::Count(n.into())) })
        })
    }

    /// `release` by lease id, without the decision (a release made
    /// elsewhere than the check): the check's attributes and its `call_id`.
    #[pyo3(signature = (attributes, call_id))]
    fn release_call(&self, py: Python<'_>, attributes: &Bound<'_, PyAny>, call_id: &Bound<'_, PyAny>) -> PyResult<u32> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            let id = convert::text(call_id, "call_id")?;
            self.blocking(py, |l| l.release_call_blocking(&attrs, &id))
        })
    }

    /// `release_call` as an awaitable.
    #[pyo3(signature = (attributes, call_id))]
    fn release_call_async<'py>(&self, py: Python<'py>, attributes: &Bound<'py, PyAny>, call_id: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            let id = convert::text(call_id, "call_id")?;
            let l = self.inner.clone();
            runtime::future_into_py(py, async move { l.release_call(&attrs, &id).await.map(|n| Value::Count(n.into())) })
        })
    }

    /// Renew the lease of the slots an admitted decision holds, for long
    /// work: each is held `seconds` (a number, or text such as `"30s"`)
    /// from now. Returns how many concurrency rules renewed a slot (0 when
    /// the decision holds none, or they were released or expired).
    fn extend(&self, py: Python<'_>, decision: &Bound<'_, Decision>, seconds: &Bound<'_, PyAny>) -> PyResult<u32> {
        guard(py, || {
            let duration = lease_duration(py, seconds)?;
            let d = &decision.get().inner;
            self.blocking(py, |l| l.extend_blocking(d, duration))
        })
    }

    /// `extend` as an awaitable.
    fn extend_async<'py>(&self, py: Python<'py>, decision: &Bound<'py, Decision>, seconds: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let duration = lease_duration(py, seconds)?;
            let d = decision.get().inner.clone();
            let l = self.inner.clone();
            runtime::future_into_py(py, async move { l.extend(&d, duration).await.map(|n| Value::Count(n.into())) })
        })
    }

    /// `extend` by lease id, without the decision: the check's attributes
    /// and `call_id`, and the new lease in seconds.
    #[pyo3(signature = (attributes, call_id, seconds))]
    fn extend_call(&self, py: Python<'_>, attributes: &Bound<'_, PyAny>, call_id: &Bound<'_, PyAny>, seconds: &Bound<'_, PyAny>) -> PyResult<u32> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            let id = convert::text(call_id, "call_id")?;
            let duration = lease_duration(py, seconds)?;
            self.blocking(py, |l| l.extend_call_blocking(&attrs, &id, duration))
        })
    }

    /// `extend_call` as an awaitable.
    #[pyo3(signature = (attributes, call_id, seconds))]
    fn extend_call_async<'py>(&self, py: Python<'py>, attributes: &Bound<'py, PyAny>, call_id: &Bound<'py, PyAny>, seconds: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            let id = convert::text(call_id, "call_id")?;
            let duration = lease_duration(py, seconds)?;
            let l = self.inner.clone();
            runtime::future_into_py(py, async move {
                l.extend_call(&attrs, &id, duration).await.map(|n| Value::Count(n.into()))
            })
        })
    }

    /// Wait (blocking this thread, not the others) until a check of `cost`
    /// is admitted, at most `timeout` (seconds, or text such as `"250ms"`):
    /// returns the admitting decision, or raises `BackendTimeoutError`
    /// (the `timeout` error kind) at once when the wait asked for is longer than
    /// the time left. Waits exactly the `retry_after` it is told, never
    /// polls; waiters of this limiter on the same keys are served in arrival order.
    #[pyo3(signature = (attributes, cost = None, *, timeout, call_id = None))]
    fn acquire(&self, py: Python<'_>, attributes: &Bound<'_, PyAny>, cost: Option<&Bound<'_, PyAny>>, timeout: &Bound<'_, PyAny>, call_id: Option<&Bound<'_, PyAny>>) -> PyResult<Decision> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            let opts = core::CheckOptions { cost: convert::opt_cost(cost)?, call_id: convert::opt_text(call_id, "call_id")? };
            let timeout = core::acquire_timeout(convert::option_value(timeout, "timeout")?, core::DurationUnit::Seconds)
                .map_err(|e| core_to_py(py, &e))?;
            self.blocking(py, |l| l.acquire_blocking(&attrs, &opts, timeout)).map(Decision::from)
        })
    }

    /// `acquire` as an awaitable: the event loop keeps running while it waits.
    #[pyo3(signature = (attributes, cost = None, *, timeout, call_id = None))]
    fn acquire_async<'py>(&self, py: Python<'py>, attributes: &Bound<'py, PyAny>, cost: Option<&Bound<'py, PyAny>>, timeout: &Bound<'py, PyAny>, call_id: Option<&Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let attrs = convert::attributes(attributes)?;
            let opts = core::CheckOptions { cost: convert::opt_cost(cost)?, call_id: convert::opt_text(call_id, "call_id")? };
            let timeout = core::acquire_timeout(convert::option_value(timeout, "timeout")?, core::DurationUnit::Seconds)
                .map_err(|e| core_to_py(py, &e))?;
            let l = self.inner.clone();
            runtime::future_into_py(py, async move { l.acquire_with(&attrs, &opts, timeout).await.map(Value::Decision) })
        })
    }

    /// The backend keys this request touches, one per applicable rule.
    fn keys(&self, py: Python<'_>, attributes: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
        guard(py, || Ok(self.inner.keys(&convert::attributes(attributes)?)))
    }

    /// Check that the backend answers within the timeout.
    fn ping(&self, py: Python<'_>) -> PyResult<()> {
        guard(py, || self.blocking(py, |l| l.ping_blocking()))
    }

    /// `ping` as an awaitable.
    fn ping_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let l = self.inner.clone();
            runtime::future_into_py(py, async move { l.ping().await.map(|()| Value::Nothing) })
        })
    }

    /// Counters since the limiter was made (in this process).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, value) in self.inner.stats().fields() {
            d.set_item(name, value)?;
        }
        Ok(d)
    }

    /// Reservation counters since the limiter was made (in this process; see
    /// docs/concepts/reserve.md): `{"trips": n, "local": n, "reserved": n,
    /// "returned": n, "dropped": n}` (checks and peeks that needed the
    /// backend for a reserved rule, checks answered from reservations alone,
    /// and units reserved, given back and dropped).
    fn reserve_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.reserve_stats();
        let d = PyDict::new(py);
        d.set_item("trips", s.trips)?;
        d.set_item("local", s.local)?;
        d.set_item("reserved", s.reserved)?;
        d.set_item("returned", s.returned)?;
        d.set_item("dropped", s.dropped)?;
        Ok(d)
    }

    /// Per-rule metrics since the limiter was made (in this process), or
    /// None when they were turned off (`metrics=False`): `{"rules": [{"rule":
    /// name, "checks": n, ...}], "backend_latency": {"buckets": [(seconds,
    /// cumulative calls), ...], "count": n, "sum_seconds": s}, "reloads": n,
    /// "reload_errors": n}`.
    /// cumulative calls), ...], "count": n, "sum_seconds": s}, "counters":
    /// {family name: [(label values, n), ...]}}` (the samples of each counter
    /// family of `METRIC_FAMILIES`, labels in the family's order).
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(m) = self.inner.metrics() else { return Ok(None) };
        let rules = pyo3::types::PyList::empty(py);
        for r in &m.rules {
            let d = PyDict::new(py);
            d.set_item("rule", r.rule.as_str())?;
            for (name, value) in r.fields() {
                d.set_item(name, value)?;
            }
            rules.append(d)?;
        }
        let h = PyDict::new(py);
        h.set_item("buckets", &m.backend_latency.buckets)?;
        h.set_item("count", m.backend_latency.count)?;
        h.set_item("sum_seconds", m.backend_latency.sum_seconds)?;
        let counters = PyDict::new(py);
        for c in m.counters() {
            counters.set_item(c.family.name, c.samples)?;
        }
        let out = PyDict::new(py);
        out.set_item("rules", rules)?;
        out.set_item("backend_latency", h)?;
        out.set_item("reloads", m.reloads)?;
        out.set_item("reload_errors", m.reload_errors)?;
        out.set_item("counters", counters)?;
        Ok(Some(out))
    }

    /// `metrics()` as the OpenMetrics text exposition, for a `/metrics`
    /// endpoint (content type `throttlegate.METRICS_CONTENT_TYPE`); None
    /// when metrics were turned off.
    fn metrics_text(&self) -> Option<String> {
        self.inner.metrics_text()
    }

    /// Put a new policy in force (a `Policy`, a path to a TOML/JSON file, or
    /// plain dicts), atomically: checks already running finish on the old
    /// policy, every later one uses the new one. A rule that keeps its name,
    /// key and algorithm (and the prefix) keeps its state; the others start
    /// afresh. The limiter's own options (`prefix`, `on_backend_error`,
    /// `key_secret`) apply to the new policy; the timeout stays. Raises
    /// `InvalidPolicyError` for a policy that does not parse, or one in
    /// which a rule keeps its name and key but changes its algorithm, and
    /// `ClosedError` after `close()`; the old policy then stays in force
    /// (a file that does not parse, and every refusal, is counted by
    /// `reload_status()`). Returns what changed, as the core's `PolicyDiff`
    /// (and `throttlegate diff --json`): `{"rules": [{"name", "change",
    /// "state_kept", "fields"}], "settings": [{"field", "old", "new"}]}`,
    /// `change` one of `unchanged`, `changed`, `replaced`, `added`, `removed`.
    fn reload<'py>(&self, py: Python<'py>, policy: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || {
            let answer = if policy.is_instance_of::<pyo3::types::PyString>() || policy.hasattr("__fspath__")? {
                let path: std::path::PathBuf = policy
                    .extract()
                    .map_err(|_| crate::errors::invalid_argument(py, "policy: the path is not a valid file name"))?;
                self.inner.reload_file(path)
            } else {
                self.inner.reload(Policy::resolve(policy)?)
            };
            let diff = answer.map_err(|e| core_to_py(py, &e))?;
            convert::from_json(py, &diff.to_json())
        })
    }

    /// How reloads went: `{"reloads": applied, "errors": refused,
    /// "last_error": the last refusal's message or None, "watching": the
    /// watched file or None}`. Background reloads (`reload_on_change`)
    /// report their failures here, and in the metrics
    /// (`throttlegate_policy_reload_errors_total`).
    fn reload_status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.reload_status();
        let d = PyDict::new(py);
        d.set_item("reloads", s.reloads)?;
        d.set_item("errors", s.errors)?;
        d.set_item("last_error", s.last_error.map(|e| e.to_string()))?;
        d.set_item("watching", s.watching.map(|p| p.to_string_lossy().into_owned()))?;
        Ok(d)
    }

    /// Close the limiter: every later call raises `ClosedError`. Idempotent.
    fn close(&self) {
        self.inner.close();
    }

    /// True after `close()`.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// `"memory"`, `"redis"` or `"cluster"` (`"closed"` after `close()`).
    #[getter]
    fn backend(&self) -> &'static str {
        self.inner.backend_name()
    }

    /// The policy in force (the last one reloaded), with the limiter's overrides applied.
    #[getter]
    fn policy(&self) -> Policy {
        Policy { inner: self.inner.policy() }
    }

    /// The request model an HTTP integration checks with, made by the core
    /// from the framework's raw parts: `ip` (already resolved, e.g. by
    /// `ClientIp`), `method`, `route` (the template of the route the
    /// framework dispatches to, in its own syntax, mount prefix included;
    /// None when none matches), `path` (the request target's path as
    /// received), `host` (the Host header), `headers` (`(name, value)` pairs,
    /// at least those `request_headers()` names) and the router's rules
    /// (`case_insensitive`, `ignore_trailing_slash`). Returns the dict to
    /// pass to `check`: `ip`, `method`, `route` and `host` when present, the
    /// normalised `path`, and each `[attributes]` source present.
    #[pyo3(signature = (*, method, path, ip = None, route = None, host = None, headers = None, case_insensitive = false, ignore_trailing_slash = false))]
    #[allow(clippy::too_many_arguments)]
    fn request_attributes<'py>(
        &self,
        py: Python<'py>,
        method: &Bound<'py, PyAny>,
        path: &Bound<'py, PyAny>,
        ip: Option<&Bound<'py, PyAny>>,
        route: Option<&Bound<'py, PyAny>>,
        host: Option<&Bound<'py, PyAny>>,
        headers: Option<&Bound<'py, PyAny>>,
        case_insensitive: bool,
        ignore_trailing_slash: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        crate::http::request_attributes(py, &self.inner, ip, method, route, path, host, headers, case_insensitive, ignore_trailing_slash)
    }

    /// The lower-case names of the request headers the policy's
    /// `[attributes]` table reads (what `request_attributes` needs in `headers`).
    fn request_headers(&self) -> Vec<String> {
        self.inner.request_headers()
    }

    /// One message per rule that needs an attribute neither in `provided`
    /// (default: the request model, `REQUEST_MODEL`) nor in the policy's
    /// `[attributes]`: what an integration logs at start-up.
    #[pyo3(signature = (provided = None))]
    fn attribute_warnings(&self, py: Python<'_>, provided: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
        crate::http::attribute_warnings(py, &self.inner, provided)
    }

    /// Add a limit written on a route to the policy in force (kept across
    /// `reload`): `rate` in the core's grammar (`"5/minute"`, `"100 per
    /// hour"`, `"10/30s"`, several joined by `;`) becomes sliding-window
    /// rules matching `route` (a template in the framework's syntax) and
    /// `methods` (empty or None: any), keyed on `key` (a template, default
    /// `"{ip}"`), named `name` (default: derived from the route). They are
    /// checked in the same single call as the policy's other rules. Returns
    /// the rule names; adding the same limit again returns the same names.
    /// Raises `InvalidArgumentError` naming what is wrong.
    #[pyo3(signature = (rate, route, *, methods = None, key = None, name = None))]
    fn add_route_limit(
        &self,
        py: Python<'_>,
        rate: &Bound<'_, PyAny>,
        route: &Bound<'_, PyAny>,
        methods: Option<&Bound<'_, PyAny>>,
        key: Option<&Bound<'_, PyAny>>,
        name: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<String>> {
        crate::http::add_route_limit(py, &self.inner, rate, route, methods, key, name)
    }

    /// `with Limiter(...) as limiter:` yields the limiter itself.
    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Leaving a `with` block closes the limiter; exceptions propagate.
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close();
        false
    }

    /// `async with Limiter(...) as limiter:` yields the limiter itself.
    fn __aenter__<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        runtime::ready(py, slf.into_any())
    }

    /// Leaving an `async with` block closes the limiter; exceptions propagate.
    #[pyo3(signature = (*_args))]
    fn __aexit__<'py>(&self, py: Python<'py>, _args: &Bound<'py, pyo3::types::PyTuple>) -> PyResult<Bound<'py, PyAny>> {
        self.close();
        runtime::ready(py, false.into_bound_py_any(py)?)
    }

    /// A readable summary for logs and the REPL.
    fn __repr__(&self) -> String {
        format!(
            "Limiter(backend={:?}, rules={:?}, closed={})",
            self.backend(),
            self.inner.policy().rules().iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
            if self.closed() { "True" } else { "False" }
        )
    }
}
