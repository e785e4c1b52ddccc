//! `bench`: concurrent checks against a backend on the real clock, with
//! checks per second and latency percentiles.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::error::{CliError, CliResult, EXIT_INTERNAL, EXIT_OK};
use crate::traffic::{
    attribute_variants, parse_attr_flags, templates_for_policy, ClientPicker, Rng,
};
use crate::{parse_duration_arg, BackendArgs};

/// Shown after `bench --help`.
pub const AFTER_HELP: &str = "\
Each of --concurrency callers checks requests back to back, for --duration or until --requests
checks are done. Clients and attributes are made as in `simulate` (--attr NAME=TEMPLATE, or from
the policy). Against Redis, keys go under a fresh prefix and are removed at the end.

Examples:
  throttlegate bench --rules rules.toml
  throttlegate bench --rules rules.toml --redis redis://127.0.0.1:6379 --concurrency 64 --duration 30s";

/// Options of `bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// Benchmark Redis at this URL instead of the embedded backend.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// How long to run.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration_arg)]
    duration: Duration,
    /// Stop after this many checks instead (still bounded by --duration).
    #[arg(long, value_name = "N")]
    requests: Option<u64>,
    /// Callers checking at the same time.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Distinct clients.
    #[arg(long, default_value_t = 1000)]
    clients: u64,
    /// Client popularity (Zipf exponent): 0 = all alike.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    skew: f64,
    /// Cost of each request.
    #[arg(long, default_value_t = 1)]
    cost: u64,
    /// Attribute template, NAME=TEMPLATE (repeatable).
    #[arg(long = "attr", value_name = "NAME=TEMPLATE")]
    attrs: Vec<String>,
    /// Random seed of client picks.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Do not draw the progress bar.
    #[arg(long)]
    no_progress: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

fn histogram() -> Histogram<u64> {
    // 1 ns to 60 s at 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

struct Totals {
    allowed: u64,
    denied: u64,
    latency: Histogram<u64>,
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// `throttlegate bench`.
pub fn run(args: BenchArgs) -> CliResult<u8> {
    if args.concurrency == 0 || args.concurrency > 10_000 {
        return Err(CliError::usage(format!(
            "--concurrency: must be between 1 and 10000, not {}",
            args.concurrency
        )));
    }
    if args.clients == 0 || args.clients > crate::traffic::MAX_CLIENTS {
        return Err(CliError::usage(format!(
            "--clients: must be between 1 and {}, not {}",
            crate::traffic::MAX_CLIENTS,
            args.clients
        )));
    }
    if !args.skew.is_finite() || !(0.0..=10.0).contains(&args.skew) {
        return Err(CliError::usage(format!(
            "--skew: must be between 0 and 10, not {}",
            args.skew
        )));
    }
    if args.cost == 0 {
        return Err(CliError::usage("--cost: must be at least 1"));
    }
    if args.requests == Some(0) {
        return Err(CliError::usage("--requests: must be at least 1"));
    }
    let mut builder = args.backend.builder(args.redis.as_deref())?;
    let own_prefix = args.redis.is_some() && args.backend.prefix.is_none();
    if own_prefix {
        builder = builder.prefix(format!("throttlegate-bench:{}:", std::process::id()));
    }
    let limiter = builder.build()?;
    let mut templates = parse_attr_flags(&args.attrs)?;
    if templates.is_empty() {
        templates = templates_for_policy(&limiter.policy());
    }
    let templates = Arc::new(templates);
    let picker = Arc::new(ClientPicker::new(args.clients, args.skew));
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(|e| CliError {
            kind: "internal",
            message: format!("cannot start the async runtime: {e}"),
            exit: EXIT_INTERNAL,
        })?;
    let backend = limiter.backend_name();
    if !args.json {
        println!(
            "bench: {} on the {backend} backend, {} callers, {} clients, cost {}, up to {}{}",
            args.backend.rules.display(),
            args.concurrency,
            args.clients,
            args.cost,
            throttlegate::duration::format_duration(args.duration),
            args.requests
                .map(|n| format!(" or {n} checks"))
                .unwrap_or_default()
        );
    }

    let bar = if args.no_progress || args.json {
        ProgressBar::hidden()
    } else {
        let (len, template) = match args.requests {
            Some(n) => (
                n,
                "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} checks {msg}",
            ),
            None => (
                args.duration.as_millis() as u64,
                "{spinner} [{elapsed_precise}] {wide_bar} {msg}",
            ),
        };
        let b = ProgressBar::new(len);
        if let Ok(style) = ProgressStyle::with_template(template) {
            b.set_style(style);
        }
        b
    };

    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let first_error: Arc<Mutex<Option<CliError>>> = Arc::new(Mutex::new(None));
    let started = Instant::now();
    let totals = rt.block_on(async {
        limiter.ping().await?;
        let deadline = Instant::now() + args.duration;
        let mut tasks = Vec::with_capacity(args.concurrency);
        for i in 0..args.concurrency {
            let limiter = limiter.clone();
            let templates = templates.clone();
            let picker = picker.clone();
            let done = done.clone();
            let stop = stop.clone();
            let first_error = first_error.clone();
            let (clients, cost, limit) = (args.clients, args.cost, args.requests);
            let mut rng = Rng::new(args.seed.wrapping_add(i as u64));
            tasks.push(tokio::spawn(async move {
                let mut t = Totals {
                    allowed: 0,
                    denied: 0,
                    latency: histogram(),
                };
                while !stop.load(Ordering::Relaxed) {
                    if let Some(n) = limit {
                        if done.fetch_add(1, Ordering::Relaxed) >= n {
                            break;
                        }
                    }
                    if Instant::now() >= deadline {
                        break;
                    }
                    let client = picker.pick(clients, &mut rng);
                    let attrs: Vec<(String, String)> = templates
                        .iter()
                        .map(|(k, tpl)| (k.clone(), tpl.value(client, "bench", &mut rng)))
                        .collect();
                    let at = Instant::now();
                    match limiter.check(&attrs, cost).await {
                        Ok(d) => {
                            t.latency.saturating_record(at.elapsed().as_nanos() as u64);
                            if d.allowed {
                                t.allowed += 1
                            } else {
                                t.denied += 1
                            }
                            if limit.is_none() {
                                done.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(e) => {
                            stop.store(true, Ordering::Relaxed);
                            first_error
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .get_or_insert(e.into());
                            break;
                        }
                    }
                }
                t
            }));
        }
        // The progress bar follows the shared counter until every caller is done.
        let ticker = {
            let bar = bar.clone();
            let done = done.clone();
            let limit = args.requests;
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let n = done.load(Ordering::Relaxed);
                    let secs = started.elapsed().as_secs_f64();
                    match limit {
                        Some(max) => bar.set_position(n.min(max)),
                        None => bar.set_position(started.elapsed().as_millis() as u64),
                    }
                    bar.set_message(format!("{n} checks, {:.0}/s", n as f64 / secs.max(1e-9)));
                }
            })
        };
        let mut all = Totals {
            allowed: 0,
            denied: 0,
            latency: histogram(),
        };
        for task in tasks {
            let t = task.await.map_err(|e| CliError {
                kind: "internal",
                message: format!("a benchmark task failed: {e}"),
                exit: EXIT_INTERNAL,
            })?;
            all.allowed += t.allowed;
            all.denied += t.denied;
            let _ = all.latency.add(&t.latency);
        }
        ticker.abort();
        Ok::<_, CliError>(all)
    });
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    if let Some(e) = first_error.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(e);
    }
    let totals = totals?;

    if own_prefix {
        cleanup(&rt, &limiter, &templates, args.clients);
    }

    let checks = totals.allowed + totals.denied;
    let secs = elapsed.as_secs_f64().max(1e-9);
    let h = &totals.latency;
    let q = |x: f64| {
        if checks == 0 {
            0.0
        } else {
            us(h.value_at_quantile(x))
        }
    };
    if args.json {
        println!(
            "{}",
            json!({
                "backend": backend,
                "concurrency": args.concurrency,
                "clients": args.clients,
                "checks": checks,
                "allowed": totals.allowed,
                "denied": totals.denied,
                "seconds": secs,
                "checks_per_second": checks as f64 / secs,
                "latency_us": {
                    "mean": if checks == 0 { 0.0 } else { h.mean() / 1000.0 },
                    "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "p999": q(0.999),
                    "max": if checks == 0 { 0.0 } else { us(h.max()) },
                },
            })
        );
    } else {
        println!(
            "  {checks} checks in {secs:.2}s: {:.0} checks/s ({} allowed, {} denied)",
            checks as f64 / secs,
            totals.allowed,
            totals.denied
        );
        if checks > 0 {
            println!(
                "  latency: p50 {:.1}us  p90 {:.1}us  p99 {:.1}us  p99.9 {:.1}us  max {:.1}us",
                q(0.5),
                q(0.9),
                q(0.99),
                q(0.999),
                us(h.max())
            );
        }
    }
    Ok(EXIT_OK)
}

/// Remove the benchmark's keys (they live under the run's own prefix).
fn cleanup(
    rt: &tokio::runtime::Runtime,
    limiter: &throttlegate::Limiter,
    templates: &crate::traffic::AttributeTemplates,
    clients: u64,
) {
    let budget = 200_000usize;
    let per_client = (budget / clients.max(1) as usize).max(1);
    let mut sets = Vec::new();
    for c in 0..clients {
        match attribute_variants(templates, c, "bench", per_client) {
            Some(v) if sets.len() + v.len() <= budget => sets.extend(v),
            _ => {
                eprintln!("throttlegate: note: too many attribute combinations to clean up; the benchmark's keys expire by their TTL");
                return;
            }
        }
    }
    rt.block_on(async {
        for attrs in &sets {
            if limiter.reset(attrs).await.is_err() {
                eprintln!("throttlegate: note: could not remove every benchmark key; the rest expire by their TTL");
                break;
            }
        }
    });
}
