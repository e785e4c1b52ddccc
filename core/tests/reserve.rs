//! Reserved rules (`reserve`) on a real redis-server: one limiter decides as
//! the direct path does, several limiters on one key never admit more than
//! the limit, unspent units come back, and what cannot honour a reservation
//! is refused.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use throttlegate::{Clock, ErrorKind, FailureMode, Limiter, ManualClock, Period, Policy, Reserve, Rule};
use throttlegate_testkit::RedisServer;

const T0: i64 = 1_700_000_000_000_000;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn build(server: &RedisServer, rules: Vec<Rule>, clock: Option<&ManualClock>) -> Limiter {
    let mut b = Limiter::builder(Policy::new(rules).unwrap().with_prefix("rsv:").unwrap())
        .url(server.url())
        .timeout(ms(2000))
        .on_backend_error(FailureMode::Error);
    if let Some(c) = clock {
        b = b.clock(Clock::Manual(c.clone()));
    }
    b.build().unwrap()
}

fn ip(v: &str) -> [(&'static str, String); 1] {
    [("ip", v.to_string())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_limiter_decides_as_the_direct_path_with_few_trips() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    // Windows of 2 s: the case crosses three of their ends.
    let direct = build(&server, vec![Rule::fixed_window("d", "ip:{ip}", 20, ms(2_000))], Some(&clock));
    let reserved = build(
        &server,
        vec![Rule::fixed_window("r", "ip:{ip}", 20, ms(2_000)).reserve(Reserve::new(10).for_duration(ms(60_000)))],
        Some(&clock),
    );
    let a = ip("1.1.1.1");
    for step in 0..70u64 {
        let cost = 1 + step % 3;
        let d1 = direct.check(&a, cost).await.unwrap();
        let d2 = reserved.check(&a, cost).await.unwrap();
        assert_eq!((d1.allowed, d1.remaining, d1.retry_after, d1.reset_after), (d2.allowed, d2.remaining, d2.retry_after, d2.reset_after), "step {step}");
        let p1 = direct.peek(&a, cost).await.unwrap();
        let p2 = reserved.peek(&a, cost).await.unwrap();
        assert_eq!((p1.allowed, p1.remaining), (p2.allowed, p2.remaining), "peek at step {step}");
        clock.advance(ms(100));
    }
    let s = reserved.reserve_stats();
    // Peeks always ask the backend; checks mostly did not.
    assert!(s.local > 20, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stacked_rules_stay_all_or_nothing() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let l = build(
        &server,
        vec![
            Rule::fixed_window("r", "ip:{ip}", 100, ms(60_000)).reserve(Reserve::new(20).for_duration(ms(60_000))),
            Rule::fixed_window("user", "u:{user}", 2, ms(60_000)),
        ],
        Some(&clock),
    );
    let a = [("ip", "1.1.1.1"), ("user", "x")];
    assert!(l.check(&a, 1).await.unwrap().allowed);
    assert!(l.check(&a, 1).await.unwrap().allowed);
    // The direct rule denies: the reserved rule spends nothing.
    let d = l.check(&a, 1).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.results[0].remaining, 98);
    let only = [("ip", "1.1.1.1")];
    let d = l.check(&only, 1).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.remaining, 97);
}

/// Several limiters (each its own connection, as processes are) hammer one
/// reserved key from many tasks: the admitted total is at most the limit.
async fn hammer(rule: Rule, limit: u64) {
    let server = RedisServer::start();
    let limiters: Vec<Limiter> = (0..4).map(|_| build(&server, vec![rule.clone()], None)).collect();
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for l in &limiters {
        for _ in 0..2 {
            let (l, admitted) = (l.clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..300 {
                    if l.check(&ip("hot"), 1).await.unwrap().allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total = admitted.load(Ordering::Relaxed);
    assert!(total <= limit, "admitted {total} of {limit}");
    // Closing gives unspent units back: the key then holds what was admitted.
    for l in &limiters {
        l.close();
    }
    let stored = server.command(&["GET", "rsv:hot:ip:hot"]).unwrap();
    if let Some(count) = stored.trim().split(':').nth(1) {
        let count: u64 = count.parse().unwrap();
        assert!(count >= total && count <= limit, "stored {count}, admitted {total}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_limiters_never_admit_more_than_a_fixed_window() {
    hammer(Rule::fixed_window("hot", "ip:{ip}", 1000, ms(3_600_000)).reserve(Reserve::new(50)), 1000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_limiters_never_admit_more_than_a_quota() {
    hammer(Rule::quota("hot", "ip:{ip}", 700, Period::Day).reserve(Reserve::new(100)), 700).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unspent_units_come_back_after_reserve_for() {
    let server = RedisServer::start();
    let rule = Rule::fixed_window("hot", "ip:{ip}", 100, ms(3_600_000)).reserve(Reserve::new(40).for_duration(ms(200)));
    let a = build(&server, vec![rule.clone()], None);
    let b = build(&server, vec![rule], None);
    assert!(a.check(&ip("k"), 1).await.unwrap().allowed);
    assert!(a.reserve_stats().reserved > 0);
    // b sees a's reservation as used...
    let before = b.peek(&ip("k"), 1).await.unwrap().remaining;
    assert!(before < 99, "{before}");
    // ...until a gives it back (a sweeps without being called).
    let mut back = before;
    for _ in 0..100 {
        tokio::time::sleep(ms(50)).await;
        back = b.peek(&ip("k"), 1).await.unwrap().remaining;
        if back == 98 {
            break;
        }
    }
    assert_eq!(back, 98, "a's unspent units came back");
    // Counted when a reads Redis's reply, which can come after b has seen the units back.
    for _ in 0..100 {
        if a.reserve_stats().returned > 0 {
            break;
        }
        tokio::time::sleep(ms(50)).await;
    }
    assert!(a.reserve_stats().returned > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_limiter_loses_its_units_and_never_doubles_them() {
    let server = RedisServer::start();
    let rule = Rule::fixed_window("hot", "ip:{ip}", 10, ms(3_600_000)).reserve(Reserve::new(10).for_duration(ms(3_600_000)));
    let a = build(&server, vec![rule.clone()], None);
    assert!(a.check(&ip("k"), 1).await.unwrap().allowed);
    // Its holder vanishes without giving back (as a killed process does).
    std::mem::forget(a);
    let b = build(&server, vec![rule], None);
    let mut admitted = 0;
    for _ in 0..20 {
        if b.check(&ip("k"), 1).await.unwrap().allowed {
            admitted += 1;
        }
    }
    assert!(admitted <= 9, "{admitted}");
}

#[test]
fn algorithms_that_cannot_honour_it_refuse_it_with_a_reason() {
    let cases = [
        (Rule::sliding_window_log("a", "k:{k}", 10, ms(1000)), "not supported by sliding_window_log"),
        (Rule::token_bucket("a", "k:{k}", 10, 1.0), "not supported by token_bucket"),
        (Rule::sliding_window("a", "k:{k}", 10, ms(1000)), "not supported by sliding_window"),
        (Rule::fixed_window("a", "k:{k}", 10, ms(1000)).shadow(true), "does not apply with shadow"),
        (Rule::fixed_window("a", "k:{k}", 10, ms(1000)).overrides(true), "does not apply with overrides"),
    ];
    for (rule, words) in cases {
        let e = Policy::new(vec![rule.reserve(Reserve::new(5))]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidPolicy);
        assert!(e.message().contains(words), "{e}");
    }
    let e = Policy::new(vec![Rule::fixed_window("a", "k:{k}", 10, ms(1000)).reserve(Reserve::new(11))]).unwrap_err();
    assert!(e.message().contains("reserve: must be between 1 and the rule's limit (10), not 11"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_id_on_a_reserved_rule_is_refused() {
    let server = RedisServer::start();
    let l = build(&server, vec![Rule::fixed_window("r", "ip:{ip}", 10, ms(1000)).reserve(Reserve::new(5))], None);
    let e = l
        .check_with(&ip("a"), &throttlegate::CheckOptions { cost: 1, call_id: Some("abc".into()) })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().starts_with("call_id: rule \"r\" reserves units in process"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_reserved_key_never_admits_more_and_cross_slot_checks_are_refused() {
    let cluster = throttlegate_testkit::RedisCluster::start(3);
    let rule = Rule::fixed_window("hot", "ip:{ip}", 300, ms(3_600_000)).reserve(Reserve::new(30));
    let make = |rules: Vec<Rule>| {
        Limiter::builder(Policy::new(rules).unwrap().with_prefix("rsvc:").unwrap())
            .url(cluster.url())
            .timeout(ms(5000))
            .on_backend_error(FailureMode::Error)
            .build()
            .unwrap()
    };
    let limiters = [make(vec![rule.clone()]), make(vec![rule.clone()])];
    let mut admitted = 0;
    for _ in 0..250 {
        for l in &limiters {
            if l.check(&ip("hot"), 1).await.unwrap().allowed {
                admitted += 1;
            }
        }
    }
    assert!(admitted <= 300, "{admitted}");
    assert!(admitted >= 300 - 30, "{admitted}");
    // A reserved rule stacked with a rule whose key is in another slot.
    let stacked = make(vec![rule, Rule::fixed_window("user", "u:{user}", 5, ms(60_000))]);
    let e = stacked.check(&[("ip", "hot"), ("user", "x")], 1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().starts_with("reserve: on Redis Cluster, the keys of a check with a reserved rule must share one slot"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_drops_reserve_checks_directly_and_the_held_units_come_back() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let reserved = Rule::fixed_window("hot", "ip:{ip}", 100, ms(3_600_000)).reserve(Reserve::new(20).for_duration(ms(1_000)));
    let l = build(&server, vec![reserved], Some(&clock));
    let d = l.check(&ip("k"), 1).await.unwrap();
    assert_eq!(d.remaining, 99);
    // The same rule without reserve: checked directly; the units held still count as used.
    l.reload(Policy::new(vec![Rule::fixed_window("hot", "ip:{ip}", 100, ms(3_600_000))]).unwrap().with_prefix("rsv:").unwrap())
        .unwrap();
    let d = l.check(&ip("k"), 1).await.unwrap();
    assert!(d.allowed);
    assert!(d.remaining < 98, "{}", d.remaining);
    // reserve_for later, the limiter gives them back by itself.
    clock.advance(ms(1_500));
    let mut remaining = 0;
    for _ in 0..100 {
        tokio::time::sleep(ms(50)).await;
        remaining = l.peek(&ip("k"), 1).await.unwrap().remaining;
        if remaining == 97 {
            break;
        }
    }
    assert_eq!(remaining, 97, "2 admitted, the rest given back");
}
