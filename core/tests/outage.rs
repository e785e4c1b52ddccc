//! Redis away: the timeout bounds every call (connecting included) against a
//! black-hole server, a paused Redis and a refused port; a check that timed
//! out never counts once Redis resumes; outages are reported once, with
//! their cause, and once when they end; `strict` fails fast.

use std::io::Read;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use throttlegate::{
    CheckOptions, ErrorKind, HealthEvent, HealthSink, Limiter, LimiterBuilder, OutageCause, Policy, Rule,
};
use throttlegate_testkit::{free_port, RedisCluster, RedisServer};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// What a call may take beyond its timeout on this (shared, noisy) machine.
const SLACK: Duration = Duration::from_millis(80);

/// A TCP listener that accepts every connection and never answers (it
/// reads and drops what it is sent). Lives as long as the test process.
fn black_hole() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    port
}

fn builder(url: &str, timeout: Duration) -> LimiterBuilder {
    Limiter::builder(
        Policy::new(vec![
            Rule::sliding_window_log("log", "l:{ip}", 1_000_000, ms(3_600_000)),
            Rule::fixed_window("fixed", "f:{ip}", 1_000_000, ms(3_600_000)),
        ])
        .unwrap(),
    )
    .url(url)
    .timeout(timeout)
}

fn ip(v: &str) -> [(&'static str, String); 1] {
    [("ip", v.to_string())]
}

/// Every call of `call` (blocking or async, run `n` times) takes at most the
/// timeout and the slack; returns the longest.
fn bounded(what: &str, timeout: Duration, n: usize, mut call: impl FnMut()) -> Duration {
    let mut worst = Duration::ZERO;
    for _ in 0..n {
        let started = Instant::now();
        call();
        worst = worst.max(started.elapsed());
    }
    assert!(worst <= timeout + SLACK, "{what}: a call took {worst:?} with a timeout of {timeout:?}");
    eprintln!("{what}: timeout {timeout:?}, longest call {worst:?}");
    worst
}

#[test]
fn every_path_is_bounded_by_the_timeout() {
    let hole = format!("redis://127.0.0.1:{}", black_hole());
    let refused = format!("redis://127.0.0.1:{}", free_port());
    let paused = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let opts = CheckOptions::default();
    for timeout in [ms(100), ms(300)] {
        for (name, url) in [("black hole", hole.clone()), ("refused", refused.clone()), ("paused", paused.url())] {
            let blocking = builder(&url, timeout).build().unwrap();
            let asynchronous = builder(&url, timeout).build().unwrap();
            if name == "paused" {
                // Connected (and the script loaded) before the pause.
                assert!(!blocking.check_blocking(&ip("a"), &opts).unwrap().degraded);
                assert!(!rt.block_on(asynchronous.check(&ip("a"), 1)).unwrap().degraded);
                paused.pause(true);
            }
            bounded(&format!("blocking, {name}"), timeout, 3, || {
                let d = blocking.check_blocking(&ip("a"), &opts).unwrap();
                assert!(d.degraded);
            });
            bounded(&format!("async, {name}"), timeout, 3, || {
                let d = rt.block_on(asynchronous.check(&ip("a"), 1)).unwrap();
                assert!(d.degraded);
            });
            if name == "paused" {
                paused.pause(false);
            }
        }
    }
}

/// A cluster URL whose nodes do not answer: the whole call (the cluster
/// client's discovery included) stays within the timeout too.
#[test]
fn a_cluster_that_does_not_answer_is_bounded_by_the_timeout() {
    let hole = black_hole();
    let refused = free_port();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let timeout = ms(150);
    for (name, port) in [("black hole", hole), ("refused", refused)] {
        let l = builder(&format!("redis+cluster://127.0.0.1:{port}"), timeout).build().unwrap();
        bounded(&format!("cluster blocking, {name}"), timeout, 3, || {
            assert!(l.check_blocking(&ip("a"), &CheckOptions::default()).unwrap().degraded);
        });
        bounded(&format!("cluster async, {name}"), timeout, 3, || {
            assert!(rt.block_on(l.check(&ip("a"), 1)).unwrap().degraded);
        });
    }
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

fn fixed_count(server: &RedisServer, key: &str) -> u64 {
    let v = server.command(&["GET", key]).unwrap();
    // "<end>:<units>[:ids]", or "(nil)" when absent.
    v.split(':').nth(1).map_or(0, |n| n.parse().unwrap())
}

/// Callers in flight at once in [`a_check_that_timed_out_never_counts`].
const IN_FLIGHT: u64 = 4;

/// Checks under load while Redis is paused, then resumed: the counts in
/// Redis equal the admissions the callers saw, on the async and the
/// blocking paths, for the short forms (one log rule; one fixed window) and
/// the general one (both rules), but for the documented window: a check
/// whose script ran just before Redis stopped, its reply held until Redis
/// resumed (at most one per caller in flight). Without the deadline, every
/// check that timed out during the pause would count.
#[test]
fn a_check_that_timed_out_never_counts() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let timeout = ms(100);
    let policies = [
        ("log", vec![Rule::sliding_window_log("log", "l:{ip}", 1_000_000, ms(3_600_000))]),
        ("fixed", vec![Rule::fixed_window("fixed", "f:{ip}", 1_000_000, ms(3_600_000))]),
        (
            "both",
            vec![
                Rule::sliding_window_log("log", "l:{ip}", 1_000_000, ms(3_600_000)),
                Rule::fixed_window("fixed", "f:{ip}", 1_000_000, ms(3_600_000)),
            ],
        ),
    ];
    for (name, rules) in policies {
        let l = Limiter::builder(Policy::new(rules).unwrap())
            .url(server.url())
            .timeout(timeout)
            .prefix(format!("t-{name}:"))
            .build()
            .unwrap();
        let admitted = Arc::new(AtomicU64::new(0));
        let degraded = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::new();
        for t in 0..IN_FLIGHT {
            let (l, admitted, degraded, stop) = (l.clone(), admitted.clone(), degraded.clone(), stop.clone());
            if t % 2 == 0 {
                workers.push(std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let d = l.check_blocking(&ip("x"), &CheckOptions::default()).unwrap();
                        let counter = if d.degraded { &degraded } else { &admitted };
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            } else {
                let handle = rt.handle().clone();
                workers.push(std::thread::spawn(move || {
                    handle.block_on(async {
                        while !stop.load(Ordering::Relaxed) {
                            let d = l.check(&ip("x"), 1).await.unwrap();
                            let counter = if d.degraded { &degraded } else { &admitted };
                            counter.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                }));
            }
        }
        std::thread::sleep(ms(150));
        server.pause(true);
        std::thread::sleep(ms(400));
        server.pause(false);
        std::thread::sleep(ms(150));
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().unwrap();
        }
        // Every late script has run once the calls are answered; a last
        // round trip makes sure.
        rt.block_on(l.ping()).unwrap();
        let (admitted, degraded) = (admitted.load(Ordering::Relaxed), degraded.load(Ordering::Relaxed));
        // Each caller timed out about 4 times during the pause.
        assert!(degraded >= 2 * IN_FLIGHT, "{name}: the pause timed calls out ({degraded})");
        let log = log_units(&server, &format!("t-{name}:log:l:x"));
        let fixed = fixed_count(&server, &format!("t-{name}:fixed:f:x"));
        let counts: &[u64] = match name {
            "log" => &[log],
            "fixed" => &[fixed],
            _ => &[log, fixed],
        };
        for &counted in counts {
            // Every admission counts; a timed-out check counts only when its
            // script ran before the stop and its reply was held by it (the
            // remaining window: at most one per caller in flight).
            assert!(
                (admitted..=admitted + IN_FLIGHT).contains(&counted),
                "{name}: {counted} counted, {admitted} admitted, {degraded} degraded"
            );
        }
        eprintln!("{name}: {admitted} admitted, {degraded} degraded, counted {counts:?}");
    }
}

/// The same on a Redis Cluster whose primary for the key is paused: checks
/// to it time out, and once it resumes the count equals the admissions.
#[test]
fn a_timed_out_cluster_check_never_counts() {
    let cluster = RedisCluster::start(3);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let l = Limiter::builder(Policy::new(vec![Rule::sliding_window_log("log", "l:{ip}", 1_000_000, ms(3_600_000))]).unwrap())
        .url(cluster.url())
        .timeout(ms(100))
        .prefix("t-cluster:")
        .build()
        .unwrap();
    let key = "t-cluster:log:l:x";
    let slot: u16 = cluster.nodes[0].command(&["CLUSTER", "KEYSLOT", key]).unwrap().parse().unwrap();
    let primary = cluster.primary_of(slot);
    let (admitted, degraded, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let workers: Vec<_> = (0..IN_FLIGHT)
        .map(|t| {
            let (l, admitted, degraded, stop) = (l.clone(), admitted.clone(), degraded.clone(), stop.clone());
            let handle = rt.handle().clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let d = if t % 2 == 0 {
                        l.check_blocking(&ip("x"), &CheckOptions::default()).unwrap()
                    } else {
                        handle.block_on(l.check(&ip("x"), 1)).unwrap()
                    };
                    let counter = if d.degraded { &degraded } else { &admitted };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(ms(150));
    primary.pause(true);
    std::thread::sleep(ms(400));
    primary.pause(false);
    std::thread::sleep(ms(150));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    // A peek of the key, after every late script on its node has run.
    while rt.block_on(l.peek(&ip("x"), 1)).unwrap().degraded {
        assert!(Instant::now() < deadline, "the cluster never answered again");
    }
    let (admitted, degraded) = (admitted.load(Ordering::Relaxed), degraded.load(Ordering::Relaxed));
    assert!(degraded >= 2 * IN_FLIGHT, "the pause timed calls out ({degraded})");
    let counted = log_units(primary, key);
    assert!(
        (admitted..=admitted + IN_FLIGHT).contains(&counted),
        "{counted} counted, {admitted} admitted, {degraded} degraded"
    );
    eprintln!("cluster: {admitted} admitted, {degraded} degraded, {counted} counted");
}

fn recorder() -> (HealthSink, Arc<Mutex<Vec<HealthEvent>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    (HealthSink::new(move |e| log.lock().unwrap().push(e.clone())), seen)
}

#[test]
fn an_outage_is_reported_once_with_its_cause_and_once_when_it_ends() {
    let opts = CheckOptions::default();
    // Refused: many failing calls, one event.
    let (sink, seen) = recorder();
    let l = builder(&format!("redis://127.0.0.1:{}", free_port()), ms(200)).on_health(sink).build().unwrap();
    for _ in 0..20 {
        assert!(l.check_blocking(&ip("a"), &opts).unwrap().degraded);
    }
    assert!(l.is_backend_down());
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(seen[0].is_down());
        assert_eq!(seen[0].cause(), OutageCause::Refused, "{}", seen[0]);
    }
    // Paused, then resumed: one warning (timeout), one recovery.
    let server = RedisServer::start();
    let (sink, seen) = recorder();
    let l = builder(&server.url(), ms(100)).on_health(sink).build().unwrap();
    assert!(!l.check_blocking(&ip("a"), &opts).unwrap().degraded);
    server.pause(true);
    for _ in 0..5 {
        assert!(l.check_blocking(&ip("a"), &opts).unwrap().degraded);
    }
    server.pause(false);
    let deadline = Instant::now() + Duration::from_secs(5);
    while l.check_blocking(&ip("a"), &opts).unwrap().degraded {
        assert!(Instant::now() < deadline, "Redis never came back");
    }
    assert!(!l.is_backend_down());
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!((seen[0].is_down(), seen[0].cause()), (true, OutageCause::Timeout));
    assert!(!seen[1].is_down());
    assert!(seen[1].message().contains("recovered"), "{}", seen[1]);
    // A wrong password: auth_failed.
    let (sink, seen) = recorder();
    let url = format!("redis://nobody:nope@127.0.0.1:{}", server.port());
    let l = builder(&url, ms(500)).on_health(sink).build().unwrap();
    for _ in 0..3 {
        assert!(l.check_blocking(&ip("a"), &opts).unwrap().degraded);
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].cause(), OutageCause::AuthFailed, "{}", seen[0]);
}

#[test]
fn strict_fails_fast_on_a_wrong_url_password_or_acl() {
    let server = RedisServer::start();
    let setuser = |args: &[&str]| {
        let mut all = vec!["ACL", "SETUSER"];
        all.extend_from_slice(args);
        assert_eq!(server.command(&all).unwrap(), "+OK");
    };
    setuser(&["limiter", "on", ">s3cret", "~*", "+@all"]);
    let good = format!("redis://limiter:s3cret@127.0.0.1:{}", server.port());
    builder(&good, ms(500)).strict(true).build().unwrap();
    // Inside an async runtime too (the check runs on a thread of its own).
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async { builder(&good, ms(500)).strict(true).build() }).unwrap();
    let refused_url = format!("redis://127.0.0.1:{}", free_port());
    let inside = rt.block_on(async { builder(&refused_url, ms(500)).strict(true).build() }).unwrap_err();
    assert_eq!(inside.kind(), ErrorKind::BackendUnavailable, "{inside}");
    // Off by default: a limiter is made whatever the URL.
    builder(&format!("redis://127.0.0.1:{}", free_port()), ms(500)).build().unwrap();
    let err = |url: &str| builder(url, ms(500)).strict(true).build().unwrap_err();
    let refused = err(&format!("redis://127.0.0.1:{}", free_port()));
    assert_eq!(refused.kind(), ErrorKind::BackendUnavailable, "{refused}");
    assert!(refused.to_string().starts_with("strict: "), "{refused}");
    let started = Instant::now();
    let silent = err(&format!("redis://127.0.0.1:{}", black_hole()));
    assert_eq!(silent.kind(), ErrorKind::Timeout, "{silent}");
    assert!(started.elapsed() <= ms(500) + SLACK);
    let password = err(&format!("redis://limiter:nope@127.0.0.1:{}", server.port()));
    assert_eq!(password.kind(), ErrorKind::Backend, "{password}");
    assert!(password.to_string().contains("PING"), "{password}");
    // A user who may PING but not run the script.
    setuser(&["pinger", "on", ">pw", "~*", "-@all", "+ping", "+auth", "+hello", "+client"]);
    let no_script = err(&format!("redis://pinger:pw@127.0.0.1:{}", server.port()));
    assert_eq!(no_script.kind(), ErrorKind::Backend, "{no_script}");
    assert!(no_script.to_string().contains("check script"), "{no_script}");
}
