//! The request plan: a policy's rules compiled once, and for each check the
//! applicable rules with their keys, validated in one place for every backend.
//!
//! A check goes: attributes -> [`Rules::plan`] (match, render keys, validate
//! cost and call id) -> a backend decides the [`Plan`] -> [`Rules::decide`]
//! turns the per-rule outcomes into a [`Decision`].

use std::cell::RefCell;
use std::time::Duration;

use smallvec::SmallVec;

use crate::algo::Outcome;
use crate::decision::{Decision, RuleName, RuleResult};
use crate::error::{Error, Result};
use crate::key::{finish_key, Attributes, KeySecret, KeyTemplate, MAX_KEY_LEN};
use crate::policy::{Algorithm, FailureMode, Period, Policy};

/// Check (consume when every rule admits) or peek (never writes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Check,
    Peek,
}

/// A rule's algorithm parameters in backend units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum RuleArgs {
    Window { limit: u64, window_us: i64, shadow: bool },
    Bucket { capacity: u64, rate: f64, shadow: bool },
    /// A sliding window of counters.
    Counters { limit: u64, window_us: i64, precision_us: i64, shadow: bool },
    /// A fixed window.
    Fixed { limit: u64, window_us: i64, shadow: bool },
    /// A calendar quota, `offset_s` seconds east of UTC.
    Quota { limit: u64, period: Period, offset_s: i64, shadow: bool },
}

impl RuleArgs {
    pub fn shadow(&self) -> bool {
        match *self {
            RuleArgs::Window { shadow, .. }
            | RuleArgs::Bucket { shadow, .. }
            | RuleArgs::Counters { shadow, .. }
            | RuleArgs::Fixed { shadow, .. }
            | RuleArgs::Quota { shadow, .. } => shadow,
        }
    }

    /// The three script arguments of this rule: the algorithm code (upper
    /// case for a shadow rule) and its two parameters.
    fn script_args(&self) -> [String; 3] {
        match *self {
            RuleArgs::Window { limit, window_us, shadow } => [
                if shadow { "W" } else { "w" }.into(),
                limit.to_string(),
                window_us.to_string(),
            ],
            // `{}` prints the shortest text that reads back as the same f64,
            // which is what Lua's tonumber gets.
            RuleArgs::Bucket { capacity, rate, shadow } => {
                [if shadow { "B" } else { "b" }.into(), capacity.to_string(), format!("{rate}")]
            }
            RuleArgs::Counters { limit, window_us, precision_us, shadow } => [
                if shadow { "K" } else { "k" }.into(),
                limit.to_string(),
                format!("{window_us}:{precision_us}"),
            ],
            RuleArgs::Fixed { limit, window_us, shadow } => [
                if shadow { "F" } else { "f" }.into(),
                limit.to_string(),
                window_us.to_string(),
            ],
            RuleArgs::Quota { limit, period, offset_s, shadow } => [
                if shadow { "Q" } else { "q" }.into(),
                limit.to_string(),
                format!("{}:{offset_s}", period.code()),
            ],
        }
    }
}

/// A rule prepared for the hot path: key head, template, arguments.
#[derive(Debug)]
pub(crate) struct CompiledRule {
    /// The rule's position in the policy.
    pub index: usize,
    pub name: RuleName,
    head: String,
    template: KeyTemplate,
    matches: Vec<(String, Vec<String>)>,
    pub args: RuleArgs,
    pub script_args: [String; 3],
    pub limit: u64,
    pub window: Duration,
    pub shadow: bool,
    pub failure: FailureMode,
}

/// A policy's rules, compiled, with the key secret they render with.
#[derive(Debug)]
pub(crate) struct Rules {
    rules: Vec<CompiledRule>,
    secret: Option<KeySecret>,
}

/// The applicable rules of one check, in policy order, with their keys
/// (strings for Redis, digests for the embedded backend).
pub(crate) struct Plan<'a, K> {
    pub keys: SmallVec<[K; 4]>,
    pub rules: SmallVec<[&'a CompiledRule; 4]>,
    pub cost: u64,
    /// The caller's id for this call; `None` means a random one is made
    /// when the call goes over the network.
    pub call_id: Option<&'a str>,
}

thread_local! {
    /// A reused buffer for rendering keys.
    static KEY_BUF: RefCell<String> = RefCell::new(String::with_capacity(MAX_KEY_LEN));
}

/// A call id: 1-64 characters from `A-Z a-z 0-9 _ -`.
pub(crate) fn validate_call_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return Err(Error::invalid_argument(format!(
            "call_id: {id:?} must be 1-64 characters from A-Z a-z 0-9 _ -"
        )));
    }
    Ok(())
}

impl Rules {
    /// Compile `policy` (with its overrides already applied).
    pub fn compile(policy: &Policy, secret: Option<&[u8]>) -> Rules {
        let rules = policy
            .rules
            .iter()
            .zip(&policy.templates)
            .enumerate()
            .map(|(index, (rule, template))| {
                let args = match rule.algorithm {
                    Algorithm::SlidingWindowLog { limit, window } => RuleArgs::Window {
                        limit,
                        window_us: window.as_micros() as i64,
                        shadow: rule.shadow,
                    },
                    Algorithm::TokenBucket { capacity, refill_rate } => RuleArgs::Bucket {
                        capacity,
                        rate: refill_rate,
                        shadow: rule.shadow,
                    },
                    Algorithm::SlidingWindow { limit, window, precision } => RuleArgs::Counters {
                        limit,
                        window_us: window.as_micros() as i64,
                        precision_us: precision.as_micros() as i64,
                        shadow: rule.shadow,
                    },
                    Algorithm::FixedWindow { limit, window } => RuleArgs::Fixed {
                        limit,
                        window_us: window.as_micros() as i64,
                        shadow: rule.shadow,
                    },
                    Algorithm::Quota { limit, period, utc_offset_minutes } => RuleArgs::Quota {
                        limit,
                        period,
                        offset_s: utc_offset_minutes as i64 * 60,
                        shadow: rule.shadow,
                    },
                };
                CompiledRule {
                    index,
                    name: RuleName::new(&rule.name),
                    head: format!("{}{}:", policy.prefix, rule.name),
                    template: template.clone(),
                    matches: rule.matches.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                    script_args: args.script_args(),
                    args,
                    limit: rule.algorithm.limit(),
                    window: rule.algorithm.window(),
                    shadow: rule.shadow,
                    failure: rule.on_backend_error.unwrap_or(policy.on_backend_error),
                }
            })
            .collect();
        Rules { rules, secret: secret.map(KeySecret::new) }
    }

    /// The rule names, in policy order.
    pub fn names(&self) -> Vec<RuleName> {
        self.rules.iter().map(|r| r.name).collect()
    }

    /// Write the rule's key for these attributes into `key` (cleared first);
    /// false when the rule does not apply.
    fn render_key(&self, rule: &CompiledRule, attrs: &dyn Attributes, key: &mut String) -> bool {
        for (attr, values) in &rule.matches {
            match attrs.get_attr(attr) {
                Some(v) if values.iter().any(|x| x == v) => {}
                _ => return false,
            }
        }
        key.clear();
        key.push_str(&rule.head);
        if !rule.template.render(attrs, self.secret.as_ref(), key) {
            return false;
        }
        if key.len() > MAX_KEY_LEN {
            *key = finish_key(&rule.head, &key[rule.head.len()..]);
        }
        true
    }

    /// The rules at these positions in the policy (those of a settle's
    /// ticket); positions beyond the policy are skipped.
    pub fn by_index(&self, indices: &[usize]) -> SmallVec<[&CompiledRule; 4]> {
        indices.iter().filter_map(|&i| self.rules.get(i)).collect()
    }

    /// The keys this request touches, one per applicable rule, in policy order.
    pub fn keys(&self, attrs: &dyn Attributes) -> Vec<String> {
        KEY_BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            let mut keys = Vec::new();
            for rule in &self.rules {
                if self.render_key(rule, attrs, &mut buf) {
                    keys.push(buf.clone());
                }
            }
            keys
        })
    }

    /// The plan of one check or peek: a cost of at least 1, a well-formed
    /// call id, and a cost that no applicable rule makes impossible; each
    /// applicable rule's key, rendered into a reused buffer and handed to
    /// `key` (which keeps it in the backend's form).
    pub fn plan<'a, K>(
        &'a self,
        attrs: &dyn Attributes,
        cost: u64,
        call_id: Option<&'a str>,
        mut key: impl FnMut(&str) -> K,
    ) -> Result<Plan<'a, K>> {
        if cost == 0 {
            return Err(Error::invalid_argument("cost: must be at least 1"));
        }
        if let Some(id) = call_id {
            validate_call_id(id)?;
        }
        let mut plan = Plan { keys: SmallVec::new(), rules: SmallVec::new(), cost, call_id };
        KEY_BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            for rule in &self.rules {
                if self.render_key(rule, attrs, &mut buf) {
                    if cost > rule.limit {
                        return Err(Error::invalid_argument(format!(
                            "cost: {cost} is more than rule {:?} allows ({}); such a request could never pass",
                            &*rule.name, rule.limit
                        )));
                    }
                    plan.keys.push(key(&buf));
                    plan.rules.push(rule);
                }
            }
            Ok(())
        })?;
        Ok(plan)
    }
}

/// The decision from the backend's per-rule outcomes (in plan order).
pub(crate) fn decide(rules: &[&CompiledRule], outcomes: &[Outcome]) -> Decision {
    let results = rules
        .iter()
        .zip(outcomes)
        .map(|(rule, o)| RuleResult {
            rule: rule.name,
            index: rule.index,
            allowed: o.allowed,
            shadow: rule.shadow,
            limit: rule.limit,
            remaining: o.remaining,
            retry_after: Duration::from_micros(o.retry_after_us.max(0) as u64),
            reset_after: Duration::from_micros(o.reset_after_us.max(0) as u64),
            window: rule.window,
        })
        .collect();
    Decision::from_results(results, false)
}
