//! Python values to core types. Every failure names the argument at fault.

use pyo3::exceptions::PyUnicodeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyMapping, PyString, PyTuple};
use serde_json::{Map, Number, Value};
use throttlegate::OptionValue;
use smallvec::SmallVec;

use crate::errors::{invalid_argument, invalid_type};

/// Deepest nesting accepted in a policy given as dicts and lists; a policy
/// is three levels deep, so this only stops runaway recursion.
const MAX_DEPTH: usize = 32;

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".to_string())
}

/// A Python `str` as Rust text; lone surrogates are refused with a message
/// naming `what`.
pub fn text(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    let py = obj.py();
    let s = obj
        .cast::<PyString>()
        .map_err(|_| invalid_type(py, format!("{what}: expected str, got {}", type_name(obj))))?;
    match s.to_cow() {
        Ok(t) => Ok(t.to_string()),
        Err(e) if e.is_instance_of::<PyUnicodeError>(py) => Err(invalid_argument(
            py,
            format!("{what}: not valid Unicode text (it contains a lone surrogate)"),
        )),
        Err(e) => Err(e),
    }
}

/// An optional `str` argument (`None` is absent).
pub fn opt_text(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<String>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => text(o, what).map(Some),
    }
}

// In every CPython 3 (and in the limited API since 3.10, so pyo3 declares it
// only for abi3 builds of 3.10 and later): the string's UTF-8 form. For ASCII
// text that is the string's own storage; other text gets its UTF-8 form made
// once and kept with the string, as CPython does for many of its own calls.
extern "C" {
    fn PyUnicode_AsUTF8AndSize(unicode: *mut pyo3::ffi::PyObject, size: *mut pyo3::ffi::Py_ssize_t) -> *const std::ffi::c_char;
}

/// Append the text of `s` to `out` as UTF-8. `Ok(false)` when it holds a
/// lone surrogate (`out` is then unchanged). The bytes are copied straight
/// from the string's UTF-8 form: no Python object is made on the way.
fn push_utf8(s: &Bound<'_, PyString>, out: &mut String) -> PyResult<bool> {
    let py = s.py();
    let mut len: pyo3::ffi::Py_ssize_t = 0;
    // SAFETY: `s` is a live str; the result stays valid while `s` lives.
    let data = unsafe { PyUnicode_AsUTF8AndSize(s.as_ptr(), &mut len) };
    if data.is_null() {
        let e = PyErr::fetch(py);
        return if e.is_instance_of::<PyUnicodeError>(py) { Ok(false) } else { Err(e) };
    }
    // SAFETY: CPython wrote `len` bytes of valid UTF-8 at `data`.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len as usize) };
    out.push_str(unsafe { std::str::from_utf8_unchecked(bytes) });
    Ok(true)
}

fn surrogate(py: Python<'_>, what: &str) -> PyErr {
    invalid_argument(py, format!("{what}: not valid Unicode text (it contains a lone surrogate)"))
}

/// Request attributes as given: the mapping's own name and value objects,
/// in mapping order, type-checked but not yet converted.
pub struct PyAttrs<'py> {
    items: SmallVec<[(Bound<'py, PyString>, Bound<'py, PyAny>); 4]>,
}

/// Request attributes as text: the core's reusable buffer.
pub type OwnedAttrs = throttlegate::AttributeBuf;

impl<'py> PyAttrs<'py> {
    /// Read a mapping of `str` to `str` (or `int`); a `None` value means the
    /// request lacks that attribute. Only types are checked here: no Python
    /// code runs while the mapping is walked.
    pub fn read(obj: &Bound<'py, PyAny>) -> PyResult<PyAttrs<'py>> {
        let py = obj.py();
        let mut attrs = PyAttrs { items: SmallVec::new() };
        if let Ok(d) = obj.cast::<PyDict>() {
            for (k, v) in d.iter() {
                attrs.push(k, v)?;
            }
            return Ok(attrs);
        }
        if let Ok(m) = obj.cast::<PyMapping>() {
            for item in m.items()?.iter() {
                let pair = item.cast_into::<PyTuple>()?;
                attrs.push(pair.get_item(0)?, pair.get_item(1)?)?;
            }
            return Ok(attrs);
        }
        Err(invalid_type(
            py,
            format!("attributes: expected a mapping of str to str, got {}", type_name(obj)),
        ))
    }

    fn push(&mut self, k: Bound<'py, PyAny>, v: Bound<'py, PyAny>) -> PyResult<()> {
        let py = k.py();
        let name = match k.cast_into::<PyString>() {
            Ok(name) => name,
            Err(e) => {
                let k = e.into_inner();
                let err = invalid_type(py, format!("attributes: names must be str, got {}", type_name(&k)));
                return Err(self.first_error(err));
            }
        };
        let ok = v.is_none()
            || v.is_instance_of::<PyString>()
            || (v.is_instance_of::<PyInt>() && !v.is_instance_of::<PyBool>());
        if !ok {
            // The name comes first: a bad name is reported before a bad value.
            let mut text = String::new();
            let err = match push_utf8(&name, &mut text) {
                Ok(true) => invalid_type(
                    py,
                    format!("attributes[{text:?}]: expected str, int or None, got {}", type_name(&v)),
                ),
                Ok(false) => surrogate(py, "attributes: a name"),
                Err(e) => e,
            };
            return Err(self.first_error(err));
        }
        self.items.push((name, v));
        Ok(())
    }

    /// The error to report when the next item is wrong with `err`: an
    /// earlier item's text error comes first, as a one-pass check finds it.
    fn first_error(&self, err: PyErr) -> PyErr {
        match self.convert(self.items.len(), OwnedAttrs::default()) {
            Err(earlier) => earlier,
            Ok(_) => err,
        }
    }

    /// The attributes as text, checked in mapping order.
    pub fn text(&self) -> PyResult<OwnedAttrs> {
        self.convert(self.items.len(), OwnedAttrs::take())
    }

    fn convert(&self, n: usize, mut attrs: OwnedAttrs) -> PyResult<OwnedAttrs> {
        for (k, v) in self.items.iter().take(n) {
            let buf = attrs.text_mut();
            let start = buf.len();
            let py = k.py();
            if !push_utf8(k, buf)? {
                return Err(surrogate(py, "attributes: a name"));
            }
            let mid = buf.len();
            if v.is_none() {
                buf.truncate(start);
                continue;
            }
            let valid = if let Ok(s) = v.cast::<PyString>() {
                push_utf8(s, buf)?
            } else {
                push_utf8(&v.str()?, buf)?
            };
            if !valid {
                let name = &buf[start..mid];
                return Err(surrogate(py, &format!("attributes[{name:?}]")));
            }
            attrs.end_attribute(start, mid).map_err(|e| crate::errors::core_to_py(py, &e))?;
        }
        Ok(attrs)
    }
}

/// Request attributes from a mapping of `str` to `str` (or `int`).
pub fn attributes(obj: &Bound<'_, PyAny>) -> PyResult<OwnedAttrs> {
    PyAttrs::read(obj)?.text()
}

/// The optional `cost` argument: 1 when absent.
pub fn opt_cost(obj: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
    match obj {
        None => Ok(1),
        Some(c) => cost(c),
    }
}

/// A cost: an `int` of at least 0 (the core says why 0 is refused).
pub fn cost(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    let py = obj.py();
    if !obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyBool>() {
        return Err(invalid_type(py, format!("cost: expected int, got {}", type_name(obj))));
    }
    obj.extract::<u64>()
        .map_err(|_| invalid_argument(py, format!("cost: {} is not an integer >= 1", obj.repr().map(|r| r.to_string()).unwrap_or_default())))
}

/// An override's `limit`: an `int` of at least 0 (the core checks the range).
pub fn limit(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    let py = obj.py();
    if !obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyBool>() {
        return Err(invalid_type(py, format!("limit: expected int, got {}", type_name(obj))));
    }
    obj.extract::<u64>()
        .map_err(|_| invalid_argument(py, format!("limit: {} is not an integer >= 1", obj.repr().map(|r| r.to_string()).unwrap_or_default())))
}

/// An `int` of at least 0 named `what` (the core bounds it).
pub fn count(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    let py = obj.py();
    if !obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyBool>() {
        return Err(invalid_type(py, format!("{what}: expected int, got {}", type_name(obj))));
    }
    obj.extract::<u64>()
        .map_err(|_| invalid_argument(py, format!("{what}: {} is not an integer >= 0", obj.repr().map(|r| r.to_string()).unwrap_or_default())))
}

/// A keyword argument as the core's [`OptionValue`] (the core checks it and
/// words the errors): `None`, `bool`, `int`/`float`, `str` (checked for lone
/// surrogates), `bytes`, a `ManualClock`, or a list or tuple of these.
pub fn option_value(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<OptionValue> {
    Ok(if obj.is_none() {
        OptionValue::Unset
    } else if let Ok(b) = obj.cast::<PyBool>() {
        OptionValue::Bool(b.is_true())
    } else if obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyFloat>() {
        OptionValue::Number(obj.extract()?)
    } else if obj.is_instance_of::<PyString>() {
        OptionValue::Text(text(obj, what)?)
    } else if let Ok(b) = obj.cast::<PyBytes>() {
        OptionValue::Bytes(b.as_bytes().to_vec())
    } else if let Ok(c) = obj.cast::<crate::clock::ManualClock>() {
        OptionValue::Clock(throttlegate::Clock::Manual(c.get().inner.clone()))
    } else if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let mut items = Vec::new();
        for (i, item) in obj.try_iter()?.enumerate() {
            items.push(option_value(&item?, &format!("{what}[{i}]"))?);
        }
        OptionValue::List(items)
    } else {
        OptionValue::Other(type_name(obj))
    })
}

/// `InvalidPolicyError`: everything wrong inside a policy tree is a policy error.
fn invalid_policy(py: Python<'_>, message: String) -> PyErr {
    crate::errors::make(py, throttlegate::ErrorKind::InvalidPolicy.as_str(), &message, false)
}

/// A policy given as Python dicts and lists, as the JSON value the core reads.
pub fn to_json(obj: &Bound<'_, PyAny>, path: &str, depth: usize) -> PyResult<Value> {
    let py = obj.py();
    if depth > MAX_DEPTH {
        return Err(invalid_policy(py, format!("policy: {path} is nested too deeply")));
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        if let Ok(v) = obj.extract::<i64>() {
            return Ok(Value::from(v));
        }
        if let Ok(v) = obj.extract::<u64>() {
            return Ok(Value::from(v));
        }
        return Err(invalid_policy(py, format!("policy: {path}: the integer is too large")));
    }
    if obj.is_instance_of::<PyFloat>() {
        let v: f64 = obj.extract()?;
        return Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| invalid_policy(py, format!("policy: {path}: {v} is not a finite number")));
    }
    if obj.is_instance_of::<PyString>() {
        return text(obj, &format!("policy: {path}"))
            .map(Value::String)
            .map_err(|_| invalid_policy(py, format!("policy: {path}: not valid Unicode text")));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = Map::new();
        for (k, v) in d.iter() {
            if !k.is_instance_of::<PyString>() {
                return Err(invalid_policy(
                    py,
                    format!("policy: {path}: keys must be str, got {}", type_name(&k)),
                ));
            }
            let key = text(&k, &format!("policy: {path}: a key"))
                .map_err(|_| invalid_policy(py, format!("policy: {path}: a key is not valid Unicode text")))?;
            let child = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
            map.insert(key, to_json(&v, &child, depth + 1)?);
        }
        return Ok(Value::Object(map));
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let mut out = Vec::new();
        for (i, item) in obj.try_iter()?.enumerate() {
            out.push(to_json(&item?, &format!("{path}[{i}]"), depth + 1)?);
        }
        return Ok(Value::Array(out));
    }
    let at = if path.is_empty() { "the policy".to_string() } else { path.to_string() };
    Err(invalid_policy(
        py,
        format!("policy: {at}: expected dict, list, str, int, float, bool or None, got {}", type_name(obj)),
    ))
}

/// A JSON value as plain Python objects (through Python's own `json`).
pub fn from_json<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?.call_method1("loads", (value.to_string(),))
}

/// A PEM document for a TLS option: `bytes` are the PEM data itself; a `str`
/// or `os.PathLike` is the path of a PEM file, read now so that a missing
/// file is reported when the limiter is made rather than at the first call.
pub fn pem(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u8>> {
    let py = obj.py();
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(b.to_vec());
    }
    if obj.is_instance_of::<PyString>() {
        // PEM text given as `str` would otherwise be taken for a file name
        // and reported as a missing file, which hides the real mistake.
        if text(obj, what)?.trim_start().starts_with("-----BEGIN") {
            return Err(invalid_argument(
                py,
                format!("{what}: a str is a file path; pass PEM data as bytes (text.encode())"),
            ));
        }
    } else if !obj.hasattr("__fspath__")? {
        return Err(invalid_type(
            py,
            format!("{what}: expected PEM data (bytes) or a PEM file's path (str or os.PathLike), got {}", type_name(obj)),
        ));
    }
    let path: std::path::PathBuf = obj
        .extract()
        .map_err(|_| invalid_argument(py, format!("{what}: the path is not a valid file name")))?;
    std::fs::read(&path)
        .map_err(|e| invalid_argument(py, format!("{what}: cannot read {}: {e}", path.display())))
}

/// Overrides as a list of dicts `{"rule", "attributes", "limit"}`.
pub fn overrides<'py>(py: Python<'py>, list: &[throttlegate::Override]) -> PyResult<Bound<'py, PyAny>> {
    let out = pyo3::types::PyList::empty(py);
    for o in list {
        let d = pyo3::types::PyDict::new(py);
        d.set_item("rule", &o.rule)?;
        let attrs = pyo3::types::PyDict::new(py);
        for (k, v) in &o.attributes {
            attrs.set_item(k, v)?;
        }
        d.set_item("attributes", attrs)?;
        d.set_item("limit", o.limit)?;
        out.append(d)?;
    }
    Ok(out.into_any())
}
