//! Synthetic traffic: attribute templates, clients, phases, and a small
//! seeded random generator, so a simulation is the same on every run.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use throttlegate::duration::parse_duration;
use throttlegate::{KeyTemplate, Policy};

use crate::error::{CliError, CliResult};

/// Most requests one simulation may generate (keeps a typo from running for hours).
pub const MAX_REQUESTS: f64 = 50_000_000.0;
/// Most distinct clients in one phase.
pub const MAX_CLIENTS: u64 = 1_000_000;

/// SplitMix64: tiny, fast, and the same sequence everywhere for a seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5eed_7468_726f_7474)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }
}

/// One piece of an attribute template.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Client,
    Phase,
}

/// An attribute value template: `"10.0.{client}.1"`; alternatives separated
/// by `|` (or a list in a scenario file) are picked at random per request.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueTemplate {
    alternatives: Vec<Vec<Piece>>,
}

impl ValueTemplate {
    /// Parse one template; `at` names it in errors.
    pub fn parse(alternatives: &[String], at: &str) -> CliResult<ValueTemplate> {
        if alternatives.is_empty() {
            return Err(CliError::usage(format!("{at}: needs at least one value")));
        }
        let alternatives = alternatives
            .iter()
            .map(|a| parse_pieces(a, at))
            .collect::<CliResult<Vec<_>>>()?;
        Ok(ValueTemplate { alternatives })
    }

    /// Parse the command-line form, where `|` separates alternatives.
    pub fn parse_flag(text: &str, at: &str) -> CliResult<ValueTemplate> {
        let alts: Vec<String> = text.split('|').map(str::to_string).collect();
        ValueTemplate::parse(&alts, at)
    }

    /// Whether the value depends on the random generator.
    pub fn is_random(&self) -> bool {
        self.alternatives.len() > 1
    }

    fn render(&self, pieces: &[Piece], client: u64, phase: &str, out: &mut String) {
        for p in pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Client => {
                    use std::fmt::Write as _;
                    let _ = write!(out, "{client}");
                }
                Piece::Phase => out.push_str(phase),
            }
        }
    }

    /// The value for one request.
    pub fn value(&self, client: u64, phase: &str, rng: &mut Rng) -> String {
        let pieces = if self.alternatives.len() == 1 {
            &self.alternatives[0]
        } else {
            &self.alternatives[rng.below(self.alternatives.len())]
        };
        let mut s = String::new();
        self.render(pieces, client, phase, &mut s);
        s
    }

    /// The template as written, alternatives joined with `|`.
    pub fn describe(&self) -> String {
        let alts: Vec<String> = self
            .alternatives
            .iter()
            .map(|pieces| {
                pieces
                    .iter()
                    .map(|p| match p {
                        Piece::Text(t) => t.as_str(),
                        Piece::Client => "{client}",
                        Piece::Phase => "{phase}",
                    })
                    .collect()
            })
            .collect();
        alts.join("|")
    }

    /// Every value this template can give for a client.
    pub fn all_values(&self, client: u64, phase: &str) -> Vec<String> {
        self.alternatives
            .iter()
            .map(|p| {
                let mut s = String::new();
                self.render(p, client, phase, &mut s);
                s
            })
            .collect()
    }
}

fn parse_pieces(text: &str, at: &str) -> CliResult<Vec<Piece>> {
    let mut pieces = Vec::new();
    let mut lit = String::new();
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        lit.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| CliError::usage(format!("{at}: {text:?} has an unclosed '{{'")))?;
        let piece = match &after[..close] {
            "client" => Piece::Client,
            "phase" => Piece::Phase,
            other => {
                return Err(CliError::usage(format!(
                    "{at}: unknown placeholder {{{other}}} in {text:?}; use {{client}} or {{phase}}"
                )))
            }
        };
        if !lit.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut lit)));
        }
        pieces.push(piece);
        rest = &after[close + 1..];
    }
    lit.push_str(rest);
    if !lit.is_empty() {
        pieces.push(Piece::Text(lit));
    }
    Ok(pieces)
}

/// Attribute name -> value template, in name order.
pub type AttributeTemplates = BTreeMap<String, ValueTemplate>;

/// Every attribute set `templates` can produce for one client (the product
/// of the alternatives), or `None` when there are more than `cap`.
pub fn attribute_variants(
    templates: &AttributeTemplates,
    client: u64,
    phase: &str,
    cap: usize,
) -> Option<Vec<Vec<(String, String)>>> {
    let mut sets: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for (name, t) in templates {
        let values = t.all_values(client, phase);
        if sets.len() * values.len() > cap {
            return None;
        }
        sets = sets
            .into_iter()
            .flat_map(|set| {
                values.iter().map(move |v| {
                    let mut s = set.clone();
                    s.push((name.clone(), v.clone()));
                    s
                })
            })
            .collect();
    }
    Some(sets)
}

/// Parse `NAME=TEMPLATE` flags.
pub fn parse_attr_flags(flags: &[String]) -> CliResult<AttributeTemplates> {
    let mut out = AttributeTemplates::new();
    for flag in flags {
        let (name, template) = flag.split_once('=').ok_or_else(|| {
            CliError::usage(format!(
                "--attr {flag:?}: expected NAME=TEMPLATE, e.g. ip=10.0.{{client}}.1"
            ))
        })?;
        check_attr_name(name, &format!("--attr {flag:?}"))?;
        if out
            .insert(
                name.to_string(),
                ValueTemplate::parse_flag(template, &format!("--attr {name}"))?,
            )
            .is_some()
        {
            return Err(CliError::usage(format!("--attr {name}: given twice")));
        }
    }
    Ok(out)
}

/// Attribute names are what policies can name: non-empty, no `=`.
pub fn check_attr_name(name: &str, at: &str) -> CliResult<()> {
    if name.is_empty() {
        return Err(CliError::usage(format!(
            "{at}: the attribute name is empty"
        )));
    }
    if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(CliError::usage(format!(
            "{at}: attribute name {name:?} contains a space or control character"
        )));
    }
    Ok(())
}

/// Attributes that exercise every rule of `policy`, for a simulation or a
/// benchmark run without attribute templates: each attribute a key template
/// names gets a per-client value, and each attribute a `match` names takes
/// one of the matched values or `"other"` at random, so rules with a `match`
/// see part of the traffic.
pub fn templates_for_policy(policy: &Policy) -> AttributeTemplates {
    let mut matched: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut keyed: Vec<String> = Vec::new();
    for rule in policy.rules() {
        for (attr, values) in &rule.matches {
            let entry = matched.entry(attr.clone()).or_default();
            for v in values {
                if !entry.contains(v) {
                    entry.push(v.clone());
                }
            }
        }
        if let Ok(t) = KeyTemplate::parse(&rule.key) {
            for a in t.attributes() {
                if !keyed.iter().any(|k| k == a) {
                    keyed.push(a.to_string());
                }
            }
        }
    }
    let mut out = AttributeTemplates::new();
    for (attr, mut values) in matched {
        values.push("other".to_string());
        let alternatives = values
            .iter()
            .map(|v| vec![Piece::Text(v.clone())])
            .collect();
        out.insert(attr, ValueTemplate { alternatives });
    }
    for attr in keyed {
        if out.contains_key(&attr) {
            continue;
        }
        let text = if attr == "ip" {
            vec![Piece::Text("10.0.0.".into()), Piece::Client]
        } else {
            vec![Piece::Text(format!("{attr}-")), Piece::Client]
        };
        out.insert(
            attr,
            ValueTemplate {
                alternatives: vec![text],
            },
        );
    }
    out
}

/// One phase of traffic.
#[derive(Debug, Clone)]
pub struct Phase {
    /// Shown in reports; `{phase}` in templates.
    pub name: String,
    /// How long the phase lasts (virtual time).
    pub duration: Duration,
    /// Requests per second, all clients together (0: a quiet period).
    pub rate: f64,
    /// Requests per arrival: one client sends `burst` requests at the same instant.
    pub burst: u64,
    /// Distinct clients (`{client}` is `0..clients`).
    pub clients: u64,
    /// Zipf exponent of client popularity: 0 = uniform, 1 = client 0 sends
    /// twice as much as client 1, three times as much as client 2...
    pub skew: f64,
    /// Cost of each request.
    pub cost: u64,
    /// Attribute templates of this phase.
    pub attributes: AttributeTemplates,
}

impl Phase {
    /// Expected number of requests.
    pub fn expected_requests(&self) -> f64 {
        self.rate * self.duration.as_secs_f64()
    }

    /// Validate the numbers; `at` names the phase in errors.
    pub fn validate(&self, at: &str) -> CliResult<()> {
        if !self.rate.is_finite() || self.rate < 0.0 || self.rate > 10_000_000.0 {
            return Err(CliError::usage(format!(
                "{at}: rate must be between 0 and 10000000 requests per second, not {}",
                self.rate
            )));
        }
        if self.duration.is_zero() {
            return Err(CliError::usage(format!(
                "{at}: duration must be at least 1ms"
            )));
        }
        if self.burst == 0 || self.burst > 100_000 {
            return Err(CliError::usage(format!(
                "{at}: burst must be between 1 and 100000, not {}",
                self.burst
            )));
        }
        if self.clients == 0 || self.clients > MAX_CLIENTS {
            return Err(CliError::usage(format!(
                "{at}: clients must be between 1 and {MAX_CLIENTS}, not {}",
                self.clients
            )));
        }
        if !self.skew.is_finite() || !(0.0..=10.0).contains(&self.skew) {
            return Err(CliError::usage(format!(
                "{at}: skew must be between 0 and 10, not {}",
                self.skew
            )));
        }
        if self.cost == 0 {
            return Err(CliError::usage(format!("{at}: cost must be at least 1")));
        }
        Ok(())
    }
}

/// Picks clients by popularity (Zipf), in O(log n) per pick.
#[derive(Debug, Clone)]
pub struct ClientPicker {
    cumulative: Vec<f64>,
}

impl ClientPicker {
    /// A picker over `clients` clients with Zipf exponent `skew`.
    pub fn new(clients: u64, skew: f64) -> ClientPicker {
        if skew == 0.0 {
            return ClientPicker {
                cumulative: Vec::new(),
            };
        }
        let mut total = 0.0;
        let cumulative = (0..clients)
            .map(|i| {
                total += 1.0 / ((i + 1) as f64).powf(skew);
                total
            })
            .collect();
        ClientPicker { cumulative }
    }

    /// One client index in `0..clients`.
    pub fn pick(&self, clients: u64, rng: &mut Rng) -> u64 {
        if self.cumulative.is_empty() {
            return rng.below(clients as usize) as u64;
        }
        let x = rng.unit() * self.cumulative[self.cumulative.len() - 1];
        self.cumulative
            .partition_point(|&c| c <= x)
            .min(self.cumulative.len() - 1) as u64
    }
}

/// A whole traffic pattern.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The phases, run one after the other.
    pub phases: Vec<Phase>,
    /// Random seed (arrivals, client picks, alternatives).
    pub seed: u64,
    /// Report interval, if the scenario fixes one.
    pub interval: Option<Duration>,
}

impl Scenario {
    /// The total virtual duration.
    pub fn duration(&self) -> Duration {
        self.phases.iter().map(|p| p.duration).sum()
    }

    /// Refuse patterns too large to simulate in reasonable time.
    pub fn validate(&self) -> CliResult<()> {
        if self.phases.is_empty() {
            return Err(CliError::usage("the scenario has no phases"));
        }
        for (i, p) in self.phases.iter().enumerate() {
            p.validate(&format!("phase {} ({:?})", i + 1, p.name))?;
        }
        let total: f64 = self.phases.iter().map(Phase::expected_requests).sum();
        if total > MAX_REQUESTS {
            return Err(CliError::usage(format!(
                "the traffic pattern makes about {total:.0} requests; at most {MAX_REQUESTS:.0} can be simulated (lower the rate or the duration)"
            )));
        }
        Ok(())
    }
}

// ---- scenario files ----------------------------------------------------------

#[derive(Deserialize)]
#[serde(untagged)]
enum DurationSpec {
    Millis(u64),
    Text(String),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ValueSpec {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    seed: Option<u64>,
    interval: Option<DurationSpec>,
    #[serde(default)]
    attributes: BTreeMap<String, ValueSpec>,
    #[serde(default)]
    phases: Vec<PhaseFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PhaseFile {
    name: Option<String>,
    duration: DurationSpec,
    rate: f64,
    burst: Option<u64>,
    clients: Option<u64>,
    skew: Option<f64>,
    cost: Option<u64>,
    #[serde(default)]
    attributes: BTreeMap<String, ValueSpec>,
}

fn duration_of(spec: &DurationSpec, at: &str) -> CliResult<Duration> {
    match spec {
        DurationSpec::Millis(ms) => Ok(Duration::from_millis(*ms)),
        DurationSpec::Text(t) => {
            parse_duration(t).map_err(|m| CliError::usage(format!("{at}: {m}")))
        }
    }
}

fn templates_of(specs: &BTreeMap<String, ValueSpec>, at: &str) -> CliResult<AttributeTemplates> {
    let mut out = AttributeTemplates::new();
    for (name, spec) in specs {
        let here = format!("{at}attributes.{name}");
        check_attr_name(name, &here)?;
        let alts = match spec {
            ValueSpec::One(s) => vec![s.clone()],
            ValueSpec::Many(v) => v.clone(),
        };
        out.insert(name.clone(), ValueTemplate::parse(&alts, &here)?);
    }
    Ok(out)
}

/// Defaults a scenario file's phases fall back on (the command-line flags).
#[derive(Debug, Clone)]
pub struct PhaseDefaults {
    /// Requests per arrival.
    pub burst: u64,
    /// Distinct clients.
    pub clients: u64,
    /// Zipf exponent.
    pub skew: f64,
    /// Cost per request.
    pub cost: u64,
}

/// Read a scenario file (TOML). Top-level `attributes` apply to every phase;
/// a phase's own `attributes` replace those of the same name.
pub fn load_scenario(path: &str, defaults: &PhaseDefaults) -> CliResult<Scenario> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::usage(format!("cannot read scenario file {path}: {e}")))?;
    let file: ScenarioFile = toml::from_str(&text).map_err(|e| {
        let msg = e.message().to_string();
        let line = e
            .span()
            .map(|s| {
                text.as_bytes()[..s.start.min(text.len())]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count()
                    + 1
            })
            .map(|l| format!(" (line {l})"))
            .unwrap_or_default();
        CliError::usage(format!("scenario file {path}{line}: {msg}"))
    })?;
    let top = templates_of(&file.attributes, &format!("scenario file {path}: "))?;
    let interval = file
        .interval
        .as_ref()
        .map(|d| duration_of(d, &format!("scenario file {path}: interval")))
        .transpose()?;
    let mut phases = Vec::with_capacity(file.phases.len());
    for (i, p) in file.phases.iter().enumerate() {
        let name = p.name.clone().unwrap_or_else(|| format!("phase {}", i + 1));
        let at = format!("scenario file {path}: phases[{i}] ({name:?}): ");
        let mut attributes = top.clone();
        attributes.extend(templates_of(&p.attributes, &at)?);
        phases.push(Phase {
            duration: duration_of(&p.duration, &format!("{at}duration"))?,
            rate: p.rate,
            burst: p.burst.unwrap_or(defaults.burst),
            clients: p.clients.unwrap_or(defaults.clients),
            skew: p.skew.unwrap_or(defaults.skew),
            cost: p.cost.unwrap_or(defaults.cost),
            attributes,
            name,
        });
    }
    if phases.is_empty() {
        return Err(CliError::usage(format!(
            "scenario file {path}: no [[phases]]; a scenario needs at least one phase"
        )));
    }
    Ok(Scenario {
        phases,
        seed: file.seed.unwrap_or(1),
        interval,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_render_clients_and_phases() {
        let t = ValueTemplate::parse_flag("10.0.{client}.1", "t").unwrap();
        let mut rng = Rng::new(1);
        assert_eq!(t.value(7, "p", &mut rng), "10.0.7.1");
        let t = ValueTemplate::parse_flag("{phase}-{client}", "t").unwrap();
        assert_eq!(t.value(3, "spike", &mut rng), "spike-3");
        let t = ValueTemplate::parse_flag("/a|/b", "t").unwrap();
        assert!(t.is_random());
        assert_eq!(t.all_values(0, ""), vec!["/a", "/b"]);
        let err = ValueTemplate::parse_flag("x{nope}", "--attr ip").unwrap_err();
        assert!(err.message.contains("{nope}"), "{}", err.message);
        assert!(ValueTemplate::parse_flag("x{client", "t").is_err());
        assert_eq!(
            ValueTemplate::parse_flag("a{client}|b", "t")
                .unwrap()
                .describe(),
            "a{client}|b"
        );
    }

    #[test]
    fn seeded_generator_is_reproducible_and_uniform_enough() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        let xs: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        let mut counts = [0u32; 4];
        for _ in 0..40_000 {
            counts[a.below(4)] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn zipf_prefers_the_first_clients() {
        let p = ClientPicker::new(100, 1.0);
        let mut rng = Rng::new(5);
        let mut hits = vec![0u32; 100];
        for _ in 0..100_000 {
            hits[p.pick(100, &mut rng) as usize] += 1;
        }
        assert!(hits[0] > hits[1] && hits[1] > hits[9] && hits[9] > hits[99]);
        let u = ClientPicker::new(10, 0.0);
        assert!((0..1000).all(|_| u.pick(10, &mut rng) < 10));
    }

    #[test]
    fn policy_templates_cover_keys_and_matches() {
        let policy = Policy::from_str_any(
            r#"
            [[rules]]
            name = "a"
            key = "ip:{ip}"
            limit = 1
            window = "1s"
            [[rules]]
            name = "b"
            key = "k:{api_key}"
            match = { route = ["/login"] }
            limit = 1
            window = "1s"
            "#,
        )
        .unwrap();
        let t = templates_for_policy(&policy);
        assert_eq!(t.keys().collect::<Vec<_>>(), vec!["api_key", "ip", "route"]);
        assert_eq!(t["route"].all_values(0, ""), vec!["/login", "other"]);
        assert_eq!(t["ip"].all_values(4, ""), vec!["10.0.0.4"]);
        let sets = attribute_variants(&t, 4, "", 10).unwrap();
        assert_eq!(sets.len(), 2);
        assert_eq!(sets[1][2], ("route".to_string(), "other".to_string()));
        assert!(attribute_variants(&t, 4, "", 1).is_none());
    }
}
