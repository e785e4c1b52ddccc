//! Result codes and the per-thread last error message.

use std::cell::RefCell;
use std::ffi::{c_char, CString};

use throttlegate::{Error, ErrorKind};

/// The result of a fallible call. `TG_OK` is 0; every other value names a
/// failure and is never reused for another meaning.
///
/// Codes 1-99 are the core's error kinds, numbered as in every throttlegate
/// language (`ErrorKind::code()` in Rust, the same ids in Python and Node).
/// Codes from 100 are failures that only C can produce; both are refinements
/// of `TG_INVALID_ARGUMENT`.
///
/// The message of the last failure on the calling thread is
/// `tg_last_error_message()`; `tg_result_name()` gives the stable id.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum tg_result {
    /// Success.
    TG_OK = 0,
    /// A policy (file or string) is malformed; the message names the field.
    TG_INVALID_POLICY = 1,
    /// An argument is invalid (cost, attribute, URL, option, index); the message names it.
    TG_INVALID_ARGUMENT = 2,
    /// A file could not be read.
    TG_IO = 3,
    /// The backend could not be reached or the connection was lost
    /// (only returned when the failure mode is `TG_FAILURE_ERROR`).
    TG_BACKEND_UNAVAILABLE = 4,
    /// The call did not complete within the timeout
    /// (only returned when the failure mode is `TG_FAILURE_ERROR`).
    TG_TIMEOUT = 5,
    /// The backend answered with an error, e.g. out of memory or no permission,
    /// or TLS with it failed (an untrusted server, a refused client
    /// certificate); only returned when the failure mode is `TG_FAILURE_ERROR`.
    TG_BACKEND = 6,
    /// The limiter was closed with `tg_limiter_close()`.
    TG_CLOSED = 7,
    /// A bug in throttlegate (a panic was caught at the C boundary). Please report it.
    TG_INTERNAL = 8,
    /// A required pointer parameter (or a pointer inside an attribute) is NULL.
    TG_NULL_POINTER = 100,
    /// A string parameter is not valid UTF-8.
    TG_INVALID_UTF8 = 101,
}

impl tg_result {
    /// The code of a core error kind: the same number as `ErrorKind::code()`.
    pub(crate) fn from_kind(kind: ErrorKind) -> tg_result {
        match kind.code() {
            1 => tg_result::TG_INVALID_POLICY,
            2 => tg_result::TG_INVALID_ARGUMENT,
            3 => tg_result::TG_IO,
            4 => tg_result::TG_BACKEND_UNAVAILABLE,
            5 => tg_result::TG_TIMEOUT,
            6 => tg_result::TG_BACKEND,
            7 => tg_result::TG_CLOSED,
            // 8, and any kind added to the core before this list learns it.
            _ => tg_result::TG_INTERNAL,
        }
    }

    fn name(code: u32) -> &'static str {
        match code {
            0 => "ok\0",
            1 => "invalid_policy\0",
            2 => "invalid_argument\0",
            3 => "io\0",
            4 => "backend_unavailable\0",
            5 => "timeout\0",
            6 => "backend\0",
            7 => "closed\0",
            8 => "internal\0",
            100 => "null_pointer\0",
            101 => "invalid_utf8\0",
            _ => "unknown\0",
        }
    }
}

/// The stable id of a result code: `"ok"`, `"invalid_policy"`,
/// `"invalid_argument"`, `"io"`, `"backend_unavailable"`, `"timeout"`,
/// `"backend"`, `"closed"`, `"internal"`, `"null_pointer"`, `"invalid_utf8"`,
/// or `"unknown"` for a number that is not a code. The ids 1-8 are the same
/// strings as the Node `code` and the core's `ErrorKind::as_str()`.
///
/// Returns a static NUL-terminated string (never NULL, never freed).
#[no_mangle]
pub extern "C" fn tg_result_name(code: u32) -> *const c_char {
    crate::ffi_value(c"unknown".as_ptr(), || tg_result::name(code).as_ptr().cast())
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// The message of the last failed call on this thread, naming what is wrong,
/// or `""` when the last call succeeded. Every call that returns a
/// `tg_result` replaces it.
///
/// Returns a NUL-terminated string owned by the library, valid on this thread
/// until the next `tg_` call that returns a `tg_result`; copy it to keep it.
/// Never NULL. Thread safety: each thread has its own message.
#[no_mangle]
pub extern "C" fn tg_last_error_message() -> *const c_char {
    crate::ffi_value(c"".as_ptr(), || {
        LAST_ERROR
            .try_with(|e| e.borrow().as_ptr())
            .unwrap_or(c"".as_ptr())
    })
}

pub(crate) fn clear_last_error() {
    let _ = LAST_ERROR.try_with(|e| {
        if let Ok(mut e) = e.try_borrow_mut() {
            if !e.as_bytes().is_empty() {
                *e = CString::default();
            }
        }
    });
}

/// A failure on its way to C: a code and a message.
#[derive(Debug)]
pub(crate) struct Fail {
    code: tg_result,
    message: String,
}

impl Fail {
    pub(crate) fn new(code: tg_result, message: impl Into<String>) -> Fail {
        Fail { code, message: message.into() }
    }

    pub(crate) fn null(what: &str) -> Fail {
        Fail::new(tg_result::TG_NULL_POINTER, format!("{what}: must not be NULL"))
    }

    pub(crate) fn utf8(what: &str, valid_up_to: usize) -> Fail {
        Fail::new(
            tg_result::TG_INVALID_UTF8,
            format!("{what}: not valid UTF-8 (invalid byte at offset {valid_up_to})"),
        )
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Fail {
        Fail::new(tg_result::TG_INVALID_ARGUMENT, message)
    }

    /// Store the message as this thread's last error and give the code.
    pub(crate) fn record(self) -> tg_result {
        let text = crate::decision::to_cstring(self.message);
        let _ = LAST_ERROR.try_with(|e| {
            if let Ok(mut e) = e.try_borrow_mut() {
                *e = text;
            }
        });
        self.code
    }
}

impl From<Error> for Fail {
    fn from(err: Error) -> Fail {
        Fail::new(tg_result::from_kind(err.kind()), err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn codes_and_names_match_the_core() {
        for kind in ErrorKind::ALL {
            let code = tg_result::from_kind(kind);
            assert_eq!(code as u32, kind.code(), "{kind}");
            let name = unsafe { CStr::from_ptr(tg_result_name(code as u32)) };
            assert_eq!(name.to_str().unwrap(), kind.as_str());
        }
        let name = unsafe { CStr::from_ptr(tg_result_name(99)) };
        assert_eq!(name.to_str().unwrap(), "unknown");
    }
}
