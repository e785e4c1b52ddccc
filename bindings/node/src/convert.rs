//! JavaScript values to the core's types, with errors that name the argument
//! or option at fault (never napi's generic conversion errors).

use std::ptr;
use std::time::Duration;

use napi::bindgen_prelude::{Buffer, ClassInstance, FromNapiValue};
use napi::{sys, Env, JsValue, Unknown, ValueType};
use throttlegate::{
    AttributeBuf, CheckOptions, Clock, Error, ErrorKind, FailureMode, LimiterOptions,
};

use crate::errors::{internal, invalid_argument};
use crate::{ManualClock, Policy};

/// Largest integer a JavaScript number holds exactly.
const MAX_SAFE: f64 = 9_007_199_254_740_991.0;

fn type_name(t: ValueType) -> &'static str {
    match t {
        ValueType::Undefined => "undefined",
        ValueType::Null => "null",
        ValueType::Boolean => "a boolean",
        ValueType::Number => "a number",
        ValueType::String => "a string",
        ValueType::Symbol => "a symbol",
        ValueType::Object => "an object",
        ValueType::Function => "a function",
        ValueType::External => "an external value",
        ValueType::BigInt => "a bigint",
        _ => "an unknown value",
    }
}

fn type_of(v: &Unknown<'_>) -> Result<ValueType, Error> {
    v.get_type()
        .map_err(|_| internal("cannot read a JavaScript value's type"))
}

fn is_array(env: &Env, v: sys::napi_value) -> bool {
    let mut out = false;
    let status = unsafe { sys::napi_is_array(env.raw(), v, &mut out) };
    status == sys::Status::napi_ok && out
}

fn napi_failed(what: &str, e: napi::Error) -> Error {
    invalid_argument(format!("{what}: {}", e.reason))
}

/// Own enumerable string-keyed properties of an object, in order.
fn entries<'a>(
    env: &'a Env,
    obj: &Unknown<'_>,
    what: &str,
) -> Result<Vec<(String, Unknown<'a>)>, Error> {
    let raw_env = env.raw();
    let mut names = ptr::null_mut();
    let status = unsafe {
        sys::napi_get_all_property_names(
            raw_env,
            obj.raw(),
            sys::KeyCollectionMode::own_only,
            sys::KeyFilter::enumerable | sys::KeyFilter::skip_symbols,
            sys::KeyConversion::numbers_to_strings,
            &mut names,
        )
    };
    if status != sys::Status::napi_ok {
        return Err(invalid_argument(format!(
            "{what}: cannot list the object's properties"
        )));
    }
    let mut len = 0u32;
    unsafe { sys::napi_get_array_length(raw_env, names, &mut len) };
    let mut out = Vec::with_capacity(len as usize);
    for i in 0..len {
        let mut key = ptr::null_mut();
        let mut value = ptr::null_mut();
        unsafe {
            if sys::napi_get_element(raw_env, names, i, &mut key) != sys::Status::napi_ok
                || sys::napi_get_property(raw_env, obj.raw(), key, &mut value)
                    != sys::Status::napi_ok
            {
                return Err(invalid_argument(format!(
                    "{what}: cannot read property {i}"
                )));
            }
        }
        let key =
            unsafe { String::from_napi_value(raw_env, key) }.map_err(|e| napi_failed(what, e))?;
        out.push((key, unsafe { Unknown::from_raw_unchecked(raw_env, value) }));
    }
    Ok(out)
}

/// `v` must be a plain object (not an array, not null).
fn expect_object(env: &Env, v: &Unknown<'_>, what: &str) -> Result<(), Error> {
    let t = type_of(v)?;
    if t != ValueType::Object || is_array(env, v.raw()) {
        let got = if t == ValueType::Object {
            "an array"
        } else {
            type_name(t)
        };
        return Err(invalid_argument(format!(
            "{what}: expected an object, got {got}"
        )));
    }
    Ok(())
}

/// A string argument.
pub(crate) fn string(env: &Env, v: &Unknown<'_>, what: &str) -> Result<String, Error> {
    let t = type_of(v)?;
    if t != ValueType::String {
        return Err(invalid_argument(format!(
            "{what}: expected a string, got {}",
            type_name(t)
        )));
    }
    unsafe { String::from_napi_value(env.raw(), v.raw()) }.map_err(|e| napi_failed(what, e))
}

/// A string, or `None` for `undefined`/`null`.
pub(crate) fn opt_string(env: &Env, v: &Unknown<'_>, what: &str) -> Result<Option<String>, Error> {
    match type_of(v)? {
        ValueType::Undefined | ValueType::Null => Ok(None),
        _ => string(env, v, what).map(Some),
    }
}

fn number(env: &Env, v: &Unknown<'_>, what: &str) -> Result<f64, Error> {
    let t = type_of(v)?;
    if t != ValueType::Number {
        return Err(invalid_argument(format!(
            "{what}: expected a number, got {}",
            type_name(t)
        )));
    }
    let n =
        unsafe { f64::from_napi_value(env.raw(), v.raw()) }.map_err(|e| napi_failed(what, e))?;
    if !n.is_finite() {
        return Err(invalid_argument(format!(
            "{what}: expected a finite number, got {n}"
        )));
    }
    Ok(n)
}

/// A whole number within `min..=max`, or `None` for `undefined`/`null`.
pub(crate) fn opt_integer(
    env: &Env,
    v: &Unknown<'_>,
    what: &str,
    min: i64,
    max: i64,
) -> Result<Option<i64>, Error> {
    if matches!(type_of(v)?, ValueType::Undefined | ValueType::Null) {
        return Ok(None);
    }
    let n = number(env, v, what)?;
    if n.fract() != 0.0 || n.abs() > MAX_SAFE {
        return Err(invalid_argument(format!(
            "{what}: expected a whole number, got {n}"
        )));
    }
    let i = n as i64;
    if i < min || i > max {
        return Err(invalid_argument(format!(
            "{what}: {i} is out of range ({min} to {max})"
        )));
    }
    Ok(Some(i))
}

/// Milliseconds (fractions allowed, not negative) as whole microseconds.
pub(crate) fn millis_to_micros(env: &Env, v: &Unknown<'_>, what: &str) -> Result<u64, Error> {
    let n = number(env, v, what)?;
    if n < 0.0 {
        return Err(invalid_argument(format!(
            "{what}: must not be negative, got {n}"
        )));
    }
    let us = (n * 1000.0).round();
    if us > MAX_SAFE {
        return Err(invalid_argument(format!("{what}: {n} is too large")));
    }
    Ok(us as u64)
}

/// A policy given as a plain object, as a JSON value tree.
pub(crate) fn policy_value(
    env: &Env,
    v: &Unknown<'_>,
    what: &str,
) -> Result<serde_json::Value, Error> {
    let t = type_of(v)?;
    if t != ValueType::Object || is_array(env, v.raw()) {
        let got = if t == ValueType::Object {
            "an array"
        } else {
            type_name(t)
        };
        return Err(Error::new(
            ErrorKind::InvalidPolicy,
            format!("{what}: expected an object with a `rules` array, got {got}"),
        ));
    }
    unsafe { serde_json::Value::from_napi_value(env.raw(), v.raw()) }
        .map_err(|e| Error::new(ErrorKind::InvalidPolicy, format!("{what}: {}", e.reason)))
}

/// The first argument of `new Limiter()`: a `Policy`, a file path, or a plain object.
pub(crate) fn any_policy(env: &Env, v: &Unknown<'_>) -> Result<throttlegate::Policy, Error> {
    match type_of(v)? {
        ValueType::String => {
            let path = string(env, v, "policy")?;
            throttlegate::Policy::from_file(path)
        }
        ValueType::Object => {
            if let Ok(p) = unsafe { ClassInstance::<Policy>::from_napi_value(env.raw(), v.raw()) } {
                return Ok(p.inner.clone());
            }
            throttlegate::Policy::from_value(&policy_value(env, v, "policy")?)
        }
        t => Err(invalid_argument(format!(
            "policy: expected a Policy, a path to a policy file or a plain object, got {}",
            type_name(t)
        ))),
    }
}

/// Bytes from a string (UTF-8) or a Buffer.
fn bytes(env: &Env, v: &Unknown<'_>, what: &str) -> Result<Vec<u8>, Error> {
    let t = type_of(v)?;
    if t == ValueType::String {
        return string(env, v, what).map(String::into_bytes);
    }
    match unsafe { Buffer::from_napi_value(env.raw(), v.raw()) } {
        Ok(b) => Ok(b.to_vec()),
        Err(_) => Err(invalid_argument(format!(
            "{what}: expected a string or a Buffer, got {}",
            type_name(t)
        ))),
    }
}

/// The `tls` option of `new Limiter()`, as PEM bytes.
fn tls_options(
    env: &Env,
    v: &Unknown<'_>,
    what: &str,
    opts: &mut LimiterOptions,
) -> Result<(), Error> {
    expect_object(env, v, what)?;
    let (mut cert, mut key) = (None, None);
    for (name, value) in entries(env, v, what)? {
        if matches!(type_of(&value)?, ValueType::Undefined | ValueType::Null) {
            continue;
        }
        let field = format!("{what}.{name}");
        match name.as_str() {
            "ca" if is_array(env, value.raw()) => {
                // PEM files concatenate: one bundle holds every listed CA.
                let mut pem = Vec::new();
                for (i, (_, item)) in entries(env, &value, &field)?.into_iter().enumerate() {
                    pem.extend(bytes(env, &item, &format!("{field}[{i}]"))?);
                    pem.push(b'\n');
                }
                opts.tls_root_cert = Some(pem);
            }
            "ca" => opts.tls_root_cert = Some(bytes(env, &value, &field)?),
            "cert" => cert = Some(bytes(env, &value, &field)?),
            "key" => key = Some(bytes(env, &value, &field)?),
            _ => {
                return Err(invalid_argument(format!(
                    "{what}: unknown option {name:?} (known: ca, cert, key)"
                )))
            }
        }
    }
    opts.tls_client_cert = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        (Some(_), None) => {
            return Err(invalid_argument(format!(
                "{what}.key: required with {what}.cert (the client certificate's private key)"
            )))
        }
        (None, Some(_)) => {
            return Err(invalid_argument(format!(
                "{what}.cert: required with {what}.key (the client certificate)"
            )))
        }
    };
    Ok(())
}

fn duration(env: &Env, v: &Unknown<'_>, what: &str) -> Result<Duration, Error> {
    match type_of(v)? {
        ValueType::Number => Ok(Duration::from_micros(millis_to_micros(env, v, what)?)),
        ValueType::String => {
            let text = string(env, v, what)?;
            throttlegate::duration::parse_duration(&text)
                .map_err(|m| invalid_argument(format!("{what}: {m}")))
        }
        t => Err(invalid_argument(format!(
            "{what}: expected milliseconds or a duration string such as \"100ms\", got {}",
            type_name(t)
        ))),
    }
}

fn boolean(env: &Env, v: &Unknown<'_>, what: &str) -> Result<bool, Error> {
    let t = type_of(v)?;
    if t != ValueType::Boolean {
        return Err(invalid_argument(format!(
            "{what}: expected a boolean, got {}",
            type_name(t)
        )));
    }
    unsafe { bool::from_napi_value(env.raw(), v.raw()) }.map_err(|e| napi_failed(what, e))
}

/// The options of `new Limiter()`: the core's options, and whether to add
/// the legacy headers (`legacyHeaders`, a header option of this package).
pub(crate) fn limiter_options(
    env: &Env,
    v: Option<&Unknown<'_>>,
) -> Result<(LimiterOptions, bool), Error> {
    let (mut opts, mut legacy) = (LimiterOptions::default(), false);
    let Some(v) = v else {
        return Ok((opts, legacy));
    };
    if matches!(type_of(v)?, ValueType::Undefined | ValueType::Null) {
        return Ok((opts, legacy));
    }
    expect_object(env, v, "options")?;
    for (name, value) in entries(env, v, "options")? {
        if matches!(type_of(&value)?, ValueType::Undefined) {
            continue;
        }
        let what = format!("options.{name}");
        match name.as_str() {
            "url" => opts.url = opt_string(env, &value, &what)?,
            "timeout" => opts.timeout = Some(duration(env, &value, &what)?),
            "onBackendError" => {
                let text = string(env, &value, &what)?;
                opts.on_backend_error =
                    Some(FailureMode::parse(&text).map_err(|e| invalid_argument(format!("{what}: {}", e.message())))?);
            }
            "keyPrefix" => opts.prefix = Some(string(env, &value, &what)?),
            "clock" => {
                opts.clock = match type_of(&value)? {
                    ValueType::String => match string(env, &value, &what)?.as_str() {
                        "backend" => Clock::Backend,
                        "system" => Clock::System,
                        other => {
                            return Err(invalid_argument(format!(
                                "{what}: expected a ManualClock, \"backend\" or \"system\", got {other:?}"
                            )))
                        }
                    },
                    _ => match unsafe { ClassInstance::<ManualClock>::from_napi_value(env.raw(), value.raw()) } {
                        Ok(c) => Clock::Manual(c.inner.clone()),
                        Err(_) => {
                            return Err(invalid_argument(format!(
                                "{what}: expected a ManualClock, \"backend\" or \"system\""
                            )))
                        }
                    },
                }
            }
            "keySecret" => opts.key_secret = Some(bytes(env, &value, &what)?),
            "legacyHeaders" => legacy = boolean(env, &value, &what)?,
            "denyCache" => opts.deny_cache = boolean(env, &value, &what)?,
            "tls" if matches!(type_of(&value)?, ValueType::Null) => {}
            "tls" => tls_options(env, &value, &what, &mut opts)?,
            _ => {
                return Err(invalid_argument(format!(
                    "options: unknown option {name:?} (known: url, timeout, onBackendError, keyPrefix, clock, keySecret, legacyHeaders, denyCache, tls)"
                )))
            }
        }
    }
    Ok((opts, legacy))
}

/// A request's attributes: an object of name -> string. `undefined` and
/// `null` values mean "absent", so `{ apiKey: req.get('x-api-key') }` works
/// when the header is missing.
pub(crate) fn attributes(env: &Env, v: &Unknown<'_>) -> Result<AttributeBuf, Error> {
    expect_object(env, v, "attributes")?;
    let mut out = AttributeBuf::take();
    for (name, value) in entries(env, v, "attributes")? {
        match type_of(&value)? {
            ValueType::Undefined | ValueType::Null => {}
            ValueType::String => {
                let s = unsafe { String::from_napi_value(env.raw(), value.raw()) }
                    .map_err(|e| napi_failed("attributes", e))?;
                out.push(&name, &s)?;
            }
            t => {
                return Err(invalid_argument(format!(
                    "attributes.{name}: expected a string, got {}",
                    type_name(t)
                )))
            }
        }
    }
    Ok(out)
}

/// The options of `check` (`allow_call_id`) or `peek`: `undefined` and
/// `null` mean the defaults. A cost is a whole number, not negative; the
/// core says which costs a check admits (0 never).
pub(crate) fn check_options(
    env: &Env,
    v: &Unknown<'_>,
    allow_call_id: bool,
) -> Result<CheckOptions, Error> {
    let mut opts = CheckOptions::default();
    if matches!(type_of(v)?, ValueType::Undefined | ValueType::Null) {
        return Ok(opts);
    }
    expect_object(env, v, "options")?;
    for (name, value) in entries(env, v, "options")? {
        let what = format!("options.{name}");
        match name.as_str() {
            "cost" => match opt_integer(env, &value, &what, i64::MIN, i64::MAX)? {
                Some(c) if c < 0 => {
                    return Err(invalid_argument(format!(
                        "{what}: expected a whole number of at least 1, got {c}"
                    )))
                }
                Some(c) => opts.cost = c as u64,
                None => {}
            },
            "callId" if allow_call_id => opts.call_id = opt_string(env, &value, &what)?,
            _ => {
                let known = if allow_call_id {
                    "cost, callId"
                } else {
                    "cost"
                };
                return Err(invalid_argument(format!(
                    "options: unknown option {name:?} (known: {known})"
                )));
            }
        }
    }
    Ok(opts)
}

/// The options of `new ClientIp()`: trusted proxies and the IPv6 prefix.
pub(crate) fn client_ip_options(
    env: &Env,
    v: Option<&Unknown<'_>>,
) -> Result<(Vec<String>, u8), Error> {
    let mut trusted = Vec::new();
    let mut prefix = 64u8;
    let Some(v) = v else {
        return Ok((trusted, prefix));
    };
    if matches!(type_of(v)?, ValueType::Undefined | ValueType::Null) {
        return Ok((trusted, prefix));
    }
    expect_object(env, v, "options")?;
    for (name, value) in entries(env, v, "options")? {
        let what = format!("options.{name}");
        match name.as_str() {
            "trustedProxies" => {
                if matches!(type_of(&value)?, ValueType::Undefined | ValueType::Null) {
                    continue;
                }
                if !is_array(env, value.raw()) {
                    return Err(invalid_argument(format!(
                        "{what}: expected an array of addresses or CIDR networks"
                    )));
                }
                for (i, (_, item)) in entries(env, &value, &what)?.into_iter().enumerate() {
                    trusted.push(string(env, &item, &format!("{what}[{i}]"))?);
                }
            }
            "ipv6Prefix" => {
                if let Some(p) = opt_integer(env, &value, &what, 0, 255)? {
                    prefix = p as u8;
                }
            }
            _ => {
                return Err(invalid_argument(format!(
                    "options: unknown option {name:?} (known: trustedProxies, ipv6Prefix)"
                )))
            }
        }
    }
    Ok((trusted, prefix))
}

/// A request header value: a string, an array of strings (joined with
/// commas, as repeated headers are), or `None` when absent.
pub(crate) fn header(
    env: &Env,
    v: Option<&Unknown<'_>>,
    what: &str,
) -> Result<Option<String>, Error> {
    let Some(v) = v else { return Ok(None) };
    match type_of(v)? {
        ValueType::Undefined | ValueType::Null => Ok(None),
        ValueType::String => string(env, v, what).map(Some),
        ValueType::Object if is_array(env, v.raw()) => {
            let mut parts = Vec::new();
            for (i, (_, item)) in entries(env, v, what)?.into_iter().enumerate() {
                parts.push(string(env, &item, &format!("{what}[{i}]"))?);
            }
            Ok(Some(parts.join(",")))
        }
        t => Err(invalid_argument(format!(
            "{what}: expected a string or an array of strings, got {}",
            type_name(t)
        ))),
    }
}
