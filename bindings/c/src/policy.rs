//! Policies from files and strings.

use std::ffi::{c_char, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;

use throttlegate::Policy;

use crate::{c_str, ffi, out_ptr, tg_result, Fail};

/// An ordered set of rules, loaded from a file or a string (TOML or JSON,
/// the format shared by every throttlegate language).
///
/// Made by `tg_policy_from_file()` or `tg_policy_from_str()`, released by
/// `tg_policy_free()`. Immutable: one policy may be read by any number of
/// threads at once (for example to build limiters). A limiter keeps its own
/// copy, so the policy may be freed as soon as the limiters are built.
pub struct tg_policy {
    pub(crate) policy: Policy,
}

/// Read a policy file: `.json` is JSON, `.toml` is TOML, anything else is
/// guessed from the content.
///
/// `path` is a NUL-terminated file name (bytes, as the OS takes them; it need
/// not be UTF-8). On success `*out` receives a new policy to release with
/// `tg_policy_free()`; on failure `*out` is left untouched.
///
/// Errors: `TG_NULL_POINTER`, `TG_IO` (cannot read), `TG_INVALID_POLICY`
/// (malformed or not UTF-8; the message names the field).
#[no_mangle]
pub unsafe extern "C" fn tg_policy_from_file(path: *const c_char, out: *mut *mut tg_policy) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        if path.is_null() {
            return Err(Fail::null("path"));
        }
        let path = OsStr::from_bytes(CStr::from_ptr(path).to_bytes());
        let policy = Policy::from_file(path)?;
        *out = Box::into_raw(Box::new(tg_policy { policy }));
        Ok(())
    })
}

/// Parse a policy from NUL-terminated UTF-8 text: JSON when the first
/// non-blank character is `{`, TOML otherwise.
///
/// On success `*out` receives a new policy to release with `tg_policy_free()`;
/// on failure `*out` is left untouched.
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_UTF8`, `TG_INVALID_POLICY` (the
/// message names the field).
#[no_mangle]
pub unsafe extern "C" fn tg_policy_from_str(text: *const c_char, out: *mut *mut tg_policy) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let text = c_str(text, || "text".into())?;
        let policy = Policy::from_str_any(text)?;
        *out = Box::into_raw(Box::new(tg_policy { policy }));
        Ok(())
    })
}

/// The number of rules of a policy, written to `*out`.
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_policy_rule_count(policy: *const tg_policy, out: *mut usize) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let policy = crate::in_ref(policy, "policy")?;
        *out = policy.policy.rules().len();
        Ok(())
    })
}

/// Release a policy. `NULL` is a no-op. Limiters built from it stay valid.
#[no_mangle]
pub unsafe extern "C" fn tg_policy_free(policy: *mut tg_policy) {
    crate::ffi_value((), || {
        if !policy.is_null() {
            drop(Box::from_raw(policy));
        }
    });
}
