//! # throttlegate
//!
//! A distributed rate limiter: sliding-window log (exact, the default) and
//! token bucket, each a Lua script run atomically in Redis and natively in an
//! embedded in-memory backend with identical results. One request is checked
//! against every applicable rule of a [`Policy`] at once, all or nothing, in
//! one round trip.
//!
//! ```no_run
//! use std::time::Duration;
//! use throttlegate::{Limiter, Policy, Rule};
//!
//! # async fn demo() -> throttlegate::Result<()> {
//! let policy = Policy::new(vec![
//!     Rule::sliding_window_log("per-ip", "ip:{ip}", 100, Duration::from_secs(60)),
//!     Rule::token_bucket("per-key", "key:{api_key}", 20, 5.0),
//! ])?;
//! let limiter = Limiter::builder(policy).url("redis://127.0.0.1:6379").build()?;
//! let d = limiter.check(&[("ip", "203.0.113.7"), ("api_key", "k_1")], 1).await?;
//! if !d.allowed {
//!     println!("retry in {:?} (rule {:?})", d.retry_after, d.rule);
//! }
//! # Ok(()) }
//! ```
//!
//! The behaviour contract shared by every front end (Python, Node, C, CLI) is
//! in the repository's README.
#![deny(missing_docs)]

// In the order a check goes through them: the policy and its parts, the
// plan of one check, the backends that decide it, the limiter around them.
mod error;
pub mod duration;
mod clock;
mod key;
mod digest;
mod attributes;
mod policy;
mod client_ip;
mod exempt;
mod decision;
pub mod options;
pub mod record;
mod algo;
mod plan;
pub mod runtime;
mod backend;
mod deny_cache;
mod limiter;
pub mod health;
pub mod diff;
pub mod lint;
pub mod http;


pub use backend::script::CHECK_SCRIPT;
pub use attributes::AttributeBuf;
pub use client_ip::{ClientIpConfig, ClientIpOption};
pub use clock::{Clock, ManualClock};
pub use decision::{ceil_millis, ceil_secs, Decision, HeaderOptions, LeaseTicket, RuleName, RuleResult, RuleResults, SettleTicket};
pub use error::{Error, ErrorKind, Result};
pub use key::{escape_into, Attributes, KeySecret, KeyTemplate, MAX_KEY_LEN};
pub use limiter::{
    acquire_timeout, actual_cost, extend_duration, new_lease_id, BatchCall, CheckItem, CheckOption, CheckOptions, ItemsDecision, LatencyHistogram, Limiter, LimiterBuilder,
    LimiterOption, LimiterOptions, Metrics, ReloadStatus, RuleMetrics, Stats, DEGRADED_RETRY_AFTER, LATENCY_BUCKETS,
    METRICS_CONTENT_TYPE, RELOAD_POLL_INTERVAL,
};
pub use limiter::{Wire, WireAddress, WireOutcomes};
pub use limiter::ReserveStats;
pub use http::{HttpRequest, RouterRules, REQUEST_MODEL};
pub use policy::rate::{self as rate, parse_rate, Rate};
pub use limiter::{RouteLimit, ROUTE_LIMIT_KEY};
pub use health::{HealthEvent, HealthSink, OutageCause};
pub use diff::{PolicyDiff, RuleChange, RuleChangeKind, SettingChange};
pub use limiter::{CounterSamples, MetricFamily, MetricKind, RuleReserveMetrics, METRIC_FAMILIES, OUTCOMES};
pub use policy::tiers::{Block, Override, TierLimit, Tiers, MAX_BLOCK_FACTOR};
pub use policy::reserve::{Reserve, DEFAULT_RESERVE_FOR, MAX_RESERVE_FOR};
pub use options::{unknown_option, DurationUnit, OptionValue};
pub use policy::{
    default_precision, format_utc_offset, parse_utc_offset, Algorithm, FailureMode, Period, Policy, Rule,
    DEFAULT_PREFIX, DEFAULT_SUB_WINDOWS, DEFAULT_TIMEOUT, MAX_LIMIT, MAX_NAME_LEN, MAX_PREFIX_LEN,
    MAX_QUOTA_LIMIT, MAX_REFILL_RATE, MAX_SUB_WINDOWS, MAX_TIMEOUT, MAX_UTC_OFFSET_MINUTES, MAX_WAIT_REPLICAS, MAX_WINDOW,
    MIN_REFILL_RATE, MIN_UTC_OFFSET_MINUTES,
};

/// The version of this crate (the same for every throttlegate package).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
