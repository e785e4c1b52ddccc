//! The core against a real local Redis Cluster (3 primaries, 1 replica each).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use throttlegate::{FailureMode, Limiter, Policy, Rule};
use throttlegate_testkit::{RedisCluster, RedisServer};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn cluster_limiter(cluster: &RedisCluster, rules: Vec<Rule>, prefix: &str) -> Limiter {
    Limiter::builder(Policy::new(rules).unwrap())
        .url(cluster.url())
        .prefix(prefix)
        .timeout(ms(3000))
        .on_backend_error(FailureMode::Error)
        .build()
        .unwrap()
}

fn keyslot(node: &RedisServer, key: &str) -> u16 {
    node.command(&["CLUSTER", "KEYSLOT", key]).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_suite() {
    let cluster = RedisCluster::start(3);
    same_slot_rules_are_one_invocation(&cluster).await;
    cross_slot_rules_never_exceed_and_give_back(&cluster).await;
    slot_migration_under_load(&cluster).await;
    overrides_listed_from_the_override_keys(&cluster).await;
    primary_failover(cluster).await;
}

async fn same_slot_rules_are_one_invocation(cluster: &RedisCluster) {
    let l = cluster_limiter(
        cluster,
        vec![
            Rule::sliding_window_log("per-user", "{{t:{tenant}}}:u:{user}", 3, ms(60_000)),
            Rule::token_bucket("per-tenant", "{{t:{tenant}}}", 10, 1.0),
        ],
        "co:",
    );
    let a = [("tenant", "acme"), ("user", "bob")];
    let keys = l.keys(&a);
    let n0 = &cluster.nodes[0];
    assert_eq!(keyslot(n0, &keys[0]), keyslot(n0, &keys[1]), "{keys:?}");
    l.peek(&a, 1).await.unwrap(); // loads the script on that node
    let before: u64 = cluster.nodes.iter().map(|n| n.command_calls("evalsha") + n.command_calls("eval")).sum();
    for i in 0..3 {
        let d = l.check(&a, 1).await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining, 2 - i);
    }
    let d = l.check(&a, 1).await.unwrap();
    assert!(!d.allowed);
    let after: u64 = cluster.nodes.iter().map(|n| n.command_calls("evalsha") + n.command_calls("eval")).sum();
    assert_eq!(after - before, 4, "co-located rules must take one invocation per check");
    // The denial consumed nothing from the bucket (7 of 10 left; the peek,
    // denied by the log, shows all of them).
    assert_eq!(l.peek(&a, 1).await.unwrap().results[1].remaining, 7);
}

async fn cross_slot_rules_never_exceed_and_give_back(cluster: &RedisCluster) {
    let l = cluster_limiter(
        cluster,
        vec![
            Rule::sliding_window_log("wide", "w:{user}", 50, ms(60_000)),
            Rule::sliding_window_log("narrow", "n:{user}", 30, ms(60_000)),
            Rule::token_bucket("bucket", "b:{user}", 40, 0.001),
        ],
        "xs:",
    );
    let a = [("user", "carol")];
    let keys = l.keys(&a);
    let n0 = &cluster.nodes[0];
    let slots: std::collections::HashSet<u16> = keys.iter().map(|k| keyslot(n0, k)).collect();
    assert_eq!(slots.len(), 3, "the test needs three different slots: {keys:?}");
    let admitted = Arc::new(AtomicU32::new(0));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (l, admitted) = (l.clone(), admitted.clone());
            tokio::spawn(async move {
                for _ in 0..4 {
                    if l.check(&[("user", "carol")], 1).await.unwrap().allowed {
                        admitted.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let admitted = admitted.load(Ordering::SeqCst) as u64;
    assert!(admitted <= 30, "{admitted} admitted with a limit of 30");
    assert!(admitted > 0);
    // Once the give-backs are done, only admitted requests hold quota.
    let d = l.peek(&a, 1).await.unwrap();
    let remaining: Vec<u64> = d.results.iter().map(|r| r.remaining).collect();
    // A peek the narrow rule denies takes nothing from the others: they show
    // all they have left; one it admits shows what would be left after it.
    let taken = if admitted >= 30 { admitted } else { admitted + 1 };
    let expect = |limit: u64| limit.saturating_sub(taken);
    assert_eq!(remaining, vec![expect(50), expect(30), expect(40)], "admitted {admitted}");
}

/// On a cluster an override and its entry in the rule's index live in
/// different slots: the listing follows the override keys (what checks
/// read), whatever happened to the index.
async fn overrides_listed_from_the_override_keys(cluster: &RedisCluster) {
    let l = cluster_limiter(
        cluster,
        vec![Rule::fixed_window("tenant", "t:{tenant}", 5, ms(3_600_000)).overrides(true)],
        "ov:",
    );
    let side = |tenant: &str| format!("ov:tenant:#o{{{}}}", l.keys(&[("tenant", tenant)])[0]);
    let on_node = |key: &str, args: &[&str]| {
        let node = cluster.primary_of(keyslot(&cluster.nodes[0], key));
        let mut all = args.to_vec();
        all.insert(1, key);
        node.command(&all).unwrap()
    };
    let listed = |l: Limiter| async move {
        l.overrides("tenant")
            .await
            .unwrap()
            .into_iter()
            .map(|o| (o.attributes["tenant"].clone(), o.limit))
            .collect::<Vec<_>>()
    };
    let tenants = ["t1", "t2", "t3", "t4", "t5", "t6"];
    for (i, t) in tenants.iter().enumerate() {
        l.set_override("tenant", &[("tenant", *t)], 11 + i as u64).await.unwrap();
    }
    let slots: std::collections::BTreeSet<u16> = tenants.iter().map(|t| keyslot(&cluster.nodes[0], &side(t))).collect();
    assert!(slots.len() > 1, "the overrides spread over slots");
    let all: Vec<(String, u64)> = tenants.iter().enumerate().map(|(i, t)| (t.to_string(), 11 + i as u64)).collect();
    assert_eq!(listed(l.clone()).await, all);
    // Deleted (or evicted) behind the index: no longer an override, nor listed.
    assert_eq!(on_node(&side("t2"), &["DEL"]), "1");
    // Changed behind the index (a set whose index write was lost): the limit checks read.
    assert_eq!(on_node(&side("t3"), &["SET", "40"]), "+OK");
    // An index entry left by a clear whose second write failed.
    let index = "ov:tenant#overrides";
    on_node(index, &["HSET", &l.keys(&[("tenant", "t9")])[0], r#"{"attributes":{"tenant":"t9"}}"#]);
    let have = listed(l.clone()).await;
    assert_eq!(
        have,
        [("t1", 11), ("t3", 40), ("t4", 14), ("t5", 15), ("t6", 16)].map(|(t, v)| (t.to_string(), v)).to_vec()
    );
    for (t, limit) in &have {
        let d = l.peek(&[("tenant", t.as_str())], 1).await.unwrap();
        assert_eq!(d.remaining, limit - 1, "{t}: the listed limit is the one a check applies");
    }
    assert_eq!(l.peek(&[("tenant", "t2")], 1).await.unwrap().remaining, 4, "t2 has the rule's limit");
    // Sets and clears of one key racing each other: listed exactly when it is set.
    for round in 1..=20u64 {
        let (a, b) = (l.clone(), l.clone());
        let set = tokio::spawn(async move { a.set_override("tenant", &[("tenant", "t7")], round).await });
        let clear = tokio::spawn(async move { b.clear_override("tenant", &[("tenant", "t7")]).await });
        set.await.unwrap().unwrap();
        clear.await.unwrap().unwrap();
        let exists = Some(on_node(&side("t7"), &["GET"])).filter(|v| v != "(nil)").unwrap_or_default();
        let shown = listed(l.clone()).await.into_iter().find(|(t, _)| t == "t7").map(|(_, v)| v.to_string());
        assert_eq!(shown.unwrap_or_default(), exists, "round {round}");
    }
    for t in tenants.iter().chain(&["t7"]) {
        l.clear_override("tenant", &[("tenant", *t)]).await.unwrap();
    }
    assert_eq!(listed(l.clone()).await, Vec::<(String, u64)>::new());
}

async fn slot_migration_under_load(cluster: &RedisCluster) {
    let l = cluster_limiter(cluster, vec![Rule::sliding_window_log("mig", "m:{user}", 100_000, ms(60_000))], "mg:");
    let a = [("user", "dave")];
    let key = l.keys(&a).remove(0);
    let n0 = &cluster.nodes[0];
    let slot = keyslot(n0, &key);
    let source = cluster.primary_of(slot);
    let target = cluster.nodes[..3]
        .iter()
        .find(|n| n.port() != source.port())
        .unwrap();
    let admitted = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..8)
        .map(|_| {
            let (l, admitted, stop) = (l.clone(), admitted.clone(), stop.clone());
            tokio::spawn(async move {
                let mut errors = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    match l.check(&[("user", "dave")], 1).await {
                        Ok(d) if d.allowed => {
                            admitted.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(_) => {}
                        Err(e) => errors.push(e.to_string()),
                    }
                    tokio::time::sleep(ms(2)).await;
                }
                errors
            })
        })
        .collect();
    tokio::time::sleep(ms(200)).await;
    let (sid, tid) = (RedisCluster::node_id(source), RedisCluster::node_id(target));
    let s = slot.to_string();
    target.command(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &sid]).unwrap();
    source.command(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &tid]).unwrap();
    tokio::time::sleep(ms(200)).await;
    let port = target.port().to_string();
    let r = source
        .command(&["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", &key])
        .unwrap();
    assert!(r == "+OK" || r == "+NOKEY", "MIGRATE answered {r}");
    for node in &cluster.nodes[..3] {
        node.command(&["CLUSTER", "SETSLOT", &s, "NODE", &tid]).unwrap();
    }
    tokio::time::sleep(ms(300)).await;
    stop.store(true, Ordering::SeqCst);
    for t in load {
        let errors = t.await.unwrap();
        assert!(errors.is_empty(), "errors reached callers during the migration: {errors:?}");
    }
    let admitted = admitted.load(Ordering::SeqCst);
    assert!(admitted > 0);
    let d = l.peek(&a, 1).await.unwrap();
    assert_eq!(d.remaining, 100_000 - admitted as u64 - 1, "the log moved with the slot");
}

async fn primary_failover(mut cluster: RedisCluster) {
    let l = Limiter::builder(Policy::new(vec![Rule::sliding_window_log("fo", "f:{user}", 1000, ms(60_000))]).unwrap())
        .url(cluster.url())
        .prefix("fo:")
        .timeout(ms(500))
        .on_backend_error(FailureMode::Error)
        .build()
        .unwrap();
    let a = [("user", "erin")];
    for _ in 0..100 {
        assert!(l.check(&a, 1).await.unwrap().allowed);
    }
    let key = l.keys(&a).remove(0);
    let slot = keyslot(&cluster.nodes[0], &key);
    let port = cluster.primary_of(slot).port();
    let idx = cluster.nodes.iter().position(|n| n.port() == port).unwrap();
    let info = cluster.nodes[idx].command(&["INFO", "replication"]).unwrap();
    println!("primary before the kill: {}", info.lines().filter(|l| l.starts_with("connected_slaves") || l.starts_with("slave0")).collect::<Vec<_>>().join(" | "));
    cluster.nodes[idx].kill();
    let started = Instant::now();
    let mut resumed = None;
    while started.elapsed() < Duration::from_secs(30) {
        if let Ok(d) = l.check(&a, 1).await {
            assert!(d.allowed);
            resumed = Some((started.elapsed(), d.remaining));
            break;
        }
        tokio::time::sleep(ms(100)).await;
    }
    let (after, remaining) = resumed.expect("checks did not resume within 30 s of the primary's death");
    // 100 admitted before the kill + 1 now: a replica that had everything
    // reports 899 remaining; anything above that is what replication lost.
    let lost = remaining.saturating_sub(899);
    println!("failover: checks resumed after {after:?}; admissions forgotten by the promoted replica: {lost}");
    assert!(lost <= 100);
}
