//! Decisions: fields, per-rule results, headers, problem body.

use std::ffi::{c_char, CString};
use std::ptr;
use std::sync::OnceLock;

use throttlegate::{ceil_millis, Decision, HeaderOptions};

use crate::{ffi, in_ref, out_ptr, tg_result, Fail};

/// The answer to one check or peek.
///
/// Made by `tg_limiter_check()`, `tg_limiter_check_with_call_id()` and
/// `tg_limiter_peek()`, released by `tg_decision_free()`. Strings read from
/// it (rule names, headers, the problem body) belong to it and stay valid
/// until it is freed.
///
/// Thread safety: immutable once made; any number of threads may read one
/// decision at once (headers and the problem body are computed once, on
/// first request, safely under concurrent readers).
pub struct tg_decision {
    pub(crate) decision: Decision,
    rule: Option<CString>,
    result_rules: Vec<CString>,
    headers: [OnceLock<Vec<(CString, CString)>>; 2],
    problem: OnceLock<Option<CString>>,
    lease: OnceLock<Option<CString>>,
}

/// The headline of a decision, filled by `tg_decision_get()`.
/// Times are whole milliseconds, rounded up.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tg_decision_info {
    /// Whether the request is admitted.
    pub allowed: bool,
    /// The headline rule's limit (0 when no rule applied).
    pub limit: u64,
    /// The headline rule's remaining units.
    pub remaining: u64,
    /// When denied, the longest wait among the denying rules; 0 when allowed.
    pub retry_after_ms: u64,
    /// The headline rule's time until it is back to full.
    pub reset_after_ms: u64,
    /// The most restrictive rule's name (NUL-terminated, owned by the
    /// decision), or NULL when no rule applied.
    pub rule: *const c_char,
    /// True when the answer came from the failure policy, not the backend.
    pub degraded: bool,
    /// How many per-rule results `tg_decision_result()` can read.
    pub result_count: usize,
}

/// One applied rule's result, filled by `tg_decision_result()`.
/// Times are whole milliseconds, rounded up.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tg_rule_result {
    /// The rule's name (NUL-terminated, owned by the decision).
    pub rule: *const c_char,
    /// Whether this rule admits the request (for a shadow rule: would admit).
    pub allowed: bool,
    /// The rule is in shadow mode: reported, never the cause of a denial.
    pub shadow: bool,
    /// The rule's limit (sliding window) or capacity (token bucket).
    pub limit: u64,
    /// Units left after this check.
    pub remaining: u64,
    /// How long until a request of the same cost would pass this rule (0 when allowed).
    pub retry_after_ms: u64,
    /// How long until the rule's state is back to full.
    pub reset_after_ms: u64,
    /// The window advertised in headers (a bucket's full refill time).
    pub window_ms: u64,
}

/// A Rust string as a C string; the core's strings hold no NUL, but a
/// message may quote user input, so a NUL is shown as `\0` rather than
/// cutting the text.
pub(crate) fn to_cstring(text: impl Into<String>) -> CString {
    let text = text.into();
    CString::new(text).unwrap_or_else(|e| {
        let escaped = String::from_utf8_lossy(&e.into_vec()).replace('\0', "\\0");
        CString::new(escaped).unwrap_or_default()
    })
}

impl tg_decision {
    pub(crate) fn new(decision: Decision) -> tg_decision {
        tg_decision {
            rule: decision.rule.as_deref().map(to_cstring),
            result_rules: decision.results.iter().map(|r| to_cstring(&*r.rule)).collect(),
            decision,
            headers: [OnceLock::new(), OnceLock::new()],
            problem: OnceLock::new(),
            lease: OnceLock::new(),
        }
    }

    fn headers(&self, legacy: bool) -> &[(CString, CString)] {
        self.headers[usize::from(legacy)].get_or_init(|| {
            self.decision
                .headers_with(HeaderOptions { legacy })
                .into_iter()
                .map(|(name, value)| (to_cstring(name), to_cstring(value)))
                .collect()
        })
    }
}

/// Whether the decision admits the request; false for NULL (a safe default
/// for a gate). `tg_decision_get()` gives every field with error reporting.
#[no_mangle]
pub unsafe extern "C" fn tg_decision_allowed(decision: *const tg_decision) -> bool {
    crate::ffi_value(false, || decision.as_ref().is_some_and(|d| d.decision.allowed))
}

/// The headline fields of a decision, written to `*out`.
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_decision_get(decision: *const tg_decision, out: *mut tg_decision_info) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let d = in_ref(decision, "decision")?;
        *out = tg_decision_info {
            allowed: d.decision.allowed,
            limit: d.decision.limit,
            remaining: d.decision.remaining,
            retry_after_ms: d.decision.retry_after_ms(),
            reset_after_ms: d.decision.reset_after_ms(),
            rule: d.rule.as_ref().map_or(ptr::null(), |r| r.as_ptr()),
            degraded: d.decision.degraded,
            result_count: d.decision.results.len(),
        };
        Ok(())
    })
}

/// The result of the `index`-th applied rule (policy order, shadow rules
/// included), written to `*out`.
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_ARGUMENT` (`index` not below
/// `result_count`).
#[no_mangle]
pub unsafe extern "C" fn tg_decision_result(
    decision: *const tg_decision,
    index: usize,
    out: *mut tg_rule_result,
) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let d = in_ref(decision, "decision")?;
        let r = d.decision.results.get(index).ok_or_else(|| {
            Fail::invalid(format!("index: {index} is out of range ({} results)", d.decision.results.len()))
        })?;
        *out = tg_rule_result {
            rule: d.result_rules[index].as_ptr(),
            allowed: r.allowed,
            shadow: r.shadow,
            limit: r.limit,
            remaining: r.remaining,
            retry_after_ms: ceil_millis(r.retry_after),
            reset_after_ms: ceil_millis(r.reset_after),
            window_ms: ceil_millis(r.window),
        };
        Ok(())
    })
}

/// How many HTTP headers the decision has, written to `*out` (0 when no
/// rule applied). `legacy` adds the `X-RateLimit-*` copies.
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_decision_header_count(
    decision: *const tg_decision,
    legacy: bool,
    out: *mut usize,
) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let d = in_ref(decision, "decision")?;
        *out = d.headers(legacy).len();
        Ok(())
    })
}

/// The `index`-th HTTP header of the decision, in order: `*name` and
/// `*value` receive NUL-terminated strings owned by the decision. The bytes
/// are identical in every throttlegate language.
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_ARGUMENT` (`index` out of range).
#[no_mangle]
pub unsafe extern "C" fn tg_decision_header(
    decision: *const tg_decision,
    legacy: bool,
    index: usize,
    name: *mut *const c_char,
    value: *mut *const c_char,
) -> tg_result {
    ffi(|| {
        let name = out_ptr(name, "name")?;
        let value = out_ptr(value, "value")?;
        let d = in_ref(decision, "decision")?;
        let headers = d.headers(legacy);
        let (n, v) = headers
            .get(index)
            .ok_or_else(|| Fail::invalid(format!("index: {index} is out of range ({} headers)", headers.len())))?;
        *name = n.as_ptr();
        *value = v.as_ptr();
        Ok(())
    })
}

/// An `application/problem+json` body (RFC 9457) for a denial, naming the
/// violated rules: `*out` receives a NUL-terminated string owned by the
/// decision, or NULL when the request is allowed (as in every language).
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_decision_problem_json(decision: *const tg_decision, out: *mut *const c_char) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let d = in_ref(decision, "decision")?;
        let body = d.problem.get_or_init(|| d.decision.problem_json().map(to_cstring));
        *out = body.as_ref().map_or(std::ptr::null(), |b| b.as_ptr());
        Ok(())
    })
}

/// The lease id of the concurrency slots an admitted decision holds (the
/// check's call id when it had one, else an id the limiter made): `*out`
/// receives a NUL-terminated string owned by the decision, or NULL when the
/// decision holds no slot (a denial, or no concurrency rule applied; such a
/// decision needs no `tg_limiter_release()`).
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_decision_lease_id(decision: *const tg_decision, out: *mut *const c_char) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let d = in_ref(decision, "decision")?;
        let lease = d.lease.get_or_init(|| d.decision.lease_id().map(to_cstring));
        *out = lease.as_ref().map_or(std::ptr::null(), |l| l.as_ptr());
        Ok(())
    })
}

/// Release a decision and every string read from it. `NULL` is a no-op.
#[no_mangle]
pub unsafe extern "C" fn tg_decision_free(decision: *mut tg_decision) {
    crate::ffi_value((), || {
        if !decision.is_null() {
            drop(Box::from_raw(decision));
        }
    });
}
