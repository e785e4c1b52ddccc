//! `Limiter::reload` and `reload_on_change`, on the embedded backend and a
//! real Redis: state kept by rule identity, bad policies refused with the
//! old one in force, checks in flight finishing on the old policy, reloads
//! under concurrent checks, metrics and remembered denials across a reload.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use throttlegate::{CheckOptions, Clock, ErrorKind, Limiter, ManualClock, Policy, RuleChangeKind};
use throttlegate_testkit::RedisServer;

const T0: i64 = 1_700_000_000_000_000;

fn policy(text: &str) -> Policy {
    Policy::from_toml_str(text).unwrap()
}

fn rules(ip_limit: u64, user_key: &str) -> Policy {
    policy(&format!(
        "[[rules]]\nname = \"ip\"\nkey = \"ip:{{ip}}\"\nlimit = {ip_limit}\nwindow = \"1m\"\n\n\
         [[rules]]\nname = \"user\"\nkey = \"{user_key}\"\nalgorithm = \"token_bucket\"\ncapacity = 2\nrefill_rate = 0.001\n"
    ))
}

fn limiters(server: &RedisServer, p: &Policy) -> Vec<Limiter> {
    let clock = || Clock::Manual(ManualClock::new(T0));
    vec![
        Limiter::builder(p.clone()).clock(clock()).build().unwrap(),
        Limiter::builder(p.clone()).url(server.url()).clock(clock()).timeout(Duration::from_secs(2)).build().unwrap(),
    ]
}

const REQ: [(&str, &str); 2] = [("ip", "1.1.1.1"), ("user", "u1")];

fn check(l: &Limiter) -> throttlegate::Decision {
    l.check_blocking(&REQ, &CheckOptions::default()).unwrap()
}

#[test]
fn kept_rules_keep_their_state_and_replaced_ones_start_afresh() {
    let server = RedisServer::start();
    for l in limiters(&server, &rules(3, "u:{user}")) {
        let b = l.backend_name();
        assert!(check(&l).allowed && check(&l).allowed);
        let d = check(&l);
        assert_eq!((d.allowed, d.rule.as_deref()), (false, Some("user")), "{b}: the bucket of 2 is empty");
        // A higher limit for "ip", a new key for "user": "ip" keeps its 2
        // admissions, "user" starts with a full bucket.
        let diff = l.reload(rules(4, "user:{user}")).unwrap();
        let kinds: Vec<_> = diff.rules.iter().map(|r| (r.name.as_str(), r.kind)).collect();
        assert_eq!(kinds, [("ip", RuleChangeKind::Changed), ("user", RuleChangeKind::Replaced)], "{b}");
        let d = check(&l);
        assert!(d.allowed, "{b}");
        assert_eq!(d.results[0].remaining, 1, "{b}: 3 of 4 used, the old state counted");
        assert_eq!(d.results[1].remaining, 1, "{b}: a fresh bucket");
        assert_eq!(l.policy().rules()[0].algorithm.limit(), 4);
        let d = check(&l);
        assert_eq!((d.allowed, d.results[0].remaining), (true, 0), "{b}: 4 of 4");
        assert!(!check(&l).results[0].allowed, "{b}");
        // Metrics: the kept rule's counters go on, across the reload.
        let m = l.metrics().unwrap();
        assert_eq!((m.rules[0].checks, m.rules[0].allowed, m.rules[0].denied), (6, 5, 1), "{b}: the rule's own verdicts");
        assert_eq!(m.reloads, 1);
        // A removed rule is no longer exposed.
        l.reload(policy("[[rules]]\nname = \"ip\"\nkey = \"ip:{ip}\"\nlimit = 4\nwindow = \"1m\"\n")).unwrap();
        let m = l.metrics().unwrap();
        assert_eq!(m.rules.len(), 1);
        assert_eq!(m.rules[0].checks, 6, "{b}");
        assert!(!l.metrics_text().unwrap().contains("rule=\"user\""));
        assert!(l.metrics_text().unwrap().contains("throttlegate_policy_reloads_total 2\n"));
    }
}

#[test]
fn a_policy_that_cannot_replace_the_current_one_is_refused_and_the_old_stays() {
    let server = RedisServer::start();
    for l in limiters(&server, &rules(3, "u:{user}")) {
        let b = l.backend_name();
        check(&l);
        let swapped = policy("[[rules]]\nname = \"ip\"\nkey = \"ip:{ip}\"\nalgorithm = \"token_bucket\"\ncapacity = 9\nrefill_rate = 1\n");
        let e = l.reload(swapped).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidPolicy, "{b}");
        assert_eq!(
            e.message(),
            "rules[0] (\"ip\"): algorithm: changed from sliding_window_log to token_bucket with the same name and key; \
             its keys hold state the new algorithm cannot read, so give the rule a new name (or a new key)"
        );
        let dir = std::env::temp_dir().join(format!("tg-reload-{}-{b}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("rules.toml");
        std::fs::write(&bad, "[[rules]]\nname = \"ip\"\nkey = \"ip:{ip}\"\nlimit = 0\nwindow = \"1m\"\n").unwrap();
        let e = l.reload_file(&bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidPolicy);
        assert!(e.message().ends_with("rules.toml: rules[0] (\"ip\"): limit: must be between 1 and 1000000000, not 0"), "{e}");
        let status = l.reload_status();
        assert_eq!((status.reloads, status.errors), (0, 2), "{b}");
        assert_eq!(status.last_error.unwrap().message(), e.message());
        assert_eq!(l.policy().rules(), rules(3, "u:{user}").rules(), "{b}: the old policy is in force");
        assert_eq!(check(&l).results[0].remaining, 1, "{b}: and its state");
        assert_eq!(l.metrics().unwrap().reload_errors, 2);
        l.close();
        assert_eq!(l.reload(rules(3, "u:{user}")).unwrap_err().kind(), ErrorKind::Closed);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_in_flight_finishes_on_the_policy_it_started_with() {
    let server = RedisServer::start();
    let l = Limiter::builder(rules(3, "u:{user}")).url(server.url()).timeout(Duration::from_secs(2)).build().unwrap();
    // The connection is made first (a check of another key); then Redis is
    // stopped, so the check starts (its first poll loads the policy and sends
    // the call, which cannot be answered) before the reload, and ends after it.
    l.check(&[("user", "warm-up")], 1).await.unwrap();
    server.pause(true);
    let mut in_flight = std::pin::pin!(l.check(&REQ, 1));
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(in_flight.as_mut().poll(cx))).await;
    let pending = first.is_pending();
    l.reload(rules(7, "u:{user}")).unwrap();
    server.pause(false);
    assert!(pending, "the check answered before Redis could: {first:?}");
    let d = in_flight.await.unwrap();
    assert_eq!(d.results[0].limit, 3);
    let d = l.check(&REQ, 1).await.unwrap();
    assert_eq!((d.results[0].limit, d.results[0].remaining), (7, 5), "the state the old policy's check wrote is kept");
}

#[test]
fn reloads_under_concurrent_checks_lose_nothing() {
    let server = RedisServer::start();
    for l in limiters(&server, &rules(1000, "u:{user}")) {
        let b = l.backend_name();
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..2)
            .map(|t| {
                let (l, stop) = (l.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) || n < 50 {
                        let ip = format!("10.0.{t}.{}", n % 200);
                        let d = l.check_blocking(&[("ip", ip.as_str())], &CheckOptions::default()).unwrap();
                        assert!(d.allowed);
                        assert!(d.results[0].limit == 1000 || d.results[0].limit == 2000, "{:?}", d.results[0]);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        for i in 0..20 {
            l.reload(rules(if i % 2 == 0 { 2000 } else { 1000 }, "u:{user}")).unwrap();
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
        let total: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        let m = l.metrics().unwrap();
        assert_eq!(m.rules[0].checks, total, "{b}: every check counted once, whichever policy it ran on");
        assert_eq!(l.stats().calls, total, "{b}");
        assert_eq!(l.reload_status().reloads, 20);
    }
}

#[test]
fn remembered_denials_of_a_changed_rule_are_forgotten() {
    let server = RedisServer::start();
    let one = policy("[[rules]]\nname = \"ip\"\nkey = \"ip:{ip}\"\nlimit = 1\nwindow = \"1m\"\n\n[[rules]]\nname = \"same\"\nkey = \"s:{user}\"\nlimit = 1\nwindow = \"1m\"\n");
    let l = Limiter::builder(one).url(server.url()).deny_cache(true).timeout(Duration::from_secs(2)).build().unwrap();
    let ip_only = [("ip", "9.9.9.9")];
    let user_only = [("user", "u9")];
    let o = CheckOptions::default();
    assert!(l.check_blocking(&ip_only, &o).unwrap().allowed);
    assert!(!l.check_blocking(&ip_only, &o).unwrap().allowed);
    assert!(l.check_blocking(&user_only, &o).unwrap().allowed);
    assert!(!l.check_blocking(&user_only, &o).unwrap().allowed);
    let evals = server.command_calls("evalsha");
    // Still remembered: no round trip.
    assert!(!l.check_blocking(&user_only, &o).unwrap().allowed);
    assert_eq!(server.command_calls("evalsha"), evals);
    l.reload(policy("[[rules]]\nname = \"ip\"\nkey = \"ip:{ip}\"\nlimit = 2\nwindow = \"1m\"\n\n[[rules]]\nname = \"same\"\nkey = \"s:{user}\"\nlimit = 1\nwindow = \"1m\"\n")).unwrap();
    // The unchanged rule's denial is still remembered...
    let d = l.check_blocking(&user_only, &o).unwrap();
    assert_eq!((d.allowed, d.results[0].index), (false, 1));
    assert_eq!(server.command_calls("evalsha"), evals);
    // ...the changed rule's is not: Redis admits under the new limit.
    assert!(l.check_blocking(&ip_only, &o).unwrap().allowed);
}

fn wait_for(l: &Limiter, what: impl Fn(&throttlegate::ReloadStatus) -> bool) -> throttlegate::ReloadStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = l.reload_status();
        if what(&s) || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn reload_on_change_follows_the_file_and_keeps_the_policy_when_it_breaks() {
    let dir = std::env::temp_dir().join(format!("tg-watch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rules.toml");
    let write = |text: &str| {
        let tmp = dir.join("rules.toml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    };
    write("[[rules]]\nname = \"ip\"\nkey = \"ip:{ip}\"\nlimit = 3\nwindow = \"1m\"\n");
    let l = Limiter::builder(Policy::from_file(&path).unwrap()).reload_on_change(true).build().unwrap();
    assert_eq!(l.reload_status().watching.as_deref(), Some(path.as_path()));
    check(&l);
    write("[[rules]]\nname = \"ip\"\nkey = \"ip:{ip}\"\nlimit = 5\nwindow = \"1m\"\n");
    let s = wait_for(&l, |s| s.reloads == 1);
    assert_eq!(s.reloads, 1);
    assert_eq!(check(&l).results[0].remaining, 3, "5 - 2: the state was kept");
    write("[[rules]]\nname = \"ip\"\nkey = \"ip:{ip}\"\nlimit = \"five\"\nwindow = \"1m\"\n");
    let s = wait_for(&l, |s| s.errors == 1);
    assert_eq!((s.reloads, s.errors), (1, 1));
    assert!(s.last_error.unwrap().message().ends_with("rules[0] (\"ip\"): limit: expected a positive integer, got a string"));
    assert_eq!(l.policy().rules()[0].algorithm.limit(), 5, "the policy in force stayed");
    l.close();
    // Not from a file: refused.
    let e = Limiter::builder(rules(1, "u:{user}")).reload_on_change(true).build().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert_eq!(e.message(), "reload_on_change: the policy was not read from a file; read it with a policy-from-file call");
    std::fs::remove_dir_all(&dir).unwrap();
}
