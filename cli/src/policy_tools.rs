//! `lint` and `diff`: a policy file read for its mistakes, and two policy
//! files compared as a reload compares them. The checks and the rule
//! identity live in the core (`throttlegate::lint`, `throttlegate::diff`);
//! this prints them.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde_json::json;
use throttlegate::lint::{self, LintOptions, Severity};
use throttlegate::{Policy, PolicyDiff};

use crate::error::CliResult;

/// How `lint` and `diff` print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Lines for people.
    Text,
    /// One JSON object.
    Json,
}

pub const LINT_AFTER_HELP: &str = "\
Checks:
  invalid_policy         error    the file does not parse or validate
  never_applies          error    the rule needs an attribute not in --attributes
  not_in_request_model   warning  (no --attributes) the rule needs an attribute beyond the HTTP
                                  request model (ip, method, route, path, host) and [attributes]
  bare_duration          warning  a duration under a second written as a bare number (60 is 60 ms)
  cost_never_passes      error    --cost is above the rule's limit: such checks are refused
  shadowed               warning  another rule applies to every request this one does, counts them
                                  under a key at least as coarse and is at least as strict
  one_slot               warning  the key's {{hash tag}} holds no attribute: one Redis Cluster slot
  never_denies           warning  every rule is in shadow mode
  duplicate_match_value  warning  a match list names a value twice
  exempt_never_applies   warning  an exempt list names an attribute no request is known to have

Exit status:
  0  nothing found
  1  warnings only
  2  at least one error (a file that does not parse included)";

pub const DIFF_AFTER_HELP: &str = "\
A rule keeps its state (its keys) when the prefix, its name, its key and its algorithm are
unchanged, as in a reload (`limiter.reload`). Lines: `~` changed, state kept; `!` new key
or prefix, state starts afresh; `+` added; `-` removed; `x` same name and key with another
algorithm, which a reload refuses.

Exit status:
  0  the policies are the same
  1  they differ, and a reload applies the new one
  2  a file does not parse, or a reload would refuse the new one";

/// `throttlegate lint`.
#[derive(Debug, Args)]
pub struct LintArgs {
    /// Policy file (TOML or JSON), or envoyproxy/ratelimit rules (YAML file or directory).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The largest cost the application sends: rules with a lower limit are errors.
    #[arg(long, value_name = "N")]
    pub cost: Option<u64>,
    /// Every attribute the application sends, comma-separated: rules needing
    /// another one never apply.
    /// Without it, the request model of the HTTP integrations (ip, method,
    /// route, path, host) and the policy's [attributes] are assumed.
    #[arg(long, value_name = "NAMES", value_delimiter = ',', conflicts_with = "any_attributes")]
    pub attributes: Option<Vec<String>>,
    /// Assume nothing about the attributes the application sends.
    #[arg(long)]
    pub any_attributes: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
}

/// `throttlegate diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The policy in force (TOML or JSON, or envoyproxy/ratelimit YAML: a file or a directory).
    #[arg(value_name = "OLD")]
    pub old: PathBuf,
    /// The policy to reload.
    #[arg(value_name = "NEW")]
    pub new: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
}

/// envoyproxy/ratelimit rules: a `.yaml`/`.yml` file or a directory of them.
fn is_envoy_rules(path: &std::path::Path) -> bool {
    path.is_dir() || matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
}

/// A policy file, or envoyproxy/ratelimit rules compiled as `throttlegate serve` compiles them.
fn load(path: &std::path::Path) -> CliResult<Policy> {
    if is_envoy_rules(path) {
        return Ok(throttlegate_server::rules::Rules::load(path)?.policy);
    }
    Ok(Policy::from_file(path)?)
}

fn plural(n: usize, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

pub fn lint(a: LintArgs) -> CliResult<u8> {
    let options = LintOptions { cost: a.cost, attributes: a.attributes, any_attributes: a.any_attributes };
    let findings = if is_envoy_rules(&a.file) {
        // envoyproxy/ratelimit YAML: its rules' attributes are the descriptors', never a request model's.
        match throttlegate_server::rules::Rules::load(&a.file) {
            Ok(rules) => lint::lint(&rules.policy, &LintOptions { any_attributes: true, attributes: None, ..options }),
            Err(e) => vec![lint::Finding {
                severity: Severity::Error,
                code: "invalid_policy",
                rule: None,
                message: e.message().to_string(),
            }],
        }
    } else {
        lint::lint_file(&a.file, &options)
    };
    let errors = findings.iter().filter(|f| f.severity == Severity::Error).count();
    let warnings = findings.len() - errors;
    let file = a.file.display().to_string();
    match a.format {
        Format::Json => println!(
            "{}",
            json!({
                "file": file,
                "errors": errors,
                "warnings": warnings,
                "findings": findings.iter().map(|f| f.to_json()).collect::<Vec<_>>(),
            })
        ),
        Format::Text => {
            for f in &findings {
                println!("{file}: {f}");
            }
            if findings.is_empty() {
                println!("{file}: no problems found");
            } else {
                println!("{file}: {}, {}", plural(errors, "error"), plural(warnings, "warning"));
            }
        }
    }
    Ok(lint::exit_code(&findings) as u8)
}

pub fn diff(a: DiffArgs) -> CliResult<u8> {
    let old = load(&a.old)?;
    let new = load(&a.new)?;
    let d = PolicyDiff::between(&old, &new);
    let refused = d.check(&old, &new).err();
    match a.format {
        Format::Json => {
            let mut v = d.to_json();
            v["reload"] = json!({
                "applies": refused.is_none(),
                "error": refused.as_ref().map(|e| e.message().to_string()),
            });
            println!("{v}");
        }
        Format::Text => {
            print!("{}", d.to_text());
            match &refused {
                None => println!("reload: applies"),
                Some(e) => println!("reload: refused: {}", e.message()),
            }
        }
    }
    Ok(match (&refused, d.is_empty()) {
        (Some(_), _) => 2,
        (None, true) => 0,
        (None, false) => 1,
    })
}
