//! Errors: the core's kinds become the JavaScript `code`, and no panic
//! crosses into JavaScript (the core's [`Error::catch_panic`] and
//! [`Error::from_panic`] make them `internal` errors).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::ptr;

use futures_util::FutureExt;
use napi::bindgen_prelude::{PromiseRaw, ToNapiValue};
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

/// A failure of Node-API itself: a bug, worded as the core words caught panics.
pub(crate) fn internal(what: &'static str) -> Error {
    Error::internal(what)
}

/// Run a synchronous entry point: core errors and panics become JavaScript
/// errors with a stable `code`.
pub(crate) fn guard<T>(f: impl FnOnce() -> Result<T, Error>) -> Result<T, napi::Error<Code>> {
    Error::catch_panic(f).map_err(|e| napi::Error::new(Code(code_of(e.kind())), e.to_string()))
}

/// A JavaScript `Error` with `message` and `code`, made on the JavaScript thread.
pub(crate) unsafe fn js_error(env: sys::napi_env, e: &Error) -> napi::Result<sys::napi_value> {
    let code = unsafe { <&str as ToNapiValue>::to_napi_value(env, code_of(e.kind()))? };
    let message = unsafe { String::to_napi_value(env, e.to_string())? };
    let mut out = ptr::null_mut();
    napi::check_status!(unsafe { sys::napi_create_error(env, code, message, &mut out) })?;
    Ok(out)
}

/// `fut`, with a panic inside it as its `internal` error.
pub(crate) async fn caught<T>(fut: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
    AssertUnwindSafe(fut)
        .catch_unwind()
        .await
        .unwrap_or_else(|payload| Err(Error::from_panic(payload.as_ref())))
}

/// A Promise for the result of `fut`, run on napi's Tokio runtime (so it
/// never blocks the event loop).
///
/// napi rejects a promise with the JavaScript value behind an error made from
/// one, so a core error is turned into an `Error` carrying `code` on the
/// JavaScript thread and handed over that way: async functions of napi only
/// carry its own status codes otherwise.
pub(crate) fn spawn<'env, T>(
    env: &'env Env,
    fut: impl Future<Output = Result<T, Error>> + Send + 'static,
) -> napi::Result<PromiseRaw<'env, T>>
where
    T: ToNapiValue + Send + 'static,
{
    env.spawn_future_with_callback(async move { Ok(caught(fut).await) }, |env, outcome| {
        outcome.map_err(|e| match unsafe { js_error(env.raw(), &e) } {
            Ok(value) => {
                napi::Error::from(unsafe { Unknown::from_raw_unchecked(env.raw(), value) })
            }
            Err(fallback) => fallback,
        })
    })
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
        assert_eq!(err.reason, Error::from_panic(&"boom").message());
        let err =
            guard(|| -> Result<(), Error> { Err(invalid_argument("cost: bad")) }).unwrap_err();
        assert_eq!(err.status.as_ref(), "invalid_argument");
        assert_eq!(err.reason, "cost: bad");
        assert_eq!(guard(|| Ok(7)).unwrap(), 7);
    }

    #[test]
    fn panicking_futures_resolve_to_internal_errors() {
        let empty: Vec<u8> = std::hint::black_box(Vec::new());
        let err = throttlegate::runtime::block_on(caught(async move { Ok(empty[3]) }))
            .unwrap()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Internal);
        assert!(
            err.message().contains("index out of bounds"),
            "{}",
            err.message()
        );
        let ok = throttlegate::runtime::block_on(caught(async { Ok(1) })).unwrap();
        assert_eq!(ok.unwrap(), 1);
    }
}
