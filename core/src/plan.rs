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
use crate::digest::{Digest, KeyDigest};
use crate::key::{finish_key, Attributes, Direct, KeySecret, KeyTemplate, MAX_KEY_LEN};
use crate::policy::{Algorithm, FailureMode, Period, Policy, Rule};

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
    /// A concurrency limit: `limit` slots, each held at most `lease_us`.
    Lease { limit: u64, lease_us: i64, shadow: bool },
}

impl RuleArgs {
    pub fn shadow(&self) -> bool {
        match *self {
            RuleArgs::Window { shadow, .. }
            | RuleArgs::Bucket { shadow, .. }
            | RuleArgs::Counters { shadow, .. }
            | RuleArgs::Fixed { shadow, .. }
            | RuleArgs::Quota { shadow, .. }
            | RuleArgs::Lease { shadow, .. } => shadow,
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
            RuleArgs::Lease { limit, lease_us, shadow } => [
                if shadow { "L" } else { "l" }.into(),
                limit.to_string(),
                lease_us.to_string(),
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
    /// The head and the template's leading text, written at once.
    lead: String,
    /// The digest of [`CompiledRule::lead`] so far, for keys digested
    /// without being rendered (the embedded backend).
    lead_digest: KeyDigest,
    /// The template's only attribute and the text after it, when the key is
    /// its lead, one attribute and that text ([`KeyTemplate::single`]).
    single: Option<(String, String)>,
    template: KeyTemplate,
    matches: Vec<(String, Vec<String>)>,
    /// Requests the rule skips (its `exempt` table).
    exempt: crate::exempt::Exempt,
    /// True when the rule has neither a `match` nor an `exempt` table.
    plain: bool,
    pub args: RuleArgs,
    pub script_args: [String; 3],
    pub limit: u64,
    pub window: Duration,
    pub shadow: bool,
    pub failure: FailureMode,
    /// Tiers: the rule compiled once per tier (`None` for an untiered rule).
    tiers: Option<Box<CompiledTiers>>,
    /// Overrides and block, `None` when the rule has neither.
    pub ext: Option<RuleExt>,
    /// Units reserved in process (`reserve`), for a network backend.
    pub reserve: Option<crate::policy::Reserve>,
}

/// One rule (or one tier of a rule) compiled for the hot path.
fn compile_rule(policy: &Policy, index: usize, rule: &Rule, algorithm: Algorithm, template: &KeyTemplate) -> CompiledRule {
    let args = match algorithm {
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
        Algorithm::Concurrency { limit, lease } => RuleArgs::Lease {
            limit,
            lease_us: lease.as_micros() as i64,
            shadow: rule.shadow,
        },
    };
    let ext = (rule.overrides || rule.block.is_some()).then(|| RuleExt {
        overrides: rule.overrides,
        max_override: crate::policy::tiers::max_limit(&algorithm),
        block: rule.block.map(|b| BlockArgs {
            duration_us: b.duration.as_micros() as i64,
            factor: b.factor,
            max_us: b.max.as_micros() as i64,
            period_us: b.period.as_micros() as i64,
        }),
    });
    let lead = format!("{}{}:{}", policy.prefix, rule.name, template.lead());
    let mut lead_digest = KeyDigest::new();
    lead_digest.write(lead.as_bytes());
    CompiledRule {
        index,
        name: RuleName::new(&rule.name),
        head: format!("{}{}:", policy.prefix, rule.name),
        lead,
        lead_digest,
        template: template.clone(),
        matches: rule.matches.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        exempt: crate::exempt::Exempt::compile(&rule.exempt),
        plain: rule.matches.is_empty() && rule.exempt.is_empty(),
        single: template.single().map(|(a, t)| (a.to_string(), t.to_string())),
        script_args: args.script_args(),
        args,
        limit: algorithm.limit(),
        window: algorithm.window(),
        shadow: rule.shadow,
        failure: rule.on_backend_error.unwrap_or(policy.on_backend_error),
        tiers: None,
        ext,
        reserve: rule.reserve,
    }
}

/// A rule's tiers, each compiled as a rule of its own (same name, index
/// and key; its own limit).
#[derive(Debug)]
pub(crate) struct CompiledTiers {
    attribute: String,
    by_value: Vec<(String, CompiledRule)>,
    default: Option<CompiledRule>,
}

/// A block in backend units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BlockArgs {
    pub duration_us: i64,
    pub factor: f64,
    pub max_us: i64,
    pub period_us: i64,
}

/// What a rule reads and writes beyond its own key: an override, a block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RuleExt {
    pub overrides: bool,
    /// The largest limit an override may set.
    pub max_override: u64,
    pub block: Option<BlockArgs>,
}

/// The keys of one applicable rule's extensions, in the backend's form.
#[derive(Debug, Clone)]
pub(crate) struct PlanExt<K> {
    /// The rule's position in the plan.
    pub at: usize,
    pub ext: RuleExt,
    /// Where an override of this key is stored (when the rule takes them).
    pub override_key: Option<K>,
    /// Where this key's block is stored (when the rule blocks).
    pub block_key: Option<K>,
}

/// The suffix of the key an override of a rule's key is stored under.
pub(crate) const OVERRIDE_SUFFIX: &str = "#o";
/// The suffix of the key a block of a rule's key is stored under.
pub(crate) const BLOCK_SUFFIX: &str = "#b";

/// A key stored beside a rule's key, in the same Redis Cluster slot, and
/// under the policy's prefix (so a key pattern such as `~throttlegate:*`
/// in an ACL covers it): `<key><suffix>` when the key has a `{hash tag}`,
/// else `<head><suffix>{<key>}`, the whole key as the tag (`head` is the
/// rule's `<prefix><name>:`). `#` appears in no rendered key but after the
/// `:` of a hashed one, so these never collide with a rule's key.
pub(crate) fn side_key(head: &str, key: &str, suffix: &str) -> String {
    let tagged = key
        .find('{')
        .and_then(|open| key[open + 1..].find('}'))
        .is_some_and(|len| len > 0);
    if tagged {
        format!("{key}{suffix}")
    } else {
        format!("{head}{suffix}{{{key}}}")
    }
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
    /// The cost of every rule (the largest when `costs` is set).
    pub cost: u64,
    /// Each rule's own cost, in plan order, when they differ or one is 0 (a
    /// check over several items, [`Rules::plan_items`]); `None`: every rule
    /// takes `cost`. A rule of cost 0 is decided as a request of cost 1
    /// would be, and records nothing.
    pub costs: Option<SmallVec<[u64; 4]>>,
    /// The caller's id for this call; `None` means a random one is made
    /// when the call goes over the network.
    pub call_id: Option<&'a str>,
    /// The overrides and blocks of the applicable rules that have them
    /// (empty for every other plan, and then no allocation: a list kept
    /// out of line keeps the plan small to move).
    pub ext: Vec<PlanExt<K>>,
    /// The lease id the slots of its concurrency rules are taken under
    /// (`None` when none applies): the call id when given, else a random one.
    pub lease: Option<String>,
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
                let mut compiled = compile_rule(policy, index, rule, rule.algorithm, template);
                compiled.tiers = rule.tiers.as_ref().map(|t| {
                    let variant = |limit| {
                        let algorithm = crate::policy::tiers::with_limit(rule.algorithm, limit).unwrap_or(rule.algorithm);
                        compile_rule(policy, index, rule, algorithm, template)
                    };
                    Box::new(CompiledTiers {
                        attribute: t.attribute.clone(),
                        by_value: t.limits.iter().map(|(v, l)| (v.clone(), variant(*l))).collect(),
                        default: t.default.map(variant),
                    })
                });
                compiled
            })
            .collect();
        Rules { rules, secret: secret.map(KeySecret::new) }
    }

    /// Where a rule of a plan of this policy sits: its index, and which of
    /// its tiers it is (`None` for the rule itself; the position among the
    /// tiers by value, or one past them for the default). A plan is kept as
    /// these while it waits for the network, and rebuilt with [`Rules::located`].
    pub fn locate(&self, planned: &CompiledRule) -> (usize, Option<usize>) {
        let rule = &self.rules[planned.index];
        let tier = rule.tiers.as_ref().and_then(|t| {
            t.by_value
                .iter()
                .position(|(_, r)| std::ptr::eq(r, planned))
                .or_else(|| t.default.as_ref().filter(|d| std::ptr::eq(*d, planned)).map(|_| t.by_value.len()))
        });
        (planned.index, tier)
    }

    /// The rule (or tier of a rule) at a place [`Rules::locate`] gave.
    pub fn located(&self, (index, tier): (usize, Option<usize>)) -> &CompiledRule {
        let rule = &self.rules[index];
        match (tier, &rule.tiers) {
            (Some(i), Some(t)) => t.by_value.get(i).map(|(_, r)| r).or(t.default.as_ref()).unwrap_or(rule),
            _ => rule,
        }
    }

    /// The rule names, in policy order.
    pub fn names(&self) -> Vec<RuleName> {
        self.rules.iter().map(|r| r.name).collect()
    }

    /// Whether any rule is reserved (`reserve`).
    pub fn any_reserved(&self) -> bool {
        self.rules.iter().any(|r| r.reserve.is_some())
    }

    /// Which rules are reserved (`reserve`), in policy order.
    pub fn reserved(&self) -> Vec<bool> {
        self.rules.iter().map(|r| r.reserve.is_some()).collect()
    }

    /// The rule as it applies to these attributes: itself, or the tier
    /// their value picks; `None` when no tier (and no default) fits.
    fn tier_of<'r>(rule: &'r CompiledRule, attrs: &dyn Attributes) -> Option<&'r CompiledRule> {
        let Some(t) = &rule.tiers else { return Some(rule) };
        let value = attrs.get_attr(&t.attribute);
        value
            .and_then(|v| t.by_value.iter().find(|(name, _)| name == v).map(|(_, r)| r))
            .or(t.default.as_ref())
    }

    /// Write the rule's key for these attributes into `key` (cleared first);
    /// false when the rule does not apply.
    fn render_key(&self, rule: &CompiledRule, attrs: &dyn Attributes, key: &mut String) -> bool {
        if Self::tier_of(rule, attrs).is_none() {
            return false;
        }
        self.render_any(rule, attrs, key)
    }

    /// The rule's key, when its `match` fits, whatever its tiers.
    fn render_any(&self, rule: &CompiledRule, attrs: &dyn Attributes, key: &mut String) -> bool {
        if !Self::selects(rule, attrs) {
            return false;
        }
        key.clear();
        key.push_str(&rule.lead);
        if !rule.template.render_after_lead(attrs, self.secret.as_ref(), key) {
            return false;
        }
        if key.len() > MAX_KEY_LEN {
            *key = finish_key(&rule.head, &key[rule.head.len()..]);
        }
        true
    }

    /// Whether `rule`'s `match` and `exempt` tables let these attributes
    /// through (its key may still lack an attribute).
    fn selects(rule: &CompiledRule, attrs: &dyn Attributes) -> bool {
        if rule.plain {
            return true;
        }
        for (attr, values) in &rule.matches {
            match attrs.get_attr(attr) {
                Some(v) if values.iter().any(|x| x == v) => {}
                _ => return false,
            }
        }
        rule.exempt.is_empty() || !rule.exempt.covers(attrs)
    }

    /// The rule (or its tier) when it applies to these attributes, its key
    /// rendered into `key`; an error for a cost it could never admit.
    fn applies<'r>(&self, rule: &'r CompiledRule, attrs: &dyn Attributes, cost: u64, key: &mut String) -> Result<Option<&'r CompiledRule>> {
        let Some(rule) = Self::tier_of(rule, attrs) else { return Ok(None) };
        if !self.render_any(rule, attrs, key) {
            return Ok(None);
        }
        // A rule that takes overrides is checked where its override is read.
        if cost > rule.limit && !rule.ext.is_some_and(|e| e.overrides) {
            return Err(Error::invalid_argument(format!(
                "cost: {cost} is more than rule {:?} allows ({}); such a request could never pass",
                &*rule.name, rule.limit
            )));
        }
        Ok(Some(rule))
    }

    /// The policy's only rule, when it is the commonest shape: one rule,
    /// without tiers, overrides or blocks (a `match` is fine), which a
    /// check can decide without a [`Plan`].
    pub fn lone(&self) -> Option<&CompiledRule> {
        match &self.rules[..] {
            [rule] if rule.tiers.is_none() && rule.ext.is_none() && !rule.is_lease() => Some(rule),
            _ => None,
        }
    }

    /// [`Rules::plan`] of the [`Rules::lone`] rule without a call id: its
    /// key in the backend's form, `None` when it does not apply, and the
    /// same errors.
    pub fn lone_key<K>(&self, rule: &CompiledRule, attrs: &dyn Attributes, cost: u64, key: impl FnOnce(&str) -> K) -> Result<Option<K>> {
        if cost == 0 {
            return Err(Error::invalid_argument("cost: must be at least 1"));
        }
        KEY_BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            Ok(self.applies(rule, attrs, cost, &mut buf)?.map(|_| key(&buf)))
        })
    }

    /// [`Rules::lone_key`] in the embedded backend's form, the key's
    /// [`KeyDigest`]: taken from the rule's lead and the attribute values
    /// without rendering the key when no value needs an escape, the key
    /// is short enough to be kept as it is and no secret hashes the values;
    /// rendered and digested otherwise. The same answer and errors.
    pub fn lone_digest(&self, rule: &CompiledRule, attrs: &dyn Attributes, cost: u64) -> Result<Option<Digest>> {
        // Anything but the plain case (a cost to refuse, a secret, tiers) is
        // lone_key's, which also gives the errors.
        if cost == 0 || cost > rule.limit || self.secret.is_some() || rule.tiers.is_some() {
            return self.lone_key(rule, attrs, cost, KeyDigest::of);
        }
        if !Self::selects(rule, attrs) {
            return Ok(None);
        }
        if let Some((attr, tail)) = &rule.single {
            // One attribute: its value straight after the lead.
            let Some(v) = attrs.get_attr(attr) else { return Ok(None) };
            if !crate::key::all_kept(v.as_bytes()) || rule.lead.len() + v.len() + tail.len() > MAX_KEY_LEN {
                return self.lone_key(rule, attrs, cost, KeyDigest::of);
            }
            let mut d = rule.lead_digest;
            d.write(v.as_bytes());
            if !tail.is_empty() {
                d.write(tail.as_bytes());
            }
            return Ok(Some(d.finish()));
        }
        match rule.template.digest_after_lead(attrs, rule.lead_digest, rule.lead.len()) {
            Direct::Missing => Ok(None),
            Direct::Render => self.lone_key(rule, attrs, cost, KeyDigest::of),
            Direct::Digest(d) => Ok(Some(d)),
        }
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

    /// The keys a reset deletes: every applicable rule's key and, for a
    /// rule that blocks, its block (an override stays).
    pub fn reset_keys(&self, attrs: &dyn Attributes) -> Vec<String> {
        KEY_BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            let mut keys = Vec::new();
            for rule in &self.rules {
                if self.render_key(rule, attrs, &mut buf) {
                    keys.push(buf.clone());
                    if rule.ext.is_some_and(|e| e.block.is_some()) {
                        keys.push(side_key(&rule.head, &buf, BLOCK_SUFFIX));
                    }
                }
            }
            keys
        })
    }

    /// The rule named `name` that takes overrides, and its key and override
    /// key for these attributes (its `match` and tiers aside: an override
    /// is for a key).
    pub fn override_target(&self, name: &str, attrs: &dyn Attributes) -> Result<(&CompiledRule, String, String)> {
        let rule = self.override_rule(name)?;
        if let Some(missing) = rule.template.attributes().find(|a| attrs.get_attr(a).is_none()) {
            return Err(Error::invalid_argument(format!(
                "attributes: rule {name:?} needs attribute {missing:?} (its key is made of it)"
            )));
        }
        let mut key = String::new();
        key.push_str(&rule.head);
        rule.template.render(attrs, self.secret.as_ref(), &mut key);
        if key.len() > MAX_KEY_LEN {
            key = finish_key(&rule.head, &key[rule.head.len()..]);
        }
        let side = side_key(&rule.head, &key, OVERRIDE_SUFFIX);
        Ok((rule, key, side))
    }

    /// The rule named `name` that takes overrides.
    pub fn override_rule(&self, name: &str) -> Result<&CompiledRule> {
        let rule = self
            .rules
            .iter()
            .find(|r| &*r.name == name)
            .ok_or_else(|| Error::invalid_argument(format!("rule: {name:?} is not a rule of this policy")))?;
        if !rule.ext.is_some_and(|e| e.overrides) {
            return Err(Error::invalid_argument(format!(
                "rule: {name:?} does not take overrides; set `overrides = true` on it"
            )));
        }
        Ok(rule)
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
        let mut plan = Plan { keys: SmallVec::new(), rules: SmallVec::new(), cost, costs: None, call_id, ext: Vec::new(), lease: None };
        KEY_BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            for rule in &self.rules {
                if let Some(rule) = self.applies(rule, attrs, cost, &mut buf)? {
                    if let (Some(id), Some(_)) = (call_id, rule.reserve) {
                        return Err(Error::invalid_argument(format!(
                            "call_id: rule {:?} reserves units in process (`reserve`), which a check with a call id ({id:?}) cannot use; call ids and settle are not supported with reserve",
                            &*rule.name
                        )));
                    }
                    if let Some(ext) = rule.ext {
                        plan.ext.push(PlanExt {
                            at: plan.keys.len(),
                            ext,
                            override_key: ext.overrides.then(|| key(&side_key(&rule.head, &buf, OVERRIDE_SUFFIX))),
                            block_key: ext.block.map(|_| key(&side_key(&rule.head, &buf, BLOCK_SUFFIX))),
                        });
                    }
                    plan.keys.push(key(&buf));
                    plan.rules.push(rule);
                }
            }
            Ok::<(), Error>(())
        })?;
        if plan.rules.iter().any(|r| r.is_lease()) {
            plan.lease = Some(call_id.map_or_else(crate::runtime::random_lease_id, str::to_string));
        }
        Ok(plan)
    }
}

impl Rules {
    /// The plan of a check over several items, each with its attributes and
    /// its cost (0: decided as a request of cost 1 would be, never
    /// recorded): every rule that
    /// applies to an item, on the key that item gives it, at that item's
    /// cost; a key that several items reach is one entry at the sum of
    /// their costs. Returns the plan (its `costs` set when they differ) and,
    /// per item, the plan positions it reached. A concurrency rule is
    /// refused (its slots would have no lease to release), and so is a rule
    /// that reserves units (`reserve`) when the costs differ.
    pub fn plan_items<'a, K: PartialEq>(
        &'a self,
        items: &[(&dyn Attributes, u64)],
        mut key: impl FnMut(&str) -> K,
    ) -> Result<(Plan<'a, K>, Reached)> {
        let mut plan = Plan { keys: SmallVec::new(), rules: SmallVec::new(), cost: 0, costs: None, call_id: None, ext: Vec::new(), lease: None };
        let mut costs: SmallVec<[u64; 4]> = SmallVec::new();
        let mut reached = Vec::with_capacity(items.len());
        KEY_BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            for (n, &(attrs, cost)) in items.iter().enumerate() {
                let mut at: SmallVec<[usize; 4]> = SmallVec::new();
                for rule in &self.rules {
                    let Some(rule) = self.applies(rule, attrs, cost, &mut buf).map_err(|e| item_error(n, e))? else { continue };
                    if rule.is_lease() {
                        return Err(Error::invalid_argument(format!(
                            "items[{n}]: rule {:?} is a concurrency limit, whose slots a check over several items cannot hold (there is no lease to release)",
                            &*rule.name
                        )));
                    }
                    let k = key(&buf);
                    if let Some(i) = plan.keys.iter().position(|x| *x == k) {
                        costs[i] += cost;
                        if !at.contains(&i) {
                            at.push(i);
                        }
                        continue;
                    }
                    if let Some(ext) = rule.ext {
                        plan.ext.push(PlanExt {
                            at: plan.keys.len(),
                            ext,
                            override_key: ext.overrides.then(|| key(&side_key(&rule.head, &buf, OVERRIDE_SUFFIX))),
                            block_key: ext.block.map(|_| key(&side_key(&rule.head, &buf, BLOCK_SUFFIX))),
                        });
                    }
                    at.push(plan.keys.len());
                    plan.keys.push(k);
                    plan.rules.push(rule);
                    costs.push(cost);
                }
                reached.push(at);
            }
            Ok::<(), Error>(())
        })?;
        for (rule, &cost) in plan.rules.iter().zip(&costs) {
            if cost > rule.limit && !rule.ext.is_some_and(|e| e.overrides) {
                return Err(Error::invalid_argument(format!(
                    "cost: the items reaching one key of rule {:?} cost {cost} together, more than it allows ({}); such a request could never pass",
                    &*rule.name, rule.limit
                )));
            }
        }
        plan.cost = costs.iter().copied().max().unwrap_or(0);
        if costs.iter().any(|&c| c != plan.cost || c == 0) {
            if let Some(rule) = plan.rules.iter().find(|r| r.reserve.is_some()) {
                return Err(Error::invalid_argument(format!(
                    "items: rule {:?} reserves units in process (`reserve`), which a check whose items cost differently (or 0) cannot use",
                    &*rule.name
                )));
            }
            plan.costs = Some(costs);
        }
        Ok((plan, reached))
    }
}

/// Per item of a check over several items, the plan positions it reached.
pub(crate) type Reached = Vec<SmallVec<[usize; 4]>>;

/// An error about item `n` of a check over several items, named so.
fn item_error(n: usize, e: Error) -> Error {
    Error::new(e.kind(), format!("items[{n}].{}", e.message()))
}

/// The decision from the backend's per-rule outcomes (in plan order).
pub(crate) fn decide(rules: &[&CompiledRule], outcomes: &[Outcome]) -> Decision {
    let results: crate::decision::RuleResults = rules
        .iter()
        .zip(outcomes)
        .map(|(rule, o)| result(rule, o))
        .collect();
    Decision::from_results(results, false)
}

/// One rule's result from its outcome.
pub(crate) fn result(rule: &CompiledRule, o: &Outcome) -> RuleResult {
    RuleResult {
        rule: rule.name,
        index: rule.index,
        allowed: o.allowed,
        shadow: rule.shadow,
        limit: if o.limit > 0 { o.limit } else { rule.limit },
        remaining: o.remaining,
        retry_after: Duration::from_micros(o.retry_after_us.max(0) as u64),
        reset_after: Duration::from_micros(o.reset_after_us.max(0) as u64),
        window: rule.window,
    }
}

impl<K> Plan<'_, K> {
    /// The cost of the rule at `i` (plan order).
    pub fn cost_at(&self, i: usize) -> u64 {
        self.costs.as_ref().map_or(self.cost, |c| c[i])
    }
}

impl CompiledRule {
    /// True for a concurrency rule (its slots are released, not settled).
    pub fn is_lease(&self) -> bool {
        matches!(self.args, RuleArgs::Lease { .. })
    }

    /// The attributes of its key template.
    pub fn key_attributes(&self) -> Vec<String> {
        self.template.attributes().map(str::to_string).collect()
    }

    /// The head of every key of this rule (`<prefix><name>:`).
    pub fn head(&self) -> &str {
        &self.head
    }
}

#[cfg(test)]
mod side_key_tests {
    use super::*;
    use crate::backend::cluster::slot;

    #[test]
    fn side_keys_share_the_slot_and_the_prefix() {
        for key in ["tg:r:ip:1.2.3.4", "tg:r:{tenant:acme}:user:7", "tg:r:#0123456789abcdef0123456789abcdef"] {
            let side = side_key("tg:r:", key, OVERRIDE_SUFFIX);
            assert_eq!(slot(&side), slot(key), "{side}");
            assert!(side.starts_with("tg:r:"), "{side}");
            assert_ne!(side, key);
        }
        assert_eq!(side_key("tg:r:", "tg:r:ip:1", BLOCK_SUFFIX), "tg:r:#b{tg:r:ip:1}");
        assert_eq!(side_key("tg:r:", "tg:r:{t}:u", BLOCK_SUFFIX), "tg:r:{t}:u#b");
    }
}

#[cfg(test)]
mod lone_digest_tests {
    use super::*;

    /// The digest taken from a key's parts is the digest of the rendered
    /// key, for every shape of template and value, and the same answer
    /// (does not apply, error) as rendering.
    #[test]
    fn a_key_digested_from_its_parts_is_the_rendered_keys_digest() {
        let long = "x".repeat(200);
        let values: [&str; 9] = ["10.0.0.1", "", "a", "::1", "50%", "{t}", "ümlaut", "abcdefghijklmnopqrstuvwxyz0123", &long];
        let templates = ["ip:{ip}", "{ip}", "{ip}:tail", "{{t:{ip}}}:u:{ip}", "a:{ip}:b:{user}:c", "global"];
        for template in templates {
            let rules = [
                Rule::token_bucket("per-ip", template, 10, 1.0),
                Rule::sliding_window_log("w", template, 10, Duration::from_secs(1)).matching("route", ["/a"]),
                Rule::fixed_window("f", template, 10, Duration::from_secs(1)).exempt("ip", ["10.0.0.1"]),
            ];
            for rule in rules {
                let policy = Policy::new(vec![rule]).unwrap();
                let compiled = Rules::compile(&policy, None);
                let lone = compiled.lone().unwrap();
                for ip in values {
                    for user in [Some("bob"), Some("a:b"), None] {
                        for route in ["/a", "/b"] {
                            let mut attrs = vec![("ip", ip), ("route", route)];
                            if let Some(u) = user {
                                attrs.push(("user", u));
                            }
                            for cost in [0, 1, 11] {
                                let direct = compiled.lone_digest(lone, &attrs, cost).map_err(|e| e.to_string());
                                let rendered = compiled.lone_key(lone, &attrs, cost, KeyDigest::of).map_err(|e| e.to_string());
                                assert_eq!(direct, rendered, "{template} {attrs:?} {cost}");
                            }
                        }
                    }
                }
            }
        }
        // With a secret, the values are hashed: rendered, as before.
        let policy = Policy::new(vec![Rule::token_bucket("k", "key:{k}", 10, 1.0)]).unwrap();
        let compiled = Rules::compile(&policy, Some(b"0123456789abcdef"));
        let lone = compiled.lone().unwrap();
        let attrs = [("k", "sk_live")];
        assert_eq!(
            compiled.lone_digest(lone, &attrs, 1).unwrap(),
            compiled.lone_key(lone, &attrs, 1, KeyDigest::of).unwrap()
        );
    }
}
