//! `throttlegate`: try a rate-limit policy before deploying it.
//!
//! - `simulate` drives synthetic traffic through a policy in virtual time
//!   (an hour of traffic in seconds) and reports what each rule admitted and
//!   denied, interval by interval;
//! - `check`, `peek` and `reset` make one decision, take one look, or clear
//!   one client's state (to unblock a customer) against a live Redis;
//! - `override set|clear|list` manage operator overrides (one key's limit);
//! - `bench` measures a backend: checks per second and latency percentiles;
//! - `lint` reads a policy for its mistakes, and `diff` compares two as a
//!   reload does (which rules keep their state);
//! - `serve` runs Envoy's rate limit service and an HTTP check API.

mod bench;
mod error;
mod oneshot;
mod outcome;
mod policy_tools;
mod report;
mod serve;
mod override_cmd;
mod simulate;
mod traffic;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use throttlegate::duration::parse_duration;
use throttlegate::{FailureMode, HealthSink, Limiter, LimiterBuilder, Policy};

use crate::error::{CliError, CliResult, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE};

const EXIT_CODES: &str = "\
Exit status:
  0  success (check/peek: the request is allowed)
  1  check/peek: the request is denied; lint: warnings only; diff: the policies differ
  2  bad input: arguments, policy file, scenario file, attributes; lint: errors;
     diff: a reload would refuse the new policy
  3  the backend is unreachable, too slow or failing
  4  internal error";

/// Distributed rate limiter: simulate, inspect and benchmark policies.
#[derive(Debug, Parser)]
#[command(name = "throttlegate", version, after_help = EXIT_CODES, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Drive a traffic pattern through a policy in virtual time and report,
    /// per interval, what each rule admitted and denied.
    #[command(after_help = simulate::AFTER_HELP)]
    Simulate(simulate::SimulateArgs),
    /// Decide one request (consuming from every applicable rule if allowed)
    /// and print the decision and its HTTP headers.
    #[command(after_help = oneshot::AFTER_HELP)]
    Check(oneshot::CheckArgs),
    /// Show the decision a request would get now, without consuming anything.
    #[command(after_help = oneshot::AFTER_HELP)]
    Peek(oneshot::PeekArgs),
    /// Forget the state of every rule that applies to a request (unblock a client).
    #[command(after_help = oneshot::AFTER_HELP)]
    Reset(oneshot::ResetArgs),
    /// Set, clear or list operator overrides: the limit of one key of a rule
    /// with `overrides = true`, stored in the backend.
    #[command(after_help = override_cmd::AFTER_HELP)]
    Override(override_cmd::OverrideArgs),
    /// Settle a check made with --call-id at its real cost, known after the
    /// response: refund the difference or debit the excess on every rule it
    /// consumed from.
    #[command(after_help = oneshot::AFTER_HELP)]
    Settle(oneshot::SettleArgs),
    /// Give back the concurrency slots a check made with --call-id holds
    /// (before its lease ends); prints how many rules freed slots.
    #[command(after_help = oneshot::AFTER_HELP)]
    Release(oneshot::ReleaseArgs),
    /// Hold the concurrency slots of a check made with --call-id for
    /// --duration from now; a lease that ended is not brought back.
    #[command(after_help = oneshot::AFTER_HELP)]
    Extend(oneshot::ExtendArgs),
    /// Wait until a request is admitted (at most --wait), then print the
    /// admitting decision; a timeout is a backend-failure exit (3).
    #[command(after_help = oneshot::AFTER_HELP)]
    Acquire(oneshot::AcquireArgs),
    /// Load a backend with checks and report checks/s and latency percentiles.
    #[command(after_help = bench::AFTER_HELP)]
    Bench(bench::BenchArgs),
    /// Report a policy's mistakes: rules that never apply or never decide,
    /// costs that never pass, keys all in one Cluster slot.
    #[command(after_help = policy_tools::LINT_AFTER_HELP)]
    Lint(policy_tools::LintArgs),
    /// Compare two policies as a reload does: which rules are added,
    /// removed or changed, and which keep their state.
    #[command(after_help = policy_tools::DIFF_AFTER_HELP)]
    Diff(policy_tools::DiffArgs),
    /// Serve Envoy's rate limit service (gRPC) and an HTTP check API.
    #[command(after_help = serve::AFTER_HELP)]
    Serve(serve::ServeArgs),
    /// Print the Lua script every check runs in Redis (for `SCRIPT LOAD`,
    /// audits and benchmarks); its arguments are documented at its top.
    Script,
}

/// Options every command shares: the policy and how to reach the backend.
#[derive(Debug, Clone, Args)]
pub struct BackendArgs {
    /// Policy file (TOML or JSON).
    #[arg(long, value_name = "FILE")]
    pub rules: PathBuf,
    /// Override the policy's key prefix.
    #[arg(long, value_name = "PREFIX")]
    pub prefix: Option<String>,
    /// Bound on each call to the backend (e.g. 500ms, 5s).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration_arg)]
    pub timeout: Duration,
    /// File holding the secret that hashes attribute values into keys; must be
    /// the one the application uses, or the keys differ.
    #[arg(long, value_name = "FILE")]
    pub key_secret_file: Option<PathBuf>,
}

impl BackendArgs {
    /// Load the policy and start a limiter builder with these options.
    /// Backend failures are errors here, never silently degraded answers.
    pub fn builder(&self, redis: Option<&str>) -> CliResult<LimiterBuilder> {
        let policy = Policy::from_file(&self.rules)?;
        // An outage met during a long command (traffic, bench) is one line
        // on stderr, and its end another; never one per call.
        let mut b = Limiter::builder(policy)
            .timeout(self.timeout)
            .on_backend_error(FailureMode::Error)
            .on_health(HealthSink::stderr());
        if let Some(url) = redis {
            b = b.url(url);
        }
        if let Some(p) = &self.prefix {
            b = b.prefix(p.clone());
        }
        if let Some(path) = &self.key_secret_file {
            let mut secret = std::fs::read(path).map_err(|e| {
                CliError::usage(format!(
                    "cannot read --key-secret-file {}: {e}",
                    path.display()
                ))
            })?;
            while secret.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                secret.pop();
            }
            b = b.key_secret(secret);
        }
        Ok(b)
    }
}

/// Durations on the command line: `250ms`, `30s`, `15m`, `1h`, `1d`, or bare milliseconds.
pub fn parse_duration_arg(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d.is_zero() {
        return Err("must be at least 1ms".into());
    }
    Ok(d)
}

fn run(cli: Cli) -> CliResult<u8> {
    match cli.command {
        Command::Simulate(a) => simulate::run(a),
        Command::Check(a) => oneshot::check(a),
        Command::Peek(a) => oneshot::peek(a),
        Command::Reset(a) => oneshot::reset(a),
        Command::Override(a) => override_cmd::run(a),
        Command::Settle(a) => oneshot::settle(a),
        Command::Release(a) => oneshot::release(a),
        Command::Extend(a) => oneshot::extend(a),
        Command::Acquire(a) => oneshot::acquire(a),
        Command::Bench(a) => bench::run(a),
        Command::Lint(a) => policy_tools::lint(a),
        Command::Diff(a) => policy_tools::diff(a),
        Command::Serve(a) => serve::run(a),
        Command::Script => {
            print!("{}", throttlegate::CHECK_SCRIPT);
            Ok(0)
        }
    }
}

fn json_requested() -> bool {
    let args: Vec<String> = std::env::args().skip(1).collect();
    args.iter().any(|a| a == "--json" || a == "--format=json")
        || args.windows(2).any(|w| w[0] == "--format" && w[1] == "json")
}

fn report(err: &CliError) {
    eprintln!("throttlegate: error: {err}");
    if json_requested() {
        println!(
            "{}",
            serde_json::json!({ "error": { "kind": err.kind, "message": err.one_line(), "exit": err.exit } })
        );
    }
}

/// mimalloc: allocation-heavy paths (tonic, hyper and h2 in `serve`) spend
/// a fraction of glibc malloc's instructions in it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind as K;
            if matches!(
                e.kind(),
                K::DisplayHelp | K::DisplayVersion | K::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                let code = if e.kind() == K::DisplayHelpOnMissingArgumentOrSubcommand {
                    EXIT_USAGE
                } else {
                    EXIT_OK
                };
                return ExitCode::from(code);
            }
            // clap's report spans several lines (tips, usage); keep its first
            // paragraph (which may list the missing arguments), on one line.
            let text = e.render().to_string();
            let first: Vec<&str> = text
                .lines()
                .skip_while(|l| l.trim().is_empty())
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let first = first.join(" ");
            let first = first.trim_start_matches("error: ");
            let first = if first.is_empty() {
                "invalid arguments"
            } else {
                first
            };
            report(&CliError::usage(format!("{first} (see --help)")));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    // A panic is reported as one line below, not as a backtrace dump.
    std::panic::set_hook(Box::new(|_| {}));
    let outcome = std::panic::catch_unwind(|| run(cli));
    match outcome {
        Ok(Ok(code)) => ExitCode::from(code),
        Ok(Err(e)) => {
            report(&e);
            ExitCode::from(e.exit)
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            report(&CliError {
                kind: "internal",
                message: format!("unexpected internal failure (a bug; please report it): {what}"),
                exit: EXIT_INTERNAL,
            });
            ExitCode::from(EXIT_INTERNAL)
        }
    }
}
