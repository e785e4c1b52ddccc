//! A settle whose call id newer checks pushed out of its key's last 64
//! recorded ids: an error naming the call id and the rules, and nothing
//! changed (never a silent double count, nor a silent loss of the real
//! cost), on the embedded backend, one Redis and a Redis Cluster, each on a
//! manual clock.

use std::time::Duration;

use throttlegate::{CheckOptions, Clock, ErrorKind, FailureMode, Limiter, ManualClock, Policy, Rule};
use throttlegate_testkit::{RedisCluster, RedisServer};

const HOUR: Duration = Duration::from_secs(3600);

fn limiter(url: Option<&str>, prefix: &str) -> Limiter {
    let policy = Policy::new(vec![
        Rule::sliding_window_log("log", "l:{tenant}", 1_000, HOUR),
        Rule::token_bucket("bucket", "b:{tenant}", 1_000, 0.001),
        Rule::sliding_window("counters", "c:{tenant}", 1_000, HOUR),
        Rule::fixed_window("window", "f:{tenant}", 1_000, HOUR),
    ])
    .unwrap();
    let mut b = Limiter::builder(policy)
        .clock(Clock::Manual(ManualClock::new(1_767_225_600_000_000)))
        .prefix(prefix)
        .timeout(Duration::from_secs(10))
        .on_backend_error(FailureMode::Error);
    if let Some(u) = url {
        b = b.url(u);
    }
    b.build().unwrap()
}

async fn check(l: &Limiter, id: &str, cost: u64) {
    let d = l.check_with(&[("tenant", "t")], &CheckOptions { cost, call_id: Some(id.to_string()) }).await.unwrap();
    assert!(d.allowed, "{id}");
}

/// Every rule's remaining, from a peek.
async fn remaining(l: &Limiter) -> Vec<u64> {
    let d = l.peek(&[("tenant", "t")], 1).await.unwrap();
    d.results.iter().map(|r| r.remaining).collect()
}

async fn scenario(l: &Limiter, backend: &str) {
    let a = [("tenant", "t")];
    // "a", then 63 newer checks with ids: "a" is still among the last 64.
    check(l, "a", 2).await;
    for i in 1..=63 {
        check(l, &format!("n{i}"), 1).await;
    }
    assert_eq!(l.settle_call(&a, "a", 2, 1).await.unwrap(), 4, "{backend}: found among the last 64");
    // Settled: a second settle is not an error, though the list is full.
    assert_eq!(l.settle_call(&a, "a", 2, 1).await.unwrap(), 0, "{backend}: settled once");

    // "b", then 64 newer checks with ids: "b" is pushed out everywhere.
    check(l, "b", 3).await;
    for i in 64..128 {
        check(l, &format!("n{i}"), 1).await;
    }
    let before = remaining(l).await;
    for actual in [0, 3, 9] {
        let e = l.settle_call(&a, "b", 3, actual).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{backend}");
        assert_eq!(
            e.message(),
            "settle: call_id \"b\" is no longer among the last 64 call ids recorded on the key of rule \"log\", \
             \"bucket\", \"counters\", \"window\": newer checks with call ids pushed it out, so its real cost was not \
             applied there (settled on 0 other rules); settle sooner, or give the key fewer checks with call ids \
             between a check and its settle",
            "{backend}"
        );
        assert_eq!(remaining(l).await, before, "{backend}: a settle that fails changes nothing");
    }
    // The newest calls still settle, once.
    assert_eq!(l.settle_call(&a, "n127", 1, 0).await.unwrap(), 4, "{backend}");
    assert_eq!(l.settle_call(&a, "n127", 1, 0).await.unwrap(), 0, "{backend}");
    let after = remaining(l).await;
    assert!(after.iter().zip(&before).all(|(x, y)| x == &(y + 1)), "{backend}: {before:?} -> {after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_whose_call_id_was_pushed_out_is_an_error_naming_it() {
    scenario(&limiter(None, "po:"), "embedded").await;
    let server = RedisServer::start();
    let l = limiter(Some(&server.url()), "po:");
    scenario(&l, "redis").await;
    // 64 ids and more in the counters' hash: it keeps Redis's compact encoding
    // (every field within hash-max-listpack-value; lua/sliding_window.lua).
    let counters = &l.keys(&[("tenant", "t")])[2];
    assert_eq!(server.command(&["OBJECT", "ENCODING", counters]).unwrap(), "listpack");
    let cluster = RedisCluster::start(3);
    scenario(&limiter(Some(&cluster.url()), "po:"), "cluster").await;
}
