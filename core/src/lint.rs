//! `throttlegate lint`: mistakes a valid policy can still hold.
//!
//! [`lint`] looks at a parsed [`Policy`] and reports [`Finding`]s, errors
//! (the policy does not do what it says) and warnings (it probably does not
//! do what was meant). [`lint_file`] and [`lint_text`] report a policy that
//! does not parse as one error. The command line prints them; every other
//! front end can call the same functions.
//!
//! | code | severity | what |
//! | --- | --- | --- |
//! | `invalid_policy` | error | the policy does not parse or validate |
//! | `never_applies` | error | the rule needs an attribute the application never sends ([`LintOptions::attributes`]) |
//! | `not_in_request_model` | warning | without [`LintOptions::attributes`]: the rule needs an attribute that no HTTP integration provides by itself (the request model, [`crate::REQUEST_MODEL`], and the policy's `[attributes]`), so it applies only where the application passes it |
//! | `bare_duration` | warning | a duration under a second written as a bare number (`window = 60` is 60 ms): write it with a unit |
//! | `cost_never_passes` | error | the largest cost the application sends ([`LintOptions::cost`]) is above the rule's limit, so such checks are refused |
//! | `shadowed` | warning | another rule applies to every request this one does, counts them under a key at least as coarse, and is at least as strict: this rule never denies on its own |
//! | `one_slot` | warning | the key's `{{hash tag}}` holds no attribute, so every key of the rule is in one Redis Cluster slot |
//! | `never_denies` | warning | every rule is in shadow mode |
//! | `duplicate_match_value` | warning | a `match` list names the same value twice |

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{json, Value};

use crate::plan::Rules;
use crate::policy::{Algorithm, Policy, Rule};

/// How bad a [`Finding`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// Probably not what was meant.
    Warning,
    /// The policy does not do what it says.
    Error,
}

impl Severity {
    /// `"warning"` or `"error"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }
}

/// One thing [`lint`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Error or warning.
    pub severity: Severity,
    /// A stable identifier (see the module documentation's table).
    pub code: &'static str,
    /// The rule concerned, if one is.
    pub rule: Option<String>,
    /// What is wrong, for people.
    pub message: String,
}

impl Finding {
    fn new(severity: Severity, code: &'static str, rule: Option<&str>, message: String) -> Finding {
        Finding { severity, code, rule: rule.map(str::to_string), message }
    }

    /// `{"severity", "code", "rule", "message"}`.
    pub fn to_json(&self) -> Value {
        json!({ "severity": self.severity.as_str(), "code": self.code, "rule": self.rule, "message": self.message })
    }
}

impl std::fmt::Display for Finding {
    /// `error[code] rule "name": message`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.severity.as_str(), self.code)?;
        if let Some(r) = &self.rule {
            write!(f, " rule {r:?}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// What [`lint`] knows about the application, for the checks that need it.
#[derive(Debug, Clone, Default)]
pub struct LintOptions {
    /// The largest cost the application sends (checks `cost_never_passes`).
    pub cost: Option<u64>,
    /// Every attribute the application sends (checks `never_applies`).
    /// When `None`, the request model of the HTTP integrations
    /// ([`crate::REQUEST_MODEL`]) and the policy's `[attributes]` are
    /// assumed, and a rule needing another attribute is a warning
    /// (`not_in_request_model`), unless `any_attributes`.
    pub attributes: Option<Vec<String>>,
    /// Make no assumption about the attributes sent (no `never_applies`
    /// or `not_in_request_model` findings without `attributes`).
    pub any_attributes: bool,
}

/// 0 when there is nothing to report, 1 for warnings only, 2 when there is
/// an error: what `throttlegate lint` exits with.
pub fn exit_code(findings: &[Finding]) -> i32 {
    match findings.iter().map(|f| f.severity).max() {
        None => 0,
        Some(Severity::Warning) => 1,
        Some(Severity::Error) => 2,
    }
}

/// Lint a policy file; one `invalid_policy` error when it does not parse.
pub fn lint_file(path: impl AsRef<Path>, options: &LintOptions) -> Vec<Finding> {
    let path = path.as_ref();
    match Policy::from_file(path) {
        Ok(p) => {
            let raw = std::fs::read_to_string(path).ok().and_then(|t| raw_value(&t, path.extension().and_then(|e| e.to_str())));
            with_durations(lint(&p, options), raw.as_ref())
        }
        Err(e) => vec![Finding::new(Severity::Error, "invalid_policy", None, e.message().to_string())],
    }
}

/// Lint policy text (TOML or JSON, as [`Policy::from_str_any`] reads it).
pub fn lint_text(text: &str, options: &LintOptions) -> Vec<Finding> {
    match Policy::from_str_any(text) {
        Ok(p) => with_durations(lint(&p, options), raw_value(text, None).as_ref()),
        Err(e) => vec![Finding::new(Severity::Error, "invalid_policy", None, e.message().to_string())],
    }
}

/// The policy text as a value tree, read as its parser reads it.
fn raw_value(text: &str, ext: Option<&str>) -> Option<Value> {
    let json = match ext.map(str::to_ascii_lowercase).as_deref() {
        Some("json") => true,
        Some("toml") => false,
        _ => text.trim_start().starts_with('{'),
    };
    if json {
        serde_json::from_str(text).ok()
    } else {
        toml::from_str::<toml::Value>(text).ok().and_then(|v| serde_json::to_value(v).ok())
    }
}

/// The duration fields of a policy, top level and per rule.
const DURATION_FIELDS: &[&str] = &["window", "lease", "precision", "block", "block_max", "block_period"];

/// `findings` with a `bare_duration` warning for each duration under a
/// second written as a bare number (milliseconds), errors kept first.
fn with_durations(mut findings: Vec<Finding>, raw: Option<&Value>) -> Vec<Finding> {
    let Some(raw) = raw else { return findings };
    let bare = |field: &str, v: &Value| -> Option<String> {
        let n = v.as_u64().filter(|&n| n < 1000)?;
        Some(format!(
            "{field} = {n} is {n} milliseconds; write it with a unit: \"{n}ms\", or \"{n}s\" if seconds were meant"
        ))
    };
    if let Some(m) = raw.get("timeout").and_then(|v| bare("timeout", v)) {
        findings.push(Finding::new(Severity::Warning, "bare_duration", None, m));
    }
    for rule in raw.get("rules").and_then(Value::as_array).into_iter().flatten() {
        let name = rule.get("name").and_then(Value::as_str);
        for field in DURATION_FIELDS {
            if let Some(m) = rule.get(*field).and_then(|v| bare(field, v)) {
                findings.push(Finding::new(Severity::Warning, "bare_duration", name, m));
            }
        }
    }
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
    findings
}

/// Every finding of `policy`, errors first, then in rule order.
pub fn lint(policy: &Policy, options: &LintOptions) -> Vec<Finding> {
    let mut out = Vec::new();
    let attrs_of = |i: usize| -> BTreeSet<&str> { policy.templates[i].attributes().collect() };
    for (i, rule) in policy.rules.iter().enumerate() {
        let name = Some(rule.name.as_str());
        let model: Vec<String> = crate::http::REQUEST_MODEL
            .iter()
            .map(|a| a.to_string())
            .chain(policy.attribute_sources().iter().map(|(n, _)| n.clone()))
            .collect();
        let known = match (&options.attributes, options.any_attributes) {
            (Some(known), _) => Some(known),
            (None, false) => Some(&model),
            (None, true) => None,
        };
        if let Some(known) = known {
            let mut needed: Vec<&str> = attrs_of(i).into_iter().collect();
            needed.extend(rule.matches.keys().map(String::as_str));
            needed.sort_unstable();
            needed.dedup();
            let missing: Vec<&str> = needed.into_iter().filter(|a| !known.iter().any(|k| k == a)).collect();
            let listed = missing.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>().join(", ");
            let s = if missing.len() == 1 { "" } else { "s" };
            if missing.is_empty() {
            } else if options.attributes.is_some() {
                out.push(Finding::new(
                    Severity::Error,
                    "never_applies",
                    name,
                    format!("needs the attribute{s} {listed} which the application never sends, so it never applies"),
                ));
            } else {
                out.push(Finding::new(
                    Severity::Warning,
                    "not_in_request_model",
                    name,
                    format!(
                        "needs the attribute{s} {listed}, which no HTTP integration provides by itself (they give ip, method, route, path, host and the policy's [attributes]), \
                         so it applies only where the application passes it (an attributes function, or a header in [attributes]); \
                         --attributes lists what the application sends, --any-attributes assumes nothing"
                    ),
                ));
            }
        }
        if let Some(cost) = options.cost {
            let limit = rule.algorithm.limit();
            if cost > limit {
                out.push(Finding::new(
                    Severity::Error,
                    "cost_never_passes",
                    name,
                    format!(
                        "a check of cost {cost} is more than its {} ({limit}); such a check is refused with invalid_argument wherever this rule applies",
                        if matches!(rule.algorithm, Algorithm::TokenBucket { .. }) { "capacity" } else { "limit" }
                    ),
                ));
            }
        }
    }
    for (i, rule) in policy.rules.iter().enumerate() {
        let name = Some(rule.name.as_str());
        let by = (!rule.shadow).then(|| policy.rules.iter().enumerate().find(|&(j, other)| {
            j != i
                && !other.shadow
                && covers(other, &attrs_of(j), rule, &attrs_of(i))
                // Of two identical rules, the later one is reported.
                && !(j > i && covers(rule, &attrs_of(i), other, &attrs_of(j)))
        })).flatten();
        if let Some((_, other)) = by {
            out.push(Finding::new(
                Severity::Warning,
                "shadowed",
                name,
                format!(
                    "never denies on its own: rule {:?} applies to every request it does, counts them under a key at least as coarse, and is at least as strict",
                    other.name
                ),
            ));
        }
        if let Some(tag) = constant_tag(policy, i) {
            out.push(Finding::new(
                Severity::Warning,
                "one_slot",
                name,
                format!("the hash tag {{{tag}}} of key {:?} holds no attribute, so every key of this rule is in one Redis Cluster slot", rule.key),
            ));
        }
        if let Some(known) = known_attributes(policy, options) {
            for attr in rule.exempt.keys().filter(|a| !known.iter().any(|k| k == *a)) {
                out.push(Finding::new(
                    Severity::Warning,
                    "exempt_never_applies",
                    name,
                    format!(
                        "exempt.{attr} names an attribute no request is known to have, so it exempts nothing \
                         (--attributes lists what the application sends, --any-attributes assumes nothing)"
                    ),
                ));
            }
        }
        for (attr, values) in &rule.matches {
            let mut seen = BTreeSet::new();
            if let Some(v) = values.iter().find(|v| !seen.insert(v.as_str())) {
                out.push(Finding::new(
                    Severity::Warning,
                    "duplicate_match_value",
                    name,
                    format!("match.{attr} lists {v:?} more than once"),
                ));
            }
        }
    }
    if policy.rules.iter().all(|r| r.shadow) {
        out.push(Finding::new(
            Severity::Warning,
            "never_denies",
            None,
            "every rule is in shadow mode, so the policy never denies a request".into(),
        ));
    }
    out.sort_by_key(|f| std::cmp::Reverse(f.severity));
    out
}

/// The attributes requests are known to have: `--attributes`, else the
/// request model and the policy's `[attributes]`; `None` with `--any-attributes`.
fn known_attributes(policy: &Policy, options: &LintOptions) -> Option<Vec<String>> {
    match (&options.attributes, options.any_attributes) {
        (Some(known), _) => Some(known.clone()),
        (None, true) => None,
        (None, false) => Some(
            crate::http::REQUEST_MODEL
                .iter()
                .map(|a| a.to_string())
                .chain(policy.attribute_sources().iter().map(|(n, _)| n.clone()))
                .collect(),
        ),
    }
}

/// True when rule `a` denies every request rule `b` would deny: `a`
/// applies whenever `b` does, its key depends on fewer attributes (so it
/// counts at least what `b` counts), and with the same algorithm it is at
/// least as strict.
fn covers(a: &Rule, a_attrs: &BTreeSet<&str>, b: &Rule, b_attrs: &BTreeSet<&str>) -> bool {
    let applies = a.matches.iter().all(|(attr, values)| {
        b.matches.get(attr).is_some_and(|bv| bv.iter().all(|v| values.contains(v)))
    });
    // `a` skips no request `b` counts: whatever `a` exempts, `b` exempts too.
    let exempts_less = a.exempt.iter().all(|(attr, values)| {
        b.exempt.get(attr).is_some_and(|bv| values.iter().all(|v| bv.contains(v)))
    });
    if !applies || !exempts_less || !a_attrs.is_subset(b_attrs) {
        return false;
    }
    match (a.algorithm, b.algorithm) {
        (Algorithm::SlidingWindowLog { limit: la, window: wa }, Algorithm::SlidingWindowLog { limit: lb, window: wb }) => {
            la <= lb && wa >= wb
        }
        (Algorithm::FixedWindow { limit: la, window: wa }, Algorithm::FixedWindow { limit: lb, window: wb }) => {
            la <= lb && wa == wb
        }
        (
            Algorithm::SlidingWindow { limit: la, window: wa, precision: pa },
            Algorithm::SlidingWindow { limit: lb, window: wb, precision: pb },
        ) => la <= lb && wa == wb && pa == pb,
        (
            Algorithm::Quota { limit: la, period: pa, utc_offset_minutes: oa },
            Algorithm::Quota { limit: lb, period: pb, utc_offset_minutes: ob },
        ) => la <= lb && pa == pb && oa == ob,
        (
            Algorithm::TokenBucket { capacity: ca, refill_rate: ra },
            Algorithm::TokenBucket { capacity: cb, refill_rate: rb },
        ) => ca <= cb && ra <= rb,
        // A longer lease holds a crashed holder's slots at least as long.
        (Algorithm::Concurrency { limit: la, lease: ea }, Algorithm::Concurrency { limit: lb, lease: eb }) => {
            la <= lb && ea >= eb
        }
        _ => false,
    }
}

/// The Redis Cluster hash tag of a key (what `{` ... `}` holds), as Redis reads it.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let len = key[open + 1..].find('}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

/// The hash tag every key of rule `index` shares, if its keys have one that
/// no attribute changes: rendered for two requests that differ in every
/// attribute they can.
fn constant_tag(policy: &Policy, index: usize) -> Option<String> {
    let rule = &policy.rules[index];
    let request = |pick: fn(&[String]) -> Option<&String>, value: &str| -> Vec<(String, String)> {
        let mut attrs: Vec<(String, String)> =
            rule.matches.iter().filter_map(|(a, v)| pick(v).map(|v| (a.clone(), v.clone()))).collect();
        for a in policy.templates[index].attributes() {
            if !rule.matches.contains_key(a) {
                attrs.push((a.to_string(), value.to_string()));
            }
        }
        attrs
    };
    let one = Policy { rules: vec![rule.clone()], templates: vec![policy.templates[index].clone()], ..policy.clone() };
    let rules = Rules::compile(&one, None);
    let first = rules.keys(&request(|v| v.first(), "a")).pop()?;
    let second = rules.keys(&request(|v| v.last(), "b")).pop()?;
    let (t1, t2) = (hash_tag(&first)?, hash_tag(&second)?);
    (t1 == t2).then(|| t1.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(text: &str, options: &LintOptions) -> Vec<(String, &'static str)> {
        lint_text(text, options).into_iter().map(|f| (f.rule.unwrap_or_default(), f.code)).collect()
    }

    #[test]
    fn each_check_fires_and_a_clean_policy_is_clean() {
        let clean = r#"{"rules":[{"name":"ip","key":"ip:{ip}","limit":10,"window":"1m"},
            {"name":"key","key":"{{t:{tenant}}}:k:{key}","algorithm":"token_bucket","capacity":5,"refill_rate":1}]}"#;
        let anything = LintOptions { any_attributes: true, ..Default::default() };
        assert_eq!(codes(clean, &anything), []);
        assert_eq!(exit_code(&lint_text(clean, &anything)), 0);
        // By default the request model is assumed: tenant and key are not in it.
        assert_eq!(codes(clean, &LintOptions::default()), [("key".into(), "not_in_request_model")]);
        let text = r#"{"rules":[
            {"name":"wide","key":"ip:{ip}","limit":10,"window":"1m"},
            {"name":"narrow","key":"ip:{ip}:route:{route}","limit":20,"window":"1m","match":{"method":["POST","POST"]}},
            {"name":"hot","key":"{{all}}:{ip}","limit":5,"window":"1s"},
            {"name":"login","key":"ip:{ip}","limit":5,"window":"1s","match":{"route":"/login"},"shadow":true}]}"#;
        let o = LintOptions { cost: Some(8), attributes: Some(vec!["ip".into(), "method".into()]), any_attributes: false };
        assert_eq!(
            codes(text, &o),
            [
                ("narrow".into(), "never_applies"),
                ("hot".into(), "cost_never_passes"),
                ("login".into(), "never_applies"),
                ("login".into(), "cost_never_passes"),
                ("narrow".into(), "shadowed"),
                ("narrow".into(), "duplicate_match_value"),
                ("hot".into(), "one_slot"),
            ]
        );
        assert_eq!(exit_code(&lint_text(text, &o)), 2);
        let twins = r#"{"rules":[{"name":"a","key":"ip:{ip}","limit":1,"window":"1s","shadow":true},
            {"name":"b","key":"ip:{ip}","limit":1,"window":"1s","shadow":true}]}"#;
        assert_eq!(codes(twins, &LintOptions::default()), [(String::new(), "never_denies")]);
        assert_eq!(exit_code(&lint_text(twins, &LintOptions::default())), 1);
        let bad = lint_text("{", &LintOptions::default());
        assert_eq!((bad[0].code, exit_code(&bad)), ("invalid_policy", 2));
    }

    #[test]
    fn the_request_model_and_the_policy_attributes_are_assumed() {
        let text = r#"{"attributes":{"api_key":"header:x-api-key"},"rules":[
            {"name":"login","key":"ip:{ip}","limit":5,"window":"1m","match":{"route":"/login","method":"POST"}},
            {"name":"key","key":"k:{api_key}:{host}:{path}","limit":5,"window":"1m"}]}"#;
        assert_eq!(codes(text, &LintOptions::default()), []);
        let f = lint_text(r#"{"rules":[{"name":"t","key":"t:{tenant}","limit":5,"window":"1m"}]}"#, &LintOptions::default());
        assert_eq!((f[0].code, f[0].severity, exit_code(&f)), ("not_in_request_model", Severity::Warning, 1));
        assert!(f[0].message.starts_with("needs the attribute \"tenant\", which no HTTP integration provides"), "{}", f[0].message);
    }

    #[test]
    fn bare_durations_under_a_second() {
        let text = "timeout = 50\n[[rules]]\nname = \"a\"\nkey = \"ip:{ip}\"\nlimit = 5\nwindow = 60\nblock = 900\n\
                    [[rules]]\nname = \"b\"\nkey = \"b:{ip}\"\nlimit = 5\nwindow = 60000\n";
        let f = lint_text(text, &LintOptions::default());
        let got: Vec<_> = f.iter().map(|f| (f.rule.clone().unwrap_or_default(), f.code, f.message.clone())).collect();
        assert_eq!(
            got,
            [
                ("a".to_string(), "shadowed", got[0].2.clone()),
                (String::new(), "bare_duration", "timeout = 50 is 50 milliseconds; write it with a unit: \"50ms\", or \"50s\" if seconds were meant".into()),
                ("a".into(), "bare_duration", "window = 60 is 60 milliseconds; write it with a unit: \"60ms\", or \"60s\" if seconds were meant".into()),
                ("a".into(), "bare_duration", "block = 900 is 900 milliseconds; write it with a unit: \"900ms\", or \"900s\" if seconds were meant".into()),
            ]
        );
        assert_eq!(exit_code(&f), 1);
    }

    #[test]
    fn identical_rules_report_the_later_one() {
        let text = r#"{"rules":[{"name":"a","key":"ip:{ip}","limit":1,"window":"1s"},
            {"name":"b","key":"ip:{ip}","limit":1,"window":"1s"}]}"#;
        assert_eq!(codes(text, &LintOptions::default()), [("b".into(), "shadowed")]);
    }

    #[test]
    fn exempt_lists_and_concurrency_rules() {
        let anything = LintOptions { any_attributes: true, ..Default::default() };
        // An exempt rule does not cover a rule without the exemption.
        let two = r#"{"rules":[{"name":"a","key":"ip:{ip}","limit":10,"window":"1m","exempt":{"ip":["10.0.0.0/8"]}},
            {"name":"b","key":"ip:{ip}","limit":20,"window":"1m"}]}"#;
        assert_eq!(codes(two, &anything), []);
        let same = r#"{"rules":[{"name":"a","key":"ip:{ip}","limit":10,"window":"1m","exempt":{"ip":["10.0.0.0/8"]}},
            {"name":"b","key":"ip:{ip}","limit":20,"window":"1m","exempt":{"ip":["10.0.0.0/8"]}}]}"#;
        assert_eq!(codes(same, &anything), [("b".into(), "shadowed")]);
        // Concurrency: fewer slots and a lease at least as long cover.
        let conc = r#"{"rules":[{"name":"a","key":"u:{ip}","algorithm":"concurrency","limit":2,"lease":"1m"},
            {"name":"b","key":"u:{ip}","algorithm":"concurrency","limit":4,"lease":"30s"}]}"#;
        assert_eq!(codes(conc, &anything), [("b".into(), "shadowed")]);
        let longer = conc.replace("\"30s\"", "\"2m\"");
        assert_eq!(codes(&longer, &anything), []);
        // An exempt attribute no request has.
        let unknown = r#"{"rules":[{"name":"a","key":"ip:{ip}","limit":10,"window":"1m","exempt":{"plan":["internal"]}}]}"#;
        assert_eq!(codes(unknown, &LintOptions::default()), [("a".into(), "exempt_never_applies")]);
        assert_eq!(codes(unknown, &anything), []);
        // A bare lease under a second.
        let bare = r#"{"rules":[{"name":"a","key":"ip:{ip}","algorithm":"concurrency","limit":1,"lease":500}]}"#;
        assert_eq!(codes(bare, &anything), [("a".into(), "bare_duration")]);
    }
}
