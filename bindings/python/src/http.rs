//! The core's request model and route limits (`throttlegate::http`) for the
//! Python HTTP integrations: conversions only, every rule is the core's.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use throttlegate as core;

use crate::convert;
use crate::errors::{core_to_py, guard, invalid_type};

/// `(name, value)` pairs from a sequence of 2-tuples (or a mapping).
fn pairs(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Vec<(String, String)>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(Vec::new()) };
    let py = obj.py();
    let mut out = Vec::new();
    if let Ok(map) = obj.cast::<PyDict>() {
        for (k, v) in map.iter() {
            out.push((convert::text(&k, what)?, convert::text(&v, what)?));
        }
        return Ok(out);
    }
    let iter = obj
        .try_iter()
        .map_err(|_| invalid_type(py, format!("{what}: expected (name, value) pairs, got {}", type_name(obj))))?;
    for item in iter {
        let item = item?;
        let pair = match item.cast::<PyTuple>() {
            Ok(t) if t.len() == 2 => t,
            Ok(t) => return Err(invalid_type(py, format!("{what}: expected (name, value) pairs, got a tuple of {} items", t.len()))),
            Err(_) => return Err(invalid_type(py, format!("{what}: expected (name, value) pairs, got an item of type {}", type_name(&item)))),
        };
        out.push((convert::text(&pair.get_item(0)?, what)?, convert::text(&pair.get_item(1)?, what)?));
    }
    Ok(out)
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "object".into())
}

/// Text items of a sequence (a lone str is refused: it would be its letters).
fn texts(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Vec<String>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(Vec::new()) };
    let py = obj.py();
    if obj.is_instance_of::<pyo3::types::PyString>() {
        return Err(invalid_type(py, format!("{what}: expected a list of str, got a str")));
    }
    let iter = obj
        .try_iter()
        .map_err(|_| invalid_type(py, format!("{what}: expected a list of str, got {}", type_name(obj))))?;
    iter.map(|item| convert::text(&item?, what)).collect()
}

/// `Limiter.request_attributes`: the request model as a dict.
#[allow(clippy::too_many_arguments)]
pub fn request_attributes<'py>(
    py: Python<'py>,
    limiter: &core::Limiter,
    ip: Option<&Bound<'py, PyAny>>,
    method: &Bound<'py, PyAny>,
    route: Option<&Bound<'py, PyAny>>,
    path: &Bound<'py, PyAny>,
    host: Option<&Bound<'py, PyAny>>,
    headers: Option<&Bound<'py, PyAny>>,
    case_insensitive: bool,
    ignore_trailing_slash: bool,
) -> PyResult<Bound<'py, PyDict>> {
    guard(py, || {
        let ip = convert::opt_text(ip, "ip")?;
        let method = convert::text(method, "method")?;
        let route = convert::opt_text(route, "route")?;
        let path = convert::text(path, "path")?;
        let host = convert::opt_text(host, "host")?;
        let headers = pairs(headers, "headers")?;
        let header_refs: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let req = core::HttpRequest {
            ip: ip.as_deref(),
            method: &method,
            route: route.as_deref(),
            path: &path,
            host: host.as_deref(),
            headers: &header_refs,
            router: core::RouterRules { case_insensitive, ignore_trailing_slash },
        };
        let out = PyDict::new(py);
        for (name, value) in limiter.request_attributes(&req) {
            out.set_item(name, value)?;
        }
        Ok(out)
    })
}

/// `Limiter.attribute_warnings`.
pub fn attribute_warnings(py: Python<'_>, limiter: &core::Limiter, provided: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    guard(py, || {
        let provided = match provided {
            None => core::REQUEST_MODEL.iter().map(|s| s.to_string()).collect(),
            Some(p) => texts(Some(p), "provided")?,
        };
        let refs: Vec<&str> = provided.iter().map(String::as_str).collect();
        Ok(limiter.attribute_warnings(&refs))
    })
}

/// `Limiter.add_route_limit`.
#[allow(clippy::too_many_arguments)]
pub fn add_route_limit(
    py: Python<'_>,
    limiter: &core::Limiter,
    rate: &Bound<'_, PyAny>,
    route: &Bound<'_, PyAny>,
    methods: Option<&Bound<'_, PyAny>>,
    key: Option<&Bound<'_, PyAny>>,
    name: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<String>> {
    guard(py, || {
        let limit = core::RouteLimit {
            rate: convert::text(rate, "rate")?,
            route: convert::text(route, "route")?,
            methods: texts(methods, "methods")?,
            key: convert::opt_text(key, "key")?,
            name: convert::opt_text(name, "name")?,
        };
        limiter.add_route_limit(&limit).map_err(|e| core_to_py(py, &e))
    })
}

/// `parse_rate(text)`: the rates a rate string means, as `(limit, window
/// in seconds)` tuples, in the core's one grammar (`"5/minute"`, `"100 per
/// hour"`, `"10/30s"`, several joined by `;`). Raises `InvalidArgumentError`
/// naming what is wrong.
#[pyfunction]
pub fn parse_rate(py: Python<'_>, text: &Bound<'_, PyAny>) -> PyResult<Vec<(u64, f64)>> {
    guard(py, || {
        let text = convert::text(text, "rate")?;
        let rates = core::parse_rate(&text).map_err(|e| core_to_py(py, &e))?;
        Ok(rates.iter().map(|r| (r.limit, r.window.as_secs_f64())).collect())
    })
}
