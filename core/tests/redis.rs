//! The core against a real redis-server started on a free loopback port.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use throttlegate::{
    CheckOptions, Clock, ErrorKind, FailureMode, Limiter, ManualClock, Period, Policy, Rule, MAX_KEY_LEN,
};
use throttlegate_testkit::RedisServer;

const T0: i64 = 1_700_000_000_000_000;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn limiter(server: &RedisServer, rules: Vec<Rule>, clock: &ManualClock) -> Limiter {
    Limiter::builder(Policy::new(rules).unwrap())
        .url(server.url())
        .timeout(ms(2000))
        .on_backend_error(FailureMode::Error)
        .clock(Clock::Manual(clock.clone()))
        .build()
        .unwrap()
}

fn ip(v: &str) -> [(&'static str, String); 1] {
    [("ip", v.to_string())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_boundaries_and_exact_retry() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let l = limiter(&server, vec![Rule::sliding_window_log("w", "ip:{ip}", 3, ms(1000))], &clock);
    let a = ip("1.1.1.1");
    for expected_remaining in [2, 1, 0] {
        let d = l.check(&a, 1).await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining, expected_remaining);
        assert_eq!(d.reset_after, ms(1000));
        clock.advance(ms(100));
    }
    // At t0+300ms: the first unit (t0) leaves at t0+1000ms.
    let d = l.check(&a, 1).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.retry_after, ms(700));
    assert_eq!(d.rule.as_deref(), Some("w"));
    // Cost 2 needs the second unit (t0+100ms) to leave too.
    let d = l.check(&a, 2).await.unwrap();
    assert_eq!(d.retry_after, ms(800));
    // One microsecond early is still denied, exactly on time is admitted.
    clock.set_us(T0 + 999_999);
    assert!(!l.check(&a, 1).await.unwrap().allowed);
    clock.set_us(T0 + 1_000_000);
    let d = l.check(&a, 1).await.unwrap();
    assert!(d.allowed, "{d:?}");
    assert_eq!(d.remaining, 0);
    // Window slides: at t0+1200ms the units of t0+100 and t0+200 are gone.
    clock.set_us(T0 + 1_200_000);
    let d = l.check(&a, 2).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
    // Cost above the limit can never pass: an error naming the rule.
    let e = l.check(&a, 4).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("\"w\""), "{e}");
    let e = l.check(&a, 0).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_refill_and_exact_retry() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let l = limiter(&server, vec![Rule::token_bucket("b", "ip:{ip}", 10, 4.0)], &clock);
    let a = ip("2.2.2.2");
    let d = l.check(&a, 10).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
    assert_eq!(d.reset_after, ms(2500));
    let d = l.check(&a, 1).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.retry_after, ms(250));
    let d = l.check(&a, 3).await.unwrap();
    assert_eq!(d.retry_after, ms(750));
    clock.advance(ms(249));
    assert!(!l.check(&a, 1).await.unwrap().allowed);
    clock.advance(ms(1));
    let d = l.check(&a, 1).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
    // Refill over time, capped at capacity.
    clock.advance(Duration::from_secs(3600));
    let d = l.peek(&a, 1).await.unwrap();
    assert_eq!(d.remaining, 9);
    // Fractional rates: 0.5 tokens/s -> one token every 2 s.
    let slow = limiter(&server, vec![Rule::token_bucket("slow", "ip:{ip}", 1, 0.5)], &clock);
    assert!(slow.check(&a, 1).await.unwrap().allowed);
    let d = slow.check(&a, 1).await.unwrap();
    assert_eq!(d.retry_after, ms(2000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_expire_with_the_state() {
    let server = RedisServer::start();
    let l = Limiter::builder(
        Policy::new(vec![
            Rule::sliding_window_log("w", "ip:{ip}", 5, ms(300)),
            Rule::token_bucket("b", "ip:{ip}", 5, 10.0),
        ])
        .unwrap(),
    )
    .url(server.url())
    .on_backend_error(FailureMode::Error)
    .timeout(ms(2000))
    .build()
    .unwrap();
    let a = ip("3.3.3.3");
    assert!(l.check(&a, 2).await.unwrap().allowed);
    let keys = l.keys(&a);
    assert_eq!(keys.len(), 2);
    for k in &keys {
        let ttl: i64 = server.command(&["PTTL", k]).unwrap().parse().unwrap();
        assert!(ttl > 0 && ttl <= 300, "{k} has TTL {ttl}");
    }
    // Bucket: 2 tokens missing at 10/s -> full after 200 ms.
    let ttl: i64 = server.command(&["PTTL", &keys[1]]).unwrap().parse().unwrap();
    assert!(ttl <= 200, "bucket TTL {ttl}");
    tokio::time::sleep(ms(450)).await;
    for k in &keys {
        assert_eq!(server.command(&["EXISTS", k]).unwrap(), "0", "{k} should have expired");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denial_consumes_nothing_from_any_rule() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let l = limiter(
        &server,
        vec![
            Rule::sliding_window_log("per-ip", "ip:{ip}", 100, ms(60_000)),
            Rule::token_bucket("per-key", "key:{api_key}", 50, 1.0),
            Rule::sliding_window_log("tight", "t:{ip}", 2, ms(60_000)),
        ],
        &clock,
    );
    let a = [("ip", "4.4.4.4"), ("api_key", "k1")];
    assert!(l.check(&a, 1).await.unwrap().allowed);
    assert!(l.check(&a, 1).await.unwrap().allowed);
    let keys = l.keys(&a);
    let snapshot = |server: &RedisServer| -> Vec<String> {
        vec![
            server.command(&["LRANGE", &keys[0], "0", "-1"]).unwrap(),
            server.command(&["GET", &keys[1]]).unwrap(),
            server.command(&["LRANGE", &keys[2], "0", "-1"]).unwrap(),
        ]
    };
    let before = snapshot(&server);
    let d = l.check(&a, 1).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.rule.as_deref(), Some("tight"));
    let results: Vec<(&str, bool)> = d.results.iter().map(|r| (&*r.rule, r.allowed)).collect();
    assert_eq!(results, vec![("per-ip", true), ("per-key", true), ("tight", false)]);
    assert_eq!(snapshot(&server), before, "a denied request changed stored state");
    // Peek never writes either.
    l.peek(&a, 1).await.unwrap();
    assert_eq!(snapshot(&server), before);
}

/// 64 tasks, task `t` on `limiters[t % len]`, each checking key "one" 4
/// times: how many of the 256 checks were admitted.
async fn admitted_by_64_tasks(limiters: &[Limiter]) -> u32 {
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let l = limiters[t % limiters.len()].clone();
            tokio::spawn(async move {
                let mut admitted = 0u32;
                for _ in 0..4 {
                    if l.check(&[("k", "one")], 1).await.unwrap().allowed {
                        admitted += 1;
                    }
                }
                admitted
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_tasks_admit_exactly_the_limit() {
    let server = RedisServer::start();
    for rep in 0..20 {
        let l = Limiter::builder(
            Policy::new(vec![Rule::sliding_window_log("hot", "k:{k}", 100, ms(60_000))]).unwrap(),
        )
        .url(server.url())
        .prefix(format!("rep{rep}:"))
        .timeout(ms(5000))
        .on_backend_error(FailureMode::Error)
        .build()
        .unwrap();
        let total = admitted_by_64_tasks(&[l]).await;
        assert_eq!(total, 100, "repetition {rep}: {total} admitted out of 256");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_tasks_on_stacked_logs_admit_exactly_the_tighter_limit() {
    // Two limiters (each its own connections), 64 tasks, two stacked logs on
    // the server's clock: once the server's time is known, the checks take
    // the stacked short form (mode "n"); never more than the tighter limit,
    // and a denied check records nothing on the looser log.
    let server = RedisServer::start();
    for rep in 0..10 {
        let build = || {
            Limiter::builder(
                Policy::new(vec![
                    Rule::sliding_window_log("hot", "k:{k}", 100, ms(60_000)),
                    Rule::sliding_window_log("wide", "w:{k}", 150, ms(30_000)),
                ])
                .unwrap(),
            )
            .url(server.url())
            .prefix(format!("stack{rep}:"))
            .timeout(ms(5000))
            .on_backend_error(FailureMode::Error)
            .build()
            .unwrap()
        };
        let limiters = [build(), build()];
        let total = admitted_by_64_tasks(&limiters).await;
        assert_eq!(total, 100, "repetition {rep}: {total} admitted out of 256");
        let keys = limiters[0].keys(&[("k", "one")]);
        assert_eq!((log_units(&server, &keys[0]), log_units(&server, &keys[1])), (100, 100), "repetition {rep}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_evalsha_per_check_whatever_the_rule_count() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let four = limiter(
        &server,
        vec![
            Rule::sliding_window_log("a", "ip:{ip}", 100, ms(60_000)),
            Rule::token_bucket("b", "key:{api_key}", 100, 1.0),
            Rule::sliding_window_log("c", "tenant:{tenant}", 100, ms(60_000)),
            Rule::token_bucket("d", "route:{route}", 100, 1.0),
        ],
        &clock,
    );
    let a = [("ip", "5.5.5.5"), ("api_key", "k"), ("tenant", "t"), ("route", "/x")];
    four.check(&a, 1).await.unwrap(); // loads the script (NOSCRIPT path) once
    let base_eval = server.command_calls("evalsha");
    let base_load = server.command_calls("script|load") + server.command_calls("script");
    for _ in 0..10 {
        let d = four.check(&a, 1).await.unwrap();
        assert_eq!(d.results.len(), 4);
    }
    assert_eq!(server.command_calls("evalsha") - base_eval, 10);
    assert_eq!(server.command_calls("script|load") + server.command_calls("script"), base_load);
    assert_eq!(server.command_calls("eval"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_script_flush_and_restart() {
    let mut server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let l = limiter(&server, vec![Rule::sliding_window_log("w", "ip:{ip}", 1000, ms(60_000))], &clock);
    let a = ip("6.6.6.6");
    for _ in 0..3 {
        assert!(l.check(&a, 1).await.unwrap().allowed);
        server.command(&["SCRIPT", "FLUSH"]).unwrap();
    }
    assert!(l.check(&a, 1).await.unwrap().allowed);
    server.restart();
    // The connection is re-established by itself: at most the calls in flight
    // (here: none, or the first after the restart) may fail.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut ok = false;
    while Instant::now() < deadline {
        match l.check(&a, 1).await {
            Ok(d) => {
                assert!(d.allowed);
                assert!(!d.degraded);
                ok = true;
                break;
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::BackendUnavailable, "{e}");
                tokio::time::sleep(ms(20)).await;
            }
        }
    }
    assert!(ok, "no successful check within 5 s of the restart");
    // The restarted server is empty: the log starts again.
    assert_eq!(l.check(&a, 1).await.unwrap().remaining, 998);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_follows_on_backend_error() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    let rules = || vec![Rule::sliding_window_log("w", "ip:{ip}", 10, ms(60_000))];
    let timeout = ms(100);
    for mode in [FailureMode::Allow, FailureMode::Deny, FailureMode::Error] {
        let l = Limiter::builder(Policy::new(rules()).unwrap())
            .url(&url)
            .timeout(timeout)
            .on_backend_error(mode)
            .build()
            .unwrap();
        for _ in 0..3 {
            let started = Instant::now();
            let r = l.check(&ip("7.7.7.7"), 1).await;
            // Bounded by the timeout (with slack for a loaded machine).
            assert!(started.elapsed() < timeout + Duration::from_secs(2));
            match mode {
                FailureMode::Allow => {
                    let d = r.unwrap();
                    assert!(d.allowed && d.degraded);
                }
                FailureMode::Deny => {
                    let d = r.unwrap();
                    assert!(!d.allowed && d.degraded);
                    assert!(d.headers().iter().any(|(k, v)| *k == "Retry-After" && v == "1"));
                }
                FailureMode::Error => {
                    let e = r.unwrap_err();
                    assert!(e.kind().is_backend_failure(), "{e:?}");
                    assert!(e.is_temporary());
                }
            }
        }
        let s = l.stats();
        match mode {
            FailureMode::Allow => assert_eq!(s.degraded_allowed, 3),
            FailureMode::Deny => assert_eq!(s.degraded_denied, 3),
            FailureMode::Error => assert_eq!(s.backend_errors, 3),
        }
    }
    // Per-rule override: error wins over deny, deny over allow.
    let l = Limiter::builder(
        Policy::new(vec![
            Rule::sliding_window_log("open", "ip:{ip}", 10, ms(60_000)),
            Rule::sliding_window_log("strict", "s:{ip}", 10, ms(60_000)).on_backend_error(FailureMode::Deny),
        ])
        .unwrap(),
    )
    .url(&url)
    .timeout(timeout)
    .build()
    .unwrap();
    let d = l.check(&ip("7.7.7.7"), 1).await.unwrap();
    assert!(!d.allowed && d.degraded);
    assert_eq!(d.rule.as_deref(), Some("strict"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_is_bounded_by_the_timeout() {
    let server = RedisServer::start();
    let l = Limiter::builder(Policy::new(vec![Rule::sliding_window_log("w", "ip:{ip}", 10, ms(60_000))]).unwrap())
        .url(server.url())
        .timeout(ms(150))
        .build()
        .unwrap();
    assert!(!l.check(&ip("8.8.8.8"), 1).await.unwrap().degraded);
    server.pause(true);
    let started = Instant::now();
    let d = l.check(&ip("8.8.8.8"), 1).await.unwrap();
    assert!(d.degraded && d.allowed);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(l.stats().timeouts, 1);
    server.pause(false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_values_never_collide_and_keys_stay_bounded() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let l = limiter(&server, vec![Rule::sliding_window_log("per-pair", "{a}:{b}", 1, ms(60_000))], &clock);
    let long = "z".repeat(1 << 20);
    let values: Vec<(String, String)> = vec![
        ("x:y".into(), "z".into()),
        ("x".into(), "y:z".into()),
        ("x%3Ay".into(), "z".into()),
        ("{x}".into(), "y".into()),
        ("x}".into(), "{y".into()),
        ("a\nb".into(), "\0".into()),
        (long.clone(), "1".into()),
        (long.clone(), "2".into()),
        (format!("{long}x"), "1".into()),
        ("#".into(), "".into()),
        ("".into(), "#".into()),
        ("ünï".into(), "😀".into()),
    ];
    for (a, b) in &values {
        // Limit 1 per pair: if two pairs shared a key, the second would be denied.
        let d = l.check(&[("a", a.as_str()), ("b", b.as_str())], 1).await.unwrap();
        assert!(d.allowed, "pair ({:.20?}, {:.20?}) collided with an earlier one", a, b);
    }
    let keys = server.command(&["KEYS", "*"]).unwrap();
    let keys: HashSet<&str> = keys.lines().collect();
    assert_eq!(keys.len(), values.len());
    for k in keys {
        assert!(k.len() <= MAX_KEY_LEN, "key of {} bytes", k.len());
        assert!(!k.contains('{') && !k.contains('\n'), "{k:?}");
        let ttl: i64 = server.command(&["PTTL", k]).unwrap().parse().unwrap();
        assert!(ttl > 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_keeps_raw_values_out_of_redis() {
    let server = RedisServer::start();
    let l = Limiter::builder(Policy::new(vec![Rule::token_bucket("k", "key:{api_key}", 5, 1.0)]).unwrap())
        .url(server.url())
        .key_secret("a secret of sixteen+ bytes")
        .build()
        .unwrap();
    l.check(&[("api_key", "sk_live_very_secret")], 1).await.unwrap();
    let keys = server.command(&["KEYS", "*"]).unwrap();
    assert!(!keys.is_empty());
    assert!(!keys.contains("sk_live"), "{keys}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peek_reset_and_idempotent_call_ids() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let l = limiter(
        &server,
        vec![
            Rule::sliding_window_log("w", "ip:{ip}", 5, ms(60_000)),
            Rule::token_bucket("b", "ip:{ip}", 5, 0.1),
        ],
        &clock,
    );
    let a = ip("9.9.9.9");
    let d = l.peek(&a, 2).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.remaining, 3);
    assert_eq!(l.peek(&a, 1).await.unwrap().remaining, 4, "peek consumed");
    let opts = CheckOptions { cost: 2, call_id: Some("req-42".into()) };
    let first = l.check_with(&a, &opts).await.unwrap();
    assert_eq!(first.remaining, 3);
    // The same call again (a retry): answered, not counted.
    let again = l.check_with(&a, &opts).await.unwrap();
    assert!(again.allowed);
    assert_eq!(l.peek(&a, 1).await.unwrap().remaining, 2);
    let e = l
        .check_with(&a, &CheckOptions { cost: 1, call_id: Some("bad:id".into()) })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert_eq!(l.reset(&a).await.unwrap(), 2);
    assert_eq!(l.peek(&a, 1).await.unwrap().remaining, 4);
    l.close();
    assert_eq!(l.check(&a, 1).await.unwrap_err().kind(), ErrorKind::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_rules_report_but_never_deny() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let l = limiter(
        &server,
        vec![
            Rule::sliding_window_log("live", "ip:{ip}", 10, ms(60_000)),
            Rule::sliding_window_log("trial", "t:{ip}", 1, ms(60_000)).shadow(true),
        ],
        &clock,
    );
    let a = ip("10.0.0.1");
    assert!(l.check(&a, 1).await.unwrap().allowed);
    let d = l.check(&a, 1).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.rule.as_deref(), Some("live"));
    let trial = d.results.iter().find(|r| &*r.rule == "trial").unwrap();
    assert!(trial.shadow && !trial.allowed, "the shadow rule reports it would deny");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_time_setting_uses_the_host_clock() {
    let server = RedisServer::start();
    let l = Limiter::builder(Policy::new(vec![Rule::sliding_window_log("w", "ip:{ip}", 5, ms(60_000))]).unwrap())
        .url(server.url())
        .clock(Clock::System)
        .on_backend_error(FailureMode::Error)
        .build()
        .unwrap();
    assert!(l.check(&ip("1.2.3.4"), 1).await.unwrap().allowed);
    let key = &l.keys(&ip("1.2.3.4"))[0];
    // The log's one entry is the check's time.
    let score: i64 = server.command(&["LINDEX", key, "0"]).unwrap().trim().parse().unwrap();
    let host_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    assert!((host_now - score).abs() < 60_000_000, "score {score} is not the host's time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_clock_single_rule_agrees_with_the_general_path() {
    // One sliding-window rule, cost 1, Redis's own clock: the script's
    // straight-line path (lua/single_rule.lua). Peeks and cost-2 checks take
    // the general one; both must read the same state the same way. The first
    // reply carries the server's time; the admissions after it come back
    // terse (mode "t": the bare remaining) with the same figures.
    let server = RedisServer::start();
    let l = Limiter::builder(Policy::new(vec![Rule::sliding_window_log("one", "ip:{ip}", 3, ms(60_000))]).unwrap())
        .url(server.url())
        .on_backend_error(FailureMode::Error)
        .timeout(ms(2000))
        .build()
        .unwrap();
    let a = ip("7.7.7.7");
    for left in [2u64, 1, 0] {
        let d = l.check(&a, 1).await.unwrap();
        assert!(d.allowed);
        assert_eq!((d.remaining, d.retry_after, d.reset_after), (left, Duration::ZERO, ms(60_000)));
        let p = l.peek(&a, 1).await.unwrap();
        assert_eq!(p.allowed, left > 0);
    }
    let key = &l.keys(&a)[0];
    let ttl: i64 = server.command(&["PTTL", key]).unwrap().parse().unwrap();
    assert!(ttl > 55_000 && ttl <= 60_000, "TTL {ttl}");
    let d = l.check(&a, 1).await.unwrap();
    let p = l.peek(&a, 1).await.unwrap();
    assert!(!d.allowed && !p.allowed);
    assert_eq!((d.remaining, p.remaining), (0, 0));
    assert!(d.retry_after <= ms(60_000) && d.retry_after > ms(50_000), "{:?}", d.retry_after);
    let close = |x: Duration, y: Duration| x.abs_diff(y) < ms(5_000);
    assert!(close(d.retry_after, p.retry_after), "{:?} vs {:?}", d.retry_after, p.retry_after);
    assert!(close(d.reset_after, p.reset_after) && d.reset_after >= d.retry_after);
    assert!(!l.check(&a, 2).await.unwrap().allowed);
    // Denials consumed nothing.
    assert_eq!(log_units(&server, key), 3);
}

/// The units a sliding-window log holds: the sum of its entries'
/// (`"<time>"` one unit, `"<time>:<units>"`), after the header if any
/// (`lua/sliding_window_log.lua`); 0 when the key is absent.
fn log_units(server: &RedisServer, key: &str) -> u64 {
    let list = server.command(&["LRANGE", key, "0", "-1"]).unwrap();
    list.lines()
        .filter(|e| !e.is_empty() && !e.starts_with('-'))
        .map(|e| e.split_once(':').map_or(1, |(_, c)| c.parse().unwrap()))
        .sum()
}

/// `evalsha` calls Redis has served so far.
fn evalsha_calls(server: &RedisServer) -> u64 {
    let info = server.command(&["INFO", "commandstats"]).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .map(|rest| rest.split(',').next().unwrap().parse().unwrap())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_cache_answers_denials_locally_and_exactly() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let rules = || {
        vec![
            Rule::sliding_window_log("per-ip", "ip:{ip}", 2, ms(1000)),
            Rule::token_bucket("per-ip-burst", "b:{ip}", 100, 1.0),
        ]
    };
    let build = |cache: bool| {
        Limiter::builder(Policy::new(rules()).unwrap())
            .url(server.url())
            .timeout(ms(2000))
            .on_backend_error(FailureMode::Error)
            .clock(Clock::Manual(clock.clone()))
            .deny_cache(cache)
            .build()
            .unwrap()
    };
    let cached = build(true);
    // The reference: no cache, the same Redis and clock, asked with peeks.
    let plain = build(false);
    let a = ip("9.9.9.9");
    assert!(cached.check(&a, 1).await.unwrap().allowed);
    assert!(cached.check(&a, 1).await.unwrap().allowed);
    let first = cached.check(&a, 1).await.unwrap();
    assert!(!first.allowed);
    assert_eq!(first.retry_after, ms(1000));

    // While the log is full: denied here, with no call to Redis, exactly as
    // Redis itself answers; the wait counts down.
    let calls = evalsha_calls(&server);
    for step in 1..=4u64 {
        clock.advance(ms(200));
        let d = cached.check(&a, 1).await.unwrap();
        let p = cached.peek(&a, 1).await.unwrap();
        let truth = plain.peek(&a, 1).await.unwrap();
        assert!(!d.allowed && !p.allowed && !truth.allowed, "step {step}");
        assert_eq!(d.retry_after, truth.retry_after, "step {step}");
        assert_eq!(d.retry_after, ms(1000 - 200 * step));
        assert_eq!(d.rule.as_deref(), Some("per-ip"));
        assert_eq!((d.remaining, d.reset_after), (truth.remaining, truth.reset_after), "step {step}");
        let retry_header = |d: &throttlegate::Decision| d.headers().into_iter().find(|(k, _)| *k == "Retry-After");
        assert_eq!(retry_header(&d), retry_header(&truth), "step {step}");
    }
    // Only the reference's peeks reached Redis.
    assert_eq!(evalsha_calls(&server), calls + 4);
    assert_eq!(cached.stats().denied, 9);

    // The wait is over: Redis is asked again, and admits.
    clock.advance(ms(200));
    assert!(cached.check(&a, 1).await.unwrap().allowed);
    assert_eq!(evalsha_calls(&server), calls + 5);

    // A reset through this limiter forgets the remembered denial at once.
    assert!(cached.check(&a, 1).await.unwrap().allowed);
    assert!(!cached.check(&a, 1).await.unwrap().allowed);
    cached.reset(&a).await.unwrap();
    assert!(cached.check(&a, 1).await.unwrap().allowed);

    // A call id always goes to Redis (a retry of an admitted call is not a denial).
    assert!(cached.check(&a, 1).await.unwrap().allowed);
    assert!(!cached.check(&a, 1).await.unwrap().allowed);
    let calls = evalsha_calls(&server);
    let opts = CheckOptions { cost: 1, call_id: Some("retry-1".into()) };
    assert!(!cached.check_with(&a, &opts).await.unwrap().allowed);
    assert_eq!(evalsha_calls(&server), calls + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_cache_and_problem_body_for_the_bounded_memory_algorithms() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let cases = [
        Rule::sliding_window("counters", "c:{ip}", 3, ms(10_000)),
        Rule::fixed_window("fixed", "f:{ip}", 3, ms(10_000)),
        Rule::quota("hourly", "h:{ip}", 3, Period::Hour),
    ];
    for rule in cases {
        let name = rule.name.clone();
        let build = |cache: bool| {
            Limiter::builder(Policy::new(vec![rule.clone()]).unwrap())
                .url(server.url())
                .timeout(ms(2000))
                .on_backend_error(FailureMode::Error)
                .clock(Clock::Manual(clock.clone()))
                .deny_cache(cache)
                .build()
                .unwrap()
        };
        let (cached, plain) = (build(true), build(false));
        let a = ip("9.9.9.9");
        assert!(cached.check(&a, 3).await.unwrap().allowed, "{name}");
        let first = cached.check(&a, 1).await.unwrap();
        assert!(!first.allowed, "{name}");
        let body = first.problem_json().expect("a denial has a problem body");
        assert!(body.contains(&format!("\"{name}\"")), "{name}: {body}");
        // Remembered: denied without a round trip, exactly as Redis answers.
        let calls = evalsha_calls(&server);
        clock.advance(ms(1000));
        let d = cached.check(&a, 1).await.unwrap();
        assert_eq!(evalsha_calls(&server), calls, "{name}: the cache answered");
        let truth = plain.peek(&a, 1).await.unwrap();
        assert!(!d.allowed && !truth.allowed, "{name}");
        assert_eq!((d.retry_after, d.remaining, d.rule), (truth.retry_after, truth.remaining, truth.rule), "{name}");
        assert_eq!(d.problem_json(), truth.problem_json(), "{name}");
        // After the wait, Redis is asked again and admits.
        clock.advance(truth.retry_after);
        assert!(cached.check(&a, 1).await.unwrap().allowed, "{name}");
        assert_eq!(cached.reset(&a).await.unwrap(), 1, "{name}");
    }
}

/// Connected clients Redis counts (the test kit's own connection included).
fn connected_clients(server: &RedisServer) -> u64 {
    let info = server.command(&["INFO", "clients"]).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .map(|n| n.trim().parse().unwrap())
        .unwrap()
}

/// The blocking path (Python's blocking calls, C, the command line) on a
/// thread's own connection: the same decisions, commands, errors and
/// recovery as the async path.
#[test]
fn blocking_checks_match_the_async_path() {
    let mut server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let rules = || {
        vec![
            Rule::sliding_window_log("w", "ip:{ip}", 3, ms(1000)),
            Rule::token_bucket("b", "key:{ip}", 5, 1.0),
        ]
    };
    let blocking = limiter(&server, rules(), &clock);
    let asynchronous = limiter(&server, rules(), &clock);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let check = CheckOptions { cost: 1, call_id: None };
    // Twin keys, one per path: every answer the same, step by step.
    for step in 0..6 {
        let b = blocking.check_blocking(&ip("9.9.9.1"), &check).unwrap();
        let a = rt.block_on(asynchronous.check(&ip("9.9.9.2"), 1)).unwrap();
        assert_eq!((b.allowed, b.remaining, b.retry_after, b.rule), (a.allowed, a.remaining, a.retry_after, a.rule), "step {step}");
        assert_eq!(b.headers(), a.headers(), "step {step}");
        let (pb, pa) = (blocking.peek_blocking(&ip("9.9.9.1"), 2).unwrap(), rt.block_on(asynchronous.peek(&ip("9.9.9.2"), 2)).unwrap());
        assert_eq!((pb.allowed, pb.retry_after), (pa.allowed, pa.retry_after), "peek {step}");
        clock.advance(ms(150));
    }
    // A caller's call id is honoured: the second call is a replay.
    let with_id = CheckOptions { cost: 1, call_id: Some("blocking-1".into()) };
    let first = blocking.check_blocking(&ip("9.9.9.3"), &with_id).unwrap();
    let again = blocking.check_blocking(&ip("9.9.9.3"), &with_id).unwrap();
    assert_eq!((first.remaining, again.remaining), (2, 2));
    // One EVALSHA per check, after a script flush too (NOSCRIPT, load, retry).
    server.command(&["SCRIPT", "FLUSH"]).unwrap();
    assert!(blocking.check_blocking(&ip("9.9.9.4"), &check).unwrap().allowed);
    let base = server.command_calls("evalsha");
    for _ in 0..5 {
        blocking.check_blocking(&ip("9.9.9.5"), &check).unwrap();
    }
    assert_eq!(server.command_calls("evalsha") - base, 5);
    assert_eq!(server.command_calls("eval"), 0);
    // Inside an async runtime it is refused, as every blocking call is.
    let e = rt.block_on(async { blocking.check_blocking(&ip("9.9.9.6"), &check) }).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("await the async method"), "{e}");
    // After a restart the dead connection is dropped: at most one call fails.
    server.restart();
    let mut failures = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while blocking.check_blocking(&ip("9.9.9.7"), &check).is_err() {
        failures += 1;
        assert!(Instant::now() < deadline, "no successful check within 5 s of the restart");
        std::thread::sleep(ms(20));
    }
    assert!(failures <= 1, "{failures} calls failed after the restart");
}

#[test]
fn blocking_checks_from_many_threads_admit_exactly_the_limit_on_few_connections() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let l = limiter(&server, vec![Rule::sliding_window_log("w", "ip:{ip}", 100, ms(60_000))], &clock);
    let before = connected_clients(&server);
    let admitted = std::thread::scope(|s| {
        let threads: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    (0..40)
                        .filter(|_| l.check_blocking(&ip("10.0.0.1"), &CheckOptions { cost: 1, call_id: None }).unwrap().allowed)
                        .count()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum::<usize>()
    });
    assert_eq!(admitted, 100);
    // At most one connection per thread that called at once, kept for the next calls.
    let opened = connected_clients(&server) - before;
    assert!((1..=8).contains(&opened), "{opened} connections");
    l.check_blocking(&ip("10.0.0.2"), &CheckOptions { cost: 1, call_id: None }).unwrap();
    assert_eq!(connected_clients(&server) - before, opened);
}

#[test]
fn blocking_check_on_a_paused_redis_times_out_like_the_async_one() {
    let server = RedisServer::start();
    let build = || {
        Limiter::builder(Policy::new(vec![Rule::sliding_window_log("w", "ip:{ip}", 10, ms(60_000))]).unwrap())
            .url(server.url())
            .timeout(ms(150))
            .on_backend_error(FailureMode::Error)
            .build()
            .unwrap()
    };
    let (blocking, asynchronous) = (build(), build());
    let check = CheckOptions { cost: 1, call_id: None };
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert_eq!(blocking.check_blocking(&ip("11.0.0.1"), &check).unwrap().remaining, 9);
    rt.block_on(asynchronous.check(&ip("11.0.0.2"), 1)).unwrap();
    server.pause(true);
    let started = Instant::now();
    let b = blocking.check_blocking(&ip("11.0.0.1"), &check).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    let a = rt.block_on(asynchronous.check(&ip("11.0.0.2"), 1)).unwrap_err();
    assert_eq!((b.kind(), b.to_string()), (a.kind(), a.to_string()));
    assert_eq!(b.kind(), ErrorKind::Timeout);
    assert_eq!(blocking.stats().timeouts, 1);
    server.pause(false);
    // The timed-out call's late reply is never read as the next call's answer:
    // the next call has its own, and the timed-out one, run by Redis after
    // its deadline, changed nothing.
    let next = blocking.check_blocking(&ip("11.0.0.1"), &check).unwrap();
    assert_eq!(next.remaining, 8, "{next:?}");
    let again = blocking.check_blocking(&ip("11.0.0.1"), &check).unwrap();
    assert_eq!(again.remaining, next.remaining - 1);
}

/// Tiers, an override and a block on one Redis: 64 tasks never admit more
/// than the tightest limit that applies; a denied check leaves nothing in the
/// other rules (the block is its one write); the deny cache answers a
/// blocked key locally; a reset lifts the block.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tiers_overrides_and_blocks_under_64_tasks() {
    use throttlegate::{Block, TierLimit, Tiers};
    let server = RedisServer::start();
    let rules = || {
        vec![
            Rule::sliding_window_log("plan", "u:{user}", 1, ms(3_600_000)).tiers(
                Tiers::new("plan").tier("free", TierLimit::Limit(10)).tier("pro", TierLimit::Limit(40)),
            ),
            Rule::fixed_window("tenant", "t:{tenant}", 5, ms(3_600_000)).overrides(true),
            Rule::sliding_window_log("ip", "ip:{ip}", 20, ms(3_600_000)).block(Block::new(ms(3_600_000))),
        ]
    };
    let build = |prefix: &str, cache: bool| {
        Limiter::builder(Policy::new(rules()).unwrap())
            .url(server.url())
            .prefix(prefix)
            .timeout(ms(5000))
            .on_backend_error(FailureMode::Error)
            .deny_cache(cache)
            .build()
            .unwrap()
    };
    // (user, plan, tenant, tenant override, ip) -> exactly admitted.
    type Case<'a> = (&'a str, &'a str, &'a str, Option<u64>, &'a str, u32);
    let cases: [Case; 4] = [
        ("u1", "pro", "t1", Some(30), "i1", 20), // the blocking rule is the tightest
        ("u2", "free", "t2", Some(30), "i2", 10), // the tier
        ("u3", "pro", "t3", Some(3), "i3", 3),    // the override
        ("u4", "pro", "t4", None, "i4", 5),       // the rule's own limit
    ];
    for (n, (user, plan, tenant, limit, ipv, want)) in cases.into_iter().enumerate() {
        let prefix = format!("tob{n}:");
        let l = build(&prefix, false);
        if let Some(v) = limit {
            l.set_override("tenant", &[("tenant", tenant)], v).await.unwrap();
        }
        let attrs: Vec<(String, String)> = [("user", user), ("plan", plan), ("tenant", tenant), ("ip", ipv)]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut tasks = Vec::new();
        for _ in 0..64 {
            let (l, attrs) = (l.clone(), attrs.clone());
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0u32;
                for _ in 0..4 {
                    if l.check(&attrs, 1).await.unwrap().allowed {
                        admitted += 1;
                    }
                }
                admitted
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        assert_eq!(total, want, "case {n}: {total} admitted out of 256");
        // Every rule holds exactly the admitted units: denials wrote nothing.
        let keys = l.keys(&attrs);
        assert_eq!(log_units(&server, &keys[0]), want as u64, "case {n}");
        let stored = server.command(&["GET", &keys[1]]).unwrap();
        assert!(stored.trim().ends_with(&format!(":{want}")), "case {n}: {stored}");
        assert_eq!(log_units(&server, &keys[2]), want as u64, "case {n}");
        let block_key = format!("ip:#b{{{}}}", keys[2]).replace("ip:#b", &format!("{prefix}ip:#b"));
        let blocked = server.command(&["EXISTS", &block_key]).unwrap().trim() == "1";
        assert_eq!(blocked, n == 0, "case {n}: only the ip rule's own denial blocks");
        if n == 0 {
            // The block holds whatever the cost, and the deny cache knows it.
            let cached = build(&prefix, true);
            let d = cached.check(&attrs, 1).await.unwrap();
            assert!(!d.allowed);
            assert!(d.retry_after > ms(3_500_000), "{:?}", d.retry_after);
            let calls = evalsha_calls(&server);
            for _ in 0..5 {
                assert!(!cached.check(&attrs, 1).await.unwrap().allowed);
            }
            assert_eq!(evalsha_calls(&server), calls, "a blocked key is answered locally");
            // A reset lifts the block (and forgets the cached denial).
            assert_eq!(cached.reset(&attrs).await.unwrap(), 4);
            assert_eq!(server.command(&["EXISTS", &block_key]).unwrap().trim(), "0");
            assert!(cached.check(&attrs, 1).await.unwrap().allowed);
        }
    }
}

/// Settles under contention: 16 tasks check at an estimate, settle at a
/// random real cost (a refund) and settle again; stacked rules of three
/// algorithms end holding exactly the sum of the real costs, never more than
/// the limit, and every second settle counts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settles_under_16_tasks_never_over_admit_and_count_once() {
    // A settle must come before 64 newer checks with call ids on its key
    // (settled ids keep their place, marked): 16 tasks stay well within it.
    let server = RedisServer::start();
    let limit = 300;
    let rules = vec![
        Rule::sliding_window_log("log", "l:{ip}", limit, ms(3_600_000)),
        Rule::fixed_window("fixed", "f:{ip}", limit, ms(3_600_000)),
        Rule::token_bucket("bucket", "b:{ip}", limit, 0.000_001),
    ];
    let l = Limiter::builder(Policy::new(rules).unwrap())
        .url(server.url())
        .timeout(ms(5000))
        .on_backend_error(FailureMode::Error)
        .build()
        .unwrap();
    let tasks: Vec<_> = (0..16u64)
        .map(|t| {
            let l = l.clone();
            tokio::spawn(async move {
                let a = ip("7.7.7.7");
                let (mut kept, mut admitted) = (0u64, 0u64);
                for i in 0..48u64 {
                    let options = CheckOptions { cost: 4, call_id: Some(format!("t{t}-{i}")) };
                    let d = l.check_with(&a, &options).await.unwrap();
                    if !d.allowed {
                        continue;
                    }
                    admitted += 1;
                    let actual = (t + i) % 5;
                    assert_eq!(l.settle(&d, actual.min(4)).await.unwrap(), 3);
                    assert_eq!(l.settle(&d, 4).await.unwrap(), 0, "a second settle counts nothing");
                    kept += actual.min(4);
                }
                (kept, admitted)
            })
        })
        .collect();
    let (mut kept, mut admitted) = (0, 0);
    for t in tasks {
        let (k, a) = t.await.unwrap();
        kept += k;
        admitted += a;
    }
    assert!(kept <= limit, "{kept} units kept of {limit}");
    assert!(admitted > limit / 4, "refunds let more calls in than estimates alone ({admitted})");
    let d = l.peek(&ip("7.7.7.7"), 1).await.unwrap();
    // A peek of cost 1 shows what would be left after it, or (denied, when
    // the real costs filled the limit) 0.
    let after_peek = (limit - kept).saturating_sub(1);
    for r in &d.results {
        assert_eq!(r.remaining, after_peek, "{}: holds exactly the real costs", r.rule);
    }
}

/// A settle racing a check on the same key: either order is all or nothing,
/// and the key ends holding exactly what the winner's order implies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_racing_a_check_on_the_same_key() {
    let server = RedisServer::start();
    let rules = vec![
        Rule::sliding_window_log("log", "l:{ip}", 10, ms(60_000)),
        Rule::token_bucket("bucket", "b:{ip}", 10, 0.001),
        Rule::sliding_window("counters", "c:{ip}", 10, ms(60_000)),
    ];
    let l = Limiter::builder(Policy::new(rules).unwrap())
        .url(server.url())
        .timeout(ms(5000))
        .on_backend_error(FailureMode::Error)
        .build()
        .unwrap();
    let mut orders = [0, 0];
    for round in 0..60 {
        let a = ip(&format!("10.0.0.{round}"));
        let first = l.check_with(&a, &CheckOptions { cost: 6, call_id: Some(format!("a{round}")) }).await.unwrap();
        assert!(first.allowed);
        let options = CheckOptions { cost: 10, call_id: Some(format!("b{round}")) };
        // The one connection sends them in the order they are first polled: alternate it.
        let (settled, second) = if round % 2 == 0 {
            tokio::join!(l.settle(&first, 0), l.check_with(&a, &options))
        } else {
            let (second, settled) = tokio::join!(l.check_with(&a, &options), l.settle(&first, 0));
            (settled, second)
        };
        let (settled, second) = (settled.unwrap(), second.unwrap());
        assert_eq!(settled, 3);
        let d = l.peek(&a, 1).await.unwrap();
        if second.allowed {
            // The settle ran first: the whole limit went to the second check.
            orders[0] += 1;
            assert!(!d.allowed, "{d:?}");
        } else {
            // The check ran first and was denied whole; the settle then emptied the key.
            orders[1] += 1;
            assert!(d.results.iter().all(|r| r.remaining == 9), "{d:?}");
        }
    }
    assert!(orders[0] > 0 && orders[1] > 0, "both orders were seen: {orders:?}");
}

/// 50 waiters on a 10-per-second rule: admitted in arrival order, 10 per
/// second, at most 2 Redis calls per acquire on average (counted by Redis).
/// The order is read back from Redis: a shadow rule with a long window keeps
/// every admitted call's id, scored by the server's time of its admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_serves_waiters_in_arrival_order_without_polling() {
    let server = RedisServer::start();
    for rule in [
        Rule::sliding_window_log("log", "l:{ip}", 10, ms(1000)),
        Rule::token_bucket("bucket", "b:{ip}", 10, 10.0),
    ] {
        let name = rule.name.clone();
        let mut record = Rule::sliding_window_log("record", "r:{ip}", 1000, ms(3_600_000));
        record.shadow = true;
        let l = Limiter::builder(Policy::new(vec![rule, record]).unwrap())
            .url(server.url())
            .prefix(format!("acq-{name}:"))
            .timeout(ms(2000))
            .on_backend_error(FailureMode::Error)
            .build()
            .unwrap();
        l.ping().await.unwrap();
        let a = ip("5.5.5.5");
        let calls = evalsha_calls(&server);
        let start = Instant::now();
        let mut waiters = Vec::new();
        for i in 0..50 {
            let (l, a) = (l.clone(), a.clone());
            let (joined, arrived) = tokio::sync::oneshot::channel();
            waiters.push(tokio::spawn(async move {
                let options = CheckOptions { cost: 1, call_id: Some(format!("w{i:02}")) };
                let acquire = l.acquire_with(&a, &options, Duration::from_secs(30));
                // The first poll joins the queue; the next waiter arrives after it.
                let mut acquire = std::pin::pin!(acquire);
                let first = futures_poll_once(acquire.as_mut()).await;
                let _ = joined.send(());
                let d = match first {
                    Some(d) => d,
                    None => acquire.await,
                };
                assert!(d.unwrap().allowed);
                start.elapsed()
            }));
            arrived.await.unwrap();
        }
        let mut admitted = Vec::new();
        for w in waiters {
            admitted.push(w.await.unwrap());
        }
        let used = evalsha_calls(&server) - calls;
        let key = l.keys(&a).into_iter().find(|k| k.contains("record:")).unwrap();
        // The log's header keeps the ids of its checks made with one, oldest first.
        let header = server.command(&["LINDEX", &key, "0"]).unwrap();
        let ids = header.trim().split_once(':').unwrap().1.to_string();
        let order: Vec<&str> = ids.split(',').map(|e| e.split_once('@').unwrap().1).collect();
        let arrival: Vec<String> = (0..50).map(|i| call_tag(&server, &format!("w{i:02}"))).collect();
        assert_eq!(order, arrival, "{name}: admitted in arrival order");
        assert!(used <= 100, "{name}: {used} Redis calls for 50 acquires");
        admitted.sort();
        let last = admitted[49];
        eprintln!(
            "acquire {name}: 50 waiters admitted in {:.2} s ({:.1}/s after the first 10), {used} EVALSHA calls ({:.2} per acquire)",
            last.as_secs_f64(),
            40.0 / (last - admitted[9]).as_secs_f64(),
            used as f64 / 50.0
        );
    }
}

/// Poll a future once: its output if it is ready at once.
async fn futures_poll_once<F: std::future::Future + Unpin>(f: F) -> Option<F::Output> {
    let mut f = f;
    std::future::poll_fn(|cx| match std::pin::Pin::new(&mut f).poll(cx) {
        std::task::Poll::Ready(v) => std::task::Poll::Ready(Some(v)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await
}

/// The log as the previous version wrote it: a sorted set, one member per
/// unit (`call_id`, `call_id:2`, ...), scored by the admission time.
fn old_log(server: &RedisServer, key: &str, checks: &[(i64, &str, u64)], ttl_ms: u64) {
    for &(t, id, cost) in checks {
        for u in 1..=cost {
            let member = if u == 1 { id.to_string() } else { format!("{id}:{u}") };
            server.command(&["ZADD", key, &t.to_string(), &member]).unwrap();
        }
    }
    server.command(&["PEXPIRE", key, &ttl_ms.to_string()]).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_of_the_previous_version_is_converted_and_counted_exactly() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let l = limiter(&server, vec![Rule::sliding_window_log("w", "ip:{ip}", 5, ms(60_000))], &clock);
    // The short form (one rule, cost 1): 3 units stored 30 s and 10 s ago, one already out of the window.
    let a = ip("1.1.1.1");
    let key = l.keys(&a)[0].clone();
    old_log(&server, &key, &[(T0 - 70_000_000, "gone", 1), (T0 - 30_000_000, "a", 2), (T0 - 10_000_000, "b", 1)], 50_000);
    let d = l.check(&a, 1).await.unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 1));
    assert_eq!(server.command(&["TYPE", &key]).unwrap(), "+list");
    let ttl: i64 = server.command(&["PTTL", &key]).unwrap().parse().unwrap();
    assert!(ttl > 55_000, "an admission sets the TTL again: {ttl}");
    assert_eq!(log_units(&server, &key), 4);
    assert!(l.check(&a, 1).await.unwrap().allowed);
    let d = l.check(&a, 1).await.unwrap();
    assert!(!d.allowed);
    // The oldest stored units (two, at T0 - 30 s) leave first.
    assert_eq!((d.remaining, d.retry_after, d.reset_after), (0, ms(30_000), ms(60_000)));

    // The general path (a peek, then a check of cost 2), on another old key.
    let b = ip("2.2.2.2");
    let key = l.keys(&b)[0].clone();
    old_log(&server, &key, &[(T0 - 20_000_000, "c", 3)], 40_000);
    let p = l.peek(&b, 2).await.unwrap();
    assert_eq!((p.allowed, p.remaining, p.reset_after), (true, 0, ms(60_000)));
    let ttl: i64 = server.command(&["PTTL", &key]).unwrap().parse().unwrap();
    assert!(ttl > 30_000 && ttl <= 40_000, "a peek keeps the old TTL: {ttl}");
    let d = l.check(&b, 3).await.unwrap();
    assert_eq!((d.allowed, d.remaining, d.retry_after), (false, 2, ms(40_000)));

    // A settle of a check made before the upgrade finds nothing (ids are not carried over).
    let c = ip("3.3.3.3");
    let key = l.keys(&c)[0].clone();
    old_log(&server, &key, &[(T0 - 1_000, "old", 2)], 60_000);
    assert_eq!(l.settle_call(&c, "old", 2, 0).await.unwrap(), 0);
    assert_eq!(log_units(&server, &key), 2);
    assert_eq!(l.peek(&c, 1).await.unwrap().remaining, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_of_the_previous_version_on_the_servers_clock() {
    // The short form (with its deadline prefix) hands the old key to the general path.
    let server = RedisServer::start();
    let l = Limiter::builder(Policy::new(vec![Rule::sliding_window_log("w", "ip:{ip}", 3, ms(60_000))]).unwrap())
        .url(server.url())
        .on_backend_error(FailureMode::Error)
        .timeout(ms(2000))
        .build()
        .unwrap();
    let a = ip("8.8.8.8");
    let key = l.keys(&a)[0].clone();
    let time = server.command(&["TIME"]).unwrap();
    let mut parts = time.lines().map(|p| p.parse::<i64>().unwrap());
    let now = parts.next().unwrap() * 1_000_000 + parts.next().unwrap();
    old_log(&server, &key, &[(now - 1_000_000, "x", 2)], 60_000);
    let d = l.check(&a, 1).await.unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 0));
    assert_eq!(server.command(&["TYPE", &key]).unwrap(), "+list");
    let d = l.check(&a, 1).await.unwrap();
    assert!(!d.allowed);
    assert!(d.retry_after > ms(55_000) && d.retry_after <= ms(59_000), "{:?}", d.retry_after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_kind_is_an_error_never_an_empty_log() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let l = limiter(&server, vec![Rule::sliding_window_log("w", "ip:{ip}", 5, ms(60_000))], &clock);
    let a = ip("4.4.4.4");
    let key = l.keys(&a)[0].clone();
    server.command(&["SET", &key, "not a log"]).unwrap();
    for cost in [1, 2] {
        let e = l.check(&a, cost).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
        assert!(e.to_string().contains("WRONGTYPE"), "{e}");
    }
    assert_eq!(server.command(&["GET", &key]).unwrap(), "not a log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_is_one_entry_whatever_its_cost() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let l = limiter(&server, vec![Rule::sliding_window_log("bulk", "t:{ip}", 1_000_000, ms(60_000))], &clock);
    let a = ip("5.5.5.5");
    let key = l.keys(&a)[0].clone();
    for cost in [1, 100, 10_000, 500_000] {
        assert!(l.check(&a, cost).await.unwrap().allowed);
        clock.advance(ms(1));
    }
    // The header and one entry per check.
    assert_eq!(server.command(&["LLEN", &key]).unwrap(), "5");
    assert_eq!(log_units(&server, &key), 510_101);
    let bytes: u64 = server.command(&["MEMORY", "USAGE", &key]).unwrap().parse().unwrap();
    assert!(bytes < 400, "{bytes} bytes for 4 checks");
    let d = l.check(&a, 500_000).await.unwrap();
    assert_eq!((d.allowed, d.remaining), (false, 489_899));
    // 10,101 units must leave: the first three checks' (the third made 2 ms after the first).
    assert_eq!(d.retry_after, ms(59_998));
}

/// The same rules on Redis (keys under `prefix`) and on the embedded
/// backend, both reading one manual clock: the differential tests below.
fn on_redis_and_in_memory(server: &RedisServer, rules: Vec<Rule>, prefix: &str) -> (Limiter, Limiter, ManualClock) {
    let clock = ManualClock::new(T0);
    let redis = Limiter::builder(Policy::new(rules.clone()).unwrap())
        .url(server.url())
        .prefix(prefix)
        .timeout(ms(2000))
        .on_backend_error(FailureMode::Error)
        .clock(Clock::Manual(clock.clone()))
        .build()
        .unwrap();
    let memory = Limiter::builder(Policy::new(rules).unwrap()).clock(Clock::Manual(clock.clone())).build().unwrap();
    (redis, memory, clock)
}

/// A tiny deterministic generator for the differential test below.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_on_redis_agrees_with_the_embedded_log_step_for_step() {
    // Checks (costs 1-4, some with call ids that come back), peeks and
    // settles, on a clock that also steps back (entries inserted in order).
    let server = RedisServer::start();
    for seed in 1..=6u64 {
        let stacked = seed % 2 == 0;
        let mut rules = vec![Rule::sliding_window_log("w", "ip:{ip}", 12, ms(1000))];
        if stacked {
            rules.push(Rule::sliding_window_log("v", "v:{ip}", 9, ms(700)));
        }
        let (redis, memory, clock) = on_redis_and_in_memory(&server, rules, &format!("diff{seed}:"));
        let mut rng = Lcg(seed);
        let mut now = T0;
        let mut made: Vec<(String, u64)> = Vec::new();
        let a = ip("6.6.6.6");
        for step in 0..600 {
            now += rng.next(300) as i64 * 1000 - 100_000;
            clock.set_us(now);
            let what = rng.next(10);
            if what < 7 {
                let cost = 1 + rng.next(4);
                let call_id = (rng.next(3) == 0).then(|| format!("c{}", rng.next(40)));
                let o = CheckOptions { cost, call_id: call_id.clone() };
                let (x, y) = (redis.check_with(&a, &o).await.unwrap(), memory.check_with(&a, &o).await.unwrap());
                let key = |d: &throttlegate::Decision| (d.allowed, d.remaining, d.retry_after, d.reset_after);
                assert_eq!(key(&x), key(&y), "seed {seed} step {step}: check {o:?}");
                if let (true, Some(id)) = (x.allowed, call_id) {
                    // A settle names the cost of the id's last check.
                    made.retain(|(i, _)| *i != id);
                    made.push((id, cost));
                }
            } else if what < 8 {
                let cost = 1 + rng.next(4);
                let (x, y) = (redis.peek(&a, cost).await.unwrap(), memory.peek(&a, cost).await.unwrap());
                assert_eq!((x.allowed, x.remaining, x.retry_after), (y.allowed, y.remaining, y.retry_after), "seed {seed} step {step}: peek");
            } else if !made.is_empty() {
                let (id, cost) = made[rng.next(made.len() as u64) as usize].clone();
                let actual = rng.next(7);
                let x = redis.settle_call(&a, &id, cost, actual).await.unwrap();
                let y = memory.settle_call(&a, &id, cost, actual).await.unwrap();
                assert_eq!(x, y, "seed {seed} step {step}: settle {id} {cost} -> {actual}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stacked_logs_in_their_short_form_agree_with_the_embedded_log_step_for_step() {
    // Checks of cost 1 with no call id on 2 or 3 stacked logs: the short form
    // (mode "n", lua/single_rule.lua), which hands denials, logs with a header
    // (after a check of cost 2), entries newer than the call (the clock steps
    // back) and long expiries to the general path. Every decision, per rule,
    // equals the embedded backend's.
    let server = RedisServer::start();
    for seed in 1..=4u64 {
        let mut rules = vec![
            Rule::sliding_window_log("w", "ip:{ip}", 12, ms(1000)),
            Rule::sliding_window_log("v", "v:{ip}", 9, ms(700)),
        ];
        if seed % 2 == 1 {
            rules.push(Rule::sliding_window_log("u", "u:{ip}", 30, ms(5000)));
        }
        let (redis, memory, clock) = on_redis_and_in_memory(&server, rules, &format!("short{seed}:"));
        let mut rng = Lcg(seed * 31);
        let mut now = T0;
        let a = ip("6.6.6.7");
        for step in 0..800 {
            // Mostly forward in small steps (full logs, denials), now and then a
            // long gap (everything expires) or a step back.
            now += match rng.next(20) {
                0 => 2_000_000,
                1 => -150_000,
                _ => rng.next(120) as i64 * 1000,
            };
            clock.set_us(now);
            let cost = if rng.next(25) == 0 { 2 } else { 1 };
            let (x, y) = (redis.check(&a, cost).await.unwrap(), memory.check(&a, cost).await.unwrap());
            let all = |d: &throttlegate::Decision| {
                d.results.iter().map(|r| (r.allowed, r.remaining, r.retry_after, r.reset_after)).collect::<Vec<_>>()
            };
            assert_eq!((x.allowed, all(&x)), (y.allowed, all(&y)), "seed {seed} step {step}: cost {cost}");
        }
    }
    // On the server's clock (mode "n" once the server's time is known): the
    // same figures as the general path's, and one entry per admission.
    let l = Limiter::builder(
        Policy::new(vec![
            Rule::sliding_window_log("a", "a:{ip}", 3, ms(60_000)),
            Rule::sliding_window_log("b", "b:{ip}", 5, ms(30_000)),
        ])
        .unwrap(),
    )
    .url(server.url())
    .on_backend_error(FailureMode::Error)
    .timeout(ms(2000))
    .build()
    .unwrap();
    let a = ip("7.7.7.8");
    for (left_a, left_b) in [(2u64, 4u64), (1, 3), (0, 2)] {
        let d = l.check(&a, 1).await.unwrap();
        assert!(d.allowed);
        let got: Vec<_> = d.results.iter().map(|r| (r.remaining, r.retry_after, r.reset_after)).collect();
        assert_eq!(got, [(left_a, Duration::ZERO, ms(60_000)), (left_b, Duration::ZERO, ms(30_000))]);
    }
    let d = l.check(&a, 1).await.unwrap();
    assert!(!d.allowed && d.retry_after > ms(50_000) && d.retry_after <= ms(60_000), "{d:?}");
    assert_eq!(d.results[1].remaining, 2, "a denial consumes nothing");
    let keys = l.keys(&a);
    assert_eq!((log_units(&server, &keys[0]), log_units(&server, &keys[1])), (3, 3));
}

/// What the script stores of a call id (lua/replay.lua): the first 48 bits
/// of its SHA-1 (read from Redis's own `redis.sha1hex`) as 8 characters of
/// the call ids' alphabet, 6 bits each.
fn call_tag(server: &RedisServer, id: &str) -> String {
    const DIGITS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let hex = server.command(&["EVAL", "return redis.sha1hex(ARGV[1])", "0", id]).unwrap();
    let bits = u64::from_str_radix(&hex[..12], 16).unwrap();
    (0..8).map(|k| DIGITS[((bits >> (42 - 6 * k)) & 63) as usize] as char).collect()
}
