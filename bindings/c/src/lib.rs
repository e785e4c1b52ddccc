//! # throttlegate-c
//!
//! The C API of throttlegate: `libthrottlegate.so` / `libthrottlegate.a` and
//! the header `include/throttlegate.h`, generated from this crate by cbindgen.
//!
//! Every exported function converts C values to the core's types, calls the
//! core (its blocking entry points, which run on the core's runtime), and
//! converts the answer back. No rate-limiting logic lives here.
//!
//! Conventions (after rustls-ffi), written out for users in `README.md`:
//! - every name starts with `tg_`;
//! - fallible functions return a [`tg_result`]: `TG_OK` (0) or a numbered
//!   code that is never reused; the message of the last failure on the
//!   calling thread is [`tg_last_error_message`];
//! - outputs are written only on success;
//! - every pointer is checked for NULL; `_free(NULL)` is a no-op;
//! - input strings are NUL-terminated UTF-8 (checked); output strings are
//!   NUL-terminated and owned by the object they came from;
//! - every body runs inside `catch_unwind`: a panic becomes `TG_INTERNAL`.
#![deny(missing_docs)]
#![allow(non_camel_case_types)]
// Exported functions take raw pointers from C and check them; marking them
// `unsafe` is what makes C's obligations (valid, live pointers) explicit.
#![allow(clippy::missing_safety_doc)]

mod clock;
mod decision;
mod error;
mod limiter;
mod policy;

pub use clock::*;
pub use decision::*;
pub use error::*;
pub use limiter::*;
pub use policy::*;

use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The library's version, e.g. `"0.1.0"`: a static NUL-terminated string.
#[no_mangle]
pub extern "C" fn tg_version() -> *const c_char {
    static VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
    VERSION.as_ptr().cast()
}

/// Runs one exported function's body: clears the thread's last error,
/// catches panics, records the failure's message, returns its code.
pub(crate) fn ffi(body: impl FnOnce() -> Result<(), Fail>) -> tg_result {
    error::clear_last_error();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => tg_result::TG_OK,
        Ok(Err(fail)) => fail.record(),
        Err(payload) => Fail::from(throttlegate::Error::from_panic(payload.as_ref())).record(),
    }
}

/// Like [`ffi`] for functions that return a value instead of a code:
/// a panic gives `fallback`.
pub(crate) fn ffi_value<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}

/// A required input string: non-NULL, NUL-terminated, UTF-8.
/// `what` names the parameter in the error message.
pub(crate) unsafe fn c_str<'a>(ptr: *const c_char, what: impl FnOnce() -> String) -> Result<&'a str, Fail> {
    if ptr.is_null() {
        return Err(Fail::null(&what()));
    }
    CStr::from_ptr(ptr)
        .to_str()
        .map_err(|e| Fail::utf8(&what(), e.valid_up_to()))
}

/// A required output location.
pub(crate) unsafe fn out_ptr<'a, T>(ptr: *mut T, what: &str) -> Result<&'a mut T, Fail> {
    ptr.as_mut().ok_or_else(|| Fail::null(what))
}

/// A required input object.
pub(crate) unsafe fn in_ref<'a, T>(ptr: *const T, what: &str) -> Result<&'a T, Fail> {
    ptr.as_ref().ok_or_else(|| Fail::null(what))
}

/// A deliberate panic inside an exported function, for the C tests to prove
/// that it comes back as `TG_INTERNAL` instead of unwinding into C.
#[cfg(feature = "test-hooks")]
#[no_mangle]
pub extern "C" fn tg_test_panic() -> tg_result {
    ffi(|| panic!("tg_test_panic: a deliberate panic"))
}
