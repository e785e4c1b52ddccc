//! Shapes of the plain objects the API accepts, declared for TypeScript.
//!
//! The values themselves are read by `convert`, which names the option at
//! fault in its errors, and decisions are made by index.js; these structs
//! exist so that `index.d.ts` is generated from this crate like everything
//! else in it.
#![allow(dead_code)]

use indexmap::IndexMap;
use napi::bindgen_prelude::{Either, Null};
use napi_derive::napi;

use crate::RuleResult;

/// The answer to one check: the most restrictive rule's figures as the
/// headline, and every applied rule's result.
// index.js makes them: `results`, `headers` and `problemJson` are built by
// the core when first read (`Limiter._results` and the like).
#[napi(object)]
pub struct Decision {
    /// Whether the request is admitted.
    pub allowed: bool,
    /// The headline rule's limit (0 when no rule applied).
    pub limit: i64,
    /// The headline rule's remaining units.
    pub remaining: i64,
    /// When denied, the longest wait among the denying rules in milliseconds (rounded up); 0 when allowed.
    pub retry_after_ms: i64,
    /// Milliseconds (rounded up) until the headline rule is back to full.
    pub reset_after_ms: i64,
    /// The most restrictive rule's name; `null` when no rule applied.
    #[napi(ts_type = "string | null")]
    pub rule: Either<String, Null>,
    /// One result per applied rule, in policy order (shadow rules included).
    pub results: Vec<RuleResult>,
    /// True when the answer came from the failure policy (`onBackendError`), not from the backend.
    pub degraded: bool,
    /// The lease id of the concurrency slots this admitted decision holds
    /// (the check's `callId` when given, else an id the limiter made), for
    /// `releaseCall` and `extendCall` elsewhere; `null` when it holds no
    /// slot (a denial, or no concurrency rule applied: nothing to release).
    #[napi(ts_type = "string | null")]
    pub lease_id: Either<String, Null>,
    /// The HTTP headers for this decision, in order (`RateLimit-*`, `Retry-After` on a denial).
    #[napi(ts_type = "Record<string, string>")]
    pub headers: IndexMap<String, String>,
    /// On a denial, an `application/problem+json` body naming the violated rules; `null` when allowed.
    #[napi(ts_type = "string | null")]
    pub problem_json: Either<String, Null>,
}

/// The options of `new Limiter()`; each overrides the policy's own setting.
#[napi(object)]
pub struct LimiterOptions {
    /// The backend: `redis://host:port/db`, `rediss://` (TLS), `redis+unix:///path`,
    /// `redis+cluster://host:port,host:port` (a Redis Cluster; `rediss+cluster://` with TLS),
    /// or `memory://` (the embedded in-memory backend, also the default when absent).
    pub url: Option<String>,
    /// Bound on the whole of one call: milliseconds, or a duration string such as `"100ms"`.
    #[napi(ts_type = "number | string")]
    pub timeout: Option<String>,
    /// What a call does when the backend is down or too slow: admit (degraded),
    /// deny (degraded), or reject with the error.
    #[napi(ts_type = "'allow' | 'deny' | 'error'")]
    pub on_backend_error: Option<String>,
    /// Prefix of every key (default `throttlegate:`).
    pub prefix: Option<String>,
    /// The old name of `prefix` (still accepted; give one of them).
    /// @deprecated use `prefix`
    pub key_prefix: Option<String>,
    /// Where "now" comes from: the backend's clock (default), this host's
    /// clock (for Redis services that refuse `TIME` in scripts), or a `ManualClock`.
    #[napi(ts_type = "ManualClock | 'backend' | 'system'")]
    pub clock: Option<String>,
    /// Hash attribute values with this secret before they go into keys, so raw
    /// values such as API keys never reach the backend.
    #[napi(ts_type = "string | Buffer")]
    pub key_secret: Option<String>,
    /// Also emit `X-RateLimit-Limit`, `-Remaining` and `-Reset` in `headers`.
    pub legacy_headers: Option<bool>,
    /// Remember Redis's denials in this process (default off): while a
    /// denial lasts (each denying rule's `retryAfterMs`), checks of the same
    /// keys with at least the denied cost are denied here, without a round
    /// trip, sparing Redis the traffic of clients that keep calling while
    /// refused. Exact but for two cases that only ever deny: a `reset` made
    /// by another process, or state lost on the server, is seen only when
    /// the wait ends. Such a denial reports only the remembered rules.
    /// Checks with a `callId` always go to Redis; `reset()` through this
    /// limiter forgets what it remembered. No effect on the embedded backend.
    pub deny_cache: Option<bool>,
    /// Count per-rule metrics (`metrics()`, `metricsText()`; default on).
    pub metrics: Option<bool>,
    /// Watch the policy's file (a path given as the policy, or
    /// `Policy.fromFile`) and reload it when it changes (default off): see
    /// `reload()`. A file that does not parse leaves the policy in force
    /// and is reported by `reloadStatus()` and the metrics. Replace the file
    /// atomically (write another, then rename it over).
    pub reload_on_change: Option<bool>,
    /// Certificates for `rediss://` and `rediss+cluster://` URLs, when the
    /// system's trust store is not enough (a private CA, mutual TLS).
    pub tls: Option<TlsOptions>,
    /// Check the backend now (default off): connect, `PING` and run the
    /// check script once on no key, within the timeout, and throw instead of
    /// degrading every call: code `'backend_unavailable'` for a wrong URL,
    /// `'timeout'` for a server that does not answer, `'backend'` for a
    /// wrong password or a user without the script's commands. The
    /// constructor waits for the check.
    pub strict: Option<bool>,
    /// Where outages are reported: one line to `warn` when calls start
    /// failing (naming the cause: `refused`, `timeout`, `auth_failed`,
    /// `noscript`, `cluster_down`, `unavailable`, `backend_error`), one line
    /// to `info` (or `warn`) when a call succeeds again; never one per call.
    /// `console`, pino and winston loggers fit. Default: each line is a
    /// process warning (`process.emitWarning(line, 'ThrottlegateWarning')`);
    /// `null` or `false` turns them off.
    #[napi(ts_type = "{ warn(message: string): void; info?(message: string): void } | null | false")]
    pub logger: Option<String>,
}

/// The `tls` option of `new Limiter()`. The names and value types are those
/// of Node's `tls.connect()`, so the same `fs.readFileSync()` results fit;
/// the certificates are PEM.
#[napi(object)]
pub struct TlsOptions {
    /// Trust these CA certificates instead of the system's roots (a private
    /// CA, a self-signed server). PEM text, or several of them in an array.
    #[napi(ts_type = "string | Buffer | Array<string | Buffer>")]
    pub ca: Option<String>,
    /// The client certificate chain to present, for servers that require
    /// mutual TLS (PEM). Give `key` with it.
    #[napi(ts_type = "string | Buffer")]
    pub cert: Option<String>,
    /// The private key of `cert` (PEM).
    #[napi(ts_type = "string | Buffer")]
    pub key: Option<String>,
}

/// The options of `Limiter.check()`.
#[napi(object)]
pub struct CheckOptions {
    /// Units this request costs (default 1); from 1 to each applicable rule's limit.
    pub cost: Option<f64>,
    /// An id making a retry of the same request idempotent: a second call with
    /// the same id does not count again. 1-64 characters from `A-Z a-z 0-9 _ -`.
    pub call_id: Option<String>,
}

/// The options of `Limiter.acquire()`.
#[napi(object)]
pub struct AcquireOptions {
    /// How long to wait at most: milliseconds, or text such as `"250ms"`.
    pub timeout: Either<f64, String>,
    /// Units this request costs (default 1); from 1 to each applicable rule's limit.
    pub cost: Option<f64>,
    /// An id given to every check the wait makes (see `CheckOptions.callId`).
    pub call_id: Option<String>,
}

/// The options of `Limiter.peek()`.
#[napi(object)]
pub struct PeekOptions {
    /// Units the request would cost (default 1).
    pub cost: Option<f64>,
}

/// The options of `new ClientIp()`.
#[napi(object)]
pub struct ClientIpOptions {
    /// Proxies whose forwarded headers are believed: addresses or CIDR networks.
    pub trusted_proxies: Option<Vec<String>>,
    /// Bits of an IPv6 address that identify one client (1-128, default 64).
    pub ipv6_prefix: Option<u32>,
}

/// One rule, in the policy-file structure (snake_case names, as in the file).
#[napi(object)]
pub struct RuleObject {
    /// Unique name of the rule (part of its keys and headers).
    pub name: String,
    /// Key template over attributes, such as `"ip:{ip}"`.
    pub key: String,
    /// The algorithm (default `sliding_window_log`).
    #[napi(ts_type = "'sliding_window_log' | 'token_bucket' | 'sliding_window' | 'fixed_window' | 'quota'")]
    pub algorithm: Option<String>,
    /// Sliding windows, fixed windows and quotas: units admitted per window or period.
    pub limit: Option<f64>,
    /// Sliding and fixed windows: milliseconds or a duration string such as `"1m"`.
    #[napi(ts_type = "number | string")]
    pub window: Option<String>,
    /// Sliding window of counters: the sub-window, milliseconds or a duration string (default 1/60 of the window).
    #[napi(ts_type = "number | string")]
    pub precision: Option<String>,
    /// Quota: the calendar period.
    #[napi(ts_type = "'hour' | 'day' | 'week' | 'month'")]
    pub period: Option<String>,
    /// Quota: the calendar's fixed offset from UTC, `"+HH:MM"` or `"-HH:MM"` (default `"+00:00"`).
    #[napi(js_name = "utc_offset")]
    pub utc_offset: Option<String>,
    /// Token bucket: the bucket's size.
    pub capacity: Option<f64>,
    /// Token bucket: tokens added per second (may be fractional).
    #[napi(js_name = "refill_rate")]
    pub refill_rate: Option<f64>,
    /// Apply the rule only to requests whose attributes have these values.
    #[napi(js_name = "match", ts_type = "Record<string, string | string[]>")]
    pub matches: Option<String>,
    /// Evaluate and report the rule without ever denying because of it.
    pub shadow: Option<bool>,
    /// Per-rule override of the policy's failure mode.
    #[napi(js_name = "on_backend_error", ts_type = "'allow' | 'deny' | 'error'")]
    pub on_backend_error: Option<String>,
    /// The limit picked by an attribute: `{ attribute: 'plan', free: 100, pro: 1000, default: 10 }`
    /// (a token bucket's tiers: `{ capacity, refill_rate }` each); the rule then has no `limit`.
    #[napi(ts_type = "{ attribute: string } & Record<string, string | number | { capacity: number; refill_rate: number }>")]
    pub tiers: Option<String>,
    /// Whether `Limiter.setOverride` may set one key's limit at run time.
    pub overrides: Option<bool>,
    /// Once the rule denies a key, deny every check on it for this long (milliseconds or a duration string).
    #[napi(ts_type = "number | string")]
    pub block: Option<String>,
    /// Each repeat block lasts this many times the previous (default 1).
    #[napi(js_name = "block_factor")]
    pub block_factor: Option<f64>,
    /// The longest block (default `block`; required when `block_factor` is above 1).
    #[napi(js_name = "block_max", ts_type = "number | string")]
    pub block_max: Option<String>,
    /// How long after a block ends the next one counts as a repeat (default `block_max`).
    #[napi(js_name = "block_period", ts_type = "number | string")]
    pub block_period: Option<String>,
}

/// A policy in the policy-file structure (what a TOML or JSON policy file holds).
#[napi(object)]
pub struct PolicyObject {
    /// The rules, in order.
    pub rules: Vec<RuleObject>,
    /// Prefix of every key (default `throttlegate:`).
    pub prefix: Option<String>,
    /// Bound on one call: milliseconds or a duration string (default `"100ms"`).
    #[napi(ts_type = "number | string")]
    pub timeout: Option<String>,
    /// What a call does when the backend fails (default `allow`).
    #[napi(js_name = "on_backend_error", ts_type = "'allow' | 'deny' | 'error'")]
    pub on_backend_error: Option<String>,
}
