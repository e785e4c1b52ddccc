//! The rules a server enforces: a native policy (TOML/JSON) or
//! envoyproxy/ratelimit's YAML (a file, or a directory of them), compiled
//! into one core [`Policy`] plus the descriptor tree that maps each
//! descriptor of a request onto the attributes of that policy's rules.
//!
//! The YAML's limits become fixed-window rules (their counting) unless a
//! descriptor names another algorithm with `algorithm:`; every rule is the
//! core's, so the counting, the stacking and the headers are the core's.
//! A descriptor that reaches a limit gives the attribute named after that
//! limit's rule, valued with the descriptor's values, and the rule's key
//! template is that one attribute: the rule applies exactly when a
//! descriptor of the request reaches it.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};
use serde_norway::Value as Yaml;
use sha2::{Digest, Sha256};
use throttlegate::{Error, ErrorKind, Policy, Result};

/// The units of envoyproxy/ratelimit's `rate_limit` (and of the RLS
/// `RateLimit.Unit` enum), with their lengths (a month is 30 days and a
/// year 365, as there).
pub const UNITS: [(&str, u64, i32); 7] = [
    ("second", 1, 1),
    ("minute", 60, 2),
    ("hour", 3600, 3),
    ("day", 86_400, 4),
    ("week", 7 * 86_400, 7),
    ("month", 30 * 86_400, 5),
    ("year", 365 * 86_400, 6),
];

/// The RLS unit number of a window, when the window is one of [`UNITS`] (0, `UNKNOWN`, otherwise).
pub fn unit_of_window(window: Duration) -> i32 {
    UNITS
        .iter()
        .find(|(_, secs, _)| Duration::from_secs(*secs) == window)
        .map_or(0, |u| u.2)
}

/// The format a rules file was read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// throttlegate's own policy (TOML or JSON): descriptor entries are attributes.
    Native,
    /// envoyproxy/ratelimit's YAML.
    Envoy,
}

/// What a descriptor that reaches a node of the tree gets.
#[derive(Debug, Clone)]
pub enum Limit {
    /// A core rule (its name is the attribute the descriptor sets).
    Rule {
        /// The core rule's name.
        rule: String,
        /// The YAML `name` of the limit, for `replaces`.
        name: Option<String>,
        /// The names of the limits this one replaces.
        replaces: Vec<String>,
    },
    /// `unlimited: true`: OK, `limit_remaining` at its maximum, nothing counted.
    Unlimited,
    /// `requests_per_unit: 0`: every request is over the limit (envoyproxy/ratelimit's block list).
    Zero {
        /// The YAML `name` of the limit, for `replaces`.
        name: Option<String>,
        /// The names of the limits this one replaces.
        replaces: Vec<String>,
        /// The RLS unit of the limit.
        unit: i32,
    },
}

/// One `descriptors` entry of the YAML.
#[derive(Debug, Default, Clone)]
pub struct Node {
    limit: Option<Limit>,
    /// With `share_threshold`, the pattern counts for every value it matches.
    share: Option<String>,
    children: Level,
}

/// One level of the tree: exact `key`+`value` entries, wildcard values, and
/// key-only entries (any value).
#[derive(Debug, Default, Clone)]
pub struct Level {
    exact: HashMap<(String, String), Node>,
    wildcards: Vec<(String, Vec<String>, Node)>,
    any: HashMap<String, Node>,
}

/// A descriptor matched against a domain's tree: the limit it reached and
/// the attribute value it gives that limit's rule.
#[derive(Debug, Clone)]
pub struct Matched<'a> {
    /// The limit reached.
    pub limit: &'a Limit,
    /// The attribute's value: the descriptor's values, each escaped, joined by `:`.
    pub value: String,
}

/// Rules in force: the core policy and, for the YAML, the descriptor trees by domain.
#[derive(Debug, Clone)]
pub struct Rules {
    /// The format they were read in.
    pub format: Format,
    /// The core policy.
    pub policy: Policy,
    /// The YAML's domains (empty for a native policy).
    pub domains: HashMap<String, Level>,
    /// The files they were read from, in order.
    pub files: Vec<PathBuf>,
}

fn invalid(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidPolicy, message)
}

/// envoyproxy/ratelimit's wildcard match: each `*` of the pattern matches
/// any run of characters (the pattern split on `*` is `parts`).
pub fn wildcard_match(parts: &[String], value: &str) -> bool {
    let (first, rest) = match parts.split_first() {
        Some(x) => x,
        None => return value.is_empty(),
    };
    let Some(mut tail) = value.strip_prefix(first.as_str()) else {
        return false;
    };
    let Some((last, middle)) = rest.split_last() else {
        return tail.is_empty();
    };
    for part in middle {
        match tail.find(part.as_str()) {
            Some(at) => tail = &tail[at + part.len()..],
            None => return false,
        }
    }
    tail.len() >= last.len() && tail.ends_with(last.as_str())
}

fn escape_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '%' => out.push_str("%25"),
            ':' => out.push_str("%3A"),
            c => out.push(c),
        }
    }
}

impl Level {
    /// Match one descriptor's entries as envoyproxy/ratelimit does: at each
    /// level the `key`+`value` entry first, then a wildcard value, then the
    /// key alone; a limit counts only at the level of the descriptor's last
    /// entry.
    pub fn matches<'a>(&'a self, entries: &[(&str, &str)]) -> Option<Matched<'a>> {
        let mut level = self;
        let mut value = String::new();
        for (i, (k, v)) in entries.iter().enumerate() {
            let node = level
                .exact
                .get(&(k.to_string(), v.to_string()))
                .or_else(|| {
                    level
                        .wildcards
                        .iter()
                        .find(|(key, parts, _)| key == k && wildcard_match(parts, v))
                        .map(|(_, _, n)| n)
                })
                .or_else(|| level.any.get(*k))?;
            if i > 0 {
                value.push(':');
            }
            escape_value(&mut value, node.share.as_deref().unwrap_or(v));
            if i + 1 == entries.len() {
                return node.limit.as_ref().map(|limit| Matched { limit, value });
            }
            level = &node.children;
        }
        None
    }
}

impl Rules {
    /// Read rules from `path`: a directory of YAML files (`*.yaml`, `*.yml`,
    /// one domain each, read in name order), a YAML file, or a native policy
    /// (`.toml`, `.json`).
    pub fn load(path: &Path) -> Result<Rules> {
        let meta = std::fs::metadata(path)
            .map_err(|e| Error::new(ErrorKind::Io, format!("cannot read rules {}: {e}", path.display())))?;
        if meta.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| Error::new(ErrorKind::Io, format!("cannot read rules {}: {e}", path.display())))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| is_yaml(p) && p.is_file())
                .collect();
            files.sort();
            if files.is_empty() {
                return Err(invalid(format!("{}: no .yaml or .yml file in the directory", path.display())));
            }
            let mut texts = Vec::new();
            for f in &files {
                texts.push((f.display().to_string(), read(f)?));
            }
            let mut rules = Rules::from_yaml(&texts)?;
            rules.files = files;
            return Ok(rules);
        }
        let text = read(path)?;
        let mut rules = if is_yaml(path) {
            Rules::from_yaml(&[(path.display().to_string(), text)])?
        } else {
            let policy = Policy::from_file(path)?;
            Rules { format: Format::Native, policy, domains: HashMap::new(), files: vec![] }
        };
        rules.files = vec![path.to_path_buf()];
        Ok(rules)
    }

    /// Compile envoyproxy/ratelimit YAML documents (`(name, text)`, one domain each).
    pub fn from_yaml(texts: &[(String, String)]) -> Result<Rules> {
        let mut rules = Vec::new();
        let mut domains = HashMap::new();
        let mut names = BTreeMap::new();
        for (file, text) in texts {
            let doc: Yaml = serde_norway::from_str(text).map_err(|e| invalid(format!("{file}: {e}")))?;
            let map = doc.as_mapping().ok_or_else(|| invalid(format!("{file}: expected a mapping with `domain` and `descriptors`")))?;
            let mut domain = None;
            let mut descriptors = None;
            for (k, v) in map {
                match k.as_str() {
                    Some("domain") => domain = Some(v.as_str().ok_or_else(|| invalid(format!("{file}: domain: expected a string")))?),
                    Some("descriptors") => descriptors = Some(v),
                    Some(other) => return Err(unknown(file, "", other)),
                    None => return Err(invalid(format!("{file}: keys must be strings"))),
                }
            }
            let domain = domain.filter(|d| !d.is_empty()).ok_or_else(|| invalid(format!("{file}: domain: missing or empty")))?;
            if domains.contains_key(domain) {
                return Err(invalid(format!("{file}: domain: \"{domain}\" is defined twice")));
            }
            let mut ctx = Ctx { file, domain, rules: &mut rules, names: &mut names };
            let level = match descriptors {
                Some(d) => ctx.level(d, "descriptors", &[])?,
                None => Level::default(),
            };
            domains.insert(domain.to_string(), level);
        }
        let policy = Policy::from_value(&json!({ "rules": rules }))?;
        Ok(Rules { format: Format::Envoy, policy, domains, files: vec![] })
    }
}

fn is_yaml(p: &Path) -> bool {
    matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::new(ErrorKind::Io, format!("cannot read rules {}: {e}", path.display())))
}

fn unknown(file: &str, at: &str, field: &str) -> Error {
    let sep = if at.is_empty() { "" } else { "." };
    invalid(format!("{file}: {at}{sep}{field}: unknown field"))
}

struct Ctx<'a> {
    file: &'a str,
    domain: &'a str,
    rules: &'a mut Vec<Value>,
    names: &'a mut BTreeMap<String, String>,
}

const VALID_NAME: fn(char) -> bool = |c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');

impl Ctx<'_> {
    fn err(&self, at: &str, message: impl std::fmt::Display) -> Error {
        invalid(format!("{}: {at}: {message}", self.file))
    }

    /// A stable rule name for a path of the tree: readable when it fits,
    /// hashed when it does not or would collide.
    fn rule_name(&mut self, path: &[(String, Option<String>)]) -> String {
        let mut readable = self.domain.to_string();
        let mut full = self.domain.to_string();
        for (k, v) in path {
            readable.push('.');
            readable.push_str(k);
            full.push('\u{0}');
            full.push_str(k);
            if let Some(v) = v {
                readable.push('_');
                readable.push_str(v);
                full.push('\u{1}');
                full.push_str(v);
            }
        }
        let mut name: String = readable.chars().map(|c| if VALID_NAME(c) { c } else { '_' }).collect();
        if name.len() > 64 || self.names.contains_key(&name) {
            let hash = Sha256::digest(full.as_bytes());
            let mut short: String = name.chars().take(47).collect();
            short.push('.');
            for b in &hash[..8] {
                let _ = write!(short, "{b:02x}");
            }
            name = short;
        }
        self.names.insert(name.clone(), full);
        name
    }

    fn level(&mut self, v: &Yaml, at: &str, path: &[(String, Option<String>)]) -> Result<Level> {
        let list = v.as_sequence().ok_or_else(|| self.err(at, "expected a list of descriptors"))?;
        let mut level = Level::default();
        for (i, d) in list.iter().enumerate() {
            let at = format!("{at}[{i}]");
            let map = d.as_mapping().ok_or_else(|| self.err(&at, "expected a mapping"))?;
            let (mut key, mut value, mut rate, mut children, mut algorithm) = (None, None, None, None, None);
            let mut shadow = false;
            let mut share = false;
            for (k, val) in map {
                let name = k.as_str().ok_or_else(|| self.err(&at, "keys must be strings"))?;
                let field = format!("{at}.{name}");
                match name {
                    "key" => key = Some(scalar(val).ok_or_else(|| self.err(&field, "expected a string"))?),
                    "value" => value = Some(scalar(val).ok_or_else(|| self.err(&field, "expected a string"))?),
                    "rate_limit" => rate = Some(val),
                    "descriptors" => children = Some(val),
                    "algorithm" => algorithm = Some(val),
                    "shadow_mode" => shadow = boolean(val).ok_or_else(|| self.err(&field, "expected true or false"))?,
                    "share_threshold" => share = boolean(val).ok_or_else(|| self.err(&field, "expected true or false"))?,
                    // Metrics only: throttlegate's metrics are per rule, and
                    // every limit of the tree is a rule of its own.
                    "detailed_metric" | "value_to_metric" => {
                        boolean(val).ok_or_else(|| self.err(&field, "expected true or false"))?;
                    }
                    "quota_mode" => return Err(self.err(&field, "not supported (a quota is `algorithm: {type: quota, ...}`)")),
                    "metadata" => return Err(self.err(&field, "not supported")),
                    other => return Err(unknown(self.file, &at, other)),
                }
            }
            let key = key.filter(|k| !k.is_empty()).ok_or_else(|| self.err(&at, "key: missing or empty"))?;
            let value = value.filter(|v| !v.is_empty());
            if share && !value.as_deref().is_some_and(|v| v.contains('*')) {
                return Err(self.err(&format!("{at}.share_threshold"), "applies only to a value with a `*` wildcard"));
            }
            let mut here = path.to_vec();
            here.push((key.clone(), value.clone()));
            let limit = match rate {
                Some(r) => Some(self.limit(r, algorithm, shadow, &at, &here)?),
                None if algorithm.is_some() => return Err(self.err(&format!("{at}.algorithm"), "needs rate_limit beside it")),
                None => None,
            };
            let node = Node {
                limit,
                share: if share { value.clone() } else { None },
                children: match children {
                    Some(c) => self.level(c, &format!("{at}.descriptors"), &here)?,
                    None => Level::default(),
                },
            };
            let duplicate = match &value {
                Some(v) if v.contains('*') => {
                    let parts: Vec<String> = v.split('*').map(str::to_string).collect();
                    let dup = level.wildcards.iter().any(|(k2, p, _)| *k2 == key && *p == parts);
                    level.wildcards.push((key.clone(), parts, node));
                    dup
                }
                Some(v) => level.exact.insert((key.clone(), v.clone()), node).is_some(),
                None => level.any.insert(key.clone(), node).is_some(),
            };
            if duplicate {
                return Err(self.err(&at, format!("the descriptor {key}{} is defined twice at this level", value.map(|v| format!("={v}")).unwrap_or_default())));
            }
        }
        Ok(level)
    }

    fn limit(&mut self, r: &Yaml, algorithm: Option<&Yaml>, shadow: bool, at: &str, path: &[(String, Option<String>)]) -> Result<Limit> {
        let at = format!("{at}.rate_limit");
        let map = r.as_mapping().ok_or_else(|| self.err(&at, "expected a mapping"))?;
        let (mut unit, mut rpu, mut unlimited, mut name, mut replaces) = (None, None, false, None, Vec::new());
        for (k, v) in map {
            let key = k.as_str().ok_or_else(|| self.err(&at, "keys must be strings"))?;
            let field = format!("{at}.{key}");
            match key {
                "unit" => {
                    let u = v.as_str().map(str::to_ascii_lowercase).ok_or_else(|| self.err(&field, "expected a string"))?;
                    let found = UNITS.iter().find(|x| x.0 == u).ok_or_else(|| {
                        self.err(&field, format!("expected second, minute, hour, day, week, month or year, not \"{u}\""))
                    })?;
                    unit = Some(*found);
                }
                "requests_per_unit" => {
                    rpu = Some(v.as_u64().filter(|n| *n <= u32::MAX as u64).ok_or_else(|| self.err(&field, "expected an integer from 0 to 4294967295"))?)
                }
                "unlimited" => unlimited = boolean(v).ok_or_else(|| self.err(&field, "expected true or false"))?,
                "name" => name = Some(scalar(v).ok_or_else(|| self.err(&field, "expected a string"))?),
                "replaces" => {
                    let list = v.as_sequence().ok_or_else(|| self.err(&field, "expected a list of {name: ...}"))?;
                    for (i, item) in list.iter().enumerate() {
                        let f = format!("{field}[{i}]");
                        let m = item.as_mapping().ok_or_else(|| self.err(&f, "expected {name: ...}"))?;
                        for (k2, v2) in m {
                            match k2.as_str() {
                                Some("name") => match scalar(v2).filter(|s| !s.is_empty()) {
                                    Some(n) => replaces.push(n),
                                    None => return Err(self.err(&format!("{f}.name"), "expected a non-empty string")),
                                },
                                Some(other) => return Err(unknown(self.file, &f, other)),
                                None => return Err(self.err(&f, "keys must be strings")),
                            }
                        }
                    }
                }
                other => return Err(unknown(self.file, &at, other)),
            }
        }
        if name.is_some() && replaces.iter().any(|r| Some(r) == name.as_ref()) {
            return Err(self.err(&format!("{at}.replaces"), "names the limit itself"));
        }
        if unlimited {
            if rpu.is_some() || unit.is_some() || algorithm.is_some() {
                return Err(self.err(&at, "unlimited: true takes no unit, requests_per_unit or algorithm"));
            }
            return Ok(Limit::Unlimited);
        }
        let unit = unit.ok_or_else(|| self.err(&format!("{at}.unit"), "missing"))?;
        let rpu = rpu.ok_or_else(|| self.err(&format!("{at}.requests_per_unit"), "missing"))?;
        if rpu == 0 {
            if algorithm.is_some() {
                return Err(self.err(&at, "requests_per_unit: 0 takes no algorithm"));
            }
            return Ok(Limit::Zero { name, replaces, unit: unit.2 });
        }
        let rule = self.rule_name(path);
        let mut value = Map::new();
        value.insert("name".into(), json!(rule));
        value.insert("key".into(), json!(format!("{{{rule}}}")));
        value.insert("shadow".into(), json!(shadow));
        match algorithm {
            None => {
                value.insert("algorithm".into(), json!("fixed_window"));
                value.insert("limit".into(), json!(rpu));
                value.insert("window".into(), json!(format!("{}s", unit.1)));
            }
            Some(Yaml::String(a)) => {
                if a == "token_bucket" || a == "quota" {
                    return Err(self.err(&format!("{at}.algorithm"), format!("{a} needs its own fields: algorithm: {{type: {a}, ...}}")));
                }
                value.insert("algorithm".into(), json!(a));
                value.insert("limit".into(), json!(rpu));
                value.insert("window".into(), json!(format!("{}s", unit.1)));
            }
            Some(Yaml::Mapping(m)) => {
                let mut fields = Map::new();
                for (k, v) in m {
                    let key = k.as_str().ok_or_else(|| self.err(&at, "algorithm: keys must be strings"))?;
                    let v: Value = serde_json::to_value(v).map_err(|e| self.err(&format!("algorithm.{key}"), e))?;
                    fields.insert(if key == "type" { "algorithm".to_string() } else { key.to_string() }, v);
                }
                if !fields.contains_key("algorithm") {
                    return Err(self.err(&at.replace(".rate_limit", ".algorithm.type"), "missing"));
                }
                let t = fields["algorithm"].as_str().unwrap_or_default().to_string();
                // A windowed algorithm without its own numbers takes rate_limit's.
                if t != "token_bucket" && t != "quota" && !fields.contains_key("limit") && !fields.contains_key("rate") {
                    fields.insert("limit".into(), json!(rpu));
                    if !fields.contains_key("window") {
                        fields.insert("window".into(), json!(format!("{}s", unit.1)));
                    }
                }
                for (k, v) in fields {
                    if matches!(k.as_str(), "name" | "key" | "shadow" | "match") {
                        return Err(self.err(&format!("{}.algorithm.{k}", at.trim_end_matches(".rate_limit")), "set by the descriptor, not by algorithm"));
                    }
                    value.insert(k, v);
                }
            }
            Some(_) => return Err(self.err(&format!("{}.algorithm", at.trim_end_matches(".rate_limit")), "expected an algorithm's name or a mapping with `type`")),
        }
        // A concurrency limit's slots are given back by a release, which the
        // RLS protocol has not: each request would hold one until its lease ends.
        if value.get("algorithm").and_then(Value::as_str) == Some("concurrency") {
            return Err(self.err(
                &format!("{}.algorithm", at.trim_end_matches(".rate_limit")),
                format!(
                    "concurrency is refused (rule {rule:?}): the rate limit service protocol (gRPC ShouldRateLimit, POST /json) has no release, so every admitted request would hold its slot until the lease ends; limit concurrency with a native policy through POST /v1/check and POST /v1/release"
                ),
            ));
        }
        let index = self.rules.len();
        // The core names the rule's fields; the message is prefixed with where it is in the YAML.
        Policy::from_value(&json!({ "rules": [Value::Object(value.clone())] })).map_err(|e| {
            let msg = e.message().trim_start_matches("rules[0] ").to_string();
            self.err(at.trim_end_matches(".rate_limit"), msg)
        })?;
        let _ = index;
        self.rules.push(Value::Object(value));
        Ok(Limit::Rule { rule, name, replaces })
    }
}

fn scalar(v: &Yaml) -> Option<String> {
    match v {
        Yaml::String(s) => Some(s.clone()),
        Yaml::Number(n) => Some(n.to_string()),
        Yaml::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn boolean(v: &Yaml) -> Option<bool> {
    v.as_bool()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(text: &str) -> Result<Rules> {
        Rules::from_yaml(&[("t.yaml".into(), text.into())])
    }

    #[test]
    fn wildcards_match_as_the_reference_does() {
        let p = |s: &str| s.split('*').map(str::to_string).collect::<Vec<_>>();
        assert!(wildcard_match(&p("value*"), "value1"));
        assert!(wildcard_match(&p("value*"), "value"));
        assert!(!wildcard_match(&p("value*"), "valu"));
        assert!(wildcard_match(&p("/api/*/action"), "/api/123/action"));
        assert!(!wildcard_match(&p("/api/*/action"), "/api/123/other"));
        assert!(wildcard_match(&p("/api/*/resource/*/action"), "/api/v1/resource/123/action"));
        assert!(!wildcard_match(&p("a*a"), "a"));
    }

    #[test]
    fn most_specific_match_and_depth() {
        let r = yaml(
            "domain: d\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: remote_address\n    value: 50.0.0.5\n    rate_limit: {unit: second, requests_per_unit: 0}\n  - key: k\n    value: v\n    rate_limit: {unit: second, requests_per_unit: 300}\n",
        )
        .unwrap();
        let d = &r.domains["d"];
        assert!(matches!(d.matches(&[("remote_address", "50.0.0.1")]).unwrap().limit, Limit::Rule { .. }));
        assert!(matches!(d.matches(&[("remote_address", "50.0.0.5")]).unwrap().limit, Limit::Zero { .. }));
        assert!(d.matches(&[("k", "v"), ("subkey", "x")]).is_none());
        assert!(d.matches(&[("other", "v")]).is_none());
        assert_eq!(r.policy.rules().len(), 2);
    }

    #[test]
    fn values_are_escaped_so_no_pair_forges_another() {
        let r = yaml("domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap();
        let d = &r.domains["d"];
        let one = d.matches(&[("a", "x:y"), ("b", "z")]).unwrap().value;
        let two = d.matches(&[("a", "x"), ("b", "y:z")]).unwrap().value;
        assert_ne!(one, two);
    }

    #[test]
    fn errors_name_the_field() {
        let e = yaml("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n    algorithm: {type: concurrency, limit: 2, lease: 30s}\n").unwrap_err();
        assert!(e.message().starts_with("t.yaml: descriptors[0].algorithm: concurrency is refused (rule \"d.a\"): the rate limit service protocol"), "{e}");
        let e = yaml("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n    algorithm: concurrency\n").unwrap_err();
        assert!(e.message().contains("concurrency is refused"), "{e}");
        let e = yaml("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").unwrap_err();
        assert!(e.message().contains("descriptors[0].rate_limit.unit"), "{e}");
        let e = yaml("domain: d\ndescriptors:\n  - key: a\n    colour: red\n").unwrap_err();
        assert_eq!(e.message(), "t.yaml: descriptors[0].colour: unknown field");
        let e = yaml("domain: d\ndescriptors:\n  - key: a\n    quota_mode: true\n").unwrap_err();
        assert!(e.message().contains("descriptors[0].quota_mode: not supported"), "{e}");
        let e = yaml("descriptors: []\n").unwrap_err();
        assert!(e.message().contains("domain: missing"), "{e}");
        let e = yaml("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n    algorithm: {type: token_bucket, capacity: 0, refill_rate: 1}\n").unwrap_err();
        assert!(e.message().contains("descriptors[0]") && e.message().contains("capacity"), "{e}");
    }

    #[test]
    fn algorithm_extension() {
        let r = yaml("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 5}\n    algorithm: sliding_window_log\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 5}\n    algorithm: {type: token_bucket, capacity: 10, refill_rate: 2}\n").unwrap();
        let names: Vec<&str> = r.policy.rules().iter().map(|r| r.algorithm.name()).collect();
        assert_eq!(names, ["sliding_window_log", "token_bucket"]);
        let r = yaml("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 5}\n    algorithm: {type: sliding_window, precision: 1s}\n  - key: b\n    rate_limit: {unit: day, requests_per_unit: 5}\n    algorithm: {type: quota, limit: 1000000, period: month}\n").unwrap();
        let rules = r.policy.rules();
        assert_eq!((rules[0].algorithm.name(), rules[0].algorithm.limit()), ("sliding_window", 5));
        assert_eq!((rules[1].algorithm.name(), rules[1].algorithm.limit()), ("quota", 1_000_000));
        let e = yaml("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 5}\n    algorithm: {type: token_bucket, capacity: 5, refill_rate: 1, name: x}\n").unwrap_err();
        assert!(e.message().contains("descriptors[0].algorithm.name: set by the descriptor"), "{e}");
    }
}
