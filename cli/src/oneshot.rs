//! `check`, `peek`, `reset`, `settle`, `release`, `extend` and `acquire`: one call against a backend.

use clap::Args;
use serde_json::{json, Value};
use throttlegate::{ceil_millis, CheckOptions, Decision, HeaderOptions, Limiter};

use crate::error::{CliError, CliResult, EXIT_DENIED, EXIT_OK};
use crate::traffic::check_attr_name;
use crate::BackendArgs;

/// Shown after the help of `check`, `peek` and `reset`.
pub const AFTER_HELP: &str = "\
Attributes are NAME=VALUE pairs, e.g. ip=203.0.113.7 api_key=k_123 route=/login.
The decision goes to stdout (with --json: one JSON object); errors are one line on stderr.

Examples:
  throttlegate check --rules rules.toml --redis redis://127.0.0.1:6379 ip=203.0.113.7
  throttlegate peek  --rules rules.toml --redis redis://127.0.0.1:6379 --json api_key=k_123
  throttlegate reset --rules rules.toml --redis redis://127.0.0.1:6379 api_key=k_123
  throttlegate check --rules rules.toml --redis redis://127.0.0.1:6379 --cost 500 --call-id req-7 tenant=t1
  throttlegate settle --rules rules.toml --redis redis://127.0.0.1:6379 --call-id req-7 --cost 500 --actual 812 tenant=t1
  throttlegate acquire --rules rules.toml --redis redis://127.0.0.1:6379 --wait 5s api_key=k_123
  throttlegate check   --rules rules.toml --redis redis://127.0.0.1:6379 --call-id job-7 user=u1
  throttlegate extend  --rules rules.toml --redis redis://127.0.0.1:6379 --call-id job-7 --duration 30s user=u1
  throttlegate release --rules rules.toml --redis redis://127.0.0.1:6379 --call-id job-7 user=u1

Exit status: 0 allowed (reset: done), 1 denied, 2 bad input, 3 backend failure, 4 internal error.";

/// Options of `check` and `peek`.
#[derive(Debug, Args)]
pub struct LookArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// Backend: redis://host:port/db, rediss://..., redis+unix:///path, or
    /// memory:// (an empty embedded store, for a dry run of a policy).
    #[arg(long, value_name = "URL")]
    redis: String,
    /// Units the request costs.
    #[arg(long, default_value_t = 1)]
    cost: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Also print the legacy X-RateLimit-* headers.
    #[arg(long)]
    legacy_headers: bool,
    /// The request's attributes, NAME=VALUE.
    #[arg(value_name = "ATTR=VALUE")]
    attributes: Vec<String>,
}

/// Options of `check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    look: LookArgs,
    /// Id of this call (1-64 of A-Z a-z 0-9 _ -): repeating a check with the
    /// same id does not count twice.
    #[arg(long, value_name = "ID")]
    call_id: Option<String>,
}

/// Options of `peek`.
#[derive(Debug, Args)]
pub struct PeekArgs {
    #[command(flatten)]
    look: LookArgs,
}

/// Options of `settle`.
#[derive(Debug, Args)]
pub struct SettleArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// Backend URL (as for `check`).
    #[arg(long, value_name = "URL")]
    redis: String,
    /// The call id the check was made with (`check --call-id`).
    #[arg(long, value_name = "ID")]
    call_id: String,
    /// The cost the check was made with (the estimate).
    #[arg(long, default_value_t = 1)]
    cost: u64,
    /// The real cost, known now (0 refunds the whole estimate).
    #[arg(long, value_name = "UNITS")]
    actual: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// The check's attributes, NAME=VALUE.
    #[arg(value_name = "ATTR=VALUE")]
    attributes: Vec<String>,
}

/// Options of `release`.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// Backend URL (as for `check`).
    #[arg(long, value_name = "URL")]
    redis: String,
    /// The lease id: the call id the check was made with (`check --call-id`).
    #[arg(long, value_name = "ID")]
    call_id: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// The check's attributes, NAME=VALUE.
    #[arg(value_name = "ATTR=VALUE")]
    attributes: Vec<String>,
}

/// Options of `extend`.
#[derive(Debug, Args)]
pub struct ExtendArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// Backend URL (as for `check`).
    #[arg(long, value_name = "URL")]
    redis: String,
    /// The lease id: the call id the check was made with (`check --call-id`).
    #[arg(long, value_name = "ID")]
    call_id: String,
    /// How long from now the slots are held (e.g. 30s), on the backend's clock.
    #[arg(long, value_name = "DURATION", value_parser = crate::parse_duration_arg)]
    duration: std::time::Duration,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// The check's attributes, NAME=VALUE.
    #[arg(value_name = "ATTR=VALUE")]
    attributes: Vec<String>,
}

/// Options of `acquire`.
#[derive(Debug, Args)]
pub struct AcquireArgs {
    #[command(flatten)]
    look: LookArgs,
    /// How long to wait at most for the request to be admitted (e.g. 2s).
    #[arg(long = "wait", value_name = "DURATION", value_parser = crate::parse_duration_arg)]
    wait: std::time::Duration,
}

/// Options of `reset`.
#[derive(Debug, Args)]
pub struct ResetArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// Backend URL (as for `check`).
    #[arg(long, value_name = "URL")]
    redis: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// The attributes of the client to unblock, NAME=VALUE.
    #[arg(value_name = "ATTR=VALUE")]
    attributes: Vec<String>,
}

/// Parse `NAME=VALUE` arguments (the value may be empty or contain `=`).
pub fn parse_attributes(args: &[String]) -> CliResult<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = Vec::with_capacity(args.len());
    for a in args {
        let (name, value) = a.split_once('=').ok_or_else(|| {
            CliError::usage(format!(
                "attribute {a:?}: expected NAME=VALUE, e.g. ip=203.0.113.7"
            ))
        })?;
        check_attr_name(name, &format!("attribute {a:?}"))?;
        if out.iter().any(|(n, _)| n == name) {
            return Err(CliError::usage(format!(
                "attribute {name:?} is given twice"
            )));
        }
        out.push((name.to_string(), value.to_string()));
    }
    Ok(out)
}

pub fn connect(backend: &BackendArgs, url: &str) -> CliResult<Limiter> {
    // A clear "cannot reach" (or wrong password, or missing permission)
    // error up front, instead of a decision that a rule's own
    // on_backend_error setting could turn into a degraded answer.
    let limiter = backend.builder(Some(url))?.strict(true).build()?;
    Ok(limiter)
}

/// The decision as JSON: the conformance-vector fields plus `degraded`.
pub fn decision_json(d: &Decision, options: HeaderOptions) -> Value {
    let mut v = d.to_json(options);
    v["degraded"] = Value::Bool(d.degraded);
    if let Some(id) = d.lease_id() {
        v["lease_id"] = Value::from(id);
    }
    v
}

/// A duration in milliseconds, readable: `850ms`, `12.5s`, `3m20s`, `2h05m`.
pub fn human_ms(ms: u64) -> String {
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        let s = ms as f64 / 1000.0;
        if ms % 1000 == 0 {
            format!("{}s", ms / 1000)
        } else {
            format!("{s:.1}s")
        }
    } else if ms < 3_600_000 {
        let s = ms.div_ceil(1000);
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        let m = ms.div_ceil(60_000);
        format!("{}h{:02}m", m / 60, m % 60)
    }
}

fn print_decision(d: &Decision, options: HeaderOptions, peek: bool) {
    let verb = if peek { "would be " } else { "" };
    match (&d.rule, d.allowed) {
        (None, _) => println!("{verb}ALLOWED: no rule applies to these attributes"),
        (Some(rule), true) => println!(
            "{verb}ALLOWED (most restrictive rule {rule:?}: {} of {} left, full again in {})",
            d.remaining,
            d.limit,
            human_ms(d.reset_after_ms())
        ),
        (Some(rule), false) => println!(
            "{verb}DENIED by rule {rule:?}: retry after {} ({} of {} left, full again in {})",
            human_ms(d.retry_after_ms()),
            d.remaining,
            d.limit,
            human_ms(d.reset_after_ms())
        ),
    }
    if d.degraded {
        println!("(degraded: the backend failed; this answer comes from on_backend_error)");
    }
    if let Some(id) = d.lease_id() {
        println!("holds concurrency slots under lease {id:?} (release with: throttlegate release --call-id {id} ...)");
    }
    if !d.results.is_empty() {
        let width = d
            .results
            .iter()
            .map(|r| r.rule.len())
            .max()
            .unwrap_or(4)
            .max(4);
        println!();
        println!(
            "  {:<width$}  {:<19}  {:>9}  {:>9}  {:>11}  {:>11}",
            "rule", "result", "remaining", "limit", "retry_after", "reset_after"
        );
        for r in &d.results {
            let result = match (r.allowed, r.shadow) {
                (true, false) => "allowed",
                (false, false) => "denied",
                (true, true) => "allowed (shadow)",
                (false, true) => "would deny (shadow)",
            };
            println!(
                "  {:<width$}  {:<19}  {:>9}  {:>9}  {:>11}  {:>11}",
                r.rule,
                result,
                r.remaining,
                r.limit,
                human_ms(ceil_millis(r.retry_after)),
                human_ms(ceil_millis(r.reset_after)),
            );
        }
    }
    let headers = d.headers_with(options);
    if !headers.is_empty() {
        println!();
        for (k, v) in headers {
            println!("{k}: {v}");
        }
    }
}

fn look(args: LookArgs, call_id: Option<String>, peek: bool) -> CliResult<u8> {
    let attrs = parse_attributes(&args.attributes)?;
    if args.cost == 0 {
        return Err(CliError::usage("--cost: must be at least 1"));
    }
    let options = HeaderOptions {
        legacy: args.legacy_headers,
    };
    let limiter = connect(&args.backend, &args.redis)?;
    let d = if peek {
        limiter.peek_blocking(&attrs, args.cost)?
    } else {
        limiter.check_blocking(&attrs, &CheckOptions { cost: args.cost, call_id })?
    };
    limiter.close();
    if args.json {
        println!("{}", decision_json(&d, options));
    } else {
        print_decision(&d, options, peek);
    }
    Ok(if d.allowed { EXIT_OK } else { EXIT_DENIED })
}

/// `throttlegate check`.
pub fn check(args: CheckArgs) -> CliResult<u8> {
    look(args.look, args.call_id, false)
}

/// `throttlegate peek`.
pub fn peek(args: PeekArgs) -> CliResult<u8> {
    look(args.look, None, true)
}

/// `throttlegate settle`: settle a check made with `--call-id` at its real cost.
pub fn settle(args: SettleArgs) -> CliResult<u8> {
    let attrs = parse_attributes(&args.attributes)?;
    let limiter = connect(&args.backend, &args.redis)?;
    let settled = limiter.settle_call_blocking(&attrs, &args.call_id, args.cost, args.actual)?;
    limiter.close();
    if args.json {
        println!("{}", json!({ "settled": settled }));
    } else if settled == 0 {
        println!("nothing settled: no rule holds call {:?} (denied, settled already, or no longer counting)", args.call_id);
    } else {
        println!("settled call {:?} at {} (estimate {}) on {settled} rule(s)", args.call_id, args.actual, args.cost);
    }
    Ok(EXIT_OK)
}

/// `throttlegate release`: give back the slots lease `--call-id` holds.
pub fn release(args: ReleaseArgs) -> CliResult<u8> {
    let lease = Lease { backend: &args.backend, url: &args.redis, call_id: &args.call_id, attributes: &args.attributes };
    lease.run(args.json, "released", |limiter, attrs, id| limiter.release_call_blocking(attrs, id))
}

/// `throttlegate extend`: hold the slots of lease `--call-id` for `--duration` from now.
pub fn extend(args: ExtendArgs) -> CliResult<u8> {
    let lease = Lease { backend: &args.backend, url: &args.redis, call_id: &args.call_id, attributes: &args.attributes };
    lease.run(args.json, "extended", |limiter, attrs, id| limiter.extend_call_blocking(attrs, id, args.duration))
}

/// What `release` and `extend` share: one lease of one check, by its call id.
struct Lease<'a> {
    backend: &'a BackendArgs,
    url: &'a str,
    call_id: &'a str,
    attributes: &'a [String],
}

impl Lease<'_> {
    /// Apply `op` to the lease and print how many rules it touched, as text
    /// ("released lease ... on N rule(s)") or as `{"<done>": N}`.
    fn run(
        &self,
        json_out: bool,
        done: &str,
        op: impl FnOnce(&Limiter, &[(String, String)], &str) -> throttlegate::Result<u32>,
    ) -> CliResult<u8> {
        let attrs = parse_attributes(self.attributes)?;
        let limiter = connect(self.backend, self.url)?;
        let rules = op(&limiter, &attrs, self.call_id);
        limiter.close();
        let rules = rules?;
        if json_out {
            println!("{}", json!({ done: rules }));
        } else if rules == 0 {
            println!(
                "nothing {done}: lease {:?} holds no slot (denied, released already, or its lease ended)",
                self.call_id
            );
        } else {
            println!("{done} lease {:?} on {rules} rule(s)", self.call_id);
        }
        Ok(EXIT_OK)
    }
}

/// `throttlegate acquire`: wait until the request is admitted, at most `--wait`.
pub fn acquire(args: AcquireArgs) -> CliResult<u8> {
    let look = args.look;
    let attrs = parse_attributes(&look.attributes)?;
    let options = HeaderOptions { legacy: look.legacy_headers };
    let limiter = connect(&look.backend, &look.redis)?;
    let d = limiter.acquire_blocking(&attrs, &CheckOptions { cost: look.cost, call_id: None }, args.wait);
    limiter.close();
    let d = d?;
    if look.json {
        println!("{}", decision_json(&d, options));
    } else {
        print_decision(&d, options, false);
    }
    Ok(EXIT_OK)
}

/// `throttlegate reset`.
pub fn reset(args: ResetArgs) -> CliResult<u8> {
    let attrs = parse_attributes(&args.attributes)?;
    let limiter = connect(&args.backend, &args.redis)?;
    let keys = limiter.keys(&attrs);
    let deleted = limiter.reset_blocking(&attrs)?;
    limiter.close();
    if args.json {
        println!("{}", json!({ "deleted": deleted, "keys": keys }));
    } else if keys.is_empty() {
        println!("no rule applies to these attributes; nothing to reset");
    } else {
        println!(
            "deleted {deleted} of {} key(s); every rule below starts afresh for this client:",
            keys.len()
        );
        for k in &keys {
            println!("  {k}");
        }
    }
    Ok(EXIT_OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_parse_and_reject() {
        let a = parse_attributes(&["ip=1.2.3.4".into(), "q=a=b".into(), "e=".into()]).unwrap();
        assert_eq!(a[1], ("q".to_string(), "a=b".to_string()));
        assert_eq!(a[2].1, "");
        assert!(parse_attributes(&["ip".into()])
            .unwrap_err()
            .message
            .contains("NAME=VALUE"));
        assert!(parse_attributes(&["=x".into()])
            .unwrap_err()
            .message
            .contains("empty"));
        assert!(parse_attributes(&["a=1".into(), "a=2".into()])
            .unwrap_err()
            .message
            .contains("twice"));
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human_ms(850), "850ms");
        assert_eq!(human_ms(12_500), "12.5s");
        assert_eq!(human_ms(30_000), "30s");
        assert_eq!(human_ms(200_000), "3m20s");
        assert_eq!(human_ms(7_500_000), "2h05m");
    }
}
