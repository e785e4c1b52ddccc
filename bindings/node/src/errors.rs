//! Errors: the core's kinds become the JavaScript `code`, and no panic
//! crosses into JavaScript.

use std::any::Any;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::ptr;
use std::task::{Context, Poll, Waker};

use napi::bindgen_prelude::{within_runtime_if_available, PromiseRaw, ToNapiValue};
use napi::{sys, Env, Unknown};
use throttlegate::{Error, ErrorKind};

/// An error's `code`: the core's stable kind id.
#[derive(Debug, Clone, Copy)]
pub struct Code(pub &'static str);

impl AsRef<str> for Code {
    fn as_ref(&self) -> &str {
        self.0
    }
}

/// The code of a core error kind. Kinds added to the core later than this
/// binding map to `internal` until the binding learns them.
fn code_of(kind: ErrorKind) -> &'static str {
    if ErrorKind::ALL.contains(&kind) {
        kind.as_str()
    } else {
        ErrorKind::Internal.as_str()
    }
}

pub(crate) fn invalid_argument(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, message)
}

pub(crate) fn panic_error(payload: Box<dyn Any + Send>) -> Error {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string());
    Error::new(
        ErrorKind::Internal,
        format!("internal error in throttlegate (please report it): {what}"),
    )
}

fn to_napi(e: Error) -> napi::Error<Code> {
    napi::Error::new(Code(code_of(e.kind())), e.to_string())
}

/// Run a synchronous entry point: core errors and panics become JavaScript
/// errors with a stable `code`.
pub(crate) fn guard<T>(f: impl FnOnce() -> Result<T, Error>) -> Result<T, napi::Error<Code>> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(to_napi),
        Err(payload) => Err(to_napi(panic_error(payload))),
    }
}

/// Run a conversion on the JavaScript thread whose error is delivered later
/// (through a rejected Promise): a panic becomes an `internal` error.
pub(crate) fn catching<T>(f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| Err(panic_error(payload)))
}

/// A future whose panics are caught and reported as `internal` errors.
pub(crate) struct CatchUnwind<F>(Pin<Box<F>>);

impl<F> CatchUnwind<F> {
    pub(crate) fn new(fut: F) -> Self {
        CatchUnwind(Box::pin(fut))
    }
}

impl<T, F: Future<Output = Result<T, Error>>> Future for CatchUnwind<F> {
    type Output = Result<T, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let fut = self.0.as_mut();
        match catch_unwind(AssertUnwindSafe(move || fut.poll(cx))) {
            Ok(p) => p,
            Err(payload) => Poll::Ready(Err(panic_error(payload))),
        }
    }
}

/// A JavaScript `Error` with `message` and `code`, made on the JavaScript thread.
pub(crate) unsafe fn js_error(env: sys::napi_env, e: &Error) -> napi::Result<sys::napi_value> {
    let code = unsafe { <&str as ToNapiValue>::to_napi_value(env, code_of(e.kind()))? };
    let message = unsafe { String::to_napi_value(env, e.to_string())? };
    let mut out = ptr::null_mut();
    napi::check_status!(unsafe { sys::napi_create_error(env, code, message, &mut out) })?;
    Ok(out)
}

/// Return a Promise for the result of `fut`.
///
/// With `try_now`, `fut` is polled once right here, inside the runtime's
/// context: the embedded backend answers at once, and its Promise is settled
/// without a trip through the runtime's threads (which costs more than the
/// check itself). A future that is not ready, and every future without
/// `try_now`, runs on napi's Tokio runtime and never blocks the event loop.
///
/// napi rejects a promise with the JavaScript value behind an error made from
/// one, so a core error is turned into an `Error` carrying `code` on the
/// JavaScript thread and handed over that way: async functions of napi only
/// carry its own status codes otherwise.
pub(crate) fn spawn<'env, T, V, F, M>(
    env: &'env Env,
    try_now: bool,
    fut: F,
    map: M,
) -> napi::Result<PromiseRaw<'env, V>>
where
    T: Send + 'static,
    V: ToNapiValue,
    F: Future<Output = Result<T, Error>> + Send + 'static,
    M: FnOnce(T) -> V + 'static,
{
    let mut fut = CatchUnwind(Box::pin(fut));
    if try_now {
        let mut cx = Context::from_waker(Waker::noop());
        let first = within_runtime_if_available(|| Pin::new(&mut fut).poll(&mut cx));
        if let Poll::Ready(outcome) = first {
            let promise = unsafe { settled(env.raw(), outcome, map) }?;
            return Ok(PromiseRaw::new(env.raw(), promise));
        }
    }
    env.spawn_future_with_callback(
        async move { Ok(fut.await) },
        move |env, outcome| match outcome {
            Ok(value) => match catch_unwind(AssertUnwindSafe(move || map(value))) {
                Ok(v) => Ok(v),
                Err(payload) => Err(reject(env, &panic_error(payload))),
            },
            Err(e) => Err(reject(env, &e)),
        },
    )
}

/// A Promise already resolved with `map(value)`, or rejected with the error.
unsafe fn settled<T, V: ToNapiValue>(
    env: sys::napi_env,
    outcome: Result<T, Error>,
    map: impl FnOnce(T) -> V,
) -> napi::Result<sys::napi_value> {
    let mut deferred = ptr::null_mut();
    let mut promise = ptr::null_mut();
    napi::check_status!(unsafe { sys::napi_create_promise(env, &mut deferred, &mut promise) })?;
    let value =
        outcome.and_then(|v| catch_unwind(AssertUnwindSafe(move || map(v))).map_err(panic_error));
    let resolved = match value {
        Ok(v) => unsafe { V::to_napi_value(env, v) }.map_err(|e| {
            Error::new(
                ErrorKind::Internal,
                format!("cannot convert the result to JavaScript: {}", e.reason),
            )
        }),
        Err(e) => Err(e),
    };
    match resolved {
        Ok(v) => napi::check_status!(unsafe { sys::napi_resolve_deferred(env, deferred, v) })?,
        Err(e) => {
            let js = unsafe { js_error(env, &e) }?;
            napi::check_status!(unsafe { sys::napi_reject_deferred(env, deferred, js) })?;
        }
    }
    Ok(promise)
}

fn reject(env: &Env, e: &Error) -> napi::Error {
    match unsafe { js_error(env.raw(), e) } {
        Ok(value) => napi::Error::from(unsafe { Unknown::from_raw_unchecked(env.raw(), value) }),
        Err(fallback) => fallback,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_core_kind_keeps_its_id_as_code() {
        for kind in ErrorKind::ALL {
            assert_eq!(code_of(kind), kind.as_str());
        }
    }

    #[test]
    fn guard_turns_panics_into_internal_errors() {
        let err = guard(|| -> Result<(), Error> { panic!("boom") }).unwrap_err();
        assert_eq!(err.status.as_ref(), "internal");
        assert!(err.reason.contains("boom"), "{}", err.reason);
        let err =
            guard(|| -> Result<(), Error> { Err(invalid_argument("cost: bad")) }).unwrap_err();
        assert_eq!(err.status.as_ref(), "invalid_argument");
        assert_eq!(err.reason, "cost: bad");
        assert_eq!(guard(|| Ok(7)).unwrap(), 7);
    }

    #[test]
    fn panicking_futures_resolve_to_internal_errors() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let empty: Vec<u8> = std::hint::black_box(Vec::new());
        let fut = CatchUnwind(Box::pin(async move { Ok::<u8, Error>(empty[3]) }));
        let err = rt.block_on(fut).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Internal);
        assert!(
            err.message().contains("index out of bounds"),
            "{}",
            err.message()
        );
        let ok = rt.block_on(CatchUnwind(Box::pin(async { Ok::<u8, Error>(1) })));
        assert_eq!(ok.unwrap(), 1);
    }
}
