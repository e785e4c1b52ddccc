//! Limiters and their options; blocking check, peek, reset, ping, stats, close.

use std::ffi::c_char;
use std::time::Duration;

use throttlegate::{CheckOptions, FailureMode, Limiter, LimiterOptions};

use crate::{c_str, ffi, in_ref, out_ptr, tg_clock, tg_decision, tg_policy, tg_result, Fail};

/// What a call does when the backend is down, too slow, or answers with an
/// error: the values of `tg_limiter_options_set_on_backend_error()`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum tg_failure_mode {
    /// Admit the request; the decision is marked `degraded`.
    TG_FAILURE_ALLOW = 0,
    /// Deny the request; the decision is marked `degraded`.
    TG_FAILURE_DENY = 1,
    /// Return the error (`TG_BACKEND_UNAVAILABLE`, `TG_TIMEOUT`, `TG_BACKEND`).
    TG_FAILURE_ERROR = 2,
}

/// One request attribute: a name (`"ip"`, `"api_key"`, `"route"`...) and its
/// value, both NUL-terminated UTF-8 strings, borrowed for the call only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tg_attribute {
    /// The attribute's name, as the policy's key templates and matches spell it.
    pub name: *const c_char,
    /// The attribute's value.
    pub value: *const c_char,
}

/// Settings of a limiter beyond its policy, for `tg_limiter_new_with_options()`.
///
/// Made by `tg_limiter_options_new()` (every setting at its default: the
/// embedded backend, the policy's own timeout, failure mode and prefix, the
/// backend's clock), released by `tg_limiter_options_free()`.
///
/// Thread safety: not synchronized. Change it from one thread at a time;
/// building limiters from it on several threads is fine while nobody
/// changes it.
pub struct tg_limiter_options {
    options: LimiterOptions,
}

/// A policy bound to a backend (Redis, or the embedded in-memory backend).
///
/// Made by `tg_limiter_new()` or `tg_limiter_new_with_options()`, released
/// by `tg_limiter_free()`.
///
/// Thread safety: every function but `tg_limiter_free()` may be called on
/// one limiter from any number of threads at once (one limiter per process
/// is the intended use; it holds one multiplexed Redis connection). Calls
/// block the calling thread until the answer or the timeout; the library
/// runs them on its own Tokio runtime, started on first use.
///
/// Across fork(): the child gets a runtime of its own on its first call.
/// Make the child's Redis limiters in the child: one made before the fork
/// has its connection in the parent, so its calls in the child meet the
/// timeout (and the failure mode); the parent's connection is unaffected.
/// Limiters on the embedded backend keep working in the child, on a copy
/// of the state.
pub struct tg_limiter {
    limiter: Limiter,
}

/// Counters of a limiter since it was made, filled by `tg_limiter_stats()`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct tg_stats {
    /// Checks and peeks answered (degraded ones included).
    pub calls: u64,
    /// Calls answered "allowed".
    pub allowed: u64,
    /// Calls answered "denied".
    pub denied: u64,
    /// Degraded decisions that admitted (failure mode allow).
    pub degraded_allowed: u64,
    /// Degraded decisions that denied (failure mode deny).
    pub degraded_denied: u64,
    /// Backend failures returned as errors (failure mode error).
    pub backend_errors: u64,
    /// Calls that ran out of time (counted also as degraded or error).
    pub timeouts: u64,
    /// Settles that corrected at least one rule (`tg_limiter_settle()`,
    /// `tg_limiter_settle_call()`).
    pub settled: u64,
    /// Units settles gave back, summed over the rules they corrected.
    pub refunded: u64,
    /// Units settles took beyond the checks' costs, summed over the rules they corrected.
    pub debited: u64,
}

/// Reservation counters of a limiter since it was made (rules with
/// `reserve`, on Redis; see docs/concepts/reserve.md), filled by
/// `tg_limiter_reserve_stats()`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct tg_reserve_stats {
    /// Checks and peeks that needed the backend for a reserved rule (each one script run).
    pub trips: u64,
    /// Checks answered from reservations alone, with no round trip.
    pub local: u64,
    /// Units reserved from the backend.
    pub reserved: u64,
    /// Units given back unspent.
    pub returned: u64,
    /// Units dropped unspent.
    pub dropped: u64,
}

/// Make options with every setting at its default.
///
/// On success `*out` receives new options to release with
/// `tg_limiter_options_free()`.
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_options_new(out: *mut *mut tg_limiter_options) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        *out = Box::into_raw(Box::new(tg_limiter_options { options: LimiterOptions::default() }));
        Ok(())
    })
}

/// The backend: `redis://host:port/db`, `rediss://...` (TLS),
/// `redis+unix:///path`, `redis+cluster://host:port,host:port` (a Redis
/// Cluster, any nodes as seeds; `rediss+cluster://` with TLS), or
/// `memory://` (the embedded backend, the default). Checked when the
/// limiter is built.
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_UTF8`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_options_set_url(options: *mut tg_limiter_options, url: *const c_char) -> tg_result {
    ffi(|| {
        let options = &mut out_ptr(options, "options")?.options;
        let url = c_str(url, || "url".into())?;
        options.url = Some(url.to_string());
        Ok(())
    })
}

/// Bound on the whole of one call, in milliseconds (overrides the policy's
/// `timeout`). Checked when the limiter is built.
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_options_set_timeout_ms(options: *mut tg_limiter_options, timeout_ms: u64) -> tg_result {
    ffi(|| {
        let options = &mut out_ptr(options, "options")?.options;
        options.timeout = Some(Duration::from_millis(timeout_ms));
        Ok(())
    })
}

/// What to do when the backend fails: one of `tg_failure_mode` (overrides
/// the policy's setting; rules' own overrides still win).
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_ARGUMENT` (not a `tg_failure_mode`).
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_options_set_on_backend_error(
    options: *mut tg_limiter_options,
    mode: u32,
) -> tg_result {
    ffi(|| {
        let options = &mut out_ptr(options, "options")?.options;
        let mode = match mode {
            0 => FailureMode::Allow,
            1 => FailureMode::Deny,
            2 => FailureMode::Error,
            other => {
                return Err(Fail::invalid(format!(
                    "mode: {other} is not a tg_failure_mode (TG_FAILURE_ALLOW, TG_FAILURE_DENY, TG_FAILURE_ERROR)"
                )))
            }
        };
        options.on_backend_error = Some(mode);
        Ok(())
    })
}

/// Key prefix (overrides the policy's `prefix`). Checked when the limiter is built.
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_UTF8`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_options_set_prefix(
    options: *mut tg_limiter_options,
    prefix: *const c_char,
) -> tg_result {
    ffi(|| {
        let options = &mut out_ptr(options, "options")?.options;
        let prefix = c_str(prefix, || "prefix".into())?;
        options.prefix = Some(prefix.to_string());
        Ok(())
    })
}

/// Where "now" comes from. The options keep their own share of the clock:
/// `clock` may be freed afterwards, and moving a manual clock moves every
/// limiter made with it.
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_options_set_clock(
    options: *mut tg_limiter_options,
    clock: *const tg_clock,
) -> tg_result {
    ffi(|| {
        let options = &mut out_ptr(options, "options")?.options;
        let clock = in_ref(clock, "clock")?;
        options.clock = clock.clock.clone();
        Ok(())
    })
}

/// Remember denials in process (`on` non-zero; default off): after Redis
/// denies a check, the same keys are denied here without a round trip for
/// exactly as long as Redis would deny them, for checks of at least the
/// denied cost. Spares Redis the traffic of refused clients. A reset made by
/// another process is not seen until the wait ends; such a denial reports
/// only the remembered rules; checks with a call id always go to Redis. No
/// effect on the embedded backend.
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_options_set_deny_cache(options: *mut tg_limiter_options, on: i32) -> tg_result {
    ffi(|| {
        let options = &mut out_ptr(options, "options")?.options;
        options.deny_cache = on != 0;
        Ok(())
    })
}

/// Hash attribute values with this secret (HMAC-SHA-256) before they go into
/// keys, so raw values such as API keys never reach the backend. `secret` is
/// `len` bytes (any bytes; copied). Every process sharing the backend must
/// use the same secret.
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_ARGUMENT` (empty).
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_options_set_key_secret(
    options: *mut tg_limiter_options,
    secret: *const u8,
    len: usize,
) -> tg_result {
    ffi(|| {
        let options = &mut out_ptr(options, "options")?.options;
        options.key_secret = Some(bytes(secret, len, "secret", "len")?);
        Ok(())
    })
}

/// For `rediss://` URLs: trust this CA certificate instead of the system's
/// roots (a private CA, or a self-signed server). `pem` is `pem_len` bytes of
/// PEM text (copied). Replaces an earlier root certificate. Checked when a
/// limiter on a Redis URL is built (`TG_INVALID_ARGUMENT` naming
/// `tls_root_cert` when it holds no PEM certificate). A server the CA does
/// not vouch for is a backend failure (`TG_BACKEND` under `TG_FAILURE_ERROR`).
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_ARGUMENT` (empty).
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_options_set_tls_root_cert(
    options: *mut tg_limiter_options,
    pem: *const u8,
    pem_len: usize,
) -> tg_result {
    ffi(|| {
        let options = &mut out_ptr(options, "options")?.options;
        options.tls_root_cert = Some(bytes(pem, pem_len, "pem", "pem_len")?);
        Ok(())
    })
}

/// For `rediss://` URLs: present this client certificate and private key
/// (mutual TLS, for a server that authenticates its clients). `cert_pem` is
/// `cert_len` bytes and `key_pem` is `key_len` bytes of PEM text (both
/// copied). Replaces an earlier client certificate. Checked when a limiter
/// on a Redis URL is built (`TG_INVALID_ARGUMENT` naming `tls_client_cert`
/// when either is not PEM). A server that refuses the certificate is
/// a backend failure (`TG_BACKEND` under `TG_FAILURE_ERROR`).
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_ARGUMENT` (empty).
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_options_set_tls_client_cert(
    options: *mut tg_limiter_options,
    cert_pem: *const u8,
    cert_len: usize,
    key_pem: *const u8,
    key_len: usize,
) -> tg_result {
    ffi(|| {
        let options = &mut out_ptr(options, "options")?.options;
        let cert = bytes(cert_pem, cert_len, "cert_pem", "cert_len")?;
        let key = bytes(key_pem, key_len, "key_pem", "key_len")?;
        options.tls_client_cert = Some((cert, key));
        Ok(())
    })
}

/// A required, non-empty byte buffer from C, copied. `what` and `what_len`
/// name the pointer and length parameters in error messages.
unsafe fn bytes(ptr: *const u8, len: usize, what: &str, what_len: &str) -> Result<Vec<u8>, Fail> {
    if ptr.is_null() {
        return Err(Fail::null(what));
    }
    if len == 0 {
        return Err(Fail::invalid(format!("{what}: must not be empty")));
    }
    if len > isize::MAX as usize {
        return Err(Fail::invalid(format!("{what_len}: {len} is too large")));
    }
    Ok(std::slice::from_raw_parts(ptr, len).to_vec())
}

/// Release options. `NULL` is a no-op. Limiters built from them are unaffected.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_options_free(options: *mut tg_limiter_options) {
    crate::ffi_value((), || {
        if !options.is_null() {
            drop(Box::from_raw(options));
        }
    });
}

fn build(policy: &tg_policy, options: LimiterOptions) -> Result<tg_limiter, Fail> {
    Ok(tg_limiter { limiter: Limiter::with_options(policy.policy.clone(), options)? })
}

/// A limiter for `policy` on the backend named by `url`: `redis://...`,
/// `rediss://...`, `redis+unix:///path`, `redis+cluster://host:port,...`,
/// or `memory://` (the embedded backend). Connections are made on first use, so this succeeds while
/// Redis is down. The limiter keeps its own copy of the policy.
///
/// On success `*out` receives a new limiter to release with `tg_limiter_free()`.
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_UTF8`, `TG_INVALID_ARGUMENT` (bad URL).
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_new(
    policy: *const tg_policy,
    url: *const c_char,
    out: *mut *mut tg_limiter,
) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let policy = in_ref(policy, "policy")?;
        let url = c_str(url, || "url".into())?;
        let options = LimiterOptions { url: Some(url.to_string()), ..Default::default() };
        *out = Box::into_raw(Box::new(build(policy, options)?));
        Ok(())
    })
}

/// A limiter for `policy` with `options` (see `tg_limiter_options_new()`).
///
/// On success `*out` receives a new limiter to release with `tg_limiter_free()`.
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_ARGUMENT` (bad URL, timeout, prefix,
/// secret, TLS certificate or key; the message names it).
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_new_with_options(
    policy: *const tg_policy,
    options: *const tg_limiter_options,
    out: *mut *mut tg_limiter,
) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let policy = in_ref(policy, "policy")?;
        let options = in_ref(options, "options")?;
        *out = Box::into_raw(Box::new(build(policy, options.options.clone())?));
        Ok(())
    })
}

/// The request's attributes as pairs borrowed from C for the call.
unsafe fn read_attributes<'a>(ptr: *const tg_attribute, len: usize) -> Result<Vec<(&'a str, &'a str)>, Fail> {
    if len == 0 {
        return Ok(Vec::new());
    }
    if ptr.is_null() {
        return Err(Fail::null("attributes"));
    }
    if len > isize::MAX as usize / std::mem::size_of::<tg_attribute>() {
        return Err(Fail::invalid(format!("attributes_len: {len} is too large")));
    }
    let items = std::slice::from_raw_parts(ptr, len);
    let mut pairs: Vec<(&str, &str)> = Vec::with_capacity(len);
    for (i, a) in items.iter().enumerate() {
        let name = c_str(a.name, || format!("attributes[{i}].name"))?;
        let value = c_str(a.value, || format!("attributes[{i}].value"))?;
        if pairs.iter().any(|(n, _)| *n == name) {
            return Err(Fail::invalid(format!(
                "attributes[{i}].name: {name:?} appears more than once"
            )));
        }
        pairs.push((name, value));
    }
    Ok(pairs)
}

/// The arguments of a call about a request, read from C in one order (the
/// limiter, the rule's name, the attributes, the call id): every entry point
/// that takes them reports a missing or malformed one the same way.
struct Request<'a> {
    limiter: &'a Limiter,
    /// The rule's name, for the calls that name one (else empty).
    rule: &'a str,
    attrs: Vec<(&'a str, &'a str)>,
    call_id: Option<&'a str>,
}

/// Read a [`Request`]: `rule` and `call_id` when the call takes them,
/// `attributes_len` pairs at `attributes` (none for a call about a rule only).
unsafe fn request<'a>(
    limiter: *const tg_limiter,
    rule: Option<*const c_char>,
    attributes: *const tg_attribute,
    attributes_len: usize,
    call_id: Option<*const c_char>,
) -> Result<Request<'a>, Fail> {
    let limiter = &in_ref(limiter, "limiter")?.limiter;
    let rule = match rule {
        Some(p) => c_str(p, || "rule".into())?,
        None => "",
    };
    let attrs = read_attributes(attributes, attributes_len)?;
    let call_id = match call_id {
        Some(p) => Some(c_str(p, || "call_id".into())?),
        None => None,
    };
    Ok(Request { limiter, rule, attrs, call_id })
}

enum Op {
    Check,
    Peek,
}

unsafe fn decide(
    limiter: *const tg_limiter,
    attrs: *const tg_attribute,
    attrs_len: usize,
    cost: u64,
    call_id: Option<*const c_char>,
    op: Op,
    out: *mut *mut tg_decision,
) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let r = request(limiter, None, attrs, attrs_len, call_id)?;
        let decision = match op {
            Op::Check => {
                let options = CheckOptions { cost, call_id: r.call_id.map(str::to_string) };
                r.limiter.check_blocking(r.attrs.as_slice(), &options)?
            }
            Op::Peek => r.limiter.peek_blocking(r.attrs.as_slice(), cost)?,
        };
        *out = Box::into_raw(Box::new(tg_decision::new(decision)));
        Ok(())
    })
}

/// Check a request: consume `cost` units (at least 1) from every applicable
/// rule if all admit it, nothing otherwise. Blocks until the answer or the
/// timeout. `attributes` is an array of `attributes_len` pairs (it may be
/// NULL when `attributes_len` is 0); each name may appear once.
///
/// On success `*out` receives a new decision to release with
/// `tg_decision_free()`. A denial is a success: read `allowed`.
///
/// Errors: `TG_NULL_POINTER` (also for a NULL name or value; the message
/// says which), `TG_INVALID_UTF8` (the message names the attribute),
/// `TG_INVALID_ARGUMENT` (cost 0 or above a rule's limit, repeated name),
/// `TG_CLOSED`, and with `TG_FAILURE_ERROR`: `TG_BACKEND_UNAVAILABLE`,
/// `TG_TIMEOUT`, `TG_BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_check(
    limiter: *const tg_limiter,
    attributes: *const tg_attribute,
    attributes_len: usize,
    cost: u64,
    out: *mut *mut tg_decision,
) -> tg_result {
    decide(limiter, attributes, attributes_len, cost, None, Op::Check, out)
}

/// `tg_limiter_check()` with an id for the call, which makes a retry of the
/// same request idempotent: a second call with the same id is answered
/// without counting again. `call_id` is 1-64 characters from
/// `A-Z a-z 0-9 _ -`, NUL-terminated.
///
/// Errors: those of `tg_limiter_check()`; `TG_INVALID_ARGUMENT` for a bad id.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_check_with_call_id(
    limiter: *const tg_limiter,
    attributes: *const tg_attribute,
    attributes_len: usize,
    cost: u64,
    call_id: *const c_char,
    out: *mut *mut tg_decision,
) -> tg_result {
    decide(limiter, attributes, attributes_len, cost, Some(call_id), Op::Check, out)
}

/// The decision a check of this cost would get now, without consuming
/// anything. Arguments and errors as for `tg_limiter_check()`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_peek(
    limiter: *const tg_limiter,
    attributes: *const tg_attribute,
    attributes_len: usize,
    cost: u64,
    out: *mut *mut tg_decision,
) -> tg_result {
    decide(limiter, attributes, attributes_len, cost, None, Op::Peek, out)
}

/// Settle an admitted check whose real cost is known only now (after the
/// response): every rule the check consumed from gets the difference back,
/// or takes the excess (even beyond the limit), atomically, once per call
/// id; `*settled` receives how many rules were settled (0 for a denied
/// decision or a second settle). The check must have been made with
/// `tg_limiter_check_with_call_id()`. Blocks until the answer or the timeout.
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_ARGUMENT` (a decision whose check
/// had no call id, `actual_cost` above 10^15), `TG_CLOSED`,
/// `TG_BACKEND_UNAVAILABLE`, `TG_TIMEOUT`, `TG_BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_settle(
    limiter: *const tg_limiter,
    decision: *const tg_decision,
    actual_cost: u64,
    settled: *mut u32,
) -> tg_result {
    ffi(|| {
        let settled = out_ptr(settled, "settled")?;
        let limiter = &in_ref(limiter, "limiter")?.limiter;
        let decision = &in_ref(decision, "decision")?.decision;
        *settled = limiter.settle_blocking(decision, actual_cost)?;
        Ok(())
    })
}

/// `tg_limiter_settle()` by call id, without the decision (a settle made
/// elsewhere than the check): the check's attributes, call id and cost, and
/// the real cost. Arguments as for `tg_limiter_check_with_call_id()`.
///
/// Errors: those of `tg_limiter_settle()` and of `tg_limiter_check_with_call_id()`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_settle_call(
    limiter: *const tg_limiter,
    attributes: *const tg_attribute,
    attributes_len: usize,
    call_id: *const c_char,
    cost: u64,
    actual_cost: u64,
    settled: *mut u32,
) -> tg_result {
    ffi(|| {
        let settled = out_ptr(settled, "settled")?;
        let r = request(limiter, None, attributes, attributes_len, Some(call_id))?;
        let call_id = r.call_id.unwrap_or_default();
        *settled = r.limiter.settle_call_blocking(r.attrs.as_slice(), call_id, cost, actual_cost)?;
        Ok(())
    })
}

/// Release the concurrency slots an admitted decision holds (rules with
/// `algorithm = "concurrency"`), as soon as the work they guard is done:
/// `*released` receives how many concurrency rules gave a slot back (0 for
/// a denied decision, one holding no slot, or a second release: releasing
/// is idempotent). Slots never released come back when their lease ends.
/// Blocks until the answer or the timeout.
///
/// Errors: `TG_NULL_POINTER`, `TG_CLOSED`, `TG_BACKEND_UNAVAILABLE`,
/// `TG_TIMEOUT`, `TG_BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_release(
    limiter: *const tg_limiter,
    decision: *const tg_decision,
    released: *mut u32,
) -> tg_result {
    ffi(|| {
        let released = out_ptr(released, "released")?;
        let limiter = &in_ref(limiter, "limiter")?.limiter;
        let decision = &in_ref(decision, "decision")?.decision;
        *released = limiter.release_blocking(decision)?;
        Ok(())
    })
}

/// `tg_limiter_release()` by lease id, without the decision (a release made
/// elsewhere than the check): the check's attributes and its call id (the
/// lease id of a check made with `tg_limiter_check_with_call_id()`).
///
/// Errors: those of `tg_limiter_release()` and `TG_INVALID_ARGUMENT` (a
/// call id that is not 1-64 allowed characters, bad attributes).
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_release_call(
    limiter: *const tg_limiter,
    attributes: *const tg_attribute,
    attributes_len: usize,
    call_id: *const c_char,
    released: *mut u32,
) -> tg_result {
    ffi(|| {
        let released = out_ptr(released, "released")?;
        let limiter = &in_ref(limiter, "limiter")?.limiter;
        let attrs = read_attributes(attributes, attributes_len)?;
        let call_id = c_str(call_id, || "call_id".into())?;
        *released = limiter.release_call_blocking(attrs.as_slice(), call_id)?;
        Ok(())
    })
}

/// Renew the lease of the concurrency slots an admitted decision holds, for
/// long work: each slot is held `duration_ms` milliseconds from now (instead
/// of the rule's `lease`). `*extended` receives how many concurrency rules
/// renewed a slot (0 when the decision holds none, or its slots were
/// released or their lease ended: they may be someone else's now).
///
/// Errors: those of `tg_limiter_release()` and `TG_INVALID_ARGUMENT` (a
/// duration the core refuses).
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_extend(
    limiter: *const tg_limiter,
    decision: *const tg_decision,
    duration_ms: u64,
    extended: *mut u32,
) -> tg_result {
    ffi(|| {
        let extended = out_ptr(extended, "extended")?;
        let limiter = &in_ref(limiter, "limiter")?.limiter;
        let decision = &in_ref(decision, "decision")?.decision;
        *extended = limiter.extend_blocking(decision, Duration::from_millis(duration_ms))?;
        Ok(())
    })
}

/// `tg_limiter_extend()` by lease id, without the decision: the check's
/// attributes and call id. Arguments as for `tg_limiter_release_call()`.
///
/// Errors: those of `tg_limiter_release_call()` and `tg_limiter_extend()`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_extend_call(
    limiter: *const tg_limiter,
    attributes: *const tg_attribute,
    attributes_len: usize,
    call_id: *const c_char,
    duration_ms: u64,
    extended: *mut u32,
) -> tg_result {
    ffi(|| {
        let extended = out_ptr(extended, "extended")?;
        let limiter = &in_ref(limiter, "limiter")?.limiter;
        let attrs = read_attributes(attributes, attributes_len)?;
        let call_id = c_str(call_id, || "call_id".into())?;
        *extended = limiter.extend_call_blocking(attrs.as_slice(), call_id, Duration::from_millis(duration_ms))?;
        Ok(())
    })
}

/// Wait, blocking the calling thread, until a check of `cost` is admitted,
/// at most `timeout_ms` milliseconds: `*out` receives the admitting decision
/// (release it with `tg_decision_free()`). Fails with `TG_TIMEOUT` at once
/// when the wait asked for is longer than the time left. It waits exactly
/// the retry-after it is told, never polls; concurrent waiters of this
/// limiter on the same keys are served in arrival order.
///
/// Errors: those of `tg_limiter_check()`, and `TG_TIMEOUT` when not admitted in time.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_acquire(
    limiter: *const tg_limiter,
    attributes: *const tg_attribute,
    attributes_len: usize,
    cost: u64,
    timeout_ms: u64,
    out: *mut *mut tg_decision,
) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let r = request(limiter, None, attributes, attributes_len, None)?;
        let options = CheckOptions { cost, call_id: None };
        let decision =
            r.limiter.acquire_blocking(r.attrs.as_slice(), &options, std::time::Duration::from_millis(timeout_ms))?;
        *out = Box::into_raw(Box::new(tg_decision::new(decision)));
        Ok(())
    })
}

/// Forget the state of every rule that applies to this request (to unblock
/// a client). `*deleted` receives how many keys existed.
///
/// Errors: as for `tg_limiter_check()` (a reset is never degraded: backend
/// failures are always returned).
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_reset(
    limiter: *const tg_limiter,
    attributes: *const tg_attribute,
    attributes_len: usize,
    deleted: *mut u64,
) -> tg_result {
    ffi(|| {
        let deleted = out_ptr(deleted, "deleted")?;
        let r = request(limiter, None, attributes, attributes_len, None)?;
        let n = r.limiter.reset_blocking(r.attrs.as_slice())?;
        *deleted = n;
        Ok(())
    })
}

/// Check that the backend answers (a `PING` for Redis) within the timeout.
///
/// Errors: `TG_NULL_POINTER`, `TG_CLOSED`, `TG_BACKEND_UNAVAILABLE`,
/// `TG_TIMEOUT`, `TG_BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_ping(limiter: *const tg_limiter) -> tg_result {
    ffi(|| {
        let limiter = &in_ref(limiter, "limiter")?.limiter;
        limiter.ping_blocking()?;
        Ok(())
    })
}

/// The limiter's reservation counters, written to `*out`.
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_reserve_stats(limiter: *const tg_limiter, out: *mut tg_reserve_stats) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let s = in_ref(limiter, "limiter")?.limiter.reserve_stats();
        *out = tg_reserve_stats {
            trips: s.trips,
            local: s.local,
            reserved: s.reserved,
            returned: s.returned,
            dropped: s.dropped,
        };
        Ok(())
    })
}

/// The limiter's counters, written to `*out`.
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_stats(limiter: *const tg_limiter, out: *mut tg_stats) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let s = in_ref(limiter, "limiter")?.limiter.stats();
        *out = tg_stats {
            calls: s.calls,
            allowed: s.allowed,
            denied: s.denied,
            degraded_allowed: s.degraded_allowed,
            degraded_denied: s.degraded_denied,
            backend_errors: s.backend_errors,
            timeouts: s.timeouts,
            settled: s.settled,
            refunded: s.refunded,
            debited: s.debited,
        };
        Ok(())
    })
}

/// Close the limiter: drop its connections and state. Every later call on
/// it fails with `TG_CLOSED`; closing twice is harmless. Safe while other
/// threads use it (their calls in flight finish or fail with `TG_CLOSED`).
/// The limiter must still be released with `tg_limiter_free()`.
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_close(limiter: *const tg_limiter) -> tg_result {
    ffi(|| {
        in_ref(limiter, "limiter")?.limiter.close();
        Ok(())
    })
}

/// Release a limiter and its connections. `NULL` is a no-op. No other
/// thread may be using it, and no call on it may follow.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_free(limiter: *mut tg_limiter) {
    crate::ffi_value((), || {
        if !limiter.is_null() {
            drop(Box::from_raw(limiter));
        }
    });
}

/// Count per-rule metrics (`on` non-zero, the default) or not
/// (`tg_limiter_metrics_text()` then gives NULL).
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_options_set_metrics(options: *mut tg_limiter_options, on: i32) -> tg_result {
    ffi(|| {
        out_ptr(options, "options")?.options.metrics = on != 0;
        Ok(())
    })
}

/// The buckets of the backend latency histogram: `TG_LATENCY_BUCKETS` upper bounds.
pub const TG_LATENCY_BUCKETS: usize = 14;
const _: () = assert!(TG_LATENCY_BUCKETS == throttlegate::LATENCY_BUCKETS.len());

/// One rule's counters, filled by `tg_limiter_rule_metrics()`: the numbers of
/// `Limiter.metrics()` in every language.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct tg_rule_metrics {
    /// Checks and peeks the rule applied to (degraded ones included).
    pub checks: u64,
    /// The rule admitted the request (its own verdict; a shadow rule's too).
    pub allowed: u64,
    /// The rule refused the request.
    pub denied: u64,
    /// The rule is in shadow mode and would have refused the request.
    pub shadow_denied: u64,
    /// The backend failed and the failure policy admitted the request.
    pub degraded_allowed: u64,
    /// The backend failed and the failure policy refused the request.
    pub degraded_denied: u64,
    /// The backend failed and the error was returned (`TG_FAILURE_ERROR`).
    pub backend_errors: u64,
    /// The backend did not answer within the timeout.
    pub timeouts: u64,
    /// Checks settled on this rule.
    pub settles: u64,
    /// Units settles gave back on this rule.
    pub settle_refunded: u64,
    /// Units settles took on this rule beyond the check's cost.
    pub settle_debited: u64,
}

/// The latency of backend calls (Redis round trips), filled by
/// `tg_limiter_backend_latency()`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct tg_latency {
    /// Each bucket's upper bound, in seconds.
    pub bounds: [f64; TG_LATENCY_BUCKETS],
    /// Calls that took at most the bucket's bound (cumulative).
    pub buckets: [u64; TG_LATENCY_BUCKETS],
    /// Calls timed.
    pub count: u64,
    /// Their total time, in seconds.
    pub sum_seconds: f64,
}

fn metrics_of(limiter: &Limiter) -> Result<throttlegate::Metrics, Fail> {
    limiter
        .metrics()
        .ok_or_else(|| Fail::invalid("limiter: its metrics are off (tg_limiter_options_set_metrics)"))
}

/// The counters of the rule at `index` (policy order) since the limiter was
/// made, written to `*out`.
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_ARGUMENT` (index out of range, or
/// metrics turned off).
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_rule_metrics(
    limiter: *const tg_limiter,
    index: usize,
    out: *mut tg_rule_metrics,
) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let m = metrics_of(&in_ref(limiter, "limiter")?.limiter)?;
        let count = m.rules.len();
        let r = m
            .rules
            .get(index)
            .ok_or_else(|| Fail::invalid(format!("index: {index} is out of range ({count} rules)")))?;
        *out = tg_rule_metrics {
            checks: r.checks,
            allowed: r.allowed,
            denied: r.denied,
            shadow_denied: r.shadow_denied,
            degraded_allowed: r.degraded_allowed,
            degraded_denied: r.degraded_denied,
            backend_errors: r.backend_errors,
            timeouts: r.timeouts,
            settles: r.settles,
            settle_refunded: r.settle_refunded,
            settle_debited: r.settle_debited,
        };
        Ok(())
    })
}

/// The backend calls' latency histogram since the limiter was made, written to `*out`.
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_ARGUMENT` (metrics turned off).
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_backend_latency(limiter: *const tg_limiter, out: *mut tg_latency) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let h = metrics_of(&in_ref(limiter, "limiter")?.limiter)?.backend_latency;
        let mut l = tg_latency { count: h.count, sum_seconds: h.sum_seconds, ..Default::default() };
        for (i, (bound, n)) in h.buckets.into_iter().enumerate().take(TG_LATENCY_BUCKETS) {
            l.bounds[i] = bound;
            l.buckets[i] = n;
        }
        *out = l;
        Ok(())
    })
}

/// The metrics as the OpenMetrics text exposition (for a `/metrics`
/// endpoint, content type `application/openmetrics-text; version=1.0.0;
/// charset=utf-8`): `*out` receives a new NUL-terminated string to release
/// with `tg_string_free()`, or NULL when metrics are turned off.
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_metrics_text(limiter: *const tg_limiter, out: *mut *mut c_char) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let text = in_ref(limiter, "limiter")?.limiter.metrics_text();
        *out = text.map_or(std::ptr::null_mut(), |t| crate::decision::to_cstring(t).into_raw());
        Ok(())
    })
}

/// Release a string made by `tg_limiter_metrics_text()`, `tg_limiter_reload()`
/// or `tg_limiter_reload_file()`. `NULL` is a no-op.
#[no_mangle]
pub unsafe extern "C" fn tg_string_free(text: *mut c_char) {
    crate::ffi_value((), || {
        if !text.is_null() {
            drop(std::ffi::CString::from_raw(text));
        }
    });
}

/// Put `policy` in force on `limiter`, atomically: calls already running
/// finish on the old policy, every later one uses the new one. A rule that
/// keeps its name, key and algorithm (and the prefix) keeps its state; the
/// others start afresh. The limiter's own options (prefix, failure mode,
/// key secret) apply to the new policy as they did to the first; the
/// timeout stays the limiter's. The limiter keeps its own copy of `policy`.
/// On failure the old policy stays in force (and the refusal is counted by
/// `tg_limiter_reload_status()`); the result code and
/// `tg_last_error_message()` say why.
///
/// When applied and `diff` is not NULL, `*diff` receives what changed, the
/// core's policy diff as JSON text (the same as `throttlegate diff --json`:
/// `{"rules":[{"name","change","state_kept","fields"}],"settings":[{"field","old","new"}]}`),
/// a new string to release with `tg_string_free()`; on failure it is set to NULL.
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_POLICY` (a rule keeps its name and
/// key but changes its algorithm; the message names it), `TG_CLOSED`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_reload(
    limiter: *const tg_limiter,
    policy: *const tg_policy,
    diff: *mut *mut c_char,
) -> tg_result {
    ffi(|| {
        let diff = diff_out(diff);
        let limiter = &in_ref(limiter, "limiter")?.limiter;
        let policy = in_ref(policy, "policy")?;
        let changes = limiter.reload(policy.policy.clone())?;
        give_diff(diff, changes);
        Ok(())
    })
}

/// The optional `diff` out-parameter of a reload, set to NULL until the reload is applied.
unsafe fn diff_out<'a>(diff: *mut *mut c_char) -> Option<&'a mut *mut c_char> {
    let diff = diff.as_mut();
    if let Some(d) = diff {
        *d = std::ptr::null_mut();
        return Some(d);
    }
    None
}

/// Write an applied reload's diff as JSON text to the caller's `diff`, when it asked for it.
fn give_diff(diff: Option<&mut *mut c_char>, changes: throttlegate::PolicyDiff) {
    if let Some(d) = diff {
        *d = crate::decision::to_cstring(changes.to_json().to_string()).into_raw();
    }
}

/// Read the policy file `path` (as `tg_policy_from_file()` does) and
/// `tg_limiter_reload()` it. A file that cannot be read or parsed is
/// refused, and counted, like any other refusal. `diff` as for `tg_limiter_reload()`.
///
/// Errors: `TG_NULL_POINTER`, `TG_IO`, `TG_INVALID_POLICY`, `TG_CLOSED`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_reload_file(
    limiter: *const tg_limiter,
    path: *const c_char,
    diff: *mut *mut c_char,
) -> tg_result {
    ffi(|| {
        let diff = diff_out(diff);
        let limiter = &in_ref(limiter, "limiter")?.limiter;
        if path.is_null() {
            return Err(Fail::null("path"));
        }
        let path = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(std::ffi::CStr::from_ptr(path).to_bytes());
        let changes = limiter.reload_file(path)?;
        give_diff(diff, changes);
        Ok(())
    })
}

/// Watch the policy's file (a policy made by `tg_policy_from_file()`) and
/// reload it when it changes (`on` non-zero; default off): the file's
/// modification time, size and inode are read every 250 ms on the library's
/// runtime. A file that does not parse, or that a reload refuses, leaves the
/// policy in force and is reported by `tg_limiter_reload_status()`,
/// `tg_limiter_reload_last_error()` and the metrics
/// (`throttlegate_policy_reload_errors_total`). Replace the file atomically
/// (write another file, then rename it over). Building a limiter with this
/// option from a policy not read from a file fails with
/// `TG_INVALID_ARGUMENT`. The watch ends with `tg_limiter_close()` or
/// `tg_limiter_free()`; a forked child does not watch.
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_options_set_reload_on_change(options: *mut tg_limiter_options, on: i32) -> tg_result {
    ffi(|| {
        out_ptr(options, "options")?.options.reload_on_change = on != 0;
        Ok(())
    })
}

/// Check the backend when the limiter is built (non-zero `on`; default
/// off): `tg_limiter_new_with_options()` then connects, sends `PING` and
/// runs the check script once on no key, within the timeout, and fails
/// instead of degrading every later call: `TG_BACKEND_UNAVAILABLE` for a
/// wrong URL, `TG_TIMEOUT` for a server that does not answer, `TG_BACKEND`
/// for a wrong password or a user without the script's commands (the
/// message, from `tg_last_error_message()`, starts with `strict:` and names
/// the failed step). No effect on the embedded backend.
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_options_set_strict(options: *mut tg_limiter_options, on: i32) -> tg_result {
    ffi(|| {
        out_ptr(options, "options")?.options.strict = on != 0;
        Ok(())
    })
}

/// The level of a line given to a `tg_log_fn`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum tg_log_level {
    /// An outage began: calls fail and are answered by the failure policy.
    TG_LOG_WARNING = 1,
    /// The backend answers again.
    TG_LOG_INFO = 2,
}

/// A log callback (`tg_limiter_options_set_log()`): `level`, the outage's
/// cause (`"refused"`, `"timeout"`, `"auth_failed"`, `"noscript"`,
/// `"cluster_down"`, `"unavailable"` or `"backend_error"`) and the line,
/// both NUL-terminated and valid only during the call; `user_data` as given.
/// Called from the thread of the call that changed the backend's health,
/// never twice at once for one limiter; it must not call the limiter.
pub type tg_log_fn = Option<
    unsafe extern "C" fn(user_data: *mut std::ffi::c_void, level: tg_log_level, cause: *const c_char, message: *const c_char),
>;

/// A `tg_log_fn` and its `user_data`, callable from any thread (the caller
/// of `tg_limiter_options_set_log()` vouches for that).
struct LogCallback(unsafe extern "C" fn(*mut std::ffi::c_void, tg_log_level, *const c_char, *const c_char), usize);

/// Report the backend's outages to `log` (with `user_data`): one
/// `TG_LOG_WARNING` line when calls start failing, naming the cause, and one
/// `TG_LOG_INFO` line when a call succeeds again; never one line per call.
/// `NULL` turns it off (the default: nothing is reported). `user_data` must
/// stay valid, and `log` callable from any thread, for the limiter's life.
///
/// Errors: `TG_NULL_POINTER` (options).
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_options_set_log(
    options: *mut tg_limiter_options,
    log: tg_log_fn,
    user_data: *mut std::ffi::c_void,
) -> tg_result {
    ffi(|| {
        let options = &mut out_ptr(options, "options")?.options;
        options.on_health = log.map(|f| {
            let callback = LogCallback(f, user_data as usize);
            throttlegate::HealthSink::new(move |event| {
                let level = if event.is_down() { tg_log_level::TG_LOG_WARNING } else { tg_log_level::TG_LOG_INFO };
                let cause = std::ffi::CString::new(event.cause().as_str()).unwrap_or_default();
                let message = std::ffi::CString::new(event.message().replace('\0', " ")).unwrap_or_default();
                // SAFETY: the caller vouched that `log` may be called with `user_data` from any thread.
                unsafe { (callback.0)(callback.1 as *mut std::ffi::c_void, level, cause.as_ptr(), message.as_ptr()) }
            })
        });
        Ok(())
    })
}

/// How a limiter's reloads went, filled by `tg_limiter_reload_status()`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct tg_reload_status {
    /// Policies applied (`tg_limiter_reload()`, `tg_limiter_reload_file()`
    /// and the file watch).
    pub reloads: u64,
    /// Reloads refused; the policy in force stayed.
    pub errors: u64,
    /// Non-zero when the limiter watches its policy file.
    pub watching: i32,
}

/// The limiter's reload counters, written to `*out`.
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_reload_status(limiter: *const tg_limiter, out: *mut tg_reload_status) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let s = in_ref(limiter, "limiter")?.limiter.reload_status();
        *out = tg_reload_status { reloads: s.reloads, errors: s.errors, watching: s.watching.is_some() as i32 };
        Ok(())
    })
}

/// The message of the last refused reload (a background one included):
/// `*out` receives a new NUL-terminated string to release with
/// `tg_string_free()`, or NULL when no reload was refused; `*kind` (when
/// not NULL) receives its result code (`TG_OK` when none).
///
/// Errors: `TG_NULL_POINTER`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_reload_last_error(
    limiter: *const tg_limiter,
    kind: *mut tg_result,
    out: *mut *mut c_char,
) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let last = in_ref(limiter, "limiter")?.limiter.reload_status().last_error;
        if !kind.is_null() {
            *kind = last.as_ref().map_or(tg_result::TG_OK, |e| tg_result::from_kind(e.kind()));
        }
        *out = last.map_or(std::ptr::null_mut(), |e| crate::decision::to_cstring(e.to_string()).into_raw());
        Ok(())
    })
}

/// Set the limit of one key of the rule named `rule` (the key these
/// attributes make; the rule needs `overrides = true`) to `limit`, stored in
/// the backend until cleared: for a token bucket the capacity, with the
/// refill rate scaled alike.
///
/// Errors: `TG_NULL_POINTER`, `TG_INVALID_UTF8`, `TG_INVALID_ARGUMENT` (no
/// such rule, a rule without overrides, a missing key attribute, a limit
/// out of range), `TG_CLOSED`, and the backend's failures.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_set_override(
    limiter: *const tg_limiter,
    rule: *const c_char,
    attributes: *const tg_attribute,
    attributes_len: usize,
    limit: u64,
) -> tg_result {
    ffi(|| {
        let r = request(limiter, Some(rule), attributes, attributes_len, None)?;
        r.limiter.set_override_blocking(r.rule, r.attrs.as_slice(), limit)?;
        Ok(())
    })
}

/// Clear the override of one key of the rule named `rule`; `*cleared`
/// receives whether there was one.
///
/// Errors: as for `tg_limiter_set_override()`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_clear_override(
    limiter: *const tg_limiter,
    rule: *const c_char,
    attributes: *const tg_attribute,
    attributes_len: usize,
    cleared: *mut bool,
) -> tg_result {
    ffi(|| {
        let cleared = out_ptr(cleared, "cleared")?;
        let r = request(limiter, Some(rule), attributes, attributes_len, None)?;
        *cleared = r.limiter.clear_override_blocking(r.rule, r.attrs.as_slice())?;
        Ok(())
    })
}

/// The overrides of the rule named `rule` as JSON: `*out` receives a new
/// NUL-terminated string, an array of `{"rule": ..., "attributes": {...},
/// "limit": N}` in key order, to release with `tg_string_free()`.
///
/// Errors: as for `tg_limiter_set_override()`.
#[no_mangle]
pub unsafe extern "C" fn tg_limiter_overrides_json(
    limiter: *const tg_limiter,
    rule: *const c_char,
    out: *mut *mut c_char,
) -> tg_result {
    ffi(|| {
        let out = out_ptr(out, "out")?;
        let r = request(limiter, Some(rule), std::ptr::null(), 0, None)?;
        let list: Vec<serde_json::Value> = r
            .limiter
            .overrides_blocking(r.rule)?
            .into_iter()
            .map(|o| serde_json::json!({ "rule": o.rule, "attributes": o.attributes, "limit": o.limit }))
            .collect();
        *out = crate::decision::to_cstring(serde_json::Value::Array(list).to_string()).into_raw();
        Ok(())
    })
}
