//! Per-rule metrics against a real Redis: decisions by rule and outcome,
//! backend call latency, failures by rule, and metrics turned off.

use std::time::Duration;

use throttlegate::{CheckOptions, FailureMode, Limiter, Policy, Rule};
use throttlegate_testkit::RedisServer;

fn policy() -> Policy {
    Policy::new(vec![
        Rule::sliding_window_log("per-ip", "ip:{ip}", 2, Duration::from_secs(60)),
        Rule::token_bucket("shadow-bucket", "b:{ip}", 1, 0.001).shadow(true),
    ])
    .unwrap()
}

#[test]
fn redis_checks_are_counted_per_rule_and_timed() {
    let server = RedisServer::start();
    let l = Limiter::builder(policy()).url(server.url()).build().unwrap();
    for _ in 0..3 {
        l.check_blocking(&[("ip", "1.1.1.1")], &CheckOptions::default()).unwrap();
    }
    let m = l.metrics().unwrap();
    let (ip, bucket) = (&m.rules[0], &m.rules[1]);
    assert_eq!((ip.checks, ip.allowed, ip.denied), (3, 2, 1));
    assert_eq!((bucket.checks, bucket.allowed, bucket.shadow_denied), (3, 1, 2));
    assert_eq!(m.backend_latency.count, 3);
    assert_eq!(m.backend_latency.buckets.last().unwrap().1, 3, "every call under 2.5 s");
    assert!(m.backend_latency.sum_seconds > 0.0);
    let text = l.metrics_text().unwrap();
    assert!(text.contains("throttlegate_decisions_total{rule=\"per-ip\",outcome=\"denied\"} 1\n"), "{text}");
    assert!(text.contains("throttlegate_backend_call_seconds_count 3\n"), "{text}");
    assert!(!text.contains("1.1.1.1"), "no attribute value in a label");
}

#[test]
fn failures_are_counted_for_every_rule_of_the_call() {
    // A port nothing listens on: every call fails at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("redis://127.0.0.1:{port}");
    let deny = Limiter::builder(policy()).url(&url).timeout(Duration::from_millis(300)).on_backend_error(FailureMode::Deny);
    let deny = deny.build().unwrap();
    assert!(!deny.check_blocking(&[("ip", "2.2.2.2")], &CheckOptions::default()).unwrap().allowed);
    let m = deny.metrics().unwrap();
    assert_eq!((m.rules[0].checks, m.rules[0].degraded_denied, m.rules[0].backend_errors), (1, 1, 0));
    let error = Limiter::builder(policy()).url(&url).timeout(Duration::from_millis(300)).on_backend_error(FailureMode::Error);
    let error = error.build().unwrap();
    assert!(error.check_blocking(&[("ip", "2.2.2.2")], &CheckOptions::default()).is_err());
    let m = error.metrics().unwrap();
    for r in &m.rules {
        assert_eq!((r.checks, r.backend_errors, r.allowed + r.denied), (1, 1, 0), "{r:?}");
    }
}

#[test]
fn metrics_can_be_turned_off() {
    let l = Limiter::builder(policy()).metrics(false).build().unwrap();
    l.check_blocking(&[("ip", "3.3.3.3")], &CheckOptions::default()).unwrap();
    assert!(l.metrics().is_none());
    assert!(l.metrics_text().is_none());
    assert_eq!(l.stats().calls, 1, "the totals still count");
}

/// Settles are counted in the totals (`stats()`) and per rule: the checks
/// settled, the units given back and the units taken beyond the checks'
/// costs (the actual cost capped at each rule's limit); a second settle of
/// the same call id changes nothing and counts nothing.
fn settles_are_counted(l: &Limiter) {
    let policy = Policy::new(vec![
        Rule::sliding_window_log("log", "ip:{ip}", 10, Duration::from_secs(60)),
        Rule::token_bucket("bucket", "b:{ip}", 5, 0.001),
    ])
    .unwrap();
    l.reload(policy).unwrap();
    let a = [("ip", "192.0.2.9")];
    let with_id = |id: &str, cost| CheckOptions { cost, call_id: Some(id.into()) };
    let d = l.check_blocking(&a, &with_id("one", 4)).unwrap();
    assert!(d.allowed);
    assert_eq!(l.settle_blocking(&d, 1).unwrap(), 2);
    assert_eq!(l.settle_blocking(&d, 0).unwrap(), 0, "settled once");
    assert!(l.check_blocking(&a, &with_id("two", 2)).unwrap().allowed);
    assert_eq!(l.settle_call_blocking(&a, "two", 2, 7).unwrap(), 2);
    let s = l.stats();
    assert_eq!((s.settled, s.refunded, s.debited), (2, 3 + 3, 5 + 3));
    let m = l.metrics().unwrap();
    let per_rule: Vec<_> = m.rules.iter().map(|r| (r.rule.as_str(), r.settles, r.settle_refunded, r.settle_debited)).collect();
    assert_eq!(per_rule, [("log", 2, 3, 5), ("bucket", 2, 3, 3)]);
    let text = m.to_text();
    for line in [
        "throttlegate_settles_total{rule=\"log\"} 2",
        "throttlegate_settle_refunded_total{rule=\"bucket\"} 3",
        "throttlegate_settle_debited_total{rule=\"log\"} 5",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
    }
}

#[test]
fn settles_are_counted_on_the_embedded_backend() {
    settles_are_counted(&Limiter::in_memory(policy()));
}

#[test]
fn settles_are_counted_on_redis() {
    let server = RedisServer::start();
    settles_are_counted(&Limiter::builder(policy()).url(server.url()).build().unwrap());
}
