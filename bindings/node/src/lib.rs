//! Node.js bindings of throttlegate (the npm package `throttlegate`).
//!
//! The binding converts JavaScript values to the core's types and the core's
//! results and errors back; every rate-limiting decision is made by the core.
//! Calls that may touch the network return Promises, so the event loop never
//! waits on Redis: `check` and `peek` on one Redis node over a connection
//! index.js moves on the JavaScript thread (the core's `Wire` makes and
//! reads the bytes), everything else resolved from napi's Tokio runtime.
#![deny(missing_docs)]
// napi-derive expands `#[napi]` items into code that clippy flags; the items
// themselves are written to pass it.
#![allow(clippy::new_without_default)]

mod convert;
mod errors;
mod fast;
mod http;
mod health;
mod types;

use std::ptr;
use std::rc::Rc;
use std::time::Duration;

use indexmap::IndexMap;
use napi::bindgen_prelude::*;
use napi::{Env, Unknown};
use napi_derive::napi;
use throttlegate::record;

use errors::{guard, Code};

/// The version of this package (the same for every throttlegate package).
#[napi]
pub const VERSION: &str = throttlegate::VERSION;

/// The stable `code` of every error this package throws or rejects with.
///
/// Compare `err.code` with these values; they never change once released.
#[napi(string_enum)]
pub enum ErrorCode {
    /// A policy (from an object, a file or a string) is malformed; the message names the field.
    #[napi(value = "invalid_policy")]
    InvalidPolicy,
    /// An argument of a call is invalid (cost, attributes, URL, option); the message names it.
    #[napi(value = "invalid_argument")]
    InvalidArgument,
    /// A file could not be read.
    #[napi(value = "io")]
    Io,
    /// The backend could not be reached or the connection was lost.
    #[napi(value = "backend_unavailable")]
    BackendUnavailable,
    /// The call did not complete within the configured timeout.
    #[napi(value = "timeout")]
    Timeout,
    /// The backend answered with an error (out of memory, missing permission, script error).
    #[napi(value = "backend")]
    Backend,
    /// The limiter was closed.
    #[napi(value = "closed")]
    Closed,
    /// A bug in throttlegate (for example a caught panic). Please report it.
    #[napi(value = "internal")]
    Internal,
}

/// A validated, ordered set of rules and the settings they share.
///
/// Build one from a plain object in the policy-file structure, or with
/// `Policy.fromFile(path)` / `Policy.fromString(text)` (TOML or JSON).
#[napi]
pub struct Policy {
    pub(crate) inner: throttlegate::Policy,
}

#[napi]
impl Policy {
    /// A policy from a plain object with the policy-file structure
    /// (`{ rules: [{ name, key, limit, window }, ...], prefix?, timeout?, on_backend_error? }`,
    /// with the file's snake_case field names).
    #[napi(constructor, ts_args_type = "value: PolicyObject")]
    pub fn new(env: &Env, value: Unknown<'_>) -> Result<Self, Code> {
        guard(|| {
            let value = convert::policy_value(env, &value, "policy")?;
            Ok(Policy {
                inner: throttlegate::Policy::from_value(&value)?,
            })
        })
    }

    /// Read a policy file: `.json` is JSON, `.toml` is TOML, anything else is guessed.
    #[napi(factory, ts_args_type = "path: string")]
    pub fn from_file(env: &Env, path: Unknown<'_>) -> Result<Policy, Code> {
        guard(|| {
            let path = convert::string(env, &path, "path")?;
            Ok(Policy {
                inner: throttlegate::Policy::from_file(path)?,
            })
        })
    }

    /// Parse a policy from TOML or JSON text (text starting with `{` is JSON).
    #[napi(factory, ts_args_type = "text: string")]
    pub fn from_string(env: &Env, text: Unknown<'_>) -> Result<Policy, Code> {
        guard(|| {
            let text = convert::string(env, &text, "text")?;
            Ok(Policy {
                inner: throttlegate::Policy::from_str_any(&text)?,
            })
        })
    }

    /// The policy as a plain object in the file structure (round-trips through `new Policy()`).
    #[napi(js_name = "toJSON", ts_return_type = "PolicyObject", catch_unwind)]
    pub fn to_json(&self) -> serde_json::Value {
        self.inner.to_value()
    }

    /// The rule names, in policy order.
    #[napi(getter)]
    pub fn rule_names(&self) -> Vec<String> {
        self.inner.rules().iter().map(|r| r.name.clone()).collect()
    }
}

/// A clock that only moves when told to, for tests and simulations; pass it
/// as the `clock` option of a `Limiter`. Readings are microseconds.
#[napi]
pub struct ManualClock {
    pub(crate) inner: throttlegate::ManualClock,
}

#[napi]
impl ManualClock {
    /// A clock reading `startUs` microseconds (default 0).
    #[napi(constructor, ts_args_type = "startUs?: number")]
    pub fn new(env: &Env, start_us: Option<Unknown<'_>>) -> Result<Self, Code> {
        guard(|| {
            let start = match start_us {
                Some(v) => {
                    convert::opt_integer(env, &v, "startUs", i64::MIN, i64::MAX)?.unwrap_or(0)
                }
                None => 0,
            };
            Ok(ManualClock {
                inner: throttlegate::ManualClock::new(start),
            })
        })
    }

    /// The current reading in microseconds.
    #[napi(getter)]
    pub fn now_us(&self) -> i64 {
        self.inner.now_us()
    }

    /// Move forward by `ms` milliseconds (fractions down to a microsecond count).
    #[napi(ts_args_type = "ms: number")]
    pub fn advance(&self, env: &Env, ms: Unknown<'_>) -> Result<(), Code> {
        guard(|| {
            let us = convert::millis_to_micros(env, &ms, "ms")?;
            self.inner.advance(Duration::from_micros(us));
            Ok(())
        })
    }

    /// Set the reading to `us` microseconds (it may move backwards).
    #[napi(ts_args_type = "us: number")]
    pub fn set(&self, env: &Env, us: Unknown<'_>) -> Result<(), Code> {
        guard(|| {
            let us = convert::opt_integer(env, &us, "us", i64::MIN, i64::MAX)?
                .ok_or_else(|| errors::invalid_argument("us: expected a number of microseconds"))?;
            self.inner.set_us(us);
            Ok(())
        })
    }
}

/// Finds the client address of a request, the same way in every throttlegate
/// front end: the socket's peer by default; `Forwarded` / `X-Forwarded-For`
/// only through the trusted proxies, right to left; IPv6 grouped by prefix;
/// IPv4-mapped IPv6 as IPv4.
#[napi]
pub struct ClientIp {
    inner: throttlegate::ClientIpConfig,
}

#[napi]
impl ClientIp {
    /// `trustedProxies`: addresses or CIDR networks (default none);
    /// `ipv6Prefix`: bits of an IPv6 client that identify it (1-128, default 64).
    #[napi(constructor, ts_args_type = "options?: ClientIpOptions")]
    pub fn new(env: &Env, options: Option<Unknown<'_>>) -> Result<Self, Code> {
        guard(|| {
            Ok(ClientIp {
                inner: convert::client_ip_options(env, options.as_ref())?,
            })
        })
    }

    /// The client address to limit on (IPv4 dotted, or an IPv6 network as
    /// `addr/prefix`), or `null` when `peer` is not an IP address.
    ///
    /// `peer` is the socket's remote address; `forwarded` and `xForwardedFor`
    /// are the raw header values (an array of values is joined with commas).
    #[napi(
        ts_args_type = "peer: string | null | undefined, forwarded?: string | string[] | null, xForwardedFor?: string | string[] | null"
    )]
    pub fn client_ip(
        &self,
        env: &Env,
        peer: Unknown<'_>,
        forwarded: Option<Unknown<'_>>,
        x_forwarded_for: Option<Unknown<'_>>,
    ) -> Result<Option<String>, Code> {
        guard(|| {
            let Some(peer) = convert::opt_string(env, &peer, "peer")? else {
                return Ok(None);
            };
            let forwarded = convert::header(env, forwarded.as_ref(), "forwarded")?;
            let xff = convert::header(env, x_forwarded_for.as_ref(), "xForwardedFor")?;
            Ok(self
                .inner
                .client_ip(&peer, forwarded.as_deref(), xff.as_deref()))
        })
    }
}

/// The outcome of one rule for one check.
#[napi(object)]
pub struct RuleResult {
    /// The rule's name.
    pub rule: String,
    /// Whether this rule admits the request (for a shadow rule: would admit).
    pub allowed: bool,
    /// The rule is in shadow mode: reported, never the cause of a denial.
    pub shadow: bool,
    /// The rule's `limit` (sliding window) or `capacity` (token bucket).
    pub limit: i64,
    /// Units left after this check (floor for buckets).
    pub remaining: i64,
    /// Milliseconds (rounded up) until a request of the same cost would pass this rule; 0 when allowed.
    pub retry_after_ms: i64,
    /// Milliseconds (rounded up) until the rule's state is back to full.
    pub reset_after_ms: i64,
    /// The window advertised in headers, in milliseconds (for a bucket: the time it takes to refill).
    pub window_ms: i64,
}

/// How a limiter's reloads went (see `Limiter.reloadStatus()`).
#[napi(object)]
pub struct ReloadStatus {
    /// Policies applied (`reload()` and the file watch).
    pub reloads: i64,
    /// Reloads refused; the policy in force stayed.
    pub errors: i64,
    /// The last refusal's message; absent when none.
    pub last_error: Option<String>,
    /// The file watched with `reloadOnChange`; absent when none.
    pub watching: Option<String>,
}

/// How one rule differs after a reload (see `Limiter.reload()`).
#[napi(object)]
pub struct RuleChange {
    /// The rule's name.
    pub name: String,
    /// How it changed.
    #[napi(ts_type = "'unchanged' | 'changed' | 'replaced' | 'added' | 'removed' | 'conflict'")]
    pub change: String,
    /// True when the rule's stored state is used by the new policy.
    pub state_kept: bool,
    /// The fields that differ, in the file format's names, sorted.
    pub fields: Vec<String>,
}

/// A policy-wide setting that a reload changed.
#[napi(object)]
pub struct SettingChange {
    /// `prefix`, `timeout`, `on_backend_error`, `wait_replicas` or `attributes`.
    pub field: String,
    /// The old value, in the file format.
    pub old: serde_json::Value,
    /// The new value, in the file format.
    pub new: serde_json::Value,
}

/// What a reload changed: the core's `PolicyDiff` (as `throttlegate diff --json`).
#[napi(object)]
pub struct PolicyDiff {
    /// The new policy's rules in its order, then the removed rules in the old order.
    pub rules: Vec<RuleChange>,
    /// Policy-wide settings that differ.
    pub settings: Vec<SettingChange>,
}

impl From<throttlegate::PolicyDiff> for PolicyDiff {
    fn from(d: throttlegate::PolicyDiff) -> PolicyDiff {
        PolicyDiff {
            rules: d
                .rules
                .iter()
                .map(|r| RuleChange {
                    name: r.name.clone(),
                    change: r.kind.as_str().to_string(),
                    state_kept: r.state_kept(),
                    fields: r.fields.clone(),
                })
                .collect(),
            settings: d
                .settings
                .into_iter()
                .map(|s| SettingChange { field: s.field, old: s.old, new: s.new })
                .collect(),
        }
    }
}

/// One override of a rule's key, as `Limiter.overrides` lists it.
#[napi(object)]
pub struct Override {
    /// The rule it belongs to.
    pub rule: String,
    /// The attributes of the rule's key it was set for.
    pub attributes: std::collections::HashMap<String, String>,
    /// The limit (a token bucket's capacity) that replaces the rule's.
    pub limit: i64,
}

/// An override's `limit` from a JS number: a whole number of at least 0
/// (the core checks the range).
fn override_limit(limit: f64) -> throttlegate::Result<u64> {
    if !limit.is_finite() || limit.fract() != 0.0 || limit < 0.0 || limit > 9_007_199_254_740_991.0 {
        return Err(throttlegate::Error::new(throttlegate::ErrorKind::InvalidArgument, format!("limit: {limit} is not an integer >= 1")));
    }
    Ok(limit as u64)
}

/// The `callId` of a release or extend, read as a check's call id (the
/// core checks it and words its errors).
fn lease_id(env: &Env, v: &Unknown<'_>) -> throttlegate::Result<String> {
    let mut opts = throttlegate::CheckOptions::default();
    opts.set(throttlegate::CheckOption::CallId, "callId", convert::value(env, v, "callId")?)?;
    Ok(opts.call_id.unwrap_or_default())
}

/// The new lease of an extend: milliseconds, or text such as `"30s"`.
fn lease_duration(env: &Env, v: &Unknown<'_>) -> throttlegate::Result<Duration> {
    throttlegate::extend_duration(convert::value(env, v, "duration")?, throttlegate::DurationUnit::Millis)
}

/// Counters since a limiter was made, for operators.
#[napi(object)]
pub struct Stats {
    /// Checks and peeks answered (degraded ones included).
    pub calls: i64,
    /// Calls answered "allowed".
    pub allowed: i64,
    /// Calls answered "denied".
    pub denied: i64,
    /// Degraded decisions that admitted (`onBackendError: 'allow'`).
    pub degraded_allowed: i64,
    /// Degraded decisions that denied (`onBackendError: 'deny'`).
    pub degraded_denied: i64,
    /// Backend failures returned as errors (`onBackendError: 'error'`).
    pub backend_errors: i64,
    /// Calls that ran out of time (counted also as degraded or error).
    pub timeouts: i64,
    /// Settles that corrected at least one rule (`settle()`, `settleCall()`).
    pub settled: i64,
    /// Units settles gave back, summed over the rules they corrected.
    pub refunded: i64,
    /// Units settles took beyond the checks' costs, summed over the rules they corrected.
    pub debited: i64,
}

/// Reservation counters since a limiter was made (rules with `reserve`,
/// on Redis; see docs/concepts/reserve.md).
#[napi(object)]
pub struct ReserveStats {
    /// Checks and peeks that needed the backend for a reserved rule (each one script run).
    pub trips: i64,
    /// Checks answered from reservations alone, with no round trip.
    pub local: i64,
    /// Units reserved from the backend.
    pub reserved: i64,
    /// Units given back unspent.
    pub returned: i64,
    /// Units dropped unspent.
    pub dropped: i64,
}

/// One rule's counters since the limiter was made (see `Limiter.metrics()`).
#[napi(object)]
pub struct RuleMetrics {
    /// The rule's name.
    pub rule: String,
    /// Checks and peeks the rule applied to (degraded ones included).
    pub checks: i64,
    /// The rule admitted the request (its own verdict; a shadow rule's too).
    pub allowed: i64,
    /// The rule refused the request.
    pub denied: i64,
    /// The rule is in shadow mode and would have refused the request.
    pub shadow_denied: i64,
    /// The backend failed and the failure policy admitted the request.
    pub degraded_allowed: i64,
    /// The backend failed and the failure policy refused the request.
    pub degraded_denied: i64,
    /// The backend failed and the error was returned (`onBackendError: 'error'`).
    pub backend_errors: i64,
    /// The backend did not answer within the timeout.
    pub timeouts: i64,
    /// Checks settled on this rule.
    pub settles: i64,
    /// Units settles gave back on this rule.
    pub settle_refunded: i64,
    /// Units settles took on this rule beyond the check's cost.
    pub settle_debited: i64,
}

/// A bucket of the backend latency histogram.
#[napi(object)]
pub struct LatencyBucket {
    /// The bucket's upper bound, in seconds.
    pub le: f64,
    /// Calls that took at most `le` (cumulative).
    pub count: i64,
}

/// The latency of backend calls (Redis round trips).
#[napi(object)]
pub struct LatencyHistogram {
    /// Cumulative buckets, by upper bound.
    pub buckets: Vec<LatencyBucket>,
    /// Calls timed.
    pub count: i64,
    /// Their total time, in seconds.
    pub sum_seconds: f64,
}

/// One sample of a counter family.
#[napi(object)]
pub struct CounterSample {
    /// The label values, in the order of the family's `labels`.
    pub labels: Vec<String>,
    /// The count.
    pub value: i64,
}

/// The samples of one counter family of `metricFamilies()`.
#[napi(object)]
pub struct CounterSamples {
    /// The family's name (`throttlegate_checks`).
    pub name: String,
    /// Rules in policy order.
    pub samples: Vec<CounterSample>,
}

/// A limiter's per-rule metrics (see `Limiter.metrics()`).
#[napi(object)]
pub struct Metrics {
    /// One entry per rule, in policy order.
    pub rules: Vec<RuleMetrics>,
    /// The backend calls' latency.
    pub backend_latency: LatencyHistogram,
    /// Policies applied by `reload()` or `reloadOnChange`.
    pub reloads: i64,
    /// Reloads refused (see `reloadStatus()`).
    pub reload_errors: i64,
    /// The samples of every counter family, in the order of `metricFamilies()`.
    pub counters: Vec<CounterSamples>,
}

/// One metric family every front end exposes (see `metricFamilies()`).
#[napi(object)]
pub struct MetricFamily {
    /// The name, without the `_total` of a counter's samples.
    pub name: String,
    /// The help text.
    pub help: String,
    /// `'counter'` or `'histogram'`.
    #[napi(js_name = "type", ts_type = "'counter' | 'histogram'")]
    pub kind: String,
    /// The label names of its samples, in order.
    pub labels: Vec<String>,
    /// The unit the name ends with (`'seconds'`), if any.
    pub unit: Option<String>,
}

/// The metric families of `metricsText()` and of the prom-client collector:
/// names, help texts, types, label names (the core's list, in exposition order).
#[napi]
pub fn metric_families() -> Vec<MetricFamily> {
    throttlegate::METRIC_FAMILIES
        .iter()
        .map(|f| MetricFamily {
            name: f.name.to_string(),
            help: f.help.to_string(),
            kind: f.kind.as_str().to_string(),
            labels: f.labels.iter().map(|l| l.to_string()).collect(),
            unit: f.unit.map(str::to_string),
        })
        .collect()
}

/// The values of the `outcome` label of `throttlegate_decisions`, in order.
#[napi]
pub fn metric_outcomes() -> Vec<String> {
    throttlegate::OUTCOMES.iter().map(|o| o.to_string()).collect()
}

/// The content type of `Limiter.metricsText()`, for a `/metrics` response.
#[napi]
pub const METRICS_CONTENT_TYPE: &str = throttlegate::METRICS_CONTENT_TYPE;

fn metrics(m: throttlegate::Metrics) -> Metrics {
    let n = |v: u64| v as i64;
    Metrics {
        rules: m
            .rules
            .iter()
            .map(|r| RuleMetrics {
                rule: r.rule.as_str().to_string(),
                checks: n(r.checks),
                allowed: n(r.allowed),
                denied: n(r.denied),
                shadow_denied: n(r.shadow_denied),
                degraded_allowed: n(r.degraded_allowed),
                degraded_denied: n(r.degraded_denied),
                backend_errors: n(r.backend_errors),
                timeouts: n(r.timeouts),
                settles: n(r.settles),
                settle_refunded: n(r.settle_refunded),
                settle_debited: n(r.settle_debited),
            })
            .collect(),
        backend_latency: LatencyHistogram {
            buckets: m.backend_latency.buckets.iter().map(|&(le, count)| LatencyBucket { le, count: n(count) }).collect(),
            count: n(m.backend_latency.count),
            sum_seconds: m.backend_latency.sum_seconds,
        },
        reloads: n(m.reloads),
        reload_errors: n(m.reload_errors),
        counters: m
            .counters()
            .into_iter()
            .map(|c| CounterSamples {
                name: c.family.name.to_string(),
                samples: c.samples.into_iter().map(|(labels, value)| CounterSample { labels, value: n(value) }).collect(),
            })
            .collect(),
    }
}

fn ms(d: Duration) -> i64 {
    throttlegate::ceil_millis(d) as i64
}

fn headers(d: &throttlegate::Decision, options: throttlegate::HeaderOptions) -> IndexMap<String, String> {
    d.headers_with(options)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

fn rule_results(d: &throttlegate::Decision) -> Vec<RuleResult> {
    d.results
        .iter()
        .map(|r| RuleResult {
            rule: r.rule.to_string(),
            allowed: r.allowed,
            shadow: r.shadow,
            limit: r.limit as i64,
            remaining: r.remaining as i64,
            retry_after_ms: ms(r.retry_after),
            reset_after_ms: ms(r.reset_after),
            window_ms: ms(r.window),
        })
        .collect()
}

/// A rate limiter: a policy bound to a backend (Redis, or the embedded
/// in-memory backend when no `url` is given).
///
/// Safe to share across requests; `check`, `peek`, `reset` and `ping` return
/// Promises and never block the event loop. After `close()` every call
/// rejects with code `'closed'`.
#[napi]
pub struct Limiter {
    inner: throttlegate::Limiter,
    /// The rule names that decision records refer to by number.
    names: std::sync::Arc<fast::NameTable>,
    /// What the fast paths of `check` and `peek` use (see `fast`).
    hot: Rc<fast::Hot>,
    /// The number that names `hot` to the fast paths.
    handle: f64,
}

impl Drop for Limiter {
    fn drop(&mut self) {
        fast::unregister(self.handle);
    }
}

/// `{ bind, setScratch, wireReceived, wireOutput }`: the per-call entry points of `check` and `peek`
/// (see `fast`), as plain functions.
#[napi(js_name = "_hotPaths", skip_typescript)]
pub fn hot_paths(env: &Env) -> Result<Unknown<'_>> {
    let value = unsafe { fast::functions(env.raw()) }?;
    Ok(unsafe { Unknown::from_raw_unchecked(env.raw(), value) })
}

/// The outcome of one batch: every decision record, one after the other in
/// call order (a failed call is the single number -1), and the failures.
pub struct BatchOut {
    records: Vec<f64>,
    errors: Vec<(usize, throttlegate::Error)>,
    /// The lease ids of the records flagged `fast::LEASED`, in record order.
    leases: Vec<String>,
}

impl ToNapiValue for BatchOut {
    /// `[Float64Array of records, errors, leases]`, where `errors` is `null`
    /// or an array holding at each failed call's position its `Error` with
    /// `code`, and `leases` is `null` or the lease ids of the records flagged
    /// `fast::LEASED`, in order.
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> napi::Result<sys::napi_value> {
        let bytes = std::mem::size_of_val(val.records.as_slice());
        let mut data = ptr::null_mut();
        let mut buffer = ptr::null_mut();
        let mut records = ptr::null_mut();
        unsafe {
            napi::check_status!(sys::napi_create_arraybuffer(
                env,
                bytes,
                &mut data,
                &mut buffer
            ))?;
            if bytes > 0 {
                ptr::copy_nonoverlapping(
                    val.records.as_ptr().cast::<u8>(),
                    data.cast::<u8>(),
                    bytes,
                );
            }
            napi::check_status!(sys::napi_create_typedarray(
                env,
                sys::TypedarrayType::float64_array,
                val.records.len(),
                buffer,
                0,
                &mut records,
            ))?;
        }
        let mut errors = ptr::null_mut();
        if val.errors.is_empty() {
            napi::check_status!(unsafe { sys::napi_get_null(env, &mut errors) })?;
        } else {
            napi::check_status!(unsafe { sys::napi_create_array(env, &mut errors) })?;
            for (i, e) in &val.errors {
                let js = unsafe { errors::js_error(env, e) }?;
                napi::check_status!(unsafe { sys::napi_set_element(env, errors, *i as u32, js) })?;
            }
        }
        let leases = if val.leases.is_empty() {
            let mut null = ptr::null_mut();
            napi::check_status!(unsafe { sys::napi_get_null(env, &mut null) })?;
            null
        } else {
            unsafe { Vec::<String>::to_napi_value(env, val.leases) }?
        };
        let mut out = ptr::null_mut();
        unsafe {
            napi::check_status!(sys::napi_create_array_with_length(env, 3, &mut out))?;
            napi::check_status!(sys::napi_set_element(env, out, 0, records))?;
            napi::check_status!(sys::napi_set_element(env, out, 1, errors))?;
            napi::check_status!(sys::napi_set_element(env, out, 2, leases))?;
        }
        Ok(out)
    }
}

/// The records of a batch's outcomes, in call order.
fn encode(mut outcomes: Vec<throttlegate::Result<throttlegate::Decision>>, names: &fast::NameTable) -> BatchOut {
    for d in outcomes.iter_mut().flatten() {
        names.renumber(d);
    }
    // Where each decision's record starts, and the lease it holds, if any.
    let mut at = 0;
    let mut leased = Vec::new();
    for outcome in &outcomes {
        match outcome {
            Ok(d) => {
                if let Some(id) = d.lease_id().filter(|_| d.allowed) {
                    leased.push((at, id.to_string()));
                }
                at += record::len(d);
            }
            Err(_) => at += 1,
        }
    }
    let (mut records, errors) = record::write_all(outcomes);
    let leases = leased
        .into_iter()
        .map(|(at, id)| {
            records[at + 1] += fast::LEASED;
            id
        })
        .collect();
    BatchOut { records, errors, leases }
}

/// What the limiter's connection settled (see `throttlegate::Wire`):
/// `[keep, ids, [records, errors], next, output]`: `keep` false when the
/// socket must be closed, the call ids in the order of `records` and
/// `errors` (as `BatchOut`), the milliseconds until the next deadline (-1
/// when no call waits), and the bytes to write now (a call's next command
/// after NOSCRIPT; `null` when none).
pub struct WireOut {
    keep: bool,
    ids: Vec<u32>,
    batch: BatchOut,
    next_ms: f64,
    output: Vec<u8>,
}

impl WireOut {
    fn new(keep: bool, done: throttlegate::WireOutcomes, wire: &mut throttlegate::Wire, names: &fast::NameTable) -> WireOut {
        let output = wire.take_output();
        WireOut::from_parts(keep, done, wire, output, names)
    }

    /// As `new`, with the wire's output taken already.
    pub(crate) fn from_parts(
        keep: bool,
        done: throttlegate::WireOutcomes,
        wire: &throttlegate::Wire,
        output: Vec<u8>,
        names: &fast::NameTable,
    ) -> WireOut {
        let (ids, outcomes): (Vec<u32>, Vec<_>) = done.into_iter().unzip();
        let next_ms = wire.next_deadline().map_or(-1.0, |d| d.as_secs_f64() * 1000.0);
        WireOut { keep, ids, batch: encode(outcomes, names), next_ms, output }
    }
}

impl ToNapiValue for WireOut {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> napi::Result<sys::napi_value> {
        let batch = unsafe { BatchOut::to_napi_value(env, val.batch) }?;
        let parts = [
            unsafe { bool::to_napi_value(env, val.keep) }?,
            unsafe { Vec::<u32>::to_napi_value(env, val.ids) }?,
            batch,
            unsafe { f64::to_napi_value(env, val.next_ms) }?,
            unsafe { Bytes::to_napi_value(env, Bytes(val.output)) }?,
        ];
        let mut out = ptr::null_mut();
        napi::check_status!(unsafe { sys::napi_create_array_with_length(env, parts.len(), &mut out) })?;
        for (i, part) in parts.into_iter().enumerate() {
            napi::check_status!(unsafe { sys::napi_set_element(env, out, i as u32, part) })?;
        }
        Ok(out)
    }
}

/// Bytes handed to JavaScript as a `Buffer` of their own (a copy: cheaper
/// than an external buffer for the few hundred bytes of a tick); `null` when empty.
pub struct Bytes(Vec<u8>);

impl ToNapiValue for Bytes {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> napi::Result<sys::napi_value> {
        let mut out = ptr::null_mut();
        if val.0.is_empty() {
            napi::check_status!(unsafe { sys::napi_get_null(env, &mut out) })?;
            return Ok(out);
        }
        let mut data = ptr::null_mut();
        napi::check_status!(unsafe {
            sys::napi_create_buffer_copy(env, val.0.len(), val.0.as_ptr().cast(), &mut data, &mut out)
        })?;
        Ok(out)
    }
}

/// An I/O failure reported by Node's socket: its `errno` (negative, as libuv
/// gives it), or the server closing the connection.
fn socket_error(errno: Option<i32>) -> std::io::Error {
    match errno {
        Some(n) if n < 0 => std::io::Error::from_raw_os_error(-n),
        _ => std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the connection was closed by the server"),
    }
}

/// The record layout index.js reads: numbers before the per-rule results, numbers per rule.
#[napi(js_name = "_recordLayout", skip_typescript)]
pub fn record_layout() -> Vec<u32> {
    vec![record::HEAD as u32, record::PER_RULE as u32]
}

#[napi]
impl Limiter {
    /// `policy`: a `Policy`, a path to a TOML/JSON policy file, or a plain
    /// object in the policy-file structure. `options` override the policy's
    /// settings and choose the backend.
    #[napi(
        constructor,
        ts_args_type = "policy: Policy | string | PolicyObject, options?: LimiterOptions"
    )]
    pub fn new(env: &Env, policy: Unknown<'_>, options: Option<Unknown<'_>>) -> Result<Self, Code> {
        guard(|| {
            let policy = convert::any_policy(env, &policy)?;
            let options = convert::limiter_options(env, options.as_ref())?;
            let inner = throttlegate::Limiter::with_options(policy, options)?;
            let hot = Rc::new(fast::Hot::new(inner.clone()));
            Ok(Limiter {
                handle: fast::register(hot.clone()),
                names: hot.names.clone(),
                hot,
                inner,
            })
        })
    }

    /// Check a request: consume `cost` (default 1) from every applicable
    /// rule if all of them admit it, nothing otherwise.
    //
    // Declared here for index.d.ts; index.js defines it: embedded checks are
    // answered in place and Redis checks batched per tick (`fast`, `_flush`),
    // with decisions that build their headers on demand.
    #[napi(
        ts_args_type = "attributes: Record<string, string | null | undefined>, options?: CheckOptions",
        ts_return_type = "Promise<Decision>"
    )]
    pub fn check(&self) -> Result<(), Code> {
        errors::guard(|| Err(throttlegate::Error::internal("Limiter.check is defined by index.js; load the package through it")))
    }

    /// `check`, answered synchronously: the same decision, returned rather
    /// than resolved, and errors thrown rather than rejected. `cost` is a
    /// number (the cost, default 1) or the options of `check`. Only for the
    /// embedded backend (`backend` `'memory'`), where a check is work in
    /// this process: on Redis a synchronous check would block the event
    /// loop on the network, so it throws (`code` `invalid_argument`) instead.
    //
    // Declared here for index.d.ts; index.js defines it (with the same
    // in-place answer as `check`), and calls this only to throw its error.
    #[napi(
        js_name = "checkSync",
        ts_args_type = "attributes: Record<string, string | null | undefined>, cost?: number | CheckOptions",
        ts_return_type = "Decision"
    )]
    pub fn check_sync(&self) -> Result<(), Code> {
        errors::guard(|| match self.inner.backend_name() {
            "memory" | "closed" => Err(throttlegate::Error::internal(
                "Limiter.checkSync is defined by index.js; load the package through it",
            )),
            backend => Err(errors::invalid_argument(format!(
                "checkSync needs the embedded backend (backend 'memory'), this limiter's backend is \
                 '{backend}': a synchronous check would block the event loop on network I/O; use check"
            ))),
        })
    }

    /// The decision a check of this cost would get now, without consuming anything.
    //
    // Declared here for index.d.ts; index.js defines it, like `check`.
    #[napi(
        ts_args_type = "attributes: Record<string, string | null | undefined>, options?: PeekOptions",
        ts_return_type = "Promise<Decision>"
    )]
    pub fn peek(&self) -> Result<(), Code> {
        errors::guard(|| Err(throttlegate::Error::internal("Limiter.peek is defined by index.js; load the package through it")))
    }

    /// Settle an admitted check whose real cost is known only now: every
    /// rule the check consumed from gets the difference back, or takes the
    /// excess (even beyond the limit), atomically, once per call id. The
    /// check must have been given a `callId`. Resolves to how many rules
    /// were settled (0 for a denied decision or a second settle).
    //
    // Declared here for index.d.ts; index.js defines it (with `settleCall`
    // or `_settleDecision`).
    #[napi(ts_args_type = "decision: Decision, actualCost: number", ts_return_type = "Promise<number>")]
    pub fn settle(&self) -> Result<(), Code> {
        errors::guard(|| Err(throttlegate::Error::internal("Limiter.settle is defined by index.js; load the package through it")))
    }

    /// `settle` by call id, without the decision (a settle made elsewhere
    /// than the check): the check's attributes, call id and cost, and the
    /// real cost.
    #[napi(
        ts_args_type = "attributes: Record<string, string | null | undefined>, callId: string, cost: number, actualCost: number",
        ts_return_type = "Promise<number>"
    )]
    pub fn settle_call<'env>(
        &self,
        env: &'env Env,
        attributes: Unknown<'_>,
        call_id: Unknown<'_>,
        cost: Unknown<'_>,
        actual_cost: Unknown<'_>,
    ) -> Result<PromiseRaw<'env, u32>> {
        let args = throttlegate::Error::catch_panic(|| {
            let attrs = convert::attributes(env, &attributes)?;
            let mut opts = throttlegate::CheckOptions::default();
            opts.set(throttlegate::CheckOption::CallId, "callId", convert::value(env, &call_id, "callId")?)?;
            opts.set(throttlegate::CheckOption::Cost, "cost", convert::value(env, &cost, "cost")?)?;
            let actual = throttlegate::actual_cost(convert::value(env, &actual_cost, "actualCost")?)?;
            Ok((attrs, opts, actual))
        });
        let limiter = self.inner.clone();
        errors::spawn(env, async move {
            let (attrs, opts, actual) = args?;
            let id = opts.call_id.unwrap_or_default();
            limiter.settle_call(&attrs, &id, opts.cost, actual).await
        })
    }

    /// `settle` of a decision whose check had no call id (index.js): the
    /// core's answer for the decision as recorded.
    #[napi(js_name = "_settleDecision", skip_typescript, enumerable = false)]
    pub fn settle_decision<'env>(
        &self,
        env: &'env Env,
        record: Option<Vec<f64>>,
        actual_cost: Unknown<'_>,
    ) -> Result<PromiseRaw<'env, u32>> {
        let args = throttlegate::Error::catch_panic(|| {
            let record = record.ok_or_else(|| errors::invalid_argument("decision: expected a Decision"))?;
            let d = self.rebuilt(&record)?;
            Ok((d, throttlegate::actual_cost(convert::value(env, &actual_cost, "actualCost")?)?))
        });
        let limiter = self.inner.clone();
        errors::spawn(env, async move {
            let (d, actual) = args?;
            limiter.settle(&d, actual).await
        })
    }

    /// Release the concurrency slots an admitted decision holds (rules with
    /// `algorithm = "concurrency"`) as soon as the work they guard is done.
    /// Resolves to how many concurrency rules gave a slot back (0 for a
    /// denied decision, one holding no slot, or a second release:
    /// idempotent). Slots never released come back when their lease ends.
    //
    // Declared here for index.d.ts; index.js defines it (with `releaseCall`
    // or `_releaseDecision`).
    #[napi(ts_args_type = "decision: Decision", ts_return_type = "Promise<number>")]
    pub fn release(&self) -> Result<(), Code> {
        errors::guard(|| Err(throttlegate::Error::internal("Limiter.release is defined by index.js; load the package through it")))
    }

    /// `release` by lease id, without the decision (a release made
    /// elsewhere than the check): the check's attributes and its `callId`
    /// (or the decision's `leaseId`).
    #[napi(
        ts_args_type = "attributes: Record<string, string | null | undefined>, callId: string",
        ts_return_type = "Promise<number>"
    )]
    pub fn release_call<'env>(&self, env: &'env Env, attributes: Unknown<'_>, call_id: Unknown<'_>) -> Result<PromiseRaw<'env, u32>> {
        let args = throttlegate::Error::catch_panic(|| Ok((convert::attributes(env, &attributes)?, lease_id(env, &call_id)?)));
        let limiter = self.inner.clone();
        errors::spawn(env, async move {
            let (attrs, id) = args?;
            limiter.release_call(&attrs, &id).await
        })
    }

    /// `release` of a decision holding no lease id (index.js): the core's
    /// answer for the decision as recorded.
    #[napi(js_name = "_releaseDecision", skip_typescript, enumerable = false)]
    pub fn release_decision<'env>(&self, env: &'env Env, record: Option<Vec<f64>>) -> Result<PromiseRaw<'env, u32>> {
        let args = throttlegate::Error::catch_panic(|| {
            let record = record.ok_or_else(|| errors::invalid_argument("decision: expected a Decision"))?;
            self.rebuilt(&record)
        });
        let limiter = self.inner.clone();
        errors::spawn(env, async move {
            let d = args?;
            limiter.release(&d).await
        })
    }

    /// Renew the lease of the slots an admitted decision holds, for long
    /// work: each is held `ms` milliseconds (or text such as `"30s"`) from
    /// now. Resolves to how many concurrency rules renewed a slot (0 when
    /// the decision holds none, or they were released or expired).
    //
    // Declared here for index.d.ts; index.js defines it (with `extendCall`
    // or `_extendDecision`).
    #[napi(ts_args_type = "decision: Decision, ms: number | string", ts_return_type = "Promise<number>")]
    pub fn extend(&self) -> Result<(), Code> {
        errors::guard(|| Err(throttlegate::Error::internal("Limiter.extend is defined by index.js; load the package through it")))
    }

    /// `extend` by lease id, without the decision: the check's attributes
    /// and `callId` (or the decision's `leaseId`), and the new lease.
    #[napi(
        ts_args_type = "attributes: Record<string, string | null | undefined>, callId: string, ms: number | string",
        ts_return_type = "Promise<number>"
    )]
    pub fn extend_call<'env>(
        &self,
        env: &'env Env,
        attributes: Unknown<'_>,
        call_id: Unknown<'_>,
        ms: Unknown<'_>,
    ) -> Result<PromiseRaw<'env, u32>> {
        let args = throttlegate::Error::catch_panic(|| {
            Ok((convert::attributes(env, &attributes)?, lease_id(env, &call_id)?, lease_duration(env, &ms)?))
        });
        let limiter = self.inner.clone();
        errors::spawn(env, async move {
            let (attrs, id, duration) = args?;
            limiter.extend_call(&attrs, &id, duration).await
        })
    }

    /// `extend` of a decision holding no lease id (index.js).
    #[napi(js_name = "_extendDecision", skip_typescript, enumerable = false)]
    pub fn extend_decision<'env>(&self, env: &'env Env, record: Option<Vec<f64>>, ms: Unknown<'_>) -> Result<PromiseRaw<'env, u32>> {
        let args = throttlegate::Error::catch_panic(|| {
            let record = record.ok_or_else(|| errors::invalid_argument("decision: expected a Decision"))?;
            Ok((self.rebuilt(&record)?, lease_duration(env, &ms)?))
        });
        let limiter = self.inner.clone();
        errors::spawn(env, async move {
            let (d, duration) = args?;
            limiter.extend(&d, duration).await
        })
    }

    /// Wait until a check is admitted, at most `options.timeout`
    /// (milliseconds, or text such as `"250ms"`): resolves to the admitting
    /// decision, or rejects with the `timeout` error kind at once when the
    /// wait asked for is longer than the time left. Waits exactly the
    /// `retryAfter` it is told, never polls; waiters of this limiter on the
    /// same keys are served in arrival order.
    //
    // Declared here for index.d.ts; index.js defines it around `_acquire`.
    #[napi(
        ts_args_type = "attributes: Record<string, string | null | undefined>, options: AcquireOptions",
        ts_return_type = "Promise<Decision>"
    )]
    pub fn acquire(&self) -> Result<(), Code> {
        errors::guard(|| Err(throttlegate::Error::internal("Limiter.acquire is defined by index.js; load the package through it")))
    }

    /// `acquire`, resolving to the decision's record as a batch of one
    /// (`[records, null, leases]`; index.js makes the `Decision`).
    #[napi(js_name = "_acquire", skip_typescript, enumerable = false)]
    pub fn acquire_record<'env>(
        &self,
        env: &'env Env,
        attributes: Unknown<'_>,
        options: Unknown<'_>,
    ) -> Result<PromiseRaw<'env, BatchOut>> {
        let args = throttlegate::Error::catch_panic(|| {
            Ok((convert::attributes(env, &attributes)?, convert::acquire_options(env, &options)?))
        });
        let limiter = self.inner.clone();
        let names = self.names.clone();
        errors::spawn(env, async move {
            let (attrs, (opts, timeout)) = args?;
            let d = limiter.acquire_with(&attrs, &opts, timeout).await?;
            Ok(encode(vec![Ok(d)], &names))
        })
    }

    /// This limiter's handle for the fast paths (`_hotPaths`).
    #[napi(js_name = "_handle", skip_typescript, enumerable = false)]
    pub fn handle(&self) -> f64 {
        self.handle
    }

    /// Run the first `count` queued checks and peeks concurrently on the
    /// runtime (their Redis commands pipelined on the multiplexed
    /// connection) and settle them all at once: the Promise resolves to
    /// `[records, errors]` (see `BatchOut`), one outcome per call, in order.
    #[napi(js_name = "_flush", skip_typescript, enumerable = false)]
    pub fn flush<'env>(&self, env: &'env Env, count: u32) -> Result<PromiseRaw<'env, BatchOut>> {
        let calls: Vec<_> = {
            let mut pending = self.hot.pending.borrow_mut();
            let n = (count as usize).min(pending.len());
            pending.drain(..n).collect()
        };
        let limiter = self.inner.clone();
        let names = self.names.clone();
        errors::spawn(
            env,
            async move { Ok(encode(limiter.check_batch(&calls).await, &names)) },
        )
    }

    /// Where this limiter's own connection goes, `{ host, port }` or
    /// `{ path }`, and `timeoutMs`; `null` when the core has no wire for its
    /// backend (a cluster, TLS, the embedded backend): calls then go through
    /// `_flush`. Makes the wire on first call.
    #[napi(js_name = "_wireAddress", skip_typescript, enumerable = false)]
    pub fn wire_address(&self) -> Option<serde_json::Value> {
        let mut slot = self.hot.wire.borrow_mut();
        if slot.is_none() {
            *slot = self.inner.wire();
        }
        let wire = slot.as_ref()?;
        let timeout_ms = wire.timeout().as_secs_f64() * 1000.0;
        Some(match wire.address() {
            throttlegate::WireAddress::Tcp { host, port } => {
                serde_json::json!({ "host": host, "port": port, "timeoutMs": timeout_ms })
            }
            throttlegate::WireAddress::Unix(path) => serde_json::json!({ "path": path, "timeoutMs": timeout_ms }),
        })
    }

    /// Run `f` on the wire, and return what it settled.
    fn on_wire(&self, f: impl FnOnce(&mut throttlegate::Wire, &mut throttlegate::WireOutcomes) -> bool) -> Option<WireOut> {
        let mut slot = self.hot.wire.borrow_mut();
        let wire = slot.as_mut()?;
        let mut done = Vec::new();
        let keep = f(wire, &mut done);
        Some(WireOut::new(keep, done, wire, &self.names))
    }

    /// The calls past their deadline, settled with the timeout error (`WireOut`).
    #[napi(js_name = "_wireExpire", skip_typescript, enumerable = false)]
    pub fn wire_expire(&self) -> Option<WireOut> {
        self.on_wire(|w, done| w.expire(done))
    }

    /// The connection could not be made: what was written on it is written
    /// again on the next attempt.
    #[napi(js_name = "_wireConnectFailed", skip_typescript, enumerable = false)]
    pub fn wire_connect_failed(&self) {
        if let Some(w) = self.hot.wire.borrow_mut().as_mut() {
            w.connect_failed();
        }
    }

    /// The connection is gone (`errno` from Node, or none when the server
    /// closed it): its calls fail with that error (`WireOut`).
    #[napi(js_name = "_wireLost", skip_typescript, enumerable = false)]
    pub fn wire_lost(&self, errno: Option<i32>) -> Option<WireOut> {
        self.on_wire(|w, done| {
            w.lost(socket_error(errno), done);
            false
        })
    }

    /// The limiter is closing: the calls still waiting fail with `closed` (`WireOut`).
    #[napi(js_name = "_wireClose", skip_typescript, enumerable = false)]
    pub fn wire_close(&self) -> Option<WireOut> {
        self.on_wire(|w, done| {
            w.close(done);
            false
        })
    }

    /// The decision of a record, as the core built it.
    fn rebuilt(&self, record: &[f64]) -> throttlegate::Result<throttlegate::Decision> {
        record::rebuild(record, &self.names.names())
    }

    /// The rule names decision records refer to by number (index.js reads
    /// them again when a record names a rule it does not know yet).
    #[napi(js_name = "_ruleTable", skip_typescript, enumerable = false)]
    pub fn rule_table(&self) -> Vec<String> {
        self.names.names().iter().map(|n| n.to_string()).collect()
    }

    /// The lease id of the last decision answered in place whose record is
    /// flagged `fast::LEASED` (read once).
    #[napi(js_name = "_takeLease", skip_typescript, enumerable = false)]
    pub fn take_lease(&self) -> Option<String> {
        self.hot.lease.borrow_mut().take()
    }

    /// The last embedded decision record that did not fit the scratch buffer.
    #[napi(js_name = "_overflow", skip_typescript, enumerable = false)]
    pub fn overflow(&self) -> Vec<f64> {
        std::mem::take(&mut *self.hot.overflow.borrow_mut())
    }

    /// Put a new policy in force (a `Policy`, a path to a TOML/JSON file,
    /// or a plain object), atomically: checks already running finish on the
    /// old policy, every later one uses the new one. A rule that keeps its
    /// name, key and algorithm (and the prefix) keeps its state; the others
    /// start afresh. The limiter's own options (`keyPrefix`,
    /// `onBackendError`, `keySecret`) apply to the new policy; the timeout
    /// stays. Throws (`code` `invalid_policy`) for a policy
    /// that does not parse, or one in which a rule keeps its name and key
    /// but changes its algorithm, and after `close()`; the old policy then
    /// stays in force, and the refusal is counted by `reloadStatus()` (for a
    /// file, one that does not parse too). Returns what changed (the
    /// core's `PolicyDiff`): per rule its change and whether its state was
    /// kept, and the settings that differ.
    #[napi(ts_args_type = "policy: Policy | string | PolicyObject")]
    pub fn reload(&self, env: &Env, policy: Unknown<'_>) -> Result<PolicyDiff, Code> {
        guard(|| {
            self.names.reloaded();
            let diff = match convert::policy_path(env, &policy)? {
                Some(path) => self.inner.reload_file(path)?,
                None => self.inner.reload(convert::any_policy(env, &policy)?)?,
            };
            Ok(diff.into())
        })
    }

    /// How reloads went: applied, refused, the last refusal's message, the
    /// watched file. Background reloads (`reloadOnChange`) report their
    /// failures here and in the metrics (`throttlegate_policy_reload_errors_total`).
    #[napi(catch_unwind)]
    pub fn reload_status(&self) -> ReloadStatus {
        let s = self.inner.reload_status();
        ReloadStatus {
            reloads: s.reloads as i64,
            errors: s.errors as i64,
            last_error: s.last_error.map(|e| e.to_string()),
            watching: s.watching.map(|p| p.to_string_lossy().into_owned()),
        }
    }

    /// The per-rule results of a decision record, given as an array of
    /// numbers (a decision's `results`, on first use).
    #[napi(js_name = "_results", skip_typescript, enumerable = false)]
    pub fn results_of(&self, record: Vec<f64>) -> Result<Vec<RuleResult>, Code> {
        guard(|| Ok(rule_results(&self.rebuilt(&record)?)))
    }

    /// The core's headers for a decision record (a decision's `headers`, on first use).
    #[napi(js_name = "_headers", skip_typescript, enumerable = false)]
    pub fn headers_of(&self, record: Vec<f64>) -> Result<IndexMap<String, String>, Code> {
        guard(|| Ok(headers(&self.rebuilt(&record)?, self.inner.header_options())))
    }

    /// The core's problem+json body for a decision record, `null` when
    /// allowed (a decision's `problemJson`, on first use).
    #[napi(js_name = "_problemJson", skip_typescript, enumerable = false)]
    pub fn problem_json_of(&self, record: Vec<f64>) -> Result<Option<String>, Code> {
        guard(|| Ok(self.rebuilt(&record)?.problem_json()))
    }

    /// Forget the state of every rule that applies to these attributes (to
    /// unblock a client). Resolves to how many keys existed.
    #[napi(ts_args_type = "attributes: Record<string, string | null | undefined>")]
    pub fn reset<'env>(
        &self,
        env: &'env Env,
        attributes: Unknown<'_>,
    ) -> Result<PromiseRaw<'env, i64>> {
        let attrs = throttlegate::Error::catch_panic(|| convert::attributes(env, &attributes));
        let limiter = self.inner.clone();
        errors::spawn(env, async move { Ok(limiter.reset(&attrs?).await? as i64) })
    }

    /// Set the limit of one key of `rule` (the key these attributes make;
    /// the rule needs `overrides = true`), stored in the backend until cleared.
    #[napi(ts_args_type = "rule: string, attributes: Record<string, string | null | undefined>, limit: number", ts_return_type = "Promise<void>")]
    pub fn set_override<'env>(
        &self,
        env: &'env Env,
        rule: String,
        attributes: Unknown<'_>,
        limit: f64,
    ) -> Result<PromiseRaw<'env, ()>> {
        let attrs = throttlegate::Error::catch_panic(|| convert::attributes(env, &attributes));
        let limiter = self.inner.clone();
        errors::spawn(env, async move { limiter.set_override(&rule, &attrs?, override_limit(limit)?).await })
    }

    /// Clear the override of one key of `rule`; resolves to whether there was one.
    #[napi(ts_args_type = "rule: string, attributes: Record<string, string | null | undefined>")]
    pub fn clear_override<'env>(
        &self,
        env: &'env Env,
        rule: String,
        attributes: Unknown<'_>,
    ) -> Result<PromiseRaw<'env, bool>> {
        let attrs = throttlegate::Error::catch_panic(|| convert::attributes(env, &attributes));
        let limiter = self.inner.clone();
        errors::spawn(env, async move { limiter.clear_override(&rule, &attrs?).await })
    }

    /// The overrides of `rule`, in key order.
    #[napi]
    pub fn overrides<'env>(&self, env: &'env Env, rule: String) -> Result<PromiseRaw<'env, Vec<Override>>> {
        let limiter = self.inner.clone();
        errors::spawn(env, async move {
            Ok(limiter
                .overrides(&rule)
                .await?
                .into_iter()
                .map(|o| Override { rule: o.rule, attributes: o.attributes.into_iter().collect(), limit: o.limit as i64 })
                .collect())
        })
    }

    /// Check that the backend answers (a `PING` for Redis) within the timeout.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn ping<'env>(&self, env: &'env Env) -> Result<PromiseRaw<'env, ()>> {
        let limiter = self.inner.clone();
        errors::spawn(env, async move { limiter.ping().await })
    }

    /// Close the limiter and drop its connections. Closing twice is harmless.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn close<'env>(&self, env: &'env Env) -> Result<PromiseRaw<'env, ()>> {
        // Closed at once: the calls queued in this tick find it closed.
        self.inner.close();
        errors::spawn(env, async { Ok(()) })
    }

    /// The keys these attributes touch, one per applicable rule, in policy order.
    #[napi(ts_args_type = "attributes: Record<string, string | null | undefined>")]
    pub fn keys(&self, env: &Env, attributes: Unknown<'_>) -> Result<Vec<String>, Code> {
        guard(|| {
            let attrs = convert::attributes(env, &attributes)?;
            Ok(self.inner.keys(&attrs))
        })
    }

    /// Counters since the limiter was made.
    #[napi(catch_unwind)]
    pub fn stats(&self) -> Stats {
        let s = self.inner.stats();
        Stats {
            calls: s.calls as i64,
            allowed: s.allowed as i64,
            denied: s.denied as i64,
            degraded_allowed: s.degraded_allowed as i64,
            degraded_denied: s.degraded_denied as i64,
            backend_errors: s.backend_errors as i64,
            timeouts: s.timeouts as i64,
            settled: s.settled as i64,
            refunded: s.refunded as i64,
            debited: s.debited as i64,
        }
    }

    /// Reservation counters since the limiter was made (see `ReserveStats`).
    #[napi(catch_unwind)]
    pub fn reserve_stats(&self) -> ReserveStats {
        let s = self.inner.reserve_stats();
        ReserveStats {
            trips: s.trips as i64,
            local: s.local as i64,
            reserved: s.reserved as i64,
            returned: s.returned as i64,
            dropped: s.dropped as i64,
        }
    }

    /// Per-rule metrics since the limiter was made, or `null` when they
    /// were turned off (`metrics: false`).
    #[napi(catch_unwind)]
    pub fn metrics(&self) -> Option<Metrics> {
        self.inner.metrics().map(metrics)
    }

    /// `metrics()` as the OpenMetrics text exposition, for a `/metrics`
    /// endpoint (content type `METRICS_CONTENT_TYPE`); `null` when off.
    #[napi(catch_unwind)]
    pub fn metrics_text(&self) -> Option<String> {
        self.inner.metrics_text()
    }

    /// `'memory'`, `'redis'` or `'cluster'` (`'closed'` after `close()`).
    #[napi(getter)]
    pub fn backend(&self) -> &'static str {
        self.inner.backend_name()
    }

    /// True after `close()`.
    #[napi(getter)]
    pub fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// The policy in effect (the last one reloaded), with the options' overrides applied.
    #[napi(getter)]
    pub fn policy(&self) -> Policy {
        Policy {
            inner: self.inner.policy(),
        }
    }
}

/// The runtime behind every Promise: the core's settings for every front
/// end (one worker thread, see `throttlegate::runtime`), owned by napi.
#[napi_derive::module_init]
fn init_runtime() {
    if let Ok(rt) = throttlegate::runtime::new_runtime() {
        napi::bindgen_prelude::create_custom_tokio_runtime(rt);
    }
}
