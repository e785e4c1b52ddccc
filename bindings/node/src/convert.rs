//! JavaScript values to the core's types, with errors that name the argument
//! or option at fault (never napi's generic conversion errors).

use std::ptr;

use napi::bindgen_prelude::{Buffer, ClassInstance, FromNapiValue};
use napi::{sys, Env, JsValue, Unknown, ValueType};
use throttlegate::{
    unknown_option, AttributeBuf, ClientIpConfig, ClientIpOption, CheckOption, CheckOptions, Clock, DurationUnit, Error,
    ErrorKind, LimiterOption, LimiterOptions, OptionValue,
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

/// The path when `v` is a string (a policy file), else `None`.
pub(crate) fn policy_path(env: &Env, v: &Unknown<'_>) -> Result<Option<String>, Error> {
    match type_of(v)? {
        ValueType::String => Ok(Some(string(env, v, "policy")?)),
        _ => Ok(None),
    }
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

/// A JavaScript value as the core's [`OptionValue`] (options are checked by
/// the core, which words the errors). A `ManualClock` is a clock, a Buffer
/// bytes, an array a list, any other object its own properties.
fn option_value(env: &Env, v: &Unknown<'_>, what: &str) -> Result<OptionValue, Error> {
    Ok(match type_of(v)? {
        ValueType::Undefined | ValueType::Null => OptionValue::Unset,
        ValueType::Boolean => OptionValue::Bool(
            unsafe { bool::from_napi_value(env.raw(), v.raw()) }.map_err(|e| napi_failed(what, e))?,
        ),
        ValueType::Number => OptionValue::Number(
            unsafe { f64::from_napi_value(env.raw(), v.raw()) }.map_err(|e| napi_failed(what, e))?,
        ),
        ValueType::String => OptionValue::Text(string(env, v, what)?),
        ValueType::Object if is_array(env, v.raw()) => {
            let mut items = Vec::new();
            for (i, (_, item)) in entries(env, v, what)?.into_iter().enumerate() {
                items.push(option_value(env, &item, &format!("{what}[{i}]"))?);
            }
            OptionValue::List(items)
        }
        ValueType::Object => {
            if let Ok(c) = unsafe { ClassInstance::<ManualClock>::from_napi_value(env.raw(), v.raw()) } {
                return Ok(OptionValue::Clock(Clock::Manual(c.inner.clone())));
            }
            if let Ok(b) = unsafe { Buffer::from_napi_value(env.raw(), v.raw()) } {
                return Ok(OptionValue::Bytes(b.to_vec()));
            }
            let mut items = Vec::new();
            for (name, item) in entries(env, v, what)? {
                let value = option_value(env, &item, &format!("{what}.{name}"))?;
                items.push((name, value));
            }
            OptionValue::Map(items)
        }
        t => OptionValue::Other(type_name(t).to_string()),
    })
}

/// This package's names of the limiter options.
/// `keyPrefix` is the old name of `prefix` (the name in every other language).
const LIMITER_OPTIONS: [(&str, LimiterOption); 13] = [
    ("url", LimiterOption::Url),
    ("timeout", LimiterOption::Timeout),
    ("onBackendError", LimiterOption::OnBackendError),
    ("prefix", LimiterOption::Prefix),
    ("keyPrefix", LimiterOption::Prefix),
    ("clock", LimiterOption::Clock),
    ("keySecret", LimiterOption::KeySecret),
    ("legacyHeaders", LimiterOption::LegacyHeaders),
    ("denyCache", LimiterOption::DenyCache),
    ("tls", LimiterOption::Tls),
    ("metrics", LimiterOption::Metrics),
    ("reloadOnChange", LimiterOption::ReloadOnChange),
    ("strict", LimiterOption::Strict),
];

/// Each property of an options object, with its option among `known`:
/// unknown names are refused.
fn named<O: Copy>(
    env: &Env,
    v: &Unknown<'_>,
    known: &[(&str, O)],
) -> Result<Vec<(O, String, OptionValue)>, Error> {
    expect_object(env, v, "options")?;
    let mut out = Vec::new();
    for (name, value) in entries(env, v, "options")? {
        let Some(&(_, option)) = known.iter().find(|(n, _)| *n == name) else {
            let names: Vec<&str> = known.iter().map(|(n, _)| *n).collect();
            return Err(unknown_option("options", &name, &names));
        };
        let what = format!("options.{name}");
        let value = option_value(env, &value, &what)?;
        out.push((option, what, value));
    }
    Ok(out)
}

/// The options of `new Limiter()`, checked by the core.
pub(crate) fn limiter_options(env: &Env, v: Option<&Unknown<'_>>) -> Result<LimiterOptions, Error> {
    let mut opts = LimiterOptions::default();
    let mut logger = None;
    match v {
        Some(v) if !matches!(type_of(v)?, ValueType::Undefined | ValueType::Null) => {
            expect_object(env, v, "options")?;
            let mut prefix_given = false;
            for (name, value) in entries(env, v, "options")? {
                if name == "logger" {
                    logger = Some(value);
                    continue;
                }
                let Some(&(_, option)) = LIMITER_OPTIONS.iter().find(|(n, _)| *n == name) else {
                    let mut names: Vec<&str> = LIMITER_OPTIONS.iter().map(|(n, _)| *n).collect();
                    names.push("logger");
                    return Err(unknown_option("options", &name, &names));
                };
                if matches!(option, LimiterOption::Prefix) {
                    if prefix_given {
                        return Err(invalid_argument(
                            "options: give `prefix` only (`keyPrefix` is its old name)".to_string(),
                        ));
                    }
                    prefix_given = true;
                }
                let what = format!("options.{name}");
                let value = option_value(env, &value, &what)?;
                opts.set(option, &what, value, DurationUnit::Millis)?;
            }
        }
        _ => {}
    }
    opts.on_health = crate::health::sink(env, logger.as_ref())?;
    Ok(opts)
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

/// The options of `check` (with `callId`, `allow_call_id`) or `peek`,
/// checked by the core; `undefined` and `null` mean the defaults.
pub(crate) fn check_options(
    env: &Env,
    v: &Unknown<'_>,
    allow_call_id: bool,
) -> Result<CheckOptions, Error> {
    let mut opts = CheckOptions::default();
    if matches!(type_of(v)?, ValueType::Undefined | ValueType::Null) {
        return Ok(opts);
    }
    let known: &[(&str, CheckOption)] =
        &[("cost", CheckOption::Cost), ("callId", CheckOption::CallId)];
    let known = if allow_call_id { known } else { &known[..1] };
    for (option, what, value) in named(env, v, known)? {
        opts.set(option, &what, value)?;
    }
    Ok(opts)
}

/// The options of `acquire`: a check's `cost` and `callId`, and its
/// `timeout` (milliseconds, or text such as `"250ms"`), checked by the core.
pub(crate) fn acquire_options(env: &Env, v: &Unknown<'_>) -> Result<(CheckOptions, std::time::Duration), Error> {
    #[derive(Clone, Copy)]
    enum A {
        Check(CheckOption),
        Timeout,
    }
    let mut opts = CheckOptions::default();
    let mut timeout = None;
    if !matches!(type_of(v)?, ValueType::Undefined | ValueType::Null) {
        let known = [("cost", A::Check(CheckOption::Cost)), ("callId", A::Check(CheckOption::CallId)), ("timeout", A::Timeout)];
        for (option, what, value) in named(env, v, &known)? {
            match option {
                A::Check(o) => opts.set(o, &what, value)?,
                A::Timeout => timeout = Some(throttlegate::acquire_timeout(value, DurationUnit::Millis)?),
            }
        }
    }
    let timeout = timeout.ok_or_else(|| invalid_argument("options.timeout: acquire needs a timeout".to_string()))?;
    Ok((opts, timeout))
}

/// A number or other value as the core's [`OptionValue`].
pub(crate) fn value(env: &Env, v: &Unknown<'_>, what: &str) -> Result<OptionValue, Error> {
    option_value(env, v, what)
}

/// The options of `new ClientIp()`, checked by the core.
pub(crate) fn client_ip_options(env: &Env, v: Option<&Unknown<'_>>) -> Result<ClientIpConfig, Error> {
    let known = [("trustedProxies", ClientIpOption::TrustedProxies), ("ipv6Prefix", ClientIpOption::Ipv6Prefix)];
    match v {
        Some(v) if !matches!(type_of(v)?, ValueType::Undefined | ValueType::Null) => {
            ClientIpConfig::from_options(named(env, v, &known)?)
        }
        _ => ClientIpConfig::from_options(Vec::new()),
    }
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
