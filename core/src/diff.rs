//! What changes between two policies, and whether each rule's state
//! carries over: the one rule-identity logic used by
//! [`crate::Limiter::reload`] and `throttlegate diff`.
//!
//! A rule's state lives under its keys, `<prefix><rule name>:<rendered key>`,
//! and is stored in its algorithm's format. So a rule of the new policy
//! **keeps its state** when the prefix, its name, its key template and its
//! algorithm (and, for a sliding window of counters, its precision, which
//! lays out the stored sub-windows) are unchanged; its other fields (limit,
//! window, capacity, rate, match, shadow, on_backend_error) may change and
//! apply to the state as it is. A rule whose key or prefix changed starts
//! afresh under new keys (the old ones expire on their own). A rule that
//! keeps its name and key but changes its algorithm (or precision) would
//! read state written in another format: such a policy is refused
//! ([`PolicyDiff::check`]); give the rule a new name instead.

use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::policy::{Algorithm, Policy, Rule};

/// How one rule differs between two policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuleChangeKind {
    /// The same rule, field for field: its state carries over.
    Unchanged,
    /// Same name, key and algorithm, other fields changed: its state carries over.
    Changed,
    /// Same name, but a new key or prefix: it starts afresh under new keys.
    Replaced,
    /// Only in the new policy.
    Added,
    /// Only in the old policy: its keys are no longer touched and expire.
    Removed,
    /// Same name and key, another algorithm (or sliding-window precision):
    /// its keys hold state of another format. Refused by a reload.
    Conflict,
}

impl RuleChangeKind {
    /// `"unchanged"`, `"changed"`, `"replaced"`, `"added"`, `"removed"` or `"conflict"`.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleChangeKind::Unchanged => "unchanged",
            RuleChangeKind::Changed => "changed",
            RuleChangeKind::Replaced => "replaced",
            RuleChangeKind::Added => "added",
            RuleChangeKind::Removed => "removed",
            RuleChangeKind::Conflict => "conflict",
        }
    }
}

/// One rule of a [`PolicyDiff`].
#[derive(Debug, Clone, PartialEq)]
pub struct RuleChange {
    /// The rule's name.
    pub name: String,
    /// How it changed.
    pub kind: RuleChangeKind,
    /// Its position in the old policy, if it was there.
    pub old_index: Option<usize>,
    /// Its position in the new policy, if it is there.
    pub new_index: Option<usize>,
    /// The fields that differ, in the file format's names (`limit`, `key`, ...), sorted.
    pub fields: Vec<String>,
}

impl RuleChange {
    /// True when the rule's stored state is used by the new policy.
    pub fn state_kept(&self) -> bool {
        matches!(self.kind, RuleChangeKind::Unchanged | RuleChangeKind::Changed)
    }
}

/// A policy-wide setting that differs.
#[derive(Debug, Clone, PartialEq)]
pub struct SettingChange {
    /// `prefix`, `timeout` or `on_backend_error`.
    pub field: String,
    /// The old value, in the file format.
    pub old: Value,
    /// The new value, in the file format.
    pub new: Value,
}

/// What changes from one policy to another: see the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyDiff {
    /// The new policy's rules in its order, then the removed rules in the old order.
    pub rules: Vec<RuleChange>,
    /// Policy-wide settings that differ.
    pub settings: Vec<SettingChange>,
}

/// The part of a rule that says where and how its state is stored (besides its name).
fn storage(rule: &Rule) -> (&'static str, Option<std::time::Duration>) {
    match rule.algorithm {
        Algorithm::SlidingWindow { precision, .. } => (rule.algorithm.name(), Some(precision)),
        _ => (rule.algorithm.name(), None),
    }
}

fn rule_fields(policy: &Policy, index: usize) -> Map<String, Value> {
    match &policy.to_value()["rules"][index] {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    }
}

impl PolicyDiff {
    /// Compare `old` with `new`.
    pub fn between(old: &Policy, new: &Policy) -> PolicyDiff {
        let (old_v, new_v) = (old.to_value(), new.to_value());
        let settings = ["prefix", "timeout", "on_backend_error", "wait_replicas", "attributes"]
            .iter()
            .filter(|f| old_v[**f] != new_v[**f])
            .map(|f| SettingChange { field: f.to_string(), old: old_v[*f].clone(), new: new_v[*f].clone() })
            .collect();
        let same_prefix = old.prefix == new.prefix;
        let mut rules = Vec::new();
        for (ni, rule) in new.rules.iter().enumerate() {
            let Some(oi) = old.rules.iter().position(|r| r.name == rule.name) else {
                rules.push(RuleChange {
                    name: rule.name.clone(),
                    kind: RuleChangeKind::Added,
                    old_index: None,
                    new_index: Some(ni),
                    fields: Vec::new(),
                });
                continue;
            };
            let (of, nf) = (rule_fields(old, oi), rule_fields(new, ni));
            let mut fields: Vec<String> = of
                .keys()
                .chain(nf.keys())
                .filter(|k| of.get(*k) != nf.get(*k))
                .cloned()
                .collect();
            fields.sort();
            fields.dedup();
            let before = &old.rules[oi];
            let kind = if before.key != rule.key || !same_prefix {
                RuleChangeKind::Replaced
            } else if storage(before) != storage(rule) {
                RuleChangeKind::Conflict
            } else if fields.is_empty() {
                RuleChangeKind::Unchanged
            } else {
                RuleChangeKind::Changed
            };
            rules.push(RuleChange { name: rule.name.clone(), kind, old_index: Some(oi), new_index: Some(ni), fields });
        }
        for (oi, rule) in old.rules.iter().enumerate() {
            if !new.rules.iter().any(|r| r.name == rule.name) {
                rules.push(RuleChange {
                    name: rule.name.clone(),
                    kind: RuleChangeKind::Removed,
                    old_index: Some(oi),
                    new_index: None,
                    fields: Vec::new(),
                });
            }
        }
        PolicyDiff { rules, settings }
    }

    /// True when nothing differs.
    pub fn is_empty(&self) -> bool {
        self.settings.is_empty() && self.rules.iter().all(|r| r.kind == RuleChangeKind::Unchanged)
    }

    /// The rules of `kind`.
    pub fn of_kind(&self, kind: RuleChangeKind) -> impl Iterator<Item = &RuleChange> {
        self.rules.iter().filter(move |r| r.kind == kind)
    }

    /// `Ok` when a limiter on the old policy may reload the new one; else
    /// an [`crate::ErrorKind::InvalidPolicy`] error naming the first rule
    /// that keeps its name and key but changes how its state is stored.
    pub fn check(&self, old: &Policy, new: &Policy) -> Result<()> {
        let Some(c) = self.of_kind(RuleChangeKind::Conflict).next() else { return Ok(()) };
        let (Some(oi), Some(ni)) = (c.old_index, c.new_index) else { return Ok(()) };
        let describe = |r: &Rule| match r.algorithm {
            Algorithm::SlidingWindow { precision, .. } => format!(
                "{} (precision {})",
                r.algorithm.name(),
                crate::duration::format_duration(precision)
            ),
            _ => r.algorithm.name().to_string(),
        };
        Err(Error::invalid_policy(format!(
            "rules[{ni}] ({:?}): algorithm: changed from {} to {} with the same name and key; its keys hold state \
             the new algorithm cannot read, so give the rule a new name (or a new key)",
            c.name,
            describe(&old.rules[oi]),
            describe(&new.rules[ni])
        )))
    }

    /// The diff as JSON: `{"rules": [{"name", "change", "state_kept", "fields"}], "settings": [{"field", "old", "new"}]}`.
    pub fn to_json(&self) -> Value {
        json!({
            "rules": self.rules.iter().map(|r| json!({
                "name": r.name,
                "change": r.kind.as_str(),
                "state_kept": r.state_kept(),
                "fields": r.fields,
            })).collect::<Vec<_>>(),
            "settings": self.settings.iter().map(|s| json!({
                "field": s.field, "old": s.old, "new": s.new,
            })).collect::<Vec<_>>(),
        })
    }

    /// The diff for people, one line per rule and setting that differs
    /// (unchanged rules are counted on the last line).
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for s in &self.settings {
            let note = match s.field.as_str() {
                "prefix" => " (every key is new: no rule keeps its state)",
                "timeout" => " (a reload keeps the limiter's timeout; applies when a limiter is made)",
                "wait_replicas" => " (a reload keeps the limiter's wait_replicas; applies when a limiter is made)",
                _ => "",
            };
            out.push_str(&format!("setting {}: {} -> {}{note}\n", s.field, s.old, s.new));
        }
        for r in &self.rules {
            let line = match r.kind {
                RuleChangeKind::Unchanged => continue,
                RuleChangeKind::Changed => format!("~ {}: {} changed; state kept", r.name, r.fields.join(", ")),
                RuleChangeKind::Replaced => {
                    format!("! {}: {} changed; new keys, state starts afresh", r.name, r.fields.join(", "))
                }
                RuleChangeKind::Added => format!("+ {}: added", r.name),
                RuleChangeKind::Removed => format!("- {}: removed; its keys expire", r.name),
                RuleChangeKind::Conflict => format!(
                    "x {}: {} changed with the same name and key; a reload refuses this (rename the rule)",
                    r.name,
                    r.fields.join(", ")
                ),
            };
            out.push_str(&line);
            out.push('\n');
        }
        let kept = self.of_kind(RuleChangeKind::Unchanged).count();
        out.push_str(&format!("{kept} rule{} unchanged\n", if kept == 1 { "" } else { "s" }));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn p(rules: Vec<Rule>) -> Policy {
        Policy::new(rules).unwrap()
    }

    #[test]
    fn rules_are_matched_by_name() {
        let old = p(vec![
            Rule::sliding_window_log("a", "ip:{ip}", 10, Duration::from_secs(1)),
            Rule::token_bucket("b", "k:{k}", 5, 1.0),
            Rule::fixed_window("c", "u:{u}", 3, Duration::from_secs(1)),
            Rule::sliding_window_log("d", "ip:{ip}", 1, Duration::from_secs(1)),
            Rule::sliding_window_log("gone", "ip:{ip}", 1, Duration::from_secs(1)),
        ]);
        let new = p(vec![
            Rule::sliding_window_log("new", "ip:{ip}", 1, Duration::from_secs(1)),
            Rule::sliding_window_log("a", "ip:{ip}", 20, Duration::from_secs(1)),
            Rule::token_bucket("b", "k:{k}", 5, 1.0),
            Rule::fixed_window("c", "user:{u}", 3, Duration::from_secs(1)),
            Rule::token_bucket("d", "ip:{ip}", 1, 1.0),
        ]);
        let d = PolicyDiff::between(&old, &new);
        let kinds: Vec<_> = d.rules.iter().map(|r| (r.name.as_str(), r.kind.as_str())).collect();
        assert_eq!(
            kinds,
            [("new", "added"), ("a", "changed"), ("b", "unchanged"), ("c", "replaced"), ("d", "conflict"), ("gone", "removed")]
        );
        assert_eq!(d.rules[1].fields, ["limit"]);
        let e = d.check(&old, &new).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidPolicy);
        assert!(e.message().starts_with("rules[4] (\"d\"): algorithm: changed from sliding_window_log to token_bucket"), "{e}");
        assert!(!d.is_empty());
        assert!(PolicyDiff::between(&old, &old).is_empty());
    }

    #[test]
    fn a_new_prefix_makes_every_key_new() {
        let old = p(vec![Rule::sliding_window_log("a", "ip:{ip}", 10, Duration::from_secs(1))]);
        let new = old.clone().with_prefix("other:").unwrap();
        let d = PolicyDiff::between(&old, &new);
        assert_eq!(d.rules[0].kind, RuleChangeKind::Replaced);
        assert_eq!(d.settings[0].field, "prefix");
        // A changed algorithm under new keys is no conflict.
        let swapped = Policy::with_settings(
            vec![Rule::token_bucket("a", "ip:{ip}", 1, 1.0)],
            "other:",
            crate::DEFAULT_TIMEOUT,
            crate::FailureMode::Allow,
        )
        .unwrap();
        assert!(PolicyDiff::between(&old, &swapped).check(&old, &swapped).is_ok());
    }

    #[test]
    fn a_sliding_window_keeps_its_state_only_with_its_precision() {
        let old = p(vec![Rule::sliding_window("a", "ip:{ip}", 10, Duration::from_secs(60))]);
        let mut r = Rule::sliding_window("a", "ip:{ip}", 20, Duration::from_secs(60));
        let d = PolicyDiff::between(&old, &p(vec![r.clone()]));
        assert_eq!(d.rules[0].kind, RuleChangeKind::Changed);
        r.algorithm = Algorithm::SlidingWindow { limit: 10, window: Duration::from_secs(60), precision: Duration::from_secs(2) };
        let d = PolicyDiff::between(&old, &p(vec![r]));
        assert_eq!(d.rules[0].kind, RuleChangeKind::Conflict);
        assert_eq!(d.rules[0].fields, ["precision"]);
    }

    #[test]
    fn exempt_and_lease_changes_are_changes_and_an_algorithm_change_to_concurrency_conflicts() {
        let old = Policy::from_toml_str("[[rules]]\nname = \"a\"\nkey = \"u:{ip}\"\nalgorithm = \"concurrency\"\nlimit = 2\nlease = \"30s\"\n").unwrap();
        let new = Policy::from_toml_str(
            "[[rules]]\nname = \"a\"\nkey = \"u:{ip}\"\nalgorithm = \"concurrency\"\nlimit = 2\nlease = \"1m\"\nexempt = { ip = [\"10.0.0.0/8\"] }\n",
        )
        .unwrap();
        let d = PolicyDiff::between(&old, &new);
        assert_eq!(d.rules[0].kind, RuleChangeKind::Changed);
        assert_eq!(d.rules[0].fields, ["exempt", "lease"]);
        assert!(d.check(&old, &new).is_ok());
        let window = Policy::from_toml_str("[[rules]]\nname = \"a\"\nkey = \"u:{ip}\"\nlimit = 2\nwindow = \"30s\"\n").unwrap();
        let d = PolicyDiff::between(&old, &window);
        assert_eq!(d.rules[0].kind, RuleChangeKind::Conflict);
        assert!(d.check(&old, &window).is_err());
    }
}
