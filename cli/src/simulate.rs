//! `simulate`: a traffic pattern through a policy, in virtual time.
//!
//! Requests arrive as a Poisson process (seeded), clients are picked by
//! popularity (Zipf), and a manual clock jumps from one arrival to the next,
//! so hours of traffic take seconds and every run with the same seed prints
//! the same report.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};
use throttlegate::duration::format_duration;
use throttlegate::{Algorithm, Clock, Limiter, ManualClock, Policy};

use crate::error::{CliError, CliResult, EXIT_OK};
use crate::traffic::{
    load_scenario, parse_attr_flags, templates_for_policy, AttributeTemplates, ClientPicker, Phase,
    PhaseDefaults, Rng, Scenario,
};
use crate::{parse_duration_arg, BackendArgs};

/// Shown after `simulate --help`.
pub const AFTER_HELP: &str = "\
Without --attr or a scenario, attributes are made up from the policy: every attribute a key
template names gets one value per client (ip = 10.0.0.{client}, others NAME-{client}), and every
attribute a `match` names takes one of its values or \"other\" at random.

Attribute templates: {client} is the client number, {phase} the phase name; A|B|C picks one
alternative at random per request.  Example:
  throttlegate simulate --rules rules.toml --rate 200 --duration 1h --clients 50 \\
      --attr ip=10.0.{client}.1 --attr route='/login|/api'

Scenario file (TOML), phases run one after the other:
  seed = 7
  interval = \"1m\"
  [attributes]                # every phase
  ip = \"10.0.{client}.1\"
  [[phases]]
  name = \"steady\"
  duration = \"10m\"
  rate = 20                   # requests per second, all clients together
  clients = 50                # optional: burst, skew, cost, attributes
  [[phases]]
  name = \"login storm\"
  duration = \"5m\"
  rate = 300
  clients = 3
  attributes = { route = \"/login\", method = \"POST\" }";

/// Options of `simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// Traffic phases from a TOML file (instead of --rate/--duration).
    #[arg(long, value_name = "FILE")]
    scenario: Option<PathBuf>,
    /// Requests per second, all clients together.
    #[arg(
        long,
        default_value_t = 50.0,
        conflicts_with = "scenario",
        allow_negative_numbers = true
    )]
    rate: f64,
    /// Length of the simulated traffic (virtual time).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration_arg, conflicts_with = "scenario")]
    duration: Duration,
    /// Requests per arrival: a client sends this many at the same instant
    /// (with --scenario: for phases that do not set it; so are the next three).
    #[arg(long, default_value_t = 1)]
    burst: u64,
    /// Distinct clients.
    #[arg(long, default_value_t = 20)]
    clients: u64,
    /// Client popularity (Zipf exponent): 0 = all alike, 1 = a few heavy clients.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    skew: f64,
    /// Cost of each request.
    #[arg(long, default_value_t = 1)]
    cost: u64,
    /// Attribute template, NAME=TEMPLATE (repeatable; wins over a scenario's); see below.
    #[arg(long = "attr", value_name = "NAME=TEMPLATE")]
    attrs: Vec<String>,
    /// Length of one row of the report (default: about 10-15 rows).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
    interval: Option<Duration>,
    /// Random seed: the same seed gives the same traffic and report.
    #[arg(long)]
    seed: Option<u64>,
    /// Run against Redis (keys under a fresh prefix, removed afterwards)
    /// instead of the embedded backend.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// How many of the most denied clients to list.
    #[arg(long, default_value_t = 5)]
    top: usize,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Also write the run as one self-contained HTML page of charts (no
    /// network needed to view it): requests allowed and denied per rule over
    /// virtual time, the shadow rules' would-be denials, the most denied clients.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// A second policy run on the same traffic: its tables follow the first
    /// one's, and the --report page draws both side by side.
    #[arg(long, value_name = "FILE")]
    compare: Option<PathBuf>,
}

/// The virtual clock starts at 2026-01-01T00:00:00Z, so runs are reproducible.
const START_US: i64 = 1_767_225_600_000_000;
const NICE_INTERVALS_S: &[u64] = &[
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
];

fn default_interval(total: Duration) -> Duration {
    let target = total.as_secs_f64() / 15.0;
    let s = NICE_INTERVALS_S
        .iter()
        .copied()
        .find(|&s| s as f64 >= target)
        .unwrap_or(86400);
    Duration::from_secs(s)
}

/// Requests allowed and denied (by a rule, or by the whole policy).
#[derive(Debug, Clone, Default)]
pub(crate) struct Counts {
    pub allowed: u64,
    pub denied: u64,
    /// Shadow rules: denials of requests the policy admitted.
    pub would_deny_admitted: u64,
}

/// One rule over the whole run.
#[derive(Debug, Clone, Default)]
pub(crate) struct RuleTotals {
    pub applied: u64,
    pub allowed: u64,
    pub denied: u64,
    /// Denials where this rule was the headline (most restrictive) rule.
    pub caused: u64,
    /// Shadow rules: would have denied a request that was admitted.
    pub would_deny_admitted: u64,
}

/// One interval of the run: the policy's decisions and each rule's.
#[derive(Debug, Clone, Default)]
pub(crate) struct Interval {
    pub total: Counts,
    /// In policy order.
    pub rules: Vec<Counts>,
}

/// One client (in one phase) over the whole run.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClientTotals {
    pub requests: u64,
    pub denied: u64,
    /// Its fixed attributes (`ip=10.0.0.3 api_key=api_key-3`).
    pub label: String,
}

/// What one policy did to the traffic.
pub(crate) struct Report {
    pub interval: Duration,
    pub intervals: Vec<Interval>,
    pub rules: Vec<RuleTotals>,
    pub phases: Vec<Counts>,
    pub clients: HashMap<(usize, u64), ClientTotals>,
    pub total: Counts,
}

fn client_label(templates: &AttributeTemplates, attrs: &[(String, String)]) -> String {
    let fixed: Vec<String> = attrs
        .iter()
        .filter(|(k, _)| templates.get(k).is_some_and(|t| !t.is_random()))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    fixed.join(" ")
}

/// Build the scenario from the flags or the scenario file.
fn scenario_of(args: &SimulateArgs, policy: &Policy, other: Option<&Policy>) -> CliResult<Scenario> {
    let defaults = PhaseDefaults {
        burst: args.burst,
        clients: args.clients,
        skew: args.skew,
        cost: args.cost,
    };
    let flags = parse_attr_flags(&args.attrs)?;
    let mut scenario = match &args.scenario {
        Some(path) => load_scenario(&path.to_string_lossy(), &defaults)?,
        None => Scenario {
            phases: vec![Phase {
                name: "traffic".into(),
                duration: args.duration,
                rate: args.rate,
                burst: args.burst,
                clients: args.clients,
                skew: args.skew,
                cost: args.cost,
                attributes: AttributeTemplates::new(),
            }],
            seed: 1,
            interval: None,
        },
    };
    for phase in &mut scenario.phases {
        phase.attributes.extend(flags.clone());
        if phase.attributes.is_empty() {
            phase.attributes = templates_for_policy(policy);
            // The same traffic for both policies: it carries the attributes
            // the compared policy names too (the first policy's win).
            if let Some(other) = other {
                for (name, t) in templates_for_policy(other) {
                    phase.attributes.entry(name).or_insert(t);
                }
            }
        }
    }
    if let Some(seed) = args.seed {
        scenario.seed = seed;
    }
    if let Some(i) = args.interval {
        scenario.interval = Some(i);
    }
    scenario.validate()?;
    Ok(scenario)
}

fn unique_prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "throttlegate-sim:{}-{:x}:",
        std::process::id(),
        nanos & 0xffff_ffff_ffff
    )
}

async fn drive(
    limiter: &Limiter,
    clock: &ManualClock,
    policy: &Policy,
    scenario: &Scenario,
    interval: Duration,
    remember_attrs: bool,
) -> CliResult<(Report, HashSet<Vec<(String, String)>>)> {
    let index: HashMap<&str, usize> = policy
        .rules()
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name.as_str(), i))
        .collect();
    let total_us = scenario.duration().as_micros() as i64;
    let interval_us = interval.as_micros() as i64;
    let slots = ((total_us + interval_us - 1) / interval_us).max(1) as usize;
    let n_rules = policy.rules().len();
    let mut report = Report {
        interval,
        intervals: vec![
            Interval {
                total: Counts::default(),
                rules: vec![Counts::default(); n_rules],
            };
            slots
        ],
        rules: vec![RuleTotals::default(); n_rules],
        phases: vec![Counts::default(); scenario.phases.len()],
        clients: HashMap::new(),
        total: Counts::default(),
    };
    let mut seen = HashSet::new();
    let mut rng = Rng::new(scenario.seed);
    let mut phase_start: i64 = 0;
    for (pi, phase) in scenario.phases.iter().enumerate() {
        let end = phase_start + phase.duration.as_micros() as i64;
        let picker = ClientPicker::new(phase.clients, phase.skew);
        let events_per_us = phase.rate / phase.burst as f64 / 1e6;
        let mut t = phase_start as f64;
        loop {
            // A phase at rate 0 is a quiet period: the clock moves, nothing arrives.
            if events_per_us <= 0.0 {
                break;
            }
            // Exponential gaps: a Poisson process of arrivals.
            t += -(1.0 - rng.unit()).ln() / events_per_us;
            let at = t.round() as i64;
            if at >= end {
                break;
            }
            clock.set_us(START_US + at);
            let client = picker.pick(phase.clients, &mut rng);
            let attrs: Vec<(String, String)> = phase
                .attributes
                .iter()
                .map(|(k, tpl)| (k.clone(), tpl.value(client, &phase.name, &mut rng)))
                .collect();
            let slot = ((at / interval_us) as usize).min(slots - 1);
            for _ in 0..phase.burst {
                let d = limiter.check(&attrs, phase.cost).await?;
                if d.degraded {
                    return Err(CliError {
                        kind: "backend_unavailable",
                        message: "the backend failed during the simulation".into(),
                        exit: crate::error::EXIT_BACKEND,
                    });
                }
                let row = &mut report.intervals[slot];
                let bump = |c: &mut Counts, ok: bool| {
                    if ok {
                        c.allowed += 1
                    } else {
                        c.denied += 1
                    }
                };
                bump(&mut row.total, d.allowed);
                bump(&mut report.total, d.allowed);
                bump(&mut report.phases[pi], d.allowed);
                for r in &d.results {
                    let i = index[&*r.rule];
                    bump(&mut row.rules[i], r.allowed);
                    let tot = &mut report.rules[i];
                    tot.applied += 1;
                    if r.allowed {
                        tot.allowed += 1;
                    } else {
                        tot.denied += 1;
                        if r.shadow && d.allowed {
                            tot.would_deny_admitted += 1;
                            row.rules[i].would_deny_admitted += 1;
                        }
                    }
                }
                if let (false, Some(rule)) = (d.allowed, &d.rule) {
                    report.rules[index[&**rule]].caused += 1;
                }
                let c = report
                    .clients
                    .entry((pi, client))
                    .or_insert_with(|| ClientTotals {
                        label: client_label(&phase.attributes, &attrs),
                        ..ClientTotals::default()
                    });
                c.requests += 1;
                if !d.allowed {
                    c.denied += 1;
                }
            }
            if remember_attrs && seen.len() < 1_000_000 {
                seen.insert(attrs);
            }
        }
        phase_start = end;
    }
    Ok((report, seen))
}

pub(crate) fn algorithm_text(a: &Algorithm) -> String {
    match *a {
        Algorithm::SlidingWindowLog { limit, window } => {
            format!("{limit} per {}", format_duration(window))
        }
        Algorithm::TokenBucket {
            capacity,
            refill_rate,
        } => format!("bucket {capacity}, +{refill_rate}/s"),
        Algorithm::SlidingWindow { limit, window, precision } => {
            format!("{limit} per {} (counted per {})", format_duration(window), format_duration(precision))
        }
        Algorithm::FixedWindow { limit, window } => {
            format!("{limit} per fixed {}", format_duration(window))
        }
        Algorithm::Quota { limit, period, utc_offset_minutes } => {
            format!("{limit} per {} (UTC{})", period.as_str(), throttlegate::format_utc_offset(utc_offset_minutes))
        }
        Algorithm::Concurrency { limit, lease } => {
            format!("{limit} at once (lease {})", format_duration(lease))
        }
    }
}

pub(crate) fn clock_text(us: i64) -> String {
    let s = us / 1_000_000;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

pub(crate) fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

fn print_report(
    args: &SimulateArgs,
    rules_file: &Path,
    policy: &Policy,
    scenario: &Scenario,
    report: &Report,
    backend: &str,
) {
    let rules = policy.rules();
    let requests = report.total.allowed + report.total.denied;
    println!(
        "Simulating {} on the {} backend: {} of virtual time, seed {}",
        rules_file.display(),
        if backend == "memory" {
            "embedded (in-memory)"
        } else {
            backend
        },
        format_duration(scenario.duration()),
        scenario.seed
    );
    for p in &scenario.phases {
        let attrs: Vec<String> = p
            .attributes
            .iter()
            .map(|(k, t)| format!("{k}={}", t.describe()))
            .collect();
        println!(
            "  phase {:?}: {} at {} req/s, {} clients (skew {}), burst {}, cost {}; {}",
            p.name,
            format_duration(p.duration),
            p.rate,
            p.clients,
            p.skew,
            p.burst,
            p.cost,
            attrs.join(" ")
        );
    }
    println!();
    println!("Per rule: requests it allowed / denied. A request passes only when every rule that");
    println!("applies allows it, and only then counts against all of them.");
    println!();

    // Per-interval table: totals, then allowed/denied per rule.
    let labels: Vec<String> = rules
        .iter()
        .map(|r| {
            if r.shadow {
                format!("{} (shadow)", r.name)
            } else {
                r.name.clone()
            }
        })
        .collect();
    let widths: Vec<usize> = labels.iter().map(|l| l.len().max(14)).collect();
    let mut h1 = format!("{:<8} {:>9} {:>9} {:>9}", "", "", "", "");
    let mut h2 = format!(
        "{:<8} {:>9} {:>9} {:>9}",
        "time", "requests", "allowed", "denied"
    );
    for (l, w) in labels.iter().zip(&widths) {
        h1.push_str(&format!(" | {l:<w$}"));
        h2.push_str(&format!(" | {:>a$} {:>6}", "allowed", "denied", a = w - 7));
    }
    println!("{}", h1.trim_end());
    println!("{h2}");
    let interval_us = report.interval.as_micros() as i64;
    for (i, row) in report.intervals.iter().enumerate() {
        let mut line = format!(
            "{:<8} {:>9} {:>9} {:>9}",
            clock_text(i as i64 * interval_us),
            row.total.allowed + row.total.denied,
            row.total.allowed,
            row.total.denied
        );
        for (c, w) in row.rules.iter().zip(&widths) {
            line.push_str(&format!(" | {:>a$} {:>6}", c.allowed, c.denied, a = w - 7));
        }
        println!("{line}");
    }

    println!();
    println!(
        "Summary: {requests} requests, {} allowed ({}), {} denied ({})",
        report.total.allowed,
        pct(report.total.allowed, requests),
        report.total.denied,
        pct(report.total.denied, requests)
    );
    println!();
    let name_w = labels.iter().map(|l| l.len()).max().unwrap_or(4).max(4);
    let algo: Vec<String> = rules.iter().map(|r| algorithm_text(&r.algorithm)).collect();
    let algo_w = algo.iter().map(|a| a.len()).max().unwrap_or(5).max(5);
    println!(
        "  {:<name_w$}  {:<algo_w$}  {:>9}  {:>9}  {:>9}  {:>7}  {:>15}",
        "rule", "limit", "applied", "allowed", "denied", "denied%", "decided denials"
    );
    for ((r, t), (label, a)) in rules
        .iter()
        .zip(&report.rules)
        .zip(labels.iter().zip(&algo))
    {
        let caused = if r.shadow {
            "-".to_string()
        } else {
            t.caused.to_string()
        };
        println!(
            "  {label:<name_w$}  {a:<algo_w$}  {:>9}  {:>9}  {:>9}  {:>7}  {caused:>15}",
            t.applied,
            t.allowed,
            t.denied,
            pct(t.denied, t.applied)
        );
    }
    println!(
        "  (decided denials: the rule was the most restrictive one, whose Retry-After was sent)"
    );
    for (r, t) in rules.iter().zip(&report.rules) {
        if r.shadow {
            println!(
                "  shadow rule {:?} would have denied {} admitted request(s) ({} of all requests)",
                r.name,
                t.would_deny_admitted,
                pct(t.would_deny_admitted, requests)
            );
        }
    }
    if scenario.phases.len() > 1 {
        println!();
        let pw = scenario
            .phases
            .iter()
            .map(|p| p.name.len())
            .max()
            .unwrap_or(5)
            .max(5);
        println!(
            "  {:<pw$}  {:>9}  {:>9}  {:>9}  {:>7}",
            "phase", "requests", "allowed", "denied", "denied%"
        );
        for (p, c) in scenario.phases.iter().zip(&report.phases) {
            let n = c.allowed + c.denied;
            println!(
                "  {:<pw$}  {n:>9}  {:>9}  {:>9}  {:>7}",
                p.name,
                c.allowed,
                c.denied,
                pct(c.denied, n)
            );
        }
    }
    let top = top_clients(report, args.top);
    if !top.is_empty() {
        println!();
        println!("  most denied clients:");
        for ((pi, client), c) in top {
            let phase = if scenario.phases.len() > 1 {
                format!(" in {:?}", scenario.phases[*pi].name)
            } else {
                String::new()
            };
            let who = if c.label.is_empty() {
                format!("client {client}")
            } else {
                c.label.clone()
            };
            println!(
                "    {who}{phase}: {} of {} denied ({})",
                c.denied,
                c.requests,
                pct(c.denied, c.requests)
            );
        }
    }
}

pub(crate) fn top_clients(report: &Report, n: usize) -> Vec<(&(usize, u64), &ClientTotals)> {
    let mut v: Vec<_> = report
        .clients
        .iter()
        .filter(|(_, c)| c.denied > 0)
        .collect();
    v.sort_by(|a, b| b.1.denied.cmp(&a.1.denied).then(a.0.cmp(b.0)));
    v.truncate(n);
    v
}

fn report_json(run: &Run, scenario: &Scenario, args: &SimulateArgs) -> Value {
    let (report, backend) = (&run.report, run.backend);
    let rules = run.policy.rules();
    let interval_ms = report.interval.as_millis() as u64;
    let intervals: Vec<Value> = report
        .intervals
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let per_rule: serde_json::Map<String, Value> = rules
                .iter()
                .zip(&row.rules)
                .map(|(r, c)| {
                    (
                        r.name.clone(),
                        json!({ "allowed": c.allowed, "denied": c.denied }),
                    )
                })
                .collect();
            json!({
                "start_ms": i as u64 * interval_ms,
                "requests": row.total.allowed + row.total.denied,
                "allowed": row.total.allowed,
                "denied": row.total.denied,
                "rules": per_rule,
            })
        })
        .collect();
    let rule_totals: Vec<Value> = rules
        .iter()
        .zip(&report.rules)
        .map(|(r, t)| {
            json!({
                "rule": r.name, "shadow": r.shadow, "applied": t.applied, "allowed": t.allowed,
                "denied": t.denied, "decided_denials": t.caused,
                "would_deny_admitted": t.would_deny_admitted,
            })
        })
        .collect();
    let phases: Vec<Value> = scenario
        .phases
        .iter()
        .zip(&report.phases)
        .map(|(p, c)| {
            json!({
                "name": p.name, "duration_ms": p.duration.as_millis() as u64, "rate": p.rate,
                "clients": p.clients, "burst": p.burst, "skew": p.skew, "cost": p.cost,
                "requests": c.allowed + c.denied, "allowed": c.allowed, "denied": c.denied,
            })
        })
        .collect();
    let top: Vec<Value> = top_clients(report, args.top)
        .into_iter()
        .map(|((pi, client), c)| {
            json!({ "phase": scenario.phases[*pi].name, "client": client, "attributes": c.label,
                    "requests": c.requests, "denied": c.denied })
        })
        .collect();
    json!({
        "rules_file": run.rules_file.display().to_string(),
        "backend": backend,
        "seed": scenario.seed,
        "duration_ms": scenario.duration().as_millis() as u64,
        "interval_ms": interval_ms,
        "requests": report.total.allowed + report.total.denied,
        "allowed": report.total.allowed,
        "denied": report.total.denied,
        "rules": rule_totals,
        "phases": phases,
        "intervals": intervals,
        "most_denied_clients": top,
    })
}

/// One policy driven through the scenario.
struct Run {
    rules_file: PathBuf,
    policy: Policy,
    report: Report,
    backend: &'static str,
    elapsed: Duration,
}

/// A limiter on a manual clock for `backend` (a fresh prefix on Redis unless one is given).
fn limiter_for(args: &SimulateArgs, backend: &BackendArgs) -> CliResult<(Limiter, ManualClock)> {
    let mut builder = backend.builder(args.redis.as_deref())?;
    if args.redis.is_some() && backend.prefix.is_none() {
        // Never touch the keys of live traffic sharing this Redis.
        builder = builder.prefix(unique_prefix());
    }
    let clock = ManualClock::new(START_US);
    let limiter = builder.clock(Clock::Manual(clock.clone())).build()?;
    Ok((limiter, clock))
}

fn simulate_one(
    args: &SimulateArgs,
    rules_file: &Path,
    limiter: &Limiter,
    clock: &ManualClock,
    scenario: &Scenario,
    interval: Duration,
) -> CliResult<Run> {
    let policy = limiter.policy().clone();
    let started = Instant::now();
    let remember = args.redis.is_some();
    let outcome = throttlegate::runtime::block_on(async {
        if remember {
            limiter.ping().await?;
        }
        let result = drive(limiter, clock, &policy, scenario, interval, remember).await;
        if let Ok((_, seen)) = &result {
            // Remove what the simulation wrote (its keys live under its own prefix).
            for attrs in seen {
                limiter.reset(attrs).await?;
            }
        }
        result
    })?;
    let (report, _) = outcome?;
    Ok(Run {
        rules_file: rules_file.to_path_buf(),
        policy,
        report,
        backend: limiter.backend_name(),
        elapsed: started.elapsed(),
    })
}

/// `throttlegate simulate`.
pub fn run(args: SimulateArgs) -> CliResult<u8> {
    let (limiter, clock) = limiter_for(&args, &args.backend)?;
    let other = match &args.compare {
        Some(path) => {
            let backend = BackendArgs {
                rules: path.clone(),
                ..args.backend.clone()
            };
            Some((path.clone(), limiter_for(&args, &backend)?))
        }
        None => None,
    };
    let (policy, other_policy) = (limiter.policy(), other.as_ref().map(|(_, (l, _))| l.policy()));
    let scenario = scenario_of(&args, &policy, other_policy.as_ref())?;
    let interval = scenario
        .interval
        .unwrap_or_else(|| default_interval(scenario.duration()));
    let mut runs = vec![simulate_one(
        &args,
        &args.backend.rules,
        &limiter,
        &clock,
        &scenario,
        interval,
    )?];
    if let Some((path, (limiter, clock))) = &other {
        runs.push(simulate_one(
            &args, path, limiter, clock, &scenario, interval,
        )?);
    }
    if let Some(path) = &args.report {
        let page = crate::report::Page {
            scenario: &scenario,
            backend: runs[0].backend,
            top: args.top,
            sides: runs
                .iter()
                .map(|r| crate::report::Side {
                    rules_file: r.rules_file.display().to_string(),
                    policy: &r.policy,
                    report: &r.report,
                })
                .collect(),
        };
        crate::report::write(path, &page)?;
        eprintln!("wrote {}", path.display());
    }
    if args.json {
        let mut out = report_json(&runs[0], &scenario, &args);
        if let Some(second) = runs.get(1) {
            out["compare"] = report_json(second, &scenario, &args);
        }
        println!("{out}");
    } else {
        for (i, r) in runs.iter().enumerate() {
            if i > 0 {
                println!();
                println!("Compared with:");
                println!();
            }
            print_report(&args, &r.rules_file, &r.policy, &scenario, &r.report, r.backend);
        }
    }
    for r in &runs {
        let requests = r.report.total.allowed + r.report.total.denied;
        eprintln!(
            "simulated {requests} checks in {:.2}s of real time ({:.0} checks/s)",
            r.elapsed.as_secs_f64(),
            requests as f64 / r.elapsed.as_secs_f64().max(1e-9)
        );
    }
    Ok(EXIT_OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_round_numbers() {
        assert_eq!(
            default_interval(Duration::from_secs(600)),
            Duration::from_secs(60)
        );
        assert_eq!(
            default_interval(Duration::from_secs(3600)),
            Duration::from_secs(300)
        );
        assert_eq!(
            default_interval(Duration::from_secs(10)),
            Duration::from_secs(1)
        );
        assert_eq!(
            default_interval(Duration::from_secs(86400 * 30)),
            Duration::from_secs(86400)
        );
    }

    #[test]
    fn clock_text_is_hours_minutes_seconds() {
        assert_eq!(clock_text(0), "0:00:00");
        assert_eq!(clock_text(3_725_000_000), "1:02:05");
    }
}
