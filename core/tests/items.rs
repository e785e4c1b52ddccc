//! A check over several items (`Limiter::check_items`): each rule at the
//! cost of the item that reaches it, all or nothing, on the embedded
//! backend, a real redis-server and a real Redis Cluster.

use std::time::Duration;

use throttlegate::{CheckItem, Clock, ErrorKind, FailureMode, ItemsDecision, Limiter, ManualClock, Policy};
use throttlegate_testkit::{RedisCluster, RedisServer};

const POLICY: &str = r#"
[[rules]]
name = "log"
key = "k:{k}"
algorithm = "sliding_window_log"
limit = 5
window = "1m"

[[rules]]
name = "bucket"
key = "b:{b}"
algorithm = "token_bucket"
capacity = 4
refill_rate = 0.001

[[rules]]
name = "counters"
key = "c:{c}"
algorithm = "sliding_window"
limit = 6
window = "1m"
precision = "1s"

[[rules]]
name = "fixed"
key = "f:{f}"
algorithm = "fixed_window"
limit = 3
window = "1h"

[[rules]]
name = "slots"
key = "s:{s}"
algorithm = "concurrency"
limit = 2
lease = "30s"
"#;

fn limiter(url: Option<&str>, clock: &ManualClock, prefix: &str) -> Limiter {
    let mut b = Limiter::builder(Policy::from_toml_str(POLICY).unwrap())
        .clock(Clock::Manual(clock.clone()))
        .prefix(prefix)
        .timeout(Duration::from_secs(5))
        .on_backend_error(FailureMode::Error);
    if let Some(u) = url {
        b = b.url(u);
    }
    b.build().unwrap()
}

fn item(name: &'static str, value: &'static str, cost: u64) -> CheckItem<[(&'static str, &'static str); 1]> {
    CheckItem { attributes: [(name, value)], cost }
}

/// The remaining of each item's first result.
fn remaining(d: &ItemsDecision) -> Vec<u64> {
    d.items.iter().map(|at| d.decision.results[at[0]].remaining).collect()
}

async fn items(l: &Limiter) {
    // Each rule at its item's cost; cost 0 is reported, not counted.
    let d = l
        .check_items(&[item("k", "a", 2), item("k", "b", 1), item("b", "x", 3), item("c", "y", 4), item("f", "z", 0)])
        .await
        .unwrap();
    assert!(d.decision.allowed);
    assert_eq!(remaining(&d), [3, 4, 1, 2, 3]);
    assert_eq!(d.items.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1, 1, 1, 1]);
    // Two items on one key: one entry at the sum of their costs.
    let d = l.check_items(&[item("k", "a", 2), item("k", "a", 1)]).await.unwrap();
    assert!(d.decision.allowed);
    assert_eq!(d.decision.results.len(), 1);
    assert_eq!(d.items, [vec![0], vec![0]]);
    assert_eq!(d.decision.results[0].remaining, 0);
    // All or nothing: the bucket has 1 token, so nothing is taken anywhere.
    let d = l.check_items(&[item("k", "b", 1), item("c", "y", 1), item("b", "x", 2)]).await.unwrap();
    assert!(!d.decision.allowed);
    assert_eq!(d.decision.rule.as_deref(), Some("bucket"));
    assert_eq!(remaining(&d), [4, 2, 1]);
    let d = l.check_items(&[item("k", "b", 0), item("c", "y", 0), item("b", "x", 0)]).await.unwrap();
    assert!(d.decision.allowed, "a check of cost 0 everywhere looks without counting");
    assert_eq!(remaining(&d), [4, 2, 1]);
    // Cost 0 beside a counted item: decided as a cost of 1, reported, never recorded, on every algorithm.
    for _ in 0..3 {
        let d = l
            .check_items(&[item("f", "z", 1), item("k", "b", 0), item("b", "x", 0), item("c", "y", 0)])
            .await
            .unwrap();
        assert!(d.decision.allowed);
        assert_eq!(remaining(&d)[1..], [4, 1, 2]);
    }
    // Cost 0 checks without consuming: a key with nothing left denies the whole check.
    let d = l.check_items(&[item("f", "z", 0), item("k", "b", 1)]).await.unwrap();
    assert!(!d.decision.allowed);
    assert_eq!(d.decision.rule.as_deref(), Some("fixed"));
    assert!(d.decision.retry_after > Duration::ZERO);
    assert_eq!(remaining(&d), [0, 4]);
    let d = l.check_items(&[item("f", "z", 1), item("k", "b", 1)]).await.unwrap();
    assert!(!d.decision.allowed);
    assert_eq!(remaining(&d), [0, 4]);
    // An item no rule applies to reaches nothing.
    let d = l.check_items(&[item("nothing", "x", 1), item("k", "b", 1)]).await.unwrap();
    assert!(d.decision.allowed);
    assert_eq!(d.items[0], Vec::<usize>::new());
    assert_eq!(d.decision.results[d.items[1][0]].remaining, 3);
    // Errors name the item, the rule and the cost; nothing is counted.
    let e = l.check_items(&[item("k", "b", 1), item("f", "new", 4)]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().starts_with("items[1].cost: 4 is more than rule \"fixed\" allows (3)"), "{e}");
    let e = l.check_items(&[item("f", "new", 2), item("f", "new", 2)]).await.unwrap_err();
    assert!(e.message().contains("rule \"fixed\" cost 4 together, more than it allows (3)"), "{e}");
    let e = l.check_items(&[item("s", "x", 1)]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().starts_with("items[0]: rule \"slots\" is a concurrency limit"), "{e}");
    let d = l.check_items(&[item("k", "b", 0), item("f", "new", 0)]).await.unwrap();
    assert_eq!(remaining(&d), [3, 3]);
    let d = l.check_items::<[(&str, &str); 1]>(&[]).await.unwrap();
    assert!(d.decision.allowed && d.decision.results.is_empty() && d.items.is_empty());
}

#[tokio::test]
async fn items_on_memory() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    items(&limiter(None, &clock, "tgi:")).await;
}

#[tokio::test]
async fn items_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_700_000_000_000_000);
    items(&limiter(Some(&server.url()), &clock, "tgi:")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_on_a_cluster() {
    // The items' keys fall in different slots: a denial gives back, per rule, what its slot took.
    let cluster = RedisCluster::start(3);
    let clock = ManualClock::new(1_700_000_000_000_000);
    items(&limiter(Some(&cluster.url()), &clock, "tgi:")).await;
}
