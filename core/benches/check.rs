//! `check` throughput: the embedded backend next to `governor` (in process),
//! and the Redis backend next to a raw EVALSHA of the same script through the
//! same client (so the library's own overhead is visible).
//!
//! `cargo bench -p throttlegate --bench check` starts its own redis-server.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use throttlegate::{FailureMode, Limiter, Policy, Rule, CHECK_SCRIPT};
use throttlegate_testkit::{RedisCluster, RedisServer};

fn one_rule() -> Policy {
    Policy::new(vec![Rule::sliding_window_log("per-ip", "ip:{ip}", 1_000_000, Duration::from_secs(60))]).unwrap()
}

/// Like for like with governor's quota below: a bucket of 1,000,000 refilling 1,000,000 per minute.
fn one_bucket() -> Policy {
    Policy::new(vec![Rule::token_bucket("per-ip", "ip:{ip}", 1_000_000, 1_000_000.0 / 60.0)]).unwrap()
}

fn four_rules() -> Policy {
    Policy::new(vec![
        Rule::sliding_window_log("per-ip", "ip:{ip}", 1_000_000, Duration::from_secs(60)),
        Rule::token_bucket("per-key", "key:{ip}", 1_000_000, 100_000.0),
        Rule::sliding_window_log("per-tenant", "tenant:{ip}", 1_000_000, Duration::from_secs(60)),
        Rule::token_bucket("per-route", "route:{ip}", 1_000_000, 100_000.0),
    ])
    .unwrap()
}

fn key_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255)).collect()
}

/// `iters` checks spread over 64 concurrent tasks; the elapsed time.
async fn sixty_four_tasks(l: &Limiter, names: &[String], iters: u64) -> Duration {
    let start = Instant::now();
    let per = iters.div_ceil(64);
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let (l, names) = (l.clone(), names.to_vec());
            tokio::spawn(async move {
                for j in 0..per {
                    let k = (j as usize * 64 + t) % names.len();
                    l.check(&[("ip", names[k].as_str())], 1).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    start.elapsed()
}

fn memory(c: &mut Criterion) {
    // The embedded backend answers synchronously (`check_in_process`), as the
    // Python and Node front ends call it: no runtime in the way.
    let opts = throttlegate::CheckOptions::default();
    let mut g = c.benchmark_group("memory");
    g.throughput(Throughput::Elements(1));
    for keys in [1usize, 100_000] {
        let names = key_names(keys);
        for (rules, policy) in [("1 rule", one_rule()), ("1 bucket", one_bucket()), ("4 rules", four_rules())] {
            let l = Limiter::in_memory(policy);
            let mut i = 0usize;
            g.bench_function(BenchmarkId::new(format!("throttlegate {rules}, 1 thread"), keys), |b| {
                b.iter(|| {
                    i = (i + 1) % keys;
                    l.check_in_process(&[("ip", names[i].as_str())], &opts).unwrap().unwrap().allowed
                })
            });
            g.bench_function(BenchmarkId::new(format!("throttlegate {rules}, 2 threads"), keys), |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    std::thread::scope(|s| {
                        for t in 0..2 {
                            let (l, names, opts) = (&l, &names, &opts);
                            s.spawn(move || {
                                for j in 0..iters / 2 {
                                    let k = (j as usize * 2 + t) % keys;
                                    l.check_in_process(&[("ip", names[k].as_str())], opts).unwrap().unwrap();
                                }
                            });
                        }
                    });
                    start.elapsed()
                })
            });
        }
        // The in-process reference: governor's keyed limiter on the same keys.
        let quota = governor::Quota::per_minute(NonZeroU32::new(1_000_000).unwrap());
        let gov = governor::RateLimiter::keyed(quota);
        let mut i = 0usize;
        g.bench_function(BenchmarkId::new("governor keyed, 1 thread", keys), |b| {
            b.iter(|| {
                i = (i + 1) % keys;
                gov.check_key(&names[i]).is_ok()
            })
        });
        g.bench_function(BenchmarkId::new("governor keyed, 2 threads", keys), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                std::thread::scope(|s| {
                    for t in 0..2 {
                        let (gov, names) = (&gov, &names);
                        s.spawn(move || {
                            for j in 0..iters / 2 {
                                let _ = gov.check_key(&names[(j as usize * 2 + t) % keys]);
                            }
                        });
                    }
                });
                start.elapsed()
            })
        });
    }
    g.finish();
}

fn redis_backend(c: &mut Criterion) {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let names = key_names(10_000);
    let mut g = c.benchmark_group("redis");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20).measurement_time(Duration::from_secs(4));
    for (rules, policy) in [("1 rule", one_rule()), ("4 rules", four_rules())] {
        let l = Limiter::builder(policy)
            .url(server.url())
            .timeout(Duration::from_secs(5))
            .on_backend_error(FailureMode::Error)
            .build()
            .unwrap();
        rt.block_on(l.ping()).unwrap();
        let counter = Arc::new(AtomicU64::new(0));
        g.bench_function(format!("throttlegate {rules}, sequential"), |b| {
            b.iter(|| {
                let i = counter.fetch_add(1, Ordering::Relaxed) as usize % names.len();
                rt.block_on(l.check(&[("ip", names[i].as_str())], 1)).unwrap()
            })
        });
        g.bench_function(format!("throttlegate {rules}, 64 tasks"), |b| {
            b.iter_custom(|iters| rt.block_on(sixty_four_tasks(&l, &names, iters)))
        });
        // The floor: the same script and arguments sent raw through the same client.
        let keys_per_check = l.keys(&[("ip", names[0].as_str())]).len();
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = rt.block_on(redis::aio::ConnectionManager::new(client)).unwrap();
        let sha = redis::Script::new(CHECK_SCRIPT).get_hash().to_string();
        rt.block_on(redis::cmd("SCRIPT").arg("LOAD").arg(CHECK_SCRIPT).query_async::<String>(&mut conn)).unwrap();
        // What the library sends: the short form for one sliding-window rule
        // (lua/single_rule.lua), the general one otherwise (lua/args.lua).
        let raw_args: Vec<&str> = if keys_per_check == 1 {
            vec!["s", "", "1000000", "60000000"]
        } else {
            vec![
                "c", "", "", "1", "w", "1000000", "60000000", "b", "1000000", "100000", "w", "1000000", "60000000", "b",
                "1000000", "100000",
            ]
        };
        let prefixes = ["raw:per-ip:", "raw:per-key:", "raw:per-tenant:", "raw:per-route:"];
        let mut n = 0u64;
        g.bench_function(format!("raw EVALSHA {rules}, sequential"), |b| {
            b.iter(|| {
                n += 1;
                let ip = &names[n as usize % names.len()];
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(&sha).arg(keys_per_check);
                for p in &prefixes[..keys_per_check] {
                    cmd.arg(format!("{p}{ip}"));
                }
                // The call id goes where each form has it: after "s", or third.
                let id = format!("{n:016x}");
                let mut args = raw_args.clone();
                args[if keys_per_check == 1 { 1 } else { 2 }] = &id;
                cmd.arg(&args);
                rt.block_on(cmd.query_async::<Vec<i64>>(&mut conn)).unwrap()
            })
        });
    }
    g.finish();
}

/// 64 tasks against one node and against a local 3-primary cluster, in the
/// same run: one rule, four co-located rules (one slot), four spread rules.
fn cluster_backend(c: &mut Criterion) {
    let server = RedisServer::start();
    let cluster = RedisCluster::start(3);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let names = key_names(10_000);
    let colocated = || {
        Policy::new(vec![
            Rule::sliding_window_log("per-ip", "{{u:{ip}}}:ip", 1_000_000, Duration::from_secs(60)),
            Rule::token_bucket("per-key", "{{u:{ip}}}:key", 1_000_000, 100_000.0),
            Rule::sliding_window_log("per-tenant", "{{u:{ip}}}:tenant", 1_000_000, Duration::from_secs(60)),
            Rule::token_bucket("per-route", "{{u:{ip}}}:route", 1_000_000, 100_000.0),
        ])
        .unwrap()
    };
    let mut g = c.benchmark_group("cluster");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10).measurement_time(Duration::from_secs(4));
    let cases = [
        ("one node", server.url(), "1 rule", one_rule()),
        ("one node", server.url(), "4 rules", four_rules()),
        ("cluster", cluster.url(), "1 rule", one_rule()),
        ("cluster", cluster.url(), "4 co-located rules", colocated()),
        ("cluster", cluster.url(), "4 spread rules", four_rules()),
    ];
    for (backend, url, rules, policy) in cases {
        let l = Limiter::builder(policy)
            .url(url)
            .timeout(Duration::from_secs(5))
            .on_backend_error(FailureMode::Error)
            .build()
            .unwrap();
        rt.block_on(l.ping()).unwrap();
        g.bench_function(format!("{backend}, {rules}, 64 tasks"), |b| {
            b.iter_custom(|iters| rt.block_on(sixty_four_tasks(&l, &names, iters)))
        });
    }
    g.finish();
}

/// The cost of per-rule metrics: the same checks with metrics on and off
/// (`cargo bench -p throttlegate --bench check -- metrics`).
fn metrics_cost(c: &mut Criterion) {
    let opts = throttlegate::CheckOptions::default();
    let names = key_names(1_000);
    let mut g = c.benchmark_group("metrics");
    g.throughput(Throughput::Elements(1));
    for (rules, policy) in [("1 rule", one_rule()), ("4 rules", four_rules())] {
        for on in [false, true] {
            let l = Limiter::builder(policy.clone()).metrics(on).build().unwrap();
            let mut i = 0usize;
            let state = if on { "on" } else { "off" };
            g.bench_function(format!("memory {rules}, metrics {state}"), |b| {
                b.iter(|| {
                    i = (i + 1) % names.len();
                    l.check_in_process(&[("ip", names[i].as_str())], &opts).unwrap().unwrap().allowed
                })
            });
        }
    }
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    g.sample_size(20).measurement_time(Duration::from_secs(4));
    for on in [false, true] {
        let l = Limiter::builder(one_rule())
            .url(server.url())
            .timeout(Duration::from_secs(5))
            .on_backend_error(FailureMode::Error)
            .metrics(on)
            .build()
            .unwrap();
        rt.block_on(l.ping()).unwrap();
        let state = if on { "on" } else { "off" };
        g.bench_function(format!("redis 1 rule, 64 tasks, metrics {state}"), |b| {
            b.iter_custom(|iters| rt.block_on(sixty_four_tasks(&l, &names, iters)))
        });
    }
    g.finish();
}

criterion_group!(benches, memory, redis_backend, cluster_backend, metrics_cost);
criterion_main!(benches);
