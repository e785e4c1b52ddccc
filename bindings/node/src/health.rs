//! The `logger` option of `new Limiter()`: where the core's health events
//! (one line when an outage begins, one when it ends) go. A logger object's
//! `warn` gets the outage, its `info` (or `warn` when it has none) the
//! recovery; without the option each line is a process warning
//! (`process.emitWarning(line, 'ThrottlegateWarning')`); `null` or `false`
//! turns them off. The lines reach JavaScript through thread-safe functions
//! (the core reports from whichever thread made the call) that never hold
//! the event loop open.

use napi::bindgen_prelude::{FnArgs, FromNapiValue, Function, Object};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::bindgen_prelude::JsObjectValue;
use napi::{Env, JsValue, Status, Unknown, ValueType};
use throttlegate::{Error, HealthSink};

use crate::errors::invalid_argument;

/// A JavaScript function called with one line, from any thread.
type Line = ThreadsafeFunction<String, Unknown<'static>, String, Status, false, true>;

/// The sink for the `logger` option's value (`None` when absent).
pub(crate) fn sink(env: &Env, logger: Option<&Unknown<'_>>) -> Result<Option<HealthSink>, Error> {
    let bad = || invalid_argument("options.logger: expected an object with a warn function (and optionally info), null or false");
    let t = match logger {
        None => ValueType::Undefined,
        Some(v) => v.get_type().map_err(|_| bad())?,
    };
    match (t, logger) {
        (ValueType::Undefined, _) => default_sink(env).map(Some),
        (ValueType::Null, _) => Ok(None),
        (ValueType::Boolean, Some(v)) if !unsafe { bool::from_napi_value(env.raw(), v.raw()) }.map_err(|_| bad())? => Ok(None),
        (ValueType::Object, Some(v)) => {
            let obj = unsafe { Object::from_napi_value(env.raw(), v.raw()) }.map_err(|_| bad())?;
            let method = |name: &str| -> Result<Option<Line>, Error> {
                let m: Unknown<'_> = obj.get_named_property(name).map_err(|_| bad())?;
                if m.get_type().map_err(|_| bad())? != ValueType::Function {
                    return Ok(None);
                }
                let f = unsafe { Function::<String, Unknown<'static>>::from_napi_value(env.raw(), m.raw()) }.map_err(|_| bad())?;
                let bound = f.bind(obj).map_err(|_| bad())?;
                bound.build_threadsafe_function().weak::<true>().build().map(Some).map_err(|_| bad())
            };
            let Some(warn) = method("warn")? else { return Err(bad()) };
            let info = method("info")?;
            Ok(Some(HealthSink::new(move |event| {
                let line = match (&info, event.is_down()) {
                    (Some(info), false) => info,
                    _ => &warn,
                };
                line.call(event.message(), ThreadsafeFunctionCallMode::NonBlocking);
            })))
        }
        _ => Err(bad()),
    }
}

/// Each line as a process warning of type `ThrottlegateWarning`.
fn default_sink(env: &Env) -> Result<HealthSink, Error> {
    let failed = |_| invalid_argument("options.logger: process.emitWarning is not available; give a logger");
    let process: Object<'_> = env.get_global().and_then(|g| g.get_named_property("process")).map_err(failed)?;
    let emit: Function<'_, FnArgs<(String, String)>, Unknown<'static>> =
        process.get_named_property("emitWarning").map_err(failed)?;
    let emit = emit.bind(process).map_err(failed)?;
    let warn = emit
        .build_threadsafe_function::<String>()
        .weak::<true>()
        .build_callback(|ctx| Ok(FnArgs::from((ctx.value, "ThrottlegateWarning".to_string()))))
        .map_err(failed)?;
    Ok(HealthSink::new(move |event| {
        warn.call(event.message(), ThreadsafeFunctionCallMode::NonBlocking);
    }))
}
