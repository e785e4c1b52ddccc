//! Reserved rules (`reserve`) on a real redis-server: one limiter decides as
//! the direct path does, several limiters on one key never admit more than
//! the limit, unspent units come back, and what cannot honour a reservation
//! is refused.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use throttlegate::{Algorithm, Clock, ErrorKind, FailureMode, Limiter, ManualClock, Period, Policy, Reserve, Rule};
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
        assert_eq!(
            (d1.allowed, d1.remaining, d1.retry_after, d1.reset_after),
            (d2.allowed, d2.remaining, d2.retry_after, d2.reset_after),
            "step {step}"
        );
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
async fn many_limiters_never_admit_more_than_a_log() {
    let total =
        hammer_count(Rule::sliding_window_log("hot", "ip:{ip}", 500, ms(3_600_000)).reserve(Reserve::new(50))).await.0;
    assert!(total <= 500, "admitted {total} of 500");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_limiters_never_admit_more_than_counters() {
    let rule = counters(500, 3_600_000, 60_000).reserve(Reserve::new(50));
    let total = hammer_count(rule).await.0;
    assert!(total <= 500, "admitted {total} of 500");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_limiters_never_admit_more_than_a_bucket() {
    // Any interval admits at most capacity + rate * its length.
    let (total, elapsed) =
        hammer_count(Rule::token_bucket("hot", "ip:{ip}", 300, 50.0).reserve(Reserve::new(40))).await;
    let bound = 300.0 + 50.0 * elapsed.as_secs_f64();
    assert!((total as f64) <= bound, "admitted {total}, bound {bound}");
}

/// Four limiters, two tasks each, 300 checks per task on one key: the
/// units admitted and the time it took (first check to last answer).
async fn hammer_count(rule: Rule) -> (u64, Duration) {
    let server = RedisServer::start();
    let limiters: Vec<Limiter> = (0..4).map(|_| build(&server, vec![rule.clone()], None)).collect();
    let admitted = Arc::new(AtomicU64::new(0));
    let started = std::time::Instant::now();
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
    let elapsed = started.elapsed();
    for l in &limiters {
        l.close();
    }
    (admitted.load(Ordering::Relaxed), elapsed)
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
    let rule =
        Rule::fixed_window("hot", "ip:{ip}", 10, ms(3_600_000)).reserve(Reserve::new(10).for_duration(ms(3_600_000)));
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
fn what_cannot_honour_it_refuses_it_with_a_reason() {
    let cases = [
        (Rule::concurrency("a", "k:{k}", 10, ms(1000)), "not supported by concurrency"),
        (Rule::fixed_window("a", "k:{k}", 10, ms(1000)).shadow(true), "does not apply with shadow"),
        (Rule::sliding_window_log("a", "k:{k}", 10, ms(1000)).shadow(true), "does not apply with shadow"),
        (Rule::fixed_window("a", "k:{k}", 10, ms(1000)).overrides(true), "does not apply with overrides"),
        (Rule::token_bucket("a", "k:{k}", 10, 1.0).overrides(true), "does not apply with overrides"),
    ];
    for (rule, words) in cases {
        let e = Policy::new(vec![rule.reserve(Reserve::new(5))]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidPolicy);
        assert!(e.message().contains(words), "{e}");
    }
    let e = Policy::new(vec![Rule::fixed_window("a", "k:{k}", 10, ms(1000)).reserve(Reserve::new(11))]).unwrap_err();
    assert!(e.message().contains("reserve: must be between 1 and the rule's limit (10), not 11"), "{e}");
    let e = Policy::new(vec![Rule::token_bucket("a", "k:{k}", 10, 1.0).reserve(Reserve::new(11))]).unwrap_err();
    assert!(e.message().contains("reserve: must be between 1 and the rule's limit (10), not 11"), "{e}");
    // Every algorithm that counts units takes it.
    for rule in [
        Rule::sliding_window_log("a", "k:{k}", 10, ms(1000)),
        Rule::token_bucket("a", "k:{k}", 10, 1.0),
        Rule::sliding_window("a", "k:{k}", 10, ms(1000)),
    ] {
        Policy::new(vec![rule.reserve(Reserve::new(5))]).unwrap();
    }
}

fn counters(limit: u64, window: u64, precision: u64) -> Rule {
    Rule::new("hot", "ip:{ip}", Algorithm::SlidingWindow { limit, window: ms(window), precision: ms(precision) })
}

/// One limiter with `reserve` against the same rule checked directly, on a
/// manual clock: the same decisions step after step (remaining exactly, or
/// never more than the direct path's for a log, whose reservation answers
/// with the count of its last trip while older entries leave).
async fn same_as_direct(rule: Rule, reserve: Reserve, steps: u64, advance: u64, exact: bool) {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let direct = build(&server, vec![Rule { name: "d".into(), ..rule.clone() }], Some(&clock));
    let reserved = build(&server, vec![Rule { name: "r".into(), ..rule }.reserve(reserve)], Some(&clock));
    let a = ip("1.1.1.1");
    for step in 0..steps {
        let cost = 1 + step % 3;
        let d1 = direct.check(&a, cost).await.unwrap();
        let d2 = reserved.check(&a, cost).await.unwrap();
        if exact {
            assert_eq!(
                (d1.allowed, d1.remaining, d1.retry_after, d1.reset_after),
                (d2.allowed, d2.remaining, d2.retry_after, d2.reset_after),
                "step {step}"
            );
        } else {
            assert_eq!((d1.allowed, d1.retry_after), (d2.allowed, d2.retry_after), "step {step}");
            assert!(d2.remaining <= d1.remaining, "step {step}: {} > {}", d2.remaining, d1.remaining);
        }
        let p1 = direct.peek(&a, cost).await.unwrap();
        let p2 = reserved.peek(&a, cost).await.unwrap();
        assert_eq!((p1.allowed, p1.remaining), (p2.allowed, p2.remaining), "peek at step {step}");
        clock.advance(ms(advance * (1 + step % 4)));
    }
    let s = reserved.reserve_stats();
    // Some checks were answered from reservations, some gave leftovers back.
    assert!(s.local >= 5 && s.returned > 0, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_limiter_on_counters_decides_as_the_direct_path() {
    same_as_direct(counters(30, 2_000, 200), Reserve::new(10).for_duration(ms(60_000)), 120, 25, true).await;
    // A window that is not a whole number of sub-windows: a reservation ends
    // when the oldest sub-window leaves the count, if that comes first.
    same_as_direct(counters(30, 2_000, 300), Reserve::new(10).for_duration(ms(60_000)), 120, 25, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_limiter_on_a_log_decides_as_the_direct_path() {
    let rule = Rule::sliding_window_log("hot", "ip:{ip}", 30, ms(2_000));
    same_as_direct(rule.clone(), Reserve::new(10).for_duration(ms(300)), 120, 25, false).await;
    // Reservations that outlive the window.
    same_as_direct(rule, Reserve::new(10).for_duration(ms(5_000)), 120, 25, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_limiter_on_a_bucket_decides_as_the_direct_path() {
    let rule = Rule::token_bucket("hot", "ip:{ip}", 30, 20.0);
    same_as_direct(rule, Reserve::new(10).for_duration(ms(60_000)), 120, 25, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_id_on_a_reserved_rule_is_refused() {
    let server = RedisServer::start();
    let l = build(&server, vec![Rule::fixed_window("r", "ip:{ip}", 10, ms(1000)).reserve(Reserve::new(5))], None);
    let e =
        l.check_with(&ip("a"), &throttlegate::CheckOptions { cost: 1, call_id: Some("abc".into()) }).await.unwrap_err();
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
    assert!(
        e.message()
            .starts_with("reserve: on Redis Cluster, the keys of a check with a reserved rule must share one slot"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_drops_reserve_checks_directly_and_the_held_units_come_back() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let reserved =
        Rule::fixed_window("hot", "ip:{ip}", 100, ms(3_600_000)).reserve(Reserve::new(20).for_duration(ms(1_000)));
    let l = build(&server, vec![reserved], Some(&clock));
    let d = l.check(&ip("k"), 1).await.unwrap();
    assert_eq!(d.remaining, 99);
    // The same rule without reserve: checked directly; the units held still count as used.
    l.reload(
        Policy::new(vec![Rule::fixed_window("hot", "ip:{ip}", 100, ms(3_600_000))])
            .unwrap()
            .with_prefix("rsv:")
            .unwrap(),
    )
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

/// The rule the processes of [`processes_on_one_key`] share.
fn shared_rule(algorithm: &str) -> Rule {
    let rule = match algorithm {
        "fixed_window" => Rule::fixed_window("hot", "ip:{ip}", 600, ms(3_600_000)),
        "quota" => Rule::quota("hot", "ip:{ip}", 600, Period::Month),
        "sliding_window_log" => Rule::sliding_window_log("hot", "ip:{ip}", 600, ms(3_600_000)),
        "sliding_window" => Rule::sliding_window("hot", "ip:{ip}", 600, ms(3_600_000)),
        "token_bucket" => Rule::token_bucket("hot", "ip:{ip}", 300, 100.0),
        other => panic!("unknown algorithm {other}"),
    };
    rule.reserve(Reserve::new(50).for_duration(ms(60_000)))
}

/// A process of [`processes_on_one_key`] (this test binary run again): checks
/// the shared key `RSV_CHECKS` times, prints what it admitted, and with
/// `RSV_HOLD` then waits, holding its reservation, to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of processes_on_one_key"]
async fn child_process() {
    let Ok(url) = std::env::var("RSV_URL") else { return };
    let rule = shared_rule(&std::env::var("RSV_ALGORITHM").unwrap());
    let checks: u64 = std::env::var("RSV_CHECKS").unwrap().parse().unwrap();
    let l = Limiter::builder(Policy::new(vec![rule]).unwrap().with_prefix("rsvp:").unwrap())
        .url(url)
        .timeout(ms(5000))
        .on_backend_error(FailureMode::Error)
        .build()
        .unwrap();
    let mut admitted = 0;
    for _ in 0..checks {
        if l.check(&ip("hot"), 1).await.unwrap().allowed {
            admitted += 1;
        }
    }
    println!("admitted {admitted}");
    if std::env::var("RSV_HOLD").is_ok() {
        println!("holding {}", l.reserve_stats().reserved);
        use std::io::Write;
        std::io::stdout().flush().unwrap();
        tokio::time::sleep(ms(120_000)).await;
    }
    l.close();
}

/// Processes on one reserved key: one takes a reservation and is killed
/// (SIGKILL) while holding it, then four more hammer the key. The units
/// admitted by all of them are within the algorithm's bound; returns them
/// and the time it took.
fn processes_on_one_key(algorithm: &str) -> (u64, Duration) {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let server = RedisServer::start();
    let child = |checks: u64, hold: bool| {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args(["child_process", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env("RSV_URL", server.url())
            .env("RSV_ALGORITHM", algorithm)
            .env("RSV_CHECKS", checks.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if hold {
            c.env("RSV_HOLD", "1");
        }
        c.spawn().unwrap()
    };
    // The test harness may print "test child_process ... " on the same line.
    let after =
        |line: &str, word: &str| line.find(word).map(|at| line[at + word.len()..].trim().parse::<u64>().unwrap());
    let admitted_of = |line: &str| after(line, "admitted ");
    let started = std::time::Instant::now();
    let mut holder = child(3, true);
    let mut total = 0;
    let mut held = 0;
    for line in std::io::BufReader::new(holder.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        total += admitted_of(&line).unwrap_or(0);
        if let Some(n) = after(&line, "holding ") {
            held = n;
            break;
        }
    }
    assert!(held > 0, "the first process holds a reservation");
    holder.kill().unwrap();
    holder.wait().unwrap();
    let children: Vec<_> = (0..4).map(|_| child(400, false)).collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success());
        total += String::from_utf8_lossy(&out.stdout).lines().filter_map(admitted_of).sum::<u64>();
    }
    (total, started.elapsed())
}

#[test]
fn processes_on_one_key_never_admit_more_than_the_limit_even_when_a_holder_is_killed() {
    for algorithm in ["fixed_window", "quota", "sliding_window_log", "sliding_window"] {
        let (total, _) = processes_on_one_key(algorithm);
        eprintln!("{algorithm}: {total}");
        assert!(total <= 600, "{algorithm}: admitted {total} of 600");
        // The killed process's units are lost (at most its reservation), never doubled.
        assert!(total >= 600 - 50 - 4 * 50, "{algorithm}: admitted {total}");
    }
    let (total, elapsed) = processes_on_one_key("token_bucket");
    eprintln!("token_bucket: {total} in {elapsed:?}");
    let bound = 300.0 + 100.0 * elapsed.as_secs_f64();
    assert!((total as f64) <= bound, "token_bucket: admitted {total}, bound {bound}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_trips_local_answers_and_units_per_reserved_rule() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let l = build(
        &server,
        vec![
            Rule::token_bucket("hot", "ip:{ip}", 100, 10.0).reserve(Reserve::new(20).for_duration(ms(60_000))),
            Rule::fixed_window("plain", "p:{ip}", 100, ms(60_000)),
        ],
        Some(&clock),
    );
    for _ in 0..10 {
        assert!(l.check(&ip("hot"), 1).await.unwrap().allowed);
    }
    l.close();
    let m = l.metrics().unwrap();
    assert_eq!(m.reserves.len(), 1, "only the reserved rule: {:?}", m.reserves);
    let r = &m.reserves[0];
    assert_eq!(r.rule.as_str(), "hot");
    // The first check takes the bucket's reservation; the next ones pay from it and go to
    // the backend for the plain rule only.
    assert_eq!((r.trips, r.local, r.reserved), (1, 9, 20), "{r:?}");
    assert_eq!(r.returned + r.dropped, 11, "{r:?}");
    let s = l.reserve_stats();
    assert_eq!((s.reserved, s.returned + s.dropped), (20, 11), "{s:?}");
    let text = m.to_text();
    for line in [
        "throttlegate_reserve_trips_total{rule=\"hot\"} 1",
        "throttlegate_reserve_local_total{rule=\"hot\"} 9",
        "throttlegate_reserve_reserved_units_total{rule=\"hot\"} 20",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    assert!(!text.contains("throttlegate_reserve_trips_total{rule=\"plain\"}"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_lists_about_one_reservation_per_limiter() {
    // A bucket that never fills again (refilled at 1 per second): each
    // reservation is spendable for all of `reserve_for`. A limiter gives its
    // spent reservation back (0 units) in the trip that takes the next one,
    // so the bucket's list does not grow with every trip (each trip reads
    // and rewrites it).
    let server = RedisServer::start();
    let rule = Rule::token_bucket("hot", "ip:{ip}", 1_000_000, 1.0).reserve(Reserve::new(10).for_duration(ms(3_600_000)));
    let limiters: Vec<Limiter> = (0..2).map(|_| build(&server, vec![rule.clone()], None)).collect();
    for i in 0..400 {
        assert!(limiters[i % 2].check(&ip("k"), 1).await.unwrap().allowed);
    }
    for l in &limiters {
        let s = l.reserve_stats();
        assert!(s.trips >= 15 && s.local >= 150, "{s:?}");
    }
    let stored = server.command(&["GET", "rsv:hot:ip:k"]).unwrap();
    let listed = stored.split_once(';').map_or(0, |(_, list)| list.split(',').count());
    assert!((1..=2).contains(&listed), "{listed} reservations listed: {stored}");
    // The tokens: every unit admitted or held is off them (200 units each, 10 at most held).
    let tokens: i64 = stored.lines().last().unwrap().split(':').next().unwrap().parse().unwrap();
    assert!(tokens <= (1_000_000 - 400) * 1_000_000, "{stored}");
    assert!(tokens >= (1_000_000 - 420) * 1_000_000, "{stored}");
}
