//! `override set|clear|list`: operator overrides of one rule's key, stored
//! in the backend (see `Limiter::set_override`).

use clap::{Args, Subcommand};
use serde_json::json;

use crate::error::{CliResult, EXIT_OK};
use crate::oneshot::{connect, parse_attributes};
use crate::BackendArgs;

/// Shown after the help of `override`.
pub const AFTER_HELP: &str = "\
The rule must have `overrides = true`. Attributes are NAME=VALUE pairs naming the rule's key
(every attribute of its key template, e.g. api_key=k_123).

Examples:
  throttlegate override set   --rules rules.toml --redis redis://127.0.0.1:6379 --rule per-key --limit 5000 api_key=k_123
  throttlegate override clear --rules rules.toml --redis redis://127.0.0.1:6379 --rule per-key api_key=k_123
  throttlegate override list  --rules rules.toml --redis redis://127.0.0.1:6379 --rule per-key --json

Exit status: 0 done, 2 bad input, 3 backend failure, 4 internal error.";

/// `throttlegate override`.
#[derive(Debug, Args)]
pub struct OverrideArgs {
    #[command(subcommand)]
    command: OverrideCommand,
}

#[derive(Debug, Subcommand)]
enum OverrideCommand {
    /// Set the limit of one key of a rule (a token bucket's capacity, its rate scaled alike).
    Set(SetArgs),
    /// Clear the override of one key of a rule.
    Clear(TargetArgs),
    /// List the overrides of a rule.
    List(ListArgs),
}

/// Where and for which rule.
#[derive(Debug, Args)]
struct Where {
    #[command(flatten)]
    backend: BackendArgs,
    /// Backend URL (as for `check`).
    #[arg(long, value_name = "URL")]
    redis: String,
    /// The rule's name.
    #[arg(long, value_name = "NAME")]
    rule: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Options of `override clear`.
#[derive(Debug, Args)]
struct TargetArgs {
    #[command(flatten)]
    at: Where,
    /// The attributes of the rule's key, NAME=VALUE.
    #[arg(value_name = "ATTR=VALUE")]
    attributes: Vec<String>,
}

/// Options of `override set`.
#[derive(Debug, Args)]
struct SetArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// The limit (a token bucket's capacity) for this key.
    #[arg(long)]
    limit: u64,
}

/// Options of `override list`.
#[derive(Debug, Args)]
struct ListArgs {
    #[command(flatten)]
    at: Where,
}

/// Run `throttlegate override ...`.
pub fn run(args: OverrideArgs) -> CliResult<u8> {
    match args.command {
        OverrideCommand::Set(a) => {
            let t = a.target;
            let attrs = parse_attributes(&t.attributes)?;
            let limiter = connect(&t.at.backend, &t.at.redis)?;
            let done = limiter.set_override_blocking(&t.at.rule, &attrs, a.limit);
            limiter.close();
            done?;
            if t.at.json {
                println!("{}", json!({ "rule": t.at.rule, "limit": a.limit, "set": true }));
            } else {
                println!("rule {:?}: limit {} for {}", t.at.rule, a.limit, t.attributes.join(" "));
            }
        }
        OverrideCommand::Clear(t) => {
            let attrs = parse_attributes(&t.attributes)?;
            let limiter = connect(&t.at.backend, &t.at.redis)?;
            let cleared = limiter.clear_override_blocking(&t.at.rule, &attrs);
            limiter.close();
            let cleared = cleared?;
            if t.at.json {
                println!("{}", json!({ "rule": t.at.rule, "cleared": cleared }));
            } else if cleared {
                println!("rule {:?}: override cleared for {}", t.at.rule, t.attributes.join(" "));
            } else {
                println!("rule {:?}: no override for {}", t.at.rule, t.attributes.join(" "));
            }
        }
        OverrideCommand::List(a) => {
            let limiter = connect(&a.at.backend, &a.at.redis)?;
            let list = limiter.overrides_blocking(&a.at.rule);
            limiter.close();
            let list = list?;
            if a.at.json {
                let items: Vec<_> =
                    list.iter().map(|o| json!({ "attributes": o.attributes, "limit": o.limit })).collect();
                println!("{}", json!({ "rule": a.at.rule, "overrides": items }));
            } else if list.is_empty() {
                println!("rule {:?}: no overrides", a.at.rule);
            } else {
                for o in &list {
                    let attrs: Vec<String> = o.attributes.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    println!("{}\t{}", o.limit, attrs.join(" "));
                }
            }
        }
    }
    Ok(EXIT_OK)
}
