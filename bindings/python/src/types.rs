//! Python classes for the core's value types: policies, decisions,
//! client-address extraction (the manual clock is in `clock`).

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use throttlegate as core;

use crate::convert;
use crate::errors::{core_to_py, guard, invalid_argument, invalid_type};

/// A validated, ordered set of rules and the settings they share.
#[pyclass(module = "throttlegate._native", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct Policy {
    pub(crate) inner: core::Policy,
}

impl Policy {
    /// Resolve the `policy` argument of `Limiter`: a `Policy`, a path to a
    /// TOML/JSON file, a dict in the file format, or a list of rule dicts.
    pub fn resolve(obj: &Bound<'_, PyAny>) -> PyResult<core::Policy> {
        let py = obj.py();
        if let Ok(p) = obj.cast::<Policy>() {
            return Ok(p.get().inner.clone());
        }
        if obj.is_instance_of::<PyString>() || obj.hasattr("__fspath__")? {
            let path: PathBuf = obj
                .extract()
                .map_err(|_| invalid_argument(py, "policy: the path is not a valid file name"))?;
            return core::Policy::from_file(path).map_err(|e| core_to_py(py, &e));
        }
        if obj.is_instance_of::<PyDict>() || obj.is_instance_of::<PyList>() {
            return Policy::from_python(obj);
        }
        Err(invalid_type(
            py,
            format!(
                "policy: expected a Policy, a path to a TOML or JSON file, a dict or a list of rules, got {}",
                obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
            ),
        ))
    }

    fn from_python(obj: &Bound<'_, PyAny>) -> PyResult<core::Policy> {
        let py = obj.py();
        // A bare list is the `rules` array; paths in messages say so.
        let top = if obj.is_instance_of::<PyList>() { "rules" } else { "" };
        let mut value = convert::to_json(obj, top, 0)?;
        if value.is_array() {
            value = serde_json::json!({ "rules": value });
        }
        core::Policy::from_value(&value).map_err(|e| core_to_py(py, &e))
    }
}

#[pymethods]
impl Policy {
    /// A policy from plain dicts (the file format) or a list of rule dicts.
    #[new]
    fn new(py: Python<'_>, source: &Bound<'_, PyAny>) -> PyResult<Self> {
        guard(py, || {
            if !(source.is_instance_of::<PyDict>() || source.is_instance_of::<PyList>()) {
                return Err(invalid_type(
                    py,
                    "policy: expected a dict in the file format or a list of rule dicts (use Policy.from_file for a path)",
                ));
            }
            Ok(Policy { inner: Policy::from_python(source)? })
        })
    }

    /// Read a policy file (`.toml`, `.json`, or guessed from the content).
    #[staticmethod]
    fn from_file(py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<Self> {
        guard(py, || {
            if !(path.is_instance_of::<PyString>() || path.hasattr("__fspath__")?) {
                return Err(invalid_type(py, "path: expected str or os.PathLike"));
            }
            let path: PathBuf = path
                .extract()
                .map_err(|_| invalid_argument(py, "path: not a valid file name"))?;
            let inner = core::Policy::from_file(path).map_err(|e| core_to_py(py, &e))?;
            Ok(Policy { inner })
        })
    }

    /// Parse policy text, TOML or JSON (text starting with `{` is JSON).
    #[staticmethod]
    fn from_str(py: Python<'_>, text: &Bound<'_, PyAny>) -> PyResult<Self> {
        guard(py, || {
            let text = convert::text(text, "text")?;
            let inner = core::Policy::from_str_any(&text).map_err(|e| core_to_py(py, &e))?;
            Ok(Policy { inner })
        })
    }

    /// The policy as plain dicts, in the file format.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        guard(py, || convert::from_json(py, &self.inner.to_value()))
    }

    /// The rule names, in policy order.
    #[getter]
    fn rule_names(&self) -> Vec<String> {
        self.inner.rules().iter().map(|r| r.name.clone()).collect()
    }

    /// The key prefix.
    #[getter]
    fn prefix(&self) -> String {
        self.inner.prefix().to_string()
    }

    /// The timeout of one call, in seconds.
    #[getter]
    fn timeout(&self) -> f64 {
        self.inner.timeout().as_secs_f64()
    }

    /// `"allow"`, `"deny"` or `"error"`.
    #[getter]
    fn on_backend_error(&self) -> &'static str {
        self.inner.on_backend_error().as_str()
    }

    /// The number of rules.
    fn __len__(&self) -> usize {
        self.inner.rules().len()
    }

    /// A readable summary for logs and the REPL.
    fn __repr__(&self) -> String {
        format!("Policy(rules={:?}, prefix={:?})", self.rule_names(), self.inner.prefix())
    }
}

/// The outcome of one rule for one check.
#[pyclass(module = "throttlegate._native", frozen)]
pub struct RuleResult {
    inner: core::RuleResult,
}

#[pymethods]
impl RuleResult {
    /// The rule's name.
    #[getter]
    fn rule(&self) -> &str {
        &self.inner.rule
    }
    /// Whether this rule admits the request (for a shadow rule: would admit).
    #[getter]
    fn allowed(&self) -> bool {
        self.inner.allowed
    }
    /// The rule is in shadow mode: reported, never the cause of a denial.
    #[getter]
    fn shadow(&self) -> bool {
        self.inner.shadow
    }
    /// The rule's limit or capacity.
    #[getter]
    fn limit(&self) -> u64 {
        self.inner.limit
    }
    /// Units left.
    #[getter]
    fn remaining(&self) -> u64 {
        self.inner.remaining
    }
    /// Seconds until a request of the same cost would pass this rule.
    #[getter]
    fn retry_after(&self) -> f64 {
        self.inner.retry_after.as_secs_f64()
    }
    /// Seconds until the rule is back to full.
    #[getter]
    fn reset_after(&self) -> f64 {
        self.inner.reset_after.as_secs_f64()
    }
    /// `retry_after` in whole milliseconds, rounded up.
    #[getter]
    fn retry_after_ms(&self) -> u64 {
        core::ceil_millis(self.inner.retry_after)
    }
    /// `reset_after` in whole milliseconds, rounded up.
    #[getter]
    fn reset_after_ms(&self) -> u64 {
        core::ceil_millis(self.inner.reset_after)
    }
    /// The window advertised in headers, in seconds.
    #[getter]
    fn window(&self) -> f64 {
        self.inner.window.as_secs_f64()
    }

    /// A readable summary for logs and the REPL.
    fn __repr__(&self) -> String {
        format!(
            "RuleResult(rule={}, allowed={}, remaining={}, retry_after={:?})",
            py_str(&self.inner.rule),
            py_bool(self.inner.allowed),
            self.inner.remaining,
            self.inner.retry_after.as_secs_f64()
        )
    }
}

/// A rule name as a Python string literal (names are plain printable text).
fn py_str(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// The answer to one check.
#[pyclass(module = "throttlegate._native", frozen, freelist = 256)]
pub struct Decision {
    pub(crate) inner: core::Decision,
}

impl From<core::Decision> for Decision {
    fn from(inner: core::Decision) -> Self {
        Decision { inner }
    }
}

fn headers_dict<'py>(py: Python<'py>, pairs: Vec<(&'static str, String)>) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (k, v) in pairs {
        dict.set_item(k, v)?;
    }
    Ok(dict)
}

#[pymethods]
impl Decision {
    /// Whether the request is admitted.
    #[getter]
    fn allowed(&self) -> bool {
        self.inner.allowed
    }
    /// The headline rule's limit (0 when no rule applied).
    #[getter]
    fn limit(&self) -> u64 {
        self.inner.limit
    }
    /// The headline rule's remaining units.
    #[getter]
    fn remaining(&self) -> u64 {
        self.inner.remaining
    }
    /// Seconds to wait before retrying (0.0 when allowed).
    #[getter]
    fn retry_after(&self) -> f64 {
        self.inner.retry_after.as_secs_f64()
    }
    /// Seconds until the headline rule is back to full.
    #[getter]
    fn reset_after(&self) -> f64 {
        self.inner.reset_after.as_secs_f64()
    }
    /// `retry_after` in whole milliseconds, rounded up.
    #[getter]
    fn retry_after_ms(&self) -> u64 {
        self.inner.retry_after_ms()
    }
    /// `reset_after` in whole milliseconds, rounded up.
    #[getter]
    fn reset_after_ms(&self) -> u64 {
        self.inner.reset_after_ms()
    }
    /// The most restrictive rule's name; None when no rule applied.
    #[getter]
    fn rule(&self) -> Option<&str> {
        self.inner.rule.as_deref()
    }
    /// One result per applied rule, in policy order.
    #[getter]
    fn results(&self) -> Vec<RuleResult> {
        self.inner.results.iter().cloned().map(|inner| RuleResult { inner }).collect()
    }
    /// True when the answer came from `on_backend_error`, not the backend.
    #[getter]
    fn degraded(&self) -> bool {
        self.inner.degraded
    }
    /// The lease id of the concurrency slots this admitted decision holds
    /// (the check's `call_id` when given, else an id the limiter made), for
    /// `Limiter.release_call` elsewhere; None when it holds no slot (a
    /// denial, or no concurrency rule applied: nothing to release).
    #[getter]
    fn lease_id(&self) -> Option<&str> {
        self.inner.lease_id()
    }
    /// The HTTP headers, in order (no legacy `X-RateLimit-*`).
    #[getter]
    fn headers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        headers_dict(py, self.inner.headers())
    }
    /// The HTTP headers; with `legacy=True` also `X-RateLimit-*`.
    #[pyo3(signature = (*, legacy = false))]
    fn headers_with<'py>(&self, py: Python<'py>, legacy: bool) -> PyResult<Bound<'py, PyDict>> {
        headers_dict(py, self.inner.headers_with(core::HeaderOptions { legacy }))
    }
    /// An `application/problem+json` body (RFC 9457) naming the violated
    /// rules; `None` when the request is allowed.
    fn problem_json(&self) -> Option<String> {
        self.inner.problem_json()
    }

    /// A readable summary for logs and the REPL.
    fn __repr__(&self) -> String {
        format!(
            "Decision(allowed={}, limit={}, remaining={}, retry_after={:?}, reset_after={:?}, rule={}, degraded={})",
            py_bool(self.inner.allowed),
            self.inner.limit,
            self.inner.remaining,
            self.inner.retry_after.as_secs_f64(),
            self.inner.reset_after.as_secs_f64(),
            match &self.inner.rule {
                Some(r) => py_str(r),
                None => "None".to_string(),
            },
            py_bool(self.inner.degraded)
        )
    }
}

/// Finds the client address of a request: the socket peer by default,
/// forwarded headers only through trusted proxies.
#[pyclass(module = "throttlegate._native", frozen)]
pub struct ClientIp {
    inner: core::ClientIpConfig,
}

#[pymethods]
impl ClientIp {
    /// Trust these proxies (addresses or CIDR networks); group IPv6 clients
    /// by `ipv6_prefix` bits.
    #[new]
    #[pyo3(signature = (trusted_proxies = None, ipv6_prefix = None))]
    fn new(py: Python<'_>, trusted_proxies: Option<&Bound<'_, PyAny>>, ipv6_prefix: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        guard(py, || {
            let mut given = Vec::new();
            for (option, what, value) in [(core::ClientIpOption::TrustedProxies, "trusted_proxies", trusted_proxies), (core::ClientIpOption::Ipv6Prefix, "ipv6_prefix", ipv6_prefix)] {
                if let Some(value) = value {
                    given.push((option, what.to_string(), convert::option_value(value, what)?));
                }
            }
            let inner = core::ClientIpConfig::from_options(given).map_err(|e| core_to_py(py, &e))?;
            Ok(ClientIp { inner })
        })
    }

    /// The client address to limit on (IPv4 dotted, or an IPv6 network as
    /// `addr/prefix`); None when `peer` is not an IP address.
    #[pyo3(signature = (peer, forwarded = None, x_forwarded_for = None))]
    fn client_ip(
        &self,
        py: Python<'_>,
        peer: &Bound<'_, PyAny>,
        forwarded: Option<&Bound<'_, PyAny>>,
        x_forwarded_for: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<String>> {
        guard(py, || {
            let peer = convert::text(peer, "peer")?;
            let fwd = convert::opt_text(forwarded, "forwarded")?;
            let xff = convert::opt_text(x_forwarded_for, "x_forwarded_for")?;
            Ok(self.inner.client_ip(&peer, fwd.as_deref(), xff.as_deref()))
        })
    }
}
