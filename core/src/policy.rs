//! Rules and policies: what is limited, how, and for which requests.
//!
//! A [`Policy`] is built from code ([`Policy::new`] with [`Rule`]s) or parsed
//! from TOML or JSON ([`Policy::from_toml_str`], [`Policy::from_json_str`],
//! [`Policy::from_file`]). Every constructor validates the whole policy; an
//! invalid field is an [`ErrorKind::InvalidPolicy`](crate::ErrorKind) error
//! whose message names the field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::duration::{format_duration, parse_duration};
use crate::error::{Error, ErrorKind, Result};
pub use crate::key::MAX_NAME_LEN;
use crate::key::{validate_name, KeyTemplate};
pub mod rate;
pub mod tiers;

pub use tiers::{Block, TierLimit, Tiers};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "throttlegate:";
/// The default timeout of one call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
/// Largest `limit` or `capacity` accepted (a quota's is [`MAX_QUOTA_LIMIT`]).
pub const MAX_LIMIT: u64 = 1_000_000_000;
/// Largest `limit` of a calendar quota (token budgets): 10^15, so that every
/// count stays an exact integer in a double (below 2^53) in the Lua script.
pub const MAX_QUOTA_LIMIT: u64 = 1_000_000_000_000_000;
/// Most sub-windows a sliding window of counters may have per window: its
/// `precision` is at least 1/`MAX_SUB_WINDOWS` of its `window`.
pub const MAX_SUB_WINDOWS: u64 = 1000;
/// Sub-windows per window when `precision` is not given (rounded so that the
/// precision is a whole number of milliseconds).
pub const DEFAULT_SUB_WINDOWS: u64 = 60;
/// Largest `utc_offset` accepted, in minutes east of UTC (`"+14:00"`).
pub const MAX_UTC_OFFSET_MINUTES: i16 = 14 * 60;
/// Smallest `utc_offset` accepted, in minutes east of UTC (`"-12:00"`).
pub const MIN_UTC_OFFSET_MINUTES: i16 = -12 * 60;
/// Longest window accepted (366 days).
pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 86_400);
/// Smallest refill rate accepted, in tokens per second.
pub const MIN_REFILL_RATE: f64 = 1e-6;
/// Largest refill rate accepted, in tokens per second.
pub const MAX_REFILL_RATE: f64 = 1e9;
/// Longest key prefix, in bytes.
pub const MAX_PREFIX_LEN: usize = 64;
/// Longest call timeout accepted.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// What a call does when the backend is down, too slow, or answers with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FailureMode {
    /// Admit the request; the decision is marked `degraded`.
    #[default]
    Allow,
    /// Deny the request; the decision is marked `degraded`.
    Deny,
    /// Return the error to the caller.
    Error,
}

impl FailureMode {
    /// The name used in policies: `"allow"`, `"deny"` or `"error"`.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureMode::Allow => "allow",
            FailureMode::Deny => "deny",
            FailureMode::Error => "error",
        }
    }

    /// Parse `"allow"`, `"deny"` or `"error"`.
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "allow" => Ok(FailureMode::Allow),
            "deny" => Ok(FailureMode::Deny),
            "error" => Ok(FailureMode::Error),
            other => Err(Error::invalid_argument(format!(
                "on_backend_error must be \"allow\", \"deny\" or \"error\", not {other:?}"
            ))),
        }
    }

    /// When rules of one check disagree: `error` wins over `deny`, `deny` over `allow`.
    pub fn strictest(self, other: FailureMode) -> FailureMode {
        fn rank(m: FailureMode) -> u8 {
            match m {
                FailureMode::Allow => 0,
                FailureMode::Deny => 1,
                FailureMode::Error => 2,
            }
        }
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

/// The calendar period of a quota, aligned to the calendar in UTC or in a
/// fixed `utc_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    /// From one whole hour to the next.
    Hour,
    /// From midnight to midnight.
    Day,
    /// From Monday 00:00 to the next Monday 00:00 (ISO weeks).
    Week,
    /// From the first of a month 00:00 to the first of the next.
    Month,
}

impl Period {
    /// The name used in policies: `"hour"`, `"day"`, `"week"` or `"month"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Hour => "hour",
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
        }
    }

    /// Parse `"hour"`, `"day"`, `"week"` or `"month"`.
    pub fn parse(text: &str) -> Option<Period> {
        match text {
            "hour" => Some(Period::Hour),
            "day" => Some(Period::Day),
            "week" => Some(Period::Week),
            "month" => Some(Period::Month),
            _ => None,
        }
    }

    /// The longest this period can be (a month: 31 days), which is what a
    /// quota advertises as its window (`w` in `RateLimit-Policy`).
    pub fn longest(self) -> Duration {
        Duration::from_secs(match self {
            Period::Hour => 3_600,
            Period::Day => 86_400,
            Period::Week => 7 * 86_400,
            Period::Month => 31 * 86_400,
        })
    }

    /// The letter the check script knows the period by.
    pub(crate) fn code(self) -> char {
        match self {
            Period::Hour => 'h',
            Period::Day => 'd',
            Period::Week => 'w',
            Period::Month => 'm',
        }
    }
}

/// Format minutes east of UTC as `"+HH:MM"` / `"-HH:MM"`.
pub fn format_utc_offset(minutes: i16) -> String {
    let sign = if minutes < 0 { '-' } else { '+' };
    let m = minutes.unsigned_abs();
    format!("{sign}{:02}:{:02}", m / 60, m % 60)
}

/// Parse `"+HH:MM"` or `"-HH:MM"` (minutes below 60) into minutes east of
/// UTC, between `-12:00` and `+14:00`. The error says what is wrong,
/// without the field name.
pub fn parse_utc_offset(text: &str) -> Result<i16, String> {
    let b = text.as_bytes();
    let well_formed = b.len() == 6
        && (b[0] == b'+' || b[0] == b'-')
        && b[1].is_ascii_digit()
        && b[2].is_ascii_digit()
        && b[3] == b':'
        && b[4].is_ascii_digit()
        && b[5].is_ascii_digit();
    if !well_formed {
        return Err(format!("{text:?} is not an offset; write \"+HH:MM\" or \"-HH:MM\" (e.g. \"+02:00\")"));
    }
    let hours = ((b[1] - b'0') * 10 + (b[2] - b'0')) as i16;
    let mins = ((b[4] - b'0') * 10 + (b[5] - b'0')) as i16;
    if mins >= 60 {
        return Err(format!("{text:?} has {mins} minutes; minutes go from 00 to 59"));
    }
    let total = (hours * 60 + mins) * if b[0] == b'-' { -1 } else { 1 };
    if !(MIN_UTC_OFFSET_MINUTES..=MAX_UTC_OFFSET_MINUTES).contains(&total) {
        return Err(format!("{text:?} is out of range; offsets go from -12:00 to +14:00"));
    }
    Ok(total)
}

/// The default `precision` of a sliding window of counters: 1/60 of the
/// window, rounded up to a whole millisecond (at least 1 ms).
pub fn default_precision(window: Duration) -> Duration {
    let ms = window.as_millis() as u64;
    Duration::from_millis(ms.div_ceil(DEFAULT_SUB_WINDOWS).max(1))
}

/// A rate-limiting algorithm with its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Algorithm {
    /// Exactly `limit` units per sliding `window` (the default algorithm).
    SlidingWindowLog {
        /// Units admitted per window.
        limit: u64,
        /// Length of the window (whole milliseconds).
        window: Duration,
    },
    /// A bucket of `capacity` tokens refilled at `refill_rate` tokens per second.
    TokenBucket {
        /// Size of the bucket, and the largest burst.
        capacity: u64,
        /// Tokens added per second; may be fractional.
        refill_rate: f64,
    },
    /// A sliding window of counters: at most `limit` units in any `window`,
    /// counted per sub-window of `precision`. A unit admitted in a
    /// sub-window counts until that sub-window's end plus the window, so it
    /// never admits more than the exact log and at most one sub-window later.
    SlidingWindow {
        /// Units admitted per window.
        limit: u64,
        /// Length of the window (whole milliseconds).
        window: Duration,
        /// Length of a sub-window (whole milliseconds, at most the window,
        /// at least 1/[`MAX_SUB_WINDOWS`] of it).
        precision: Duration,
    },
    /// A fixed window: `limit` units per window, windows aligned to the Unix
    /// epoch, one counter per key. Up to twice the limit can pass around a
    /// window's boundary.
    FixedWindow {
        /// Units admitted per window.
        limit: u64,
        /// Length of the window (whole milliseconds).
        window: Duration,
    },
    /// A calendar quota: `limit` units per hour, day, week or month, aligned
    /// to the calendar at a fixed offset from UTC.
    Quota {
        /// Units admitted per period (up to [`MAX_QUOTA_LIMIT`]).
        limit: u64,
        /// The calendar period.
        period: Period,
        /// Minutes east of UTC the calendar is read in (0 for UTC).
        utc_offset_minutes: i16,
    },
    /// A concurrency limit: at most `limit` slots held at once per key, each
    /// for at most `lease` (a holder that never releases loses its slots
    /// then). A check takes `cost` slots under a lease id that
    /// [`crate::Limiter::release`] gives back.
    Concurrency {
        /// Slots per key.
        limit: u64,
        /// The longest a slot is held without a release or an extend
        /// (whole milliseconds).
        lease: Duration,
    },
}

impl Algorithm {
    /// The name used in policies: `"sliding_window_log"`, `"token_bucket"`,
    /// `"sliding_window"`, `"fixed_window"`, `"quota"` or `"concurrency"`.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::Concurrency { .. } => "concurrency",
            Algorithm::SlidingWindowLog { .. } => "sliding_window_log",
            Algorithm::TokenBucket { .. } => "token_bucket",
            Algorithm::SlidingWindow { .. } => "sliding_window",
            Algorithm::FixedWindow { .. } => "fixed_window",
            Algorithm::Quota { .. } => "quota",
        }
    }

    /// The most one request can cost: `limit` or `capacity`.
    pub fn limit(&self) -> u64 {
        match *self {
            Algorithm::SlidingWindowLog { limit, .. }
            | Algorithm::SlidingWindow { limit, .. }
            | Algorithm::FixedWindow { limit, .. }
            | Algorithm::Quota { limit, .. }
            | Algorithm::Concurrency { limit, .. } => limit,
            Algorithm::TokenBucket { capacity, .. } => capacity,
        }
    }

    /// The window advertised in headers: the window, the time a bucket takes
    /// to refill completely, a quota's longest period (a month: 31 days), or
    /// a concurrency rule's lease.
    pub fn window(&self) -> Duration {
        match *self {
            Algorithm::Concurrency { lease, .. } => lease,
            Algorithm::SlidingWindowLog { window, .. }
            | Algorithm::SlidingWindow { window, .. }
            | Algorithm::FixedWindow { window, .. } => window,
            Algorithm::Quota { period, .. } => period.longest(),
            Algorithm::TokenBucket {
                capacity,
                refill_rate,
            } => Duration::from_secs_f64(capacity as f64 / refill_rate),
        }
    }
}

/// One rule of a policy: a name, a key template, an algorithm, and optionally
/// which requests it applies to.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Unique name within the policy; part of every key of the rule.
    pub name: String,
    /// Key template over attributes, e.g. `"ip:{ip}"`.
    pub key: String,
    /// Algorithm and parameters.
    pub algorithm: Algorithm,
    /// Attribute -> accepted values. The rule applies only when every listed
    /// attribute is present with one of its values.
    pub matches: BTreeMap<String, Vec<String>>,
    /// Evaluate and report, but never deny because of this rule.
    pub shadow: bool,
    /// Override of the policy's `on_backend_error` for this rule.
    pub on_backend_error: Option<FailureMode>,
    /// The limit picked per request by an attribute (see [`Tiers`]); the
    /// algorithm's own limit then stands for the default tier.
    pub tiers: Option<Tiers>,
    /// Whether limits set at run time for one key of this rule
    /// ([`crate::Limiter::set_override`]) are read by its checks.
    pub overrides: bool,
    /// The penalty of a denial (see [`Block`]).
    pub block: Option<Block>,
    /// Attribute -> values for which the rule does not apply (checked before
    /// any round trip): a value that is an IP address or a CIDR network
    /// (`"10.0.0.0/8"`) matches the attribute's value by address, any other
    /// value matches exactly.
    pub exempt: BTreeMap<String, Vec<String>>,
}

impl Rule {
    /// A sliding-window-log rule: `limit` units per `window`.
    pub fn sliding_window_log(
        name: impl Into<String>,
        key: impl Into<String>,
        limit: u64,
        window: Duration,
    ) -> Rule {
        Rule::new(
            name,
            key,
            Algorithm::SlidingWindowLog { limit, window },
        )
    }

    /// A token-bucket rule: `capacity` tokens, refilled at `refill_rate` per second.
    pub fn token_bucket(
        name: impl Into<String>,
        key: impl Into<String>,
        capacity: u64,
        refill_rate: f64,
    ) -> Rule {
        Rule::new(
            name,
            key,
            Algorithm::TokenBucket {
                capacity,
                refill_rate,
            },
        )
    }

    /// A sliding-window-of-counters rule: `limit` units per `window`, with
    /// the default precision ([`default_precision`]: 1/60 of the window).
    pub fn sliding_window(
        name: impl Into<String>,
        key: impl Into<String>,
        limit: u64,
        window: Duration,
    ) -> Rule {
        Rule::new(name, key, Algorithm::SlidingWindow { limit, window, precision: default_precision(window) })
    }

    /// A fixed-window rule: `limit` units per epoch-aligned `window`.
    pub fn fixed_window(
        name: impl Into<String>,
        key: impl Into<String>,
        limit: u64,
        window: Duration,
    ) -> Rule {
        Rule::new(name, key, Algorithm::FixedWindow { limit, window })
    }

    /// A calendar quota in UTC: `limit` units per `period`.
    pub fn quota(name: impl Into<String>, key: impl Into<String>, limit: u64, period: Period) -> Rule {
        Rule::new(name, key, Algorithm::Quota { limit, period, utc_offset_minutes: 0 })
    }

    /// A concurrency rule: at most `limit` slots held at once per key, each
    /// for at most `lease` unless released or extended.
    pub fn concurrency(name: impl Into<String>, key: impl Into<String>, limit: u64, lease: Duration) -> Rule {
        Rule::new(name, key, Algorithm::Concurrency { limit, lease })
    }

    /// A rule with any algorithm.
    pub fn new(name: impl Into<String>, key: impl Into<String>, algorithm: Algorithm) -> Rule {
        Rule {
            name: name.into(),
            key: key.into(),
            algorithm,
            matches: BTreeMap::new(),
            shadow: false,
            on_backend_error: None,
            tiers: None,
            overrides: false,
            block: None,
            exempt: BTreeMap::new(),
        }
    }

    /// Pick the limit per request by an attribute's value.
    pub fn tiers(mut self, tiers: Tiers) -> Rule {
        self.tiers = Some(tiers);
        self
    }

    /// Let this rule's checks read limits set at run time for one key.
    pub fn overrides(mut self, overrides: bool) -> Rule {
        self.overrides = overrides;
        self
    }

    /// Block a key for a while once this rule denies it.
    pub fn block(mut self, block: Block) -> Rule {
        self.block = Some(block);
        self
    }

    /// Apply the rule only when `attribute` has one of `values`.
    pub fn matching<I, S>(mut self, attribute: impl Into<String>, values: I) -> Rule
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.matches
            .insert(attribute.into(), values.into_iter().map(Into::into).collect());
        self
    }

    /// Skip the rule for requests whose `attribute` has one of `values` (an
    /// IP address or CIDR network matches by address, see [`Rule::exempt`]).
    pub fn exempt<I, S>(mut self, attribute: impl Into<String>, values: I) -> Rule
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.exempt.insert(attribute.into(), values.into_iter().map(Into::into).collect());
        self
    }

    /// Put the rule in shadow mode (reported, never denies).
    pub fn shadow(mut self, shadow: bool) -> Rule {
        self.shadow = shadow;
        self
    }

    /// Override the policy's failure mode for this rule.
    pub fn on_backend_error(mut self, mode: FailureMode) -> Rule {
        self.on_backend_error = Some(mode);
        self
    }
}

/// A validated, ordered set of rules and the settings they share.
#[derive(Debug, Clone)]
pub struct Policy {
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) on_backend_error: FailureMode,
    /// Replicas that must acknowledge a check before it is answered (`WAIT`).
    pub(crate) wait_replicas: u32,
    pub(crate) rules: Vec<Rule>,
    pub(crate) templates: Vec<KeyTemplate>,
    /// The `[attributes]` table: attribute name -> lower-case header name.
    pub(crate) attributes: Vec<(String, String)>,
    /// The file the policy was read from ([`Policy::from_file`]), for `reload_on_change`.
    pub(crate) source: Option<PathBuf>,
}

impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        self.prefix == other.prefix
            && self.timeout == other.timeout
            && self.on_backend_error == other.on_backend_error
            && self.wait_replicas == other.wait_replicas
            && self.rules == other.rules
            && self.attributes == other.attributes
    }
}

impl Policy {
    /// A policy of `rules` with the default settings (prefix `throttlegate:`,
    /// timeout 100 ms, `on_backend_error = allow`).
    pub fn new(rules: Vec<Rule>) -> Result<Policy> {
        Policy::with_settings(rules, DEFAULT_PREFIX, DEFAULT_TIMEOUT, FailureMode::Allow)
    }

    /// A policy with explicit settings.
    pub fn with_settings(
        rules: Vec<Rule>,
        prefix: impl Into<String>,
        timeout: Duration,
        on_backend_error: FailureMode,
    ) -> Result<Policy> {
        let prefix = prefix.into();
        validate_prefix(&prefix).map_err(|m| Error::invalid_policy(format!("prefix: {m}")))?;
        validate_timeout(timeout).map_err(|m| Error::invalid_policy(format!("timeout: {m}")))?;
        if rules.is_empty() {
            return Err(Error::invalid_policy("rules: a policy needs at least one rule"));
        }
        let mut rules = rules;
        let mut templates = Vec::with_capacity(rules.len());
        for i in 0..rules.len() {
            let at = rule_path(i, &rules[i].name);
            tiers::validate(&rules[i]).map_err(|m| Error::invalid_policy(format!("{at}: {m}")))?;
            // A tiered rule's algorithm stands for its default (or first) tier.
            if let Some(stand_in) = rules[i].tiers.as_ref().and_then(|t| t.placeholder()) {
                if let Some(a) = tiers::with_limit(rules[i].algorithm, stand_in) {
                    rules[i].algorithm = a;
                }
            }
            let rule = &rules[i];
            validate_rule(rule).map_err(|m| Error::invalid_policy(format!("{at}: {m}")))?;
            if rules[..i].iter().any(|r| r.name == rule.name) {
                return Err(Error::invalid_policy(format!(
                    "{at}: name: {:?} is used by another rule; rule names are unique",
                    rule.name
                )));
            }
            let template = KeyTemplate::parse(&rule.key)
                .map_err(|m| Error::invalid_policy(format!("{at}: key: {m}")))?;
            templates.push(template);
        }
        Ok(Policy {
            prefix,
            timeout,
            on_backend_error,
            wait_replicas: 0,
            rules,
            templates,
            attributes: Vec::new(),
            source: None,
        })
    }

    /// The same policy with attributes read from request headers (the
    /// `[attributes]` table: `api_key = "header:x-api-key"`): pairs of an
    /// attribute name and a source, `"header:<name>"`. The HTTP
    /// integrations give each as an attribute when the request has the
    /// header ([`crate::Limiter::request_attributes`]). An attribute of the
    /// request model (`ip`, `method`, `route`, `path`, `host`) cannot be
    /// redefined.
    pub fn with_attribute_sources<N: AsRef<str>, S: AsRef<str>>(mut self, sources: &[(N, S)]) -> Result<Policy> {
        let mut out: Vec<(String, String)> = Vec::with_capacity(sources.len());
        for (name, source) in sources {
            let (name, source) = (name.as_ref(), source.as_ref());
            let header = parse_attribute_source(name, source).map_err(Error::invalid_policy)?;
            if out.iter().any(|(n, _)| n == name) {
                return Err(Error::invalid_policy(format!("attributes.{name}: given twice")));
            }
            out.push((name.to_string(), header));
        }
        self.attributes = out;
        Ok(self)
    }

    /// The same policy with `rules` after its own (validated as a whole:
    /// a name used twice is an error naming it).
    pub(crate) fn with_rules_added(self, rules: &[Rule]) -> Result<Policy> {
        if rules.is_empty() {
            return Ok(self);
        }
        let mut all = self.rules.clone();
        all.extend(rules.iter().cloned());
        let mut p = Policy::with_settings(all, self.prefix, self.timeout, self.on_backend_error)?;
        p.attributes = self.attributes;
        p.source = self.source;
        p.wait_replicas = self.wait_replicas;
        Ok(p)
    }

    /// The same policy without the rules `drop` picks (at least one rule is kept by the caller).
    pub(crate) fn without_rules(mut self, drop: impl Fn(&Rule) -> bool) -> Policy {
        let keep: Vec<bool> = self.rules.iter().map(|r| !drop(r)).collect();
        let mut i = 0;
        self.rules.retain(|_| (keep[i], i += 1).0);
        let mut i = 0;
        self.templates.retain(|_| (keep[i], i += 1).0);
        self
    }

    /// The `[attributes]` table: (attribute, lower-case header name) pairs.
    pub fn attribute_sources(&self) -> &[(String, String)] {
        &self.attributes
    }

    /// Parse a policy from TOML text.
    pub fn from_toml_str(text: &str) -> Result<Policy> {
        let value: toml::Value = toml::from_str(text)
            .map_err(|e| Error::invalid_policy(format!("malformed TOML: {}", e.to_string().trim())))?;
        let json = serde_json::to_value(value)
            .map_err(|e| Error::invalid_policy(format!("malformed TOML: {e}")))?;
        Policy::from_value(&json)
    }

    /// Parse a policy from JSON text (an object with a `rules` array).
    pub fn from_json_str(text: &str) -> Result<Policy> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| Error::invalid_policy(format!("malformed JSON: {e}")))?;
        Policy::from_value(&value)
    }

    /// Parse a policy from TOML or JSON text, guessing the format: text whose
    /// first non-blank character is `{` is JSON.
    pub fn from_str_any(text: &str) -> Result<Policy> {
        if text.trim_start().starts_with('{') {
            Policy::from_json_str(text)
        } else {
            Policy::from_toml_str(text)
        }
    }

    /// Read a policy file: `.json` is JSON, `.toml` is TOML, anything else is guessed.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Policy> {
        let path = path.as_ref();
        let text = std::fs::read(path).map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("cannot read policy file {}", path.display()),
            )
            .with_source(e)
        })?;
        let text = String::from_utf8(text).map_err(|_| {
            Error::invalid_policy(format!("policy file {} is not valid UTF-8", path.display()))
        })?;
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(|e| e.to_ascii_lowercase());
        let parsed = match ext.as_deref() {
            Some("json") => Policy::from_json_str(&text),
            Some("toml") => Policy::from_toml_str(&text),
            _ => Policy::from_str_any(&text),
        };
        let mut policy = parsed.map_err(|e| {
            Error::invalid_policy(format!("{}: {}", path.display(), e.message()))
        })?;
        policy.source = Some(path.to_path_buf());
        Ok(policy)
    }

    /// The file this policy was read from ([`Policy::from_file`]); `None`
    /// for a policy built from code or text. What `reload_on_change` watches.
    pub fn source(&self) -> Option<&Path> {
        self.source.as_deref()
    }

    /// Build a policy from a JSON value tree (what the Python and Node
    /// constructors receive as plain dicts/objects).
    pub fn from_value(value: &Value) -> Result<Policy> {
        parse_policy(value).map_err(Error::invalid_policy)
    }

    /// The policy as a JSON value, in the file format (round-trips through [`Policy::from_value`]).
    pub fn to_value(&self) -> Value {
        let mut top = Map::new();
        top.insert("prefix".into(), Value::from(self.prefix.clone()));
        top.insert("timeout".into(), Value::from(format_duration(self.timeout)));
        top.insert(
            "on_backend_error".into(),
            Value::from(self.on_backend_error.as_str()),
        );
        if self.wait_replicas > 0 {
            top.insert("wait_replicas".into(), Value::from(self.wait_replicas));
        }
        let rules = self
            .rules
            .iter()
            .map(|r| {
                let mut m = Map::new();
                m.insert("name".into(), Value::from(r.name.clone()));
                m.insert("key".into(), Value::from(r.key.clone()));
                m.insert("algorithm".into(), Value::from(r.algorithm.name()));
                match r.algorithm {
                    Algorithm::SlidingWindowLog { limit, window } => {
                        m.insert("limit".into(), Value::from(limit));
                        m.insert("window".into(), Value::from(format_duration(window)));
                    }
                    Algorithm::TokenBucket {
                        capacity,
                        refill_rate,
                    } => {
                        m.insert("capacity".into(), Value::from(capacity));
                        m.insert("refill_rate".into(), Value::from(refill_rate));
                    }
                    Algorithm::SlidingWindow { limit, window, precision } => {
                        m.insert("limit".into(), Value::from(limit));
                        m.insert("window".into(), Value::from(format_duration(window)));
                        m.insert("precision".into(), Value::from(format_duration(precision)));
                    }
                    Algorithm::FixedWindow { limit, window } => {
                        m.insert("limit".into(), Value::from(limit));
                        m.insert("window".into(), Value::from(format_duration(window)));
                    }
                    Algorithm::Quota { limit, period, utc_offset_minutes } => {
                        m.insert("limit".into(), Value::from(limit));
                        m.insert("period".into(), Value::from(period.as_str()));
                        m.insert("utc_offset".into(), Value::from(format_utc_offset(utc_offset_minutes)));
                    }
                    Algorithm::Concurrency { limit, lease } => {
                        m.insert("limit".into(), Value::from(limit));
                        m.insert("lease".into(), Value::from(format_duration(lease)));
                    }
                }
                if !r.matches.is_empty() {
                    let mut mm = Map::new();
                    for (k, v) in &r.matches {
                        mm.insert(k.clone(), Value::from(v.clone()));
                    }
                    m.insert("match".into(), Value::Object(mm));
                }
                if !r.exempt.is_empty() {
                    let mut mm = Map::new();
                    for (k, v) in &r.exempt {
                        mm.insert(k.clone(), Value::from(v.clone()));
                    }
                    m.insert("exempt".into(), Value::Object(mm));
                }
                if r.shadow {
                    m.insert("shadow".into(), Value::from(true));
                }
                if let Some(mode) = r.on_backend_error {
                    m.insert("on_backend_error".into(), Value::from(mode.as_str()));
                }
                tiers::write_into(r, &mut m);
                Value::Object(m)
            })
            .collect();
        top.insert("rules".into(), Value::Array(rules));
        if !self.attributes.is_empty() {
            let mut a = Map::new();
            for (name, header) in &self.attributes {
                a.insert(name.clone(), Value::from(format!("header:{header}")));
            }
            top.insert("attributes".into(), Value::Object(a));
        }
        Value::Object(top)
    }

    /// The rules, in policy order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The timeout of one call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The policy-wide failure mode.
    pub fn on_backend_error(&self) -> FailureMode {
        self.on_backend_error
    }

    /// The same rules with another prefix.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Result<Policy> {
        let prefix = prefix.into();
        validate_prefix(&prefix).map_err(|m| Error::invalid_argument(format!("prefix: {m}")))?;
        self.prefix = prefix;
        Ok(self)
    }

    /// How many replicas must acknowledge a check before it is answered
    /// (`wait_replicas`, default 0): the Redis backends send `WAIT` after
    /// the check script, in the same round trip, so an admission a failover
    /// could lose (asynchronous replication) is never answered. A check
    /// that is not acknowledged within the timeout is answered by
    /// `on_backend_error`. Ignored by the embedded backend.
    pub fn wait_replicas(&self) -> u32 {
        self.wait_replicas
    }

    /// The same rules with another `wait_replicas` (at most
    /// [`MAX_WAIT_REPLICAS`]).
    pub fn with_wait_replicas(mut self, replicas: u32) -> Result<Policy> {
        validate_wait_replicas(replicas as u64).map_err(|m| Error::invalid_argument(format!("wait_replicas: {m}")))?;
        self.wait_replicas = replicas;
        Ok(self)
    }

    /// The same rules with another timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Result<Policy> {
        validate_timeout(timeout).map_err(|m| Error::invalid_argument(format!("timeout: {m}")))?;
        self.timeout = timeout;
        Ok(self)
    }

    /// The same rules with another policy-wide failure mode.
    pub fn with_on_backend_error(mut self, mode: FailureMode) -> Policy {
        self.on_backend_error = mode;
        self
    }
}

fn rule_path(index: usize, name: &str) -> String {
    if name.is_empty() {
        format!("rules[{index}]")
    } else {
        format!("rules[{index}] ({name:?})")
    }
}

fn validate_prefix(prefix: &str) -> Result<(), String> {
    if prefix.len() > MAX_PREFIX_LEN {
        return Err(format!("is longer than {MAX_PREFIX_LEN} bytes"));
    }
    if let Some(c) = prefix
        .chars()
        .find(|&c| c.is_control() || c == '{' || c == '}' || c == ' ' || !c.is_ascii())
    {
        return Err(format!(
            "{prefix:?} contains {c:?}; a prefix is printable ASCII without spaces or braces"
        ));
    }
    Ok(())
}

/// The most replicas `wait_replicas` may ask for.
pub const MAX_WAIT_REPLICAS: u32 = 16;

fn validate_wait_replicas(n: u64) -> Result<(), String> {
    if n > MAX_WAIT_REPLICAS as u64 {
        return Err(format!("at most {MAX_WAIT_REPLICAS} replicas, got {n}"));
    }
    Ok(())
}

fn validate_timeout(timeout: Duration) -> Result<(), String> {
    if timeout < Duration::from_millis(1) {
        return Err("must be at least 1ms".into());
    }
    if timeout > MAX_TIMEOUT {
        return Err("must be at most 1h".into());
    }
    Ok(())
}

fn validate_limit(limit: u64, max: u64) -> Result<(), String> {
    if limit == 0 || limit > max {
        return Err(format!("limit: must be between 1 and {max}, not {limit}"));
    }
    Ok(())
}

fn validate_window(window: Duration) -> Result<(), String> {
    if window < Duration::from_millis(1) {
        return Err("window: must be at least 1ms".into());
    }
    if window > MAX_WINDOW {
        return Err("window: must be at most 366d".into());
    }
    if window.subsec_nanos() % 1_000_000 != 0 {
        return Err("window: must be a whole number of milliseconds".into());
    }
    Ok(())
}

fn validate_rule(rule: &Rule) -> Result<(), String> {
    validate_name(&rule.name).map_err(|m| format!("name: {m}"))?;
    match rule.algorithm {
        Algorithm::Concurrency { limit, lease } => {
            validate_limit(limit, MAX_LIMIT)?;
            validate_window(lease).map_err(|m| m.replacen("window:", "lease:", 1))?;
            if rule.tiers.is_some() {
                return Err("tiers: does not apply to concurrency (a rule has one number of slots)".into());
            }
            if rule.overrides {
                return Err("overrides: does not apply to concurrency".into());
            }
            if rule.block.is_some() {
                return Err("block: does not apply to concurrency (a denial waits for a slot, not a penalty)".into());
            }
        }
        Algorithm::SlidingWindowLog { limit, window } | Algorithm::FixedWindow { limit, window } => {
            validate_limit(limit, MAX_LIMIT)?;
            validate_window(window)?;
        }
        Algorithm::SlidingWindow { limit, window, precision } => {
            validate_limit(limit, MAX_LIMIT)?;
            validate_window(window)?;
            if precision.subsec_nanos() % 1_000_000 != 0 {
                return Err("precision: must be a whole number of milliseconds".into());
            }
            if precision < Duration::from_millis(1) {
                return Err("precision: must be at least 1ms".into());
            }
            if precision > window {
                return Err(format!(
                    "precision: must be at most the window ({}), not {}",
                    format_duration(window),
                    format_duration(precision)
                ));
            }
            let finest = Duration::from_millis((window.as_millis() as u64).div_ceil(MAX_SUB_WINDOWS));
            if precision < finest {
                return Err(format!(
                    "precision: must be at least 1/{MAX_SUB_WINDOWS} of the window ({}), not {}",
                    format_duration(finest),
                    format_duration(precision)
                ));
            }
        }
        Algorithm::Quota { limit, utc_offset_minutes, .. } => {
            validate_limit(limit, MAX_QUOTA_LIMIT)?;
            if !(MIN_UTC_OFFSET_MINUTES..=MAX_UTC_OFFSET_MINUTES).contains(&utc_offset_minutes) {
                return Err(format!(
                    "utc_offset: {:?} is out of range; offsets go from -12:00 to +14:00",
                    format_utc_offset(utc_offset_minutes)
                ));
            }
        }
        Algorithm::TokenBucket {
            capacity,
            refill_rate,
        } => {
            if capacity == 0 || capacity > MAX_LIMIT {
                return Err(format!(
                    "capacity: must be between 1 and {MAX_LIMIT}, not {capacity}"
                ));
            }
            if !refill_rate.is_finite() || refill_rate <= 0.0 {
                return Err(format!("refill_rate: must be a positive number, not {refill_rate}"));
            }
            if !(MIN_REFILL_RATE..=MAX_REFILL_RATE).contains(&refill_rate) {
                return Err(format!(
                    "refill_rate: must be between {MIN_REFILL_RATE} and {MAX_REFILL_RATE} tokens per second, not {refill_rate}"
                ));
            }
        }
    }
    for (attr, values) in &rule.matches {
        validate_name(attr).map_err(|m| format!("match: attribute name {m}"))?;
        if values.is_empty() {
            return Err(format!("match.{attr}: needs at least one value"));
        }
    }
    for (attr, values) in &rule.exempt {
        validate_name(attr).map_err(|m| format!("exempt: attribute name {m}"))?;
        if values.is_empty() {
            return Err(format!("exempt.{attr}: needs at least one value"));
        }
        for v in values {
            crate::exempt::Exemption::parse(v).map_err(|m| format!("exempt.{attr}: {m}"))?;
        }
    }
    Ok(())
}

// ---- parsing from a JSON value tree ---------------------------------------

const TOP_FIELDS: &[&str] = &["prefix", "timeout", "on_backend_error", "wait_replicas", "attributes", "rules"];

/// The header an `[attributes]` entry reads, checked: `header:<name>`.
fn parse_attribute_source(name: &str, source: &str) -> Result<String, String> {
    let at = format!("attributes.{name}");
    validate_name(name).map_err(|m| format!("{at}: attribute name {m}"))?;
    if crate::http::REQUEST_MODEL.contains(&name) {
        return Err(format!(
            "{at}: {name:?} is part of the request model every integration provides (ip, method, route, path, host); give the attribute another name"
        ));
    }
    let header = source.strip_prefix("header:").ok_or_else(|| {
        format!("{at}: {source:?} is not a source; write \"header:<name>\" (e.g. \"header:x-api-key\")")
    })?;
    let header = header.trim();
    if header.is_empty() || !header.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)) {
        return Err(format!("{at}: {header:?} is not a header name"));
    }
    Ok(header.to_ascii_lowercase())
}
const RULE_FIELDS: &[&str] = &[
    "name",
    "key",
    "algorithm",
    "limit",
    "window",
    "rate",
    "capacity",
    "refill_rate",
    "precision",
    "period",
    "utc_offset",
    "lease",
    "match",
    "exempt",
    "shadow",
    "on_backend_error",
    "tiers",
    "overrides",
    "block",
    "block_factor",
    "block_max",
    "block_period",
];

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn unknown_field(at: &str, field: &str, expected: &[&str]) -> String {
    format!(
        "{at}unknown field `{field}`; expected one of: {}",
        expected.join(", ")
    )
}

fn get_string<'a>(v: &'a Value, at: &str) -> Result<&'a str, String> {
    v.as_str()
        .ok_or_else(|| format!("{at}: expected a string, got {}", type_name(v)))
}

fn get_duration(v: &Value, at: &str) -> Result<Duration, String> {
    match v {
        Value::Number(n) => match n.as_u64() {
            Some(ms) => Ok(Duration::from_millis(ms)),
            None => Err(format!(
                "{at}: expected whole milliseconds or a string like \"1m\", got {n}"
            )),
        },
        Value::String(s) => parse_duration(s).map_err(|m| format!("{at}: {m}")),
        other => Err(format!(
            "{at}: expected milliseconds or a string like \"1m\", got {}",
            type_name(other)
        )),
    }
}

fn get_count(v: &Value, at: &str) -> Result<u64, String> {
    match v {
        Value::Number(n) => {
            if let Some(x) = n.as_u64() {
                Ok(x)
            } else if n.as_i64().is_some() {
                Err(format!("{at}: must be a positive integer, got {n}"))
            } else {
                match n.as_f64() {
                    Some(f) if f.fract() == 0.0 && f >= 0.0 && f <= u64::MAX as f64 => Ok(f as u64),
                    _ => Err(format!("{at}: must be a positive integer, got {n}")),
                }
            }
        }
        other => Err(format!(
            "{at}: expected a positive integer, got {}",
            type_name(other)
        )),
    }
}

fn get_rate(v: &Value, at: &str) -> Result<f64, String> {
    match v {
        Value::Number(n) => n
            .as_f64()
            .ok_or_else(|| format!("{at}: expected a number, got {n}")),
        other => Err(format!("{at}: expected a number, got {}", type_name(other))),
    }
}

fn get_mode(v: &Value, at: &str) -> Result<FailureMode, String> {
    let s = get_string(v, at)?;
    FailureMode::parse(s).map_err(|_| {
        format!("{at}: must be \"allow\", \"deny\" or \"error\", not {s:?}")
    })
}

fn parse_policy(value: &Value) -> Result<Policy, String> {
    let obj = value.as_object().ok_or_else(|| {
        format!(
            "a policy is an object with a `rules` array, got {}",
            type_name(value)
        )
    })?;
    for field in obj.keys() {
        if !TOP_FIELDS.contains(&field.as_str()) {
            return Err(unknown_field("", field, TOP_FIELDS));
        }
    }
    let prefix = match obj.get("prefix") {
        Some(v) => get_string(v, "prefix")?.to_string(),
        None => DEFAULT_PREFIX.to_string(),
    };
    let timeout = match obj.get("timeout") {
        Some(v) => get_duration(v, "timeout")?,
        None => DEFAULT_TIMEOUT,
    };
    let on_backend_error = match obj.get("on_backend_error") {
        Some(v) => get_mode(v, "on_backend_error")?,
        None => FailureMode::Allow,
    };
    let rules_v = obj
        .get("rules")
        .ok_or_else(|| "rules: missing; a policy needs a `rules` array".to_string())?;
    let rules_a = rules_v
        .as_array()
        .ok_or_else(|| format!("rules: expected an array, got {}", type_name(rules_v)))?;
    let mut rules = Vec::with_capacity(rules_a.len());
    for (i, rv) in rules_a.iter().enumerate() {
        rules.push(parse_rule(i, rv)?);
    }
    let mut sources: Vec<(String, String)> = Vec::new();
    if let Some(a) = obj.get("attributes") {
        let table = a
            .as_object()
            .ok_or_else(|| format!("attributes: expected a table of attribute = \"header:<name>\", got {}", type_name(a)))?;
        for (name, v) in table {
            sources.push((name.clone(), get_string(v, &format!("attributes.{name}"))?.to_string()));
        }
    }
    let wait_replicas = match obj.get("wait_replicas") {
        Some(v) => {
            let n = get_count(v, "wait_replicas")?;
            validate_wait_replicas(n).map_err(|m| format!("wait_replicas: {m}"))?;
            n as u32
        }
        None => 0,
    };
    let mut policy = Policy::with_settings(rules, prefix, timeout, on_backend_error)
        .and_then(|p| p.with_attribute_sources(&sources))
        .map_err(|e| e.message().to_string())?;
    policy.wait_replicas = wait_replicas;
    Ok(policy)
}

fn parse_rule(i: usize, v: &Value) -> Result<Rule, String> {
    let obj = v
        .as_object()
        .ok_or_else(|| format!("rules[{i}]: expected an object, got {}", type_name(v)))?;
    let name = match obj.get("name") {
        Some(n) => get_string(n, &format!("rules[{i}].name"))?.to_string(),
        None => return Err(format!("rules[{i}]: name: missing")),
    };
    let at = rule_path(i, &name);
    for field in obj.keys() {
        if !RULE_FIELDS.contains(&field.as_str()) {
            return Err(unknown_field(&format!("{at}: "), field, RULE_FIELDS));
        }
    }
    let key = match obj.get("key") {
        Some(k) => get_string(k, &format!("{at}: key"))?.to_string(),
        None => return Err(format!("{at}: key: missing")),
    };
    let algo = match obj.get("algorithm") {
        Some(a) => get_string(a, &format!("{at}: algorithm"))?,
        None => "sliding_window_log",
    };
    // A tiered rule leaves its limit out: the tiers give it, and the
    // default (or first) tier stands in for the algorithm's own.
    let tiers = match obj.get("tiers") {
        Some(_) if algo == "concurrency" => {
            return Err(format!("{at}: tiers: does not apply to concurrency (a rule has one number of slots)"))
        }
        Some(t) => {
            let bucket = algo == "token_bucket";
            for f in tiers::tiered_fields(bucket) {
                if obj.contains_key(*f) {
                    return Err(format!("{at}: {f}: does not apply with tiers (each tier gives it)"));
                }
            }
            let tiers = tiers::parse_tiers(t, bucket).map_err(|m| format!("{at}: {m}"))?;
            Some(tiers)
        }
        None => None,
    };
    let mut stand_in = obj.clone();
    if let Some(t) = &tiers {
        match t.placeholder() {
            Some(TierLimit::Limit(n)) => {
                stand_in.insert("limit".into(), Value::from(n));
            }
            Some(TierLimit::Bucket { capacity, refill_rate }) => {
                stand_in.insert("capacity".into(), Value::from(capacity));
                stand_in.insert("refill_rate".into(), Value::from(refill_rate));
            }
            None => {}
        }
    }
    // `rate = "5/minute"` gives the limit and the window in one string.
    let rated = match obj.get("rate") {
        Some(r) => {
            let text = get_string(r, &format!("{at}: rate"))?;
            if !matches!(algo, "sliding_window_log" | "sliding_window" | "fixed_window") {
                return Err(format!("{at}: rate: does not apply to {algo} (it has no window)"));
            }
            for f in ["limit", "window", "tiers"] {
                if obj.contains_key(f) {
                    return Err(format!("{at}: {f}: does not apply with rate (the rate gives the limit and the window)"));
                }
            }
            let rates = rate::parse_rate(text).map_err(|e| format!("{at}: {}", e.message()))?;
            if rates.len() != 1 {
                return Err(format!("{at}: rate: {text:?} gives {} limits; a rule has one (write a rule per limit)", rates.len()));
            }
            let mut with = obj.clone();
            with.insert("limit".into(), Value::from(rates[0].limit));
            with.insert("window".into(), Value::from(rates[0].window.as_millis() as u64));
            with.remove("rate");
            Some(with)
        }
        None => None,
    };
    let obj = match (&rated, tiers.is_some()) {
        (Some(r), _) => r,
        (None, true) => &stand_in,
        (None, false) => obj,
    };
    let field = |f: &str| obj.get(f);
    let required = |f: &str| {
        field(f).ok_or_else(|| format!("{at}: {f}: missing (required by {algo})"))
    };
    let reject = |fields: &[&str]| -> Result<(), String> {
        for f in fields {
            if field(f).is_some() {
                return Err(format!("{at}: {f}: does not apply to {algo}"));
            }
        }
        Ok(())
    };
    if algo != "concurrency" {
        reject(&["lease"])?;
    }
    let algorithm = match algo {
        "concurrency" => {
            reject(&["window", "capacity", "refill_rate", "precision", "period", "utc_offset"])?;
            Algorithm::Concurrency {
                limit: get_count(required("limit")?, &format!("{at}: limit"))?,
                lease: get_duration(required("lease")?, &format!("{at}: lease"))?,
            }
        }
        "sliding_window_log" => {
            reject(&["capacity", "refill_rate", "precision", "period", "utc_offset"])?;
            Algorithm::SlidingWindowLog {
                limit: get_count(required("limit")?, &format!("{at}: limit"))?,
                window: get_duration(required("window")?, &format!("{at}: window"))?,
            }
        }
        "sliding_window" => {
            reject(&["capacity", "refill_rate", "period", "utc_offset"])?;
            let limit = get_count(required("limit")?, &format!("{at}: limit"))?;
            let window = get_duration(required("window")?, &format!("{at}: window"))?;
            let precision = match field("precision") {
                Some(p) => get_duration(p, &format!("{at}: precision"))?,
                None => default_precision(window),
            };
            Algorithm::SlidingWindow { limit, window, precision }
        }
        "fixed_window" => {
            reject(&["capacity", "refill_rate", "precision", "period", "utc_offset"])?;
            Algorithm::FixedWindow {
                limit: get_count(required("limit")?, &format!("{at}: limit"))?,
                window: get_duration(required("window")?, &format!("{at}: window"))?,
            }
        }
        "quota" => {
            reject(&["capacity", "refill_rate", "window", "precision"])?;
            let limit = get_count(required("limit")?, &format!("{at}: limit"))?;
            let text = get_string(required("period")?, &format!("{at}: period"))?;
            let period = Period::parse(text).ok_or_else(|| {
                format!("{at}: period: must be \"hour\", \"day\", \"week\" or \"month\", not {text:?}")
            })?;
            let utc_offset_minutes = match field("utc_offset") {
                Some(v) => parse_utc_offset(get_string(v, &format!("{at}: utc_offset"))?)
                    .map_err(|m| format!("{at}: utc_offset: {m}"))?,
                None => 0,
            };
            Algorithm::Quota { limit, period, utc_offset_minutes }
        }
        "token_bucket" => {
            reject(&["limit", "window", "precision", "period", "utc_offset"])?;
            Algorithm::TokenBucket {
                capacity: get_count(required("capacity")?, &format!("{at}: capacity"))?,
                refill_rate: get_rate(required("refill_rate")?, &format!("{at}: refill_rate"))?,
            }
        }
        other => {
            return Err(format!(
                "{at}: algorithm: unknown algorithm {other:?}; expected \"sliding_window_log\", \"token_bucket\", \"sliding_window\", \"fixed_window\", \"quota\" or \"concurrency\""
            ))
        }
    };
    let mut rule = Rule::new(name, key, algorithm);
    if let Some(m) = field("match") {
        let mobj = m
            .as_object()
            .ok_or_else(|| format!("{at}: match: expected an object, got {}", type_name(m)))?;
        for (attr, vals) in mobj {
            let p = format!("{at}: match.{attr}");
            let values = match vals {
                Value::String(s) => vec![s.clone()],
                Value::Array(items) => items
                    .iter()
                    .map(|x| get_string(x, &p).map(str::to_string))
                    .collect::<Result<Vec<_>, _>>()?,
                other => {
                    return Err(format!(
                        "{p}: expected a string or an array of strings, got {}",
                        type_name(other)
                    ))
                }
            };
            rule.matches.insert(attr.clone(), values);
        }
    }
    if let Some(m) = field("exempt") {
        let mobj = m
            .as_object()
            .ok_or_else(|| format!("{at}: exempt: expected a table of attribute = [values], got {}", type_name(m)))?;
        for (attr, vals) in mobj {
            let p = format!("{at}: exempt.{attr}");
            let values = match vals {
                Value::String(s) => vec![s.clone()],
                Value::Array(items) => items
                    .iter()
                    .map(|x| get_string(x, &p).map(str::to_string))
                    .collect::<Result<Vec<_>, _>>()?,
                other => {
                    return Err(format!("{p}: expected a string or an array of strings, got {}", type_name(other)))
                }
            };
            rule.exempt.insert(attr.clone(), values);
        }
    }
    if let Some(s) = field("shadow") {
        rule.shadow = s
            .as_bool()
            .ok_or_else(|| format!("{at}: shadow: expected true or false, got {}", type_name(s)))?;
    }
    if let Some(m) = field("on_backend_error") {
        rule.on_backend_error = Some(get_mode(m, &format!("{at}: on_backend_error"))?);
    }
    rule.tiers = tiers;
    tiers::parse_into(&mut rule, obj).map_err(|m| format!("{at}: {m}"))?;
    Ok(rule)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
prefix = "throttlegate:"
timeout = "100ms"
on_backend_error = "allow"

[[rules]]
name = "per-ip"
key = "ip:{ip}"
algorithm = "sliding_window_log"
limit = 100
window = "1m"

[[rules]]
name = "per-api-key"
key = "key:{api_key}"
algorithm = "token_bucket"
capacity = 20
refill_rate = 5

[[rules]]
name = "login"
key = "login:{ip}"
match = { route = "/login", method = ["POST"] }
limit = 5
window = "15m"
shadow = false
on_backend_error = "deny"
"#;

    #[test]
    fn parses_the_spec_example() {
        let p = Policy::from_toml_str(EXAMPLE).unwrap();
        assert_eq!(p.rules().len(), 3);
        assert_eq!(
            p.rules()[1].algorithm,
            Algorithm::TokenBucket { capacity: 20, refill_rate: 5.0 }
        );
        assert_eq!(p.rules()[2].matches["method"], vec!["POST".to_string()]);
        assert_eq!(p.rules()[2].on_backend_error, Some(FailureMode::Deny));
        // JSON round trip gives the same policy.
        let again = Policy::from_json_str(&p.to_value().to_string()).unwrap();
        assert_eq!(p, again);
    }

    fn err(text: &str) -> String {
        let e = Policy::from_str_any(text).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidPolicy);
        e.message().to_string()
    }

    #[test]
    fn every_bad_field_is_named() {
        let cases: &[(&str, &str)] = &[
            (r#"{"rules":[{"name":"a","key":"k","limit":0,"window":"1m"}]}"#, "limit"),
            (r#"{"rules":[{"name":"a","key":"k","limit":-3,"window":"1m"}]}"#, "limit"),
            (r#"{"rules":[{"name":"a","key":"k","limit":1.5,"window":"1m"}]}"#, "limit"),
            (r#"{"rules":[{"name":"a","key":"k","limit":5,"window":"0s"}]}"#, "window"),
            (r#"{"rules":[{"name":"a","key":"k","limit":5,"window":"5 years"}]}"#, "window"),
            (r#"{"rules":[{"name":"a","key":"k","limit":5}]}"#, "window"),
            (r#"{"rules":[{"name":"a","key":"k","algorithm":"leaky","limit":5,"window":"1s"}]}"#, "algorithm"),
            (r#"{"rules":[{"name":"a","key":"k","algorithm":"token_bucket","capacity":5,"refill_rate":0}]}"#, "refill_rate"),
            (r#"{"rules":[{"name":"a","key":"k","algorithm":"token_bucket","capacity":5,"refill_rate":-1}]}"#, "refill_rate"),
            (r#"{"rules":[{"name":"a","key":"k","algorithm":"token_bucket","capacity":0,"refill_rate":1}]}"#, "capacity"),
            (r#"{"rules":[{"name":"a","key":"k","algorithm":"token_bucket","capacity":5,"refill_rate":1,"window":"1s"}]}"#, "window"),
            (r#"{"rules":[{"name":"","key":"k","limit":5,"window":"1s"}]}"#, "name"),
            (r#"{"rules":[{"name":"a b","key":"k","limit":5,"window":"1s"}]}"#, "name"),
            (r#"{"rules":[{"key":"k","limit":5,"window":"1s"}]}"#, "name"),
            (r#"{"rules":[{"name":"a","limit":5,"window":"1s"}]}"#, "key"),
            (r#"{"rules":[{"name":"a","key":"ip:{ip","limit":5,"window":"1s"}]}"#, "key"),
            (r#"{"rules":[{"name":"a","key":"ip:{}","limit":5,"window":"1s"}]}"#, "key"),
            (r#"{"rules":[{"name":"a","key":"k","limit":5,"window":"1s","colour":"red"}]}"#, "colour"),
            (r#"{"rules":[{"name":"a","key":"k","limit":5,"window":"1s","shadow":"yes"}]}"#, "shadow"),
            (r#"{"rules":[{"name":"a","key":"k","limit":5,"window":"1s","match":{"route":5}}]}"#, "match.route"),
            (r#"{"rules":[{"name":"a","key":"k","limit":5,"window":"1s","match":{"route":[]}}]}"#, "match.route"),
            (r#"{"rules":[{"name":"a","key":"k","limit":5,"window":"1s","on_backend_error":"panic"}]}"#, "on_backend_error"),
            (r#"{"rules":[{"name":"a","key":"k","limit":5,"window":"1s"},{"name":"a","key":"k","limit":5,"window":"1s"}]}"#, "unique"),
            (r#"{"rules":[]}"#, "rules"),
            (r#"{"rulez":[]}"#, "rulez"),
            (r#"{"timeout":"0ms","rules":[{"name":"a","key":"k","limit":5,"window":"1s"}]}"#, "timeout"),
            (r#"{"prefix":"a{b}","rules":[{"name":"a","key":"k","limit":5,"window":"1s"}]}"#, "prefix"),
            (r#"{"rules":[{"name":"a","key":"k","limit":5,"window":"1s"}"#, "JSON"),
            ("[[rules]]\nname = \"a\"\nkey = \"k\"\nlimit = 5\nwindow = \n", "TOML"),
            ("[[rules]]\nname = \"a\"\nkey = \"k\"\nlimit = 5\nwindow = \"1s\"\nburst = 3\n", "burst"),
        ];
        for (text, field) in cases {
            let m = err(text);
            assert!(m.contains(field), "message {m:?} for {text} should name {field}");
        }
    }

    #[test]
    fn concurrency_and_exempt_parse_and_round_trip() {
        let p = Policy::from_toml_str(
            "[[rules]]\nname = \"jobs\"\nkey = \"u:{user}\"\nalgorithm = \"concurrency\"\nlimit = 3\nlease = \"30s\"\n\
             exempt = { ip = [\"10.0.0.0/8\"], api_key = \"healthcheck\" }\n",
        )
        .unwrap();
        let r = &p.rules()[0];
        assert_eq!(r.algorithm, Algorithm::Concurrency { limit: 3, lease: Duration::from_secs(30) });
        assert_eq!((r.algorithm.limit(), r.algorithm.window()), (3, Duration::from_secs(30)));
        assert_eq!(r.exempt["api_key"], ["healthcheck"]);
        let again = Policy::from_json_str(&p.to_value().to_string()).unwrap();
        assert_eq!(p, again);
        // From code: the same checks.
        let tiered = Rule::concurrency("c", "k", 2, Duration::from_secs(1)).tiers(Tiers::new("plan").tier("free", TierLimit::Limit(1)));
        assert!(Policy::new(vec![tiered]).unwrap_err().message().contains("tiers"));
        let bad = Rule::concurrency("c", "k", 2, Duration::ZERO);
        assert!(Policy::new(vec![bad]).unwrap_err().message().contains("lease"));
        let cidr = Rule::sliding_window_log("w", "k", 2, Duration::from_secs(1)).exempt("ip", ["10.0.0.0/40"]);
        assert_eq!(Policy::new(vec![cidr]).unwrap_err().message(), "rules[0] (\"w\"): exempt.ip: \"10.0.0.0/40\" has an invalid prefix length (0 to 32)");
    }
}
