//! Failure behaviour and security against real redis-servers: TLS, ACL users
//! with only the commands the script needs, `maxmemory` refusals, `SCRIPT
//! FLUSH` storms.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use throttlegate::{CheckOptions, ErrorKind, FailureMode, Limiter, Period, Policy, Rule};
use throttlegate_testkit::{free_port, RedisServer};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn rules() -> Vec<Rule> {
    vec![
        Rule::sliding_window_log("per-ip", "ip:{ip}", 100_000, ms(60_000)),
        // Refills one token in 1,000 s: the counts these tests assert stay
        // exact however slowly a loaded machine runs them.
        Rule::token_bucket("per-key", "key:{ip}", 100_000, 0.001),
    ]
}

fn build(url: &str) -> throttlegate::LimiterBuilder {
    Limiter::builder(Policy::new(rules()).unwrap())
        .url(url)
        .timeout(ms(3000))
        .on_backend_error(FailureMode::Error)
}

/// The exact ACL a limiter needs (documented in docs/operating/redis.md).
pub const LIMITER_ACL: &[&str] = &[
    "on", ">s3cret", "~throttlegate:*", "resetchannels", "-@all", "+evalsha", "+eval",
    "+script|load", "+ping", "+del", "+time", "+lrange", "+lindex", "+llen", "+lset", "+rpush", "+lpush", "+ltrim",
    "+linsert", "+lrem", "+lpos", "+type", "+pttl", "+zrange", "+pexpire", "+get", "+set", "+hgetall",
    "+hmget", "+hget", "+hincrby", "+hset", "+hdel",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_with_only_the_script_commands() {
    let server = RedisServer::start();
    let mut setuser = vec!["ACL", "SETUSER", "limiter"];
    setuser.extend_from_slice(LIMITER_ACL);
    assert_eq!(server.command(&setuser).unwrap(), "+OK");
    let url = format!("redis://limiter:s3cret@127.0.0.1:{}", server.port());
    let l = build(&url).build().unwrap();
    let a = [("ip", "1.2.3.4")];
    for _ in 0..3 {
        assert!(l.check(&a, 1).await.unwrap().allowed);
    }
    assert!(l.peek(&a, 1).await.unwrap().allowed);
    server.command(&["SCRIPT", "FLUSH"]).unwrap();
    assert!(l.check(&a, 1).await.unwrap().allowed, "NOSCRIPT recovery needs only SCRIPT LOAD");
    // A settle of a log and a bucket needs no other command.
    let d = l.check_with(&a, &CheckOptions { cost: 3, call_id: Some("acl-0".into()) }).await.unwrap();
    assert_eq!(l.settle(&d, 5).await.unwrap(), 2);
    assert_eq!(l.reset(&a).await.unwrap(), 2);
    // The algorithms with bounded memory need nothing more, replays included.
    let bounded = Limiter::builder(
        Policy::new(vec![
            Rule::sliding_window("counters", "c:{ip}", 10, ms(60_000)),
            Rule::fixed_window("fixed", "f:{ip}", 10, ms(60_000)),
            Rule::quota("daily", "d:{ip}", 10, Period::Day),
        ])
        .unwrap(),
    )
    .url(&url)
    .timeout(ms(3000))
    .on_backend_error(FailureMode::Error)
    .build()
    .unwrap();
    for _ in 0..2 {
        let opts = CheckOptions { cost: 2, call_id: Some("acl-1".into()) };
        let d = bounded.check_with(&a, &opts).await.unwrap();
        assert_eq!((d.allowed, d.remaining), (true, 8), "a replay counts once");
    }
    for _ in 0..4 {
        assert!(bounded.check(&a, 2).await.unwrap().allowed);
    }
    assert!(!bounded.check(&a, 1).await.unwrap().allowed);
    // So do settles: the first check's 2 units come back on every rule.
    assert_eq!(bounded.settle_call(&a, "acl-1", 2, 0).await.unwrap(), 3);
    assert!(bounded.check(&a, 2).await.unwrap().allowed);
    assert_eq!(bounded.reset(&a).await.unwrap(), 3);
    // Overrides and blocks live under the prefix too: the same ACL serves them.
    let penalties = Limiter::builder(
        Policy::new(vec![Rule::sliding_window_log("login", "l:{ip}", 1, ms(60_000))
            .overrides(true)
            .block(throttlegate::Block::new(ms(60_000)))])
        .unwrap(),
    )
    .url(&url)
    .timeout(ms(3000))
    .on_backend_error(FailureMode::Error)
    .build()
    .unwrap();
    penalties.set_override("login", &a, 2).await.unwrap();
    assert_eq!(penalties.overrides("login").await.unwrap().len(), 1);
    assert!(penalties.check(&a, 1).await.unwrap().allowed);
    assert!(penalties.check(&a, 1).await.unwrap().allowed);
    assert!(!penalties.check(&a, 1).await.unwrap().allowed);
    assert!(penalties.peek(&a, 1).await.unwrap().retry_after > ms(59_000), "blocked");
    assert_eq!(penalties.reset(&a).await.unwrap(), 2);
    assert!(penalties.clear_override("login", &a).await.unwrap());
    // Keys outside the allowed pattern are refused: a backend error, not a crash.
    let other = build(&url).prefix("other:").build().unwrap();
    let e = other.check(&a, 1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
    // A wrong password is an error too.
    let bad = build(&format!("redis://limiter:nope@127.0.0.1:{}", server.port())).build().unwrap();
    assert!(bad.check(&a, 1).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let dir = std::env::temp_dir().join(format!("throttlegate-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca_path, cert_path, key_path) = (dir.join("ca.pem"), dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&ca_path, ca_cert.pem()).unwrap();
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let tls_port = free_port();
    let port_s = tls_port.to_string();
    let server = RedisServer::start_with(&[
        "--tls-port", &port_s,
        "--tls-cert-file", cert_path.to_str().unwrap(),
        "--tls-key-file", key_path.to_str().unwrap(),
        "--tls-ca-cert-file", ca_path.to_str().unwrap(),
        "--tls-auth-clients", "no",
    ]);
    let url = format!("rediss://localhost:{tls_port}");
    let l = build(&url).tls_root_cert(ca_cert.pem()).build().unwrap();
    let a = [("ip", "5.6.7.8")];
    let d = l.check(&a, 1).await.unwrap();
    assert!(d.allowed && !d.degraded);
    assert_eq!(server.command(&["EXISTS", &l.keys(&a)[0]]).unwrap(), "1");
    // Without the CA, the server's certificate is not trusted: an error, never plain text.
    let untrusted = build(&url).build().unwrap();
    let e = untrusted.check(&a, 1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
    assert!(!e.is_temporary(), "a certificate problem does not go away by retrying");
    assert!(e.to_string().contains("TLS"), "{e}");
    // Bad PEM is refused when the limiter is built, naming the option.
    let e = build(&url).tls_root_cert("not a certificate").build().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("tls_root_cert"), "{e}");
    let e = build(&url).tls_client_cert(cert.pem(), "no key here").build().unwrap_err();
    assert!(e.message().contains("tls_client_cert"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maxmemory_refuses_a_check_whole() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let l = build(&server.url()).build().unwrap();
    let a = [("ip", "9.9.9.9")];
    // One rule's key exists before memory runs out.
    assert!(l.check(&a, 1).await.unwrap().allowed);
    let keys = l.keys(&a);
    let before = (
        server.command(&["LRANGE", &keys[0], "0", "-1"]).unwrap(),
        server.command(&["GET", &keys[1]]).unwrap(),
    );
    let used: u64 = server
        .command(&["INFO", "memory"])
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Below what is already used: every write is refused from now on.
    server.command(&["CONFIG", "SET", "maxmemory", &(used / 2).to_string()]).unwrap();
    assert!(server.command(&["SET", "probe", "1"]).unwrap().starts_with("-OOM"));
    let e = l.check(&a, 1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
    assert!(e.to_string().contains("OOM"), "{e}");
    let after = (
        server.command(&["LRANGE", &keys[0], "0", "-1"]).unwrap(),
        server.command(&["GET", &keys[1]]).unwrap(),
    );
    assert_eq!(before, after, "a refused check must not be half-applied");
    // With on_backend_error = deny the caller gets a degraded denial instead.
    let deny = build(&server.url()).on_backend_error(FailureMode::Deny).build().unwrap();
    let d = deny.check(&a, 1).await.unwrap();
    assert!(!d.allowed && d.degraded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn script_flush_storm_loses_no_call_and_no_count() {
    let server = Arc::new(RedisServer::start());
    let l = build(&server.url()).build().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flusher = {
        let (server, stop) = (server.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut flushes = 0;
            while !stop.load(Ordering::SeqCst) {
                server.command(&["SCRIPT", "FLUSH"]).unwrap();
                flushes += 1;
                std::thread::sleep(ms(100));
            }
            flushes
        })
    };
    let admitted = Arc::new(AtomicU32::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (l, admitted) = (l.clone(), admitted.clone());
            tokio::spawn(async move {
                for _ in 0..150 {
                    let d = l.check(&[("ip", "4.4.4.4")], 1).await.expect("no error may reach a caller");
                    if d.allowed {
                        admitted.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(ms(1)).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let flushes = flusher.join().unwrap();
    assert!(flushes >= 2, "only {flushes} flushes happened during the load");
    let admitted = admitted.load(Ordering::SeqCst) as u64;
    assert_eq!(admitted, 16 * 150);
    let d = l.peek(&[("ip", "4.4.4.4")], 1).await.unwrap();
    assert_eq!(d.results[0].remaining, 100_000 - admitted - 1, "counts must stay exact");
    assert_eq!(d.results[1].remaining, 100_000 - admitted - 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_mid_load_then_restarted() {
    let mut server = RedisServer::start();
    let timeout = ms(200);
    let l = Limiter::builder(Policy::new(rules()).unwrap())
        .url(server.url())
        .timeout(timeout)
        .on_backend_error(FailureMode::Allow)
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let slowest = Arc::new(std::sync::Mutex::new(Duration::ZERO));
    let load: Vec<_> = (0..16)
        .map(|t| {
            let (l, stop, slowest) = (l.clone(), stop.clone(), slowest.clone());
            tokio::spawn(async move {
                let mut calls = 0u32;
                while !stop.load(Ordering::SeqCst) {
                    let ip = format!("10.0.0.{t}");
                    let started = std::time::Instant::now();
                    let d = l.check(&[("ip", ip.as_str())], 1).await.expect("allow mode never errors");
                    let took = started.elapsed();
                    {
                        let mut s = slowest.lock().unwrap();
                        *s = (*s).max(took);
                    }
                    assert!(d.allowed);
                    calls += 1;
                    tokio::time::sleep(ms(2)).await;
                }
                calls
            })
        })
        .collect();
    tokio::time::sleep(ms(300)).await;
    server.kill();
    tokio::time::sleep(ms(1000)).await;
    let degraded_while_down = l.stats().degraded_allowed;
    assert!(degraded_while_down > 0, "no degraded decision while Redis was down");
    server.restart();
    let back = std::time::Instant::now();
    // Redis-backed decisions resume by themselves: wait for the first
    // non-degraded answer.
    let resumed = loop {
        let d = l.check(&[("ip", "probe")], 1).await.unwrap();
        if !d.degraded {
            break back.elapsed();
        }
        assert!(back.elapsed() < Duration::from_secs(10), "no Redis-backed decision 10 s after the restart");
        tokio::time::sleep(ms(10)).await;
    };
    stop.store(true, Ordering::SeqCst);
    let mut calls = 0;
    for t in load {
        calls += t.await.unwrap();
    }
    let slowest = *slowest.lock().unwrap();
    println!(
        "killed mid-load: {calls} calls, {degraded_while_down} degraded while down, slowest call {slowest:?} \
         (timeout {timeout:?}), Redis-backed again {resumed:?} after the restart"
    );
    // Every call returned within the timeout (plus scheduling slack on a loaded machine).
    assert!(slowest < timeout + Duration::from_secs(1), "a call took {slowest:?}");
    // The bar is 1 s; allow slack for a loaded CI machine.
    assert!(resumed < Duration::from_secs(3), "resumed only after {resumed:?}");
}
