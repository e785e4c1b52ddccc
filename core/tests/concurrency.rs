//! Concurrency rules: slots taken, released, extended and expired, on the
//! embedded backend and a real redis-server (manual and server clocks).

use std::time::Duration;

use throttlegate::{CheckOptions, Clock, ErrorKind, FailureMode, Limiter, ManualClock, Policy};
use throttlegate_testkit::RedisServer;

const POLICY: &str = r#"
[[rules]]
name = "slots"
key = "user:{user}"
algorithm = "concurrency"
limit = 2
lease = "30s"
exempt = { ip = ["10.0.0.0/8"], user = ["healthcheck"] }
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

async fn lifecycle(l: &Limiter, clock: &ManualClock) {
    let a = [("user", "u1")];
    let d1 = l.check(&a, 1).await.unwrap();
    assert!(d1.allowed);
    assert_eq!((d1.limit, d1.remaining), (2, 1));
    let id1 = d1.lease_id().expect("a lease id").to_string();
    assert_eq!(id1.len(), 32);
    let d2 = l.check_with(&a, &CheckOptions { cost: 1, call_id: Some("job-2".into()) }).await.unwrap();
    assert_eq!(d2.lease_id(), Some("job-2"));
    assert_eq!(d2.remaining, 0);
    clock.advance(Duration::from_secs(10));
    let denied = l.check(&a, 1).await.unwrap();
    assert!(!denied.allowed);
    assert!(denied.lease.is_none());
    assert_eq!(denied.retry_after, Duration::from_secs(20));
    assert_eq!(l.release(&denied).await.unwrap(), 0);
    // Release: once.
    assert_eq!(l.release(&d1).await.unwrap(), 1);
    assert_eq!(l.release(&d1).await.unwrap(), 0);
    assert!(l.peek(&a, 1).await.unwrap().allowed);
    // Extend job-2 by 60 s from now; it outlives its first lease.
    assert_eq!(l.extend_call(&a, "job-2", Duration::from_secs(60)).await.unwrap(), 1);
    clock.advance(Duration::from_secs(50));
    let d3 = l.check(&a, 1).await.unwrap();
    assert!(d3.allowed);
    assert_eq!(d3.remaining, 0, "job-2 still holds its slot");
    // Expiry: after the lease, the slot comes back; a late release frees nothing.
    clock.advance(Duration::from_secs(31));
    assert_eq!(l.release_call(&a, "job-2").await.unwrap(), 0);
    assert_eq!(l.release(&d3).await.unwrap(), 0);
    assert_eq!(l.extend(&d3, Duration::from_secs(5)).await.unwrap(), 0, "never re-created");
    assert_eq!(l.peek(&a, 2).await.unwrap().remaining, 0);
    assert!(l.peek(&a, 2).await.unwrap().allowed);
    // Exempt requests are not limited.
    assert!(l.check(&[("user", "healthcheck")], 1).await.unwrap().results.is_empty());
    assert!(l.check(&[("user", "u1"), ("ip", "10.2.3.4")], 1).await.unwrap().results.is_empty());
    // Errors.
    let e = l.extend(&d1, Duration::ZERO).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("duration"), "{e}");
    let e = l.release_call(&a, "bad id!").await.unwrap_err();
    assert!(e.message().contains("call_id"), "{e}");
    l.close();
    assert_eq!(l.release(&d1).await.unwrap_err().kind(), ErrorKind::Closed);
}

#[tokio::test]
async fn lifecycle_on_memory() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let l = limiter(None, &clock, "tgc:");
    lifecycle(&l, &clock).await;
}

#[tokio::test]
async fn lifecycle_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_700_000_000_000_000);
    let l = limiter(Some(&server.url()), &clock, "tgc:");
    lifecycle(&l, &clock).await;
}

/// A request exempt from every rule sends no command to Redis; one that is
/// not sends one.
#[tokio::test]
async fn an_exempt_request_sends_no_command() {
    let server = RedisServer::start();
    let l = Limiter::builder(Policy::from_toml_str(POLICY).unwrap())
        .url(server.url())
        .prefix("tgx:")
        .timeout(Duration::from_secs(5))
        .on_backend_error(FailureMode::Error)
        .build()
        .unwrap();
    // Load the script and connect first, so only the calls below count.
    assert!(l.check(&[("user", "warm")], 1).await.unwrap().allowed);
    let calls = || server.command_calls("evalsha") + server.command_calls("eval");
    let before = calls();
    for attrs in [[("user", "healthcheck"), ("ip", "203.0.113.7")], [("user", "u9"), ("ip", "10.20.30.40")], [("user", "u9"), ("ip", "::ffff:10.0.0.1")]] {
        let d = l.check(&attrs, 1).await.unwrap();
        assert!(d.allowed && d.results.is_empty() && d.lease.is_none(), "{attrs:?}");
        assert_eq!(l.release(&d).await.unwrap(), 0);
    }
    assert_eq!(calls(), before, "an exempt request reached Redis");
    assert!(l.check(&[("user", "u9"), ("ip", "203.0.113.7")], 1).await.unwrap().allowed);
    assert_eq!(calls(), before + 1);
}

/// On the server's clock: the key holds at most `limit` members, expires
/// with its latest lease, and a release or an extend runs on Redis's time.
#[tokio::test]
async fn on_the_server_clock_memory_is_bounded_by_the_limit() {
    let server = RedisServer::start();
    let l = Limiter::builder(Policy::from_toml_str(POLICY).unwrap())
        .url(server.url())
        .prefix("tgs:")
        .timeout(Duration::from_secs(5))
        .on_backend_error(FailureMode::Error)
        .build()
        .unwrap();
    let a = [("user", "u1")];
    for _ in 0..50 {
        let held: Vec<_> = [l.check(&a, 1).await.unwrap(), l.check(&a, 1).await.unwrap(), l.check(&a, 1).await.unwrap()].into();
        assert_eq!(held.iter().filter(|d| d.allowed).count(), 2);
        let card: u64 = server.command(&["ZCARD", "tgs:slots:user:u1"]).unwrap().trim_start_matches(':').parse().unwrap();
        assert!(card <= 2, "{card} members for a limit of 2");
        for d in &held {
            l.release(d).await.unwrap();
        }
    }
    let d = l.check(&a, 2).await.unwrap();
    assert_eq!(server.command(&["ZCARD", "tgs:slots:user:u1"]).unwrap().trim_start_matches(':'), "2", "one member per slot");
    let ttl: i64 = server.command(&["PTTL", "tgs:slots:user:u1"]).unwrap().trim_start_matches(':').parse().unwrap();
    assert!(ttl > 0 && ttl <= 30_000, "the key lives until its lease ends, not longer: {ttl}");
    assert_eq!(l.extend(&d, Duration::from_secs(120)).await.unwrap(), 1);
    let ttl: i64 = server.command(&["PTTL", "tgs:slots:user:u1"]).unwrap().trim_start_matches(':').parse().unwrap();
    assert!(ttl > 30_000 && ttl <= 120_000, "{ttl}");
    assert_eq!(l.release(&d).await.unwrap(), 1);
    assert_eq!(server.command(&["EXISTS", "tgs:slots:user:u1"]).unwrap().trim_start_matches(':'), "0", "nothing left behind");
}

// ---- the crash test -----------------------------------------------------------

const CRASH_POLICY: &str = r#"
[[rules]]
name = "slots"
key = "pool:{pool}"
algorithm = "concurrency"
limit = 4
lease = "5s"
"#;

const WORKERS_PER_PROCESS: usize = 16;
const PROCESSES: usize = 4;
const ADMISSIONS_PER_WORKER: usize = 4;

fn crash_limiter(url: &str) -> Limiter {
    Limiter::builder(Policy::from_toml_str(CRASH_POLICY).unwrap())
        .url(url)
        .prefix("tgcrash:")
        .timeout(Duration::from_secs(5))
        .on_backend_error(FailureMode::Error)
        .build()
        .unwrap()
}

/// The child processes of the crash test (run by re-executing this test
/// binary; not a test by itself). `TG_CONC_ROLE=holder` takes every slot,
/// says so and waits to be killed; `worker` runs 16 tasks that each take a
/// slot 4 times, count themselves in (`INCR` of a Redis counter: the number
/// of holders at that moment, across processes), hold it briefly, count
/// themselves out and release; it prints the most holders seen.
#[test]
#[ignore = "a child process of crash_and_64_workers, run by it"]
fn conc_child() {
    let (Ok(role), Ok(url)) = (std::env::var("TG_CONC_ROLE"), std::env::var("TG_CONC_URL")) else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let l = crash_limiter(&url);
    rt.block_on(async move {
        let a = [("pool", "p")];
        if role == "holder" {
            let d = l.check(&a, 4).await.unwrap();
            assert!(d.allowed);
            println!("held {}", d.lease_id().unwrap());
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return;
        }
        let counter = redis::Client::open(url.as_str()).unwrap();
        let tasks: Vec<_> = (0..WORKERS_PER_PROCESS)
            .map(|_| {
                let (l, counter) = (l.clone(), counter.clone());
                tokio::spawn(async move {
                    let mut conn = counter.get_multiplexed_async_connection().await.unwrap();
                    let mut most = 0i64;
                    for _ in 0..ADMISSIONS_PER_WORKER {
                        loop {
                            let d = l.check(&a, 1).await.unwrap();
                            if !d.allowed {
                                tokio::time::sleep(Duration::from_millis(3)).await;
                                continue;
                            }
                            let n: i64 = redis::cmd("INCR").arg("holders").query_async(&mut conn).await.unwrap();
                            most = most.max(n);
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            let _: i64 = redis::cmd("DECR").arg("holders").query_async(&mut conn).await.unwrap();
                            assert_eq!(l.release(&d).await.unwrap(), 1);
                            break;
                        }
                    }
                    most
                })
            })
            .collect();
        let mut most = 0;
        for t in tasks {
            most = most.max(t.await.unwrap());
        }
        println!("most {most}");
    });
}

fn child(role: &str, url: &str) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "conc_child", "--ignored", "--nocapture", "--test-threads", "1"])
        .env("TG_CONC_ROLE", role)
        .env("TG_CONC_URL", url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap()
}

/// A process holding every slot is killed with SIGKILL: its slots stay held
/// (the next check is denied, and told to wait until the lease ends), and
/// come back when the lease ends. Then 64 workers in 4 processes contend
/// for the 4 slots; the holders, counting themselves, never see more than 4.
#[test]
fn crash_and_64_workers() {
    use std::io::BufRead;
    let server = RedisServer::start();
    let url = server.url();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let l = crash_limiter(&url);
    let a = [("pool", "p")];
    // Connected and the script loaded before the holder starts its lease.
    assert!(rt.block_on(l.peek(&a, 4)).unwrap().allowed);

    let mut holder = child("holder", &url);
    // The test harness prints its own words first (also on the same line).
    let mut said = std::io::BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("held ") {
        line.clear();
        assert!(said.read_line(&mut line).unwrap() > 0, "the holder ended without holding");
    }
    holder.kill().unwrap(); // SIGKILL
    holder.wait().unwrap();

    // The crash freed nothing: denied, and told to wait for the lease's end.
    let d = rt.block_on(l.check(&a, 1)).unwrap();
    assert!(!d.allowed, "slots came back before their lease ended");
    assert!(d.retry_after > Duration::ZERO && d.retry_after <= Duration::from_secs(5), "{:?}", d.retry_after);
    // Nobody can release them but their lease id's owner: a stranger's release frees nothing.
    assert_eq!(rt.block_on(l.release_call(&a, "not-the-holder")).unwrap(), 0);
    // When the lease ends, they are back.
    std::thread::sleep(d.retry_after + Duration::from_millis(5));
    let back = rt.block_on(l.check(&a, 4)).unwrap();
    assert!(back.allowed, "the killed holder's slots came back after the lease");
    assert_eq!(rt.block_on(l.release(&back)).unwrap(), 1);

    // 64 workers in 4 processes.
    let workers: Vec<_> = (0..PROCESSES).map(|_| child("worker", &url)).collect();
    let mut most = 0;
    for w in workers {
        let out = w.wait_with_output().unwrap();
        assert!(out.status.success(), "a worker process failed");
        let text = String::from_utf8_lossy(&out.stdout);
        let m: i64 = text
            .lines()
            .find_map(|l| l.split_once("most ").map(|(_, n)| n.trim()))
            .unwrap_or_else(|| panic!("no report in {text:?}"))
            .parse()
            .unwrap();
        most = most.max(m);
    }
    assert!((1..=4).contains(&most), "{most} holders at once for 4 slots");
    // Every worker released: nothing is held.
    assert!(rt.block_on(l.check(&a, 4)).unwrap().allowed);
}

/// The wire (Node's own socket): a check of a concurrency rule carries the
/// same lease id the core sent, and a release by the decision frees it.
#[test]
fn a_check_over_the_wire_holds_a_lease_the_core_releases() {
    use std::io::{Read, Write};
    let server = RedisServer::start();
    let l = Limiter::builder(Policy::from_toml_str(POLICY).unwrap())
        .url(server.url())
        .prefix("tgw:")
        .timeout(Duration::from_secs(5))
        .on_backend_error(FailureMode::Error)
        .build()
        .unwrap();
    let mut wire = l.wire().expect("one Redis node over TCP");
    let mut sock = std::net::TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    let mut done = Vec::new();
    let mut decide = |wire: &mut throttlegate::Wire, id: u32, options: &CheckOptions| {
        assert!(wire.begin(id, &[("user", "u1")], options, false).is_none());
        while done.is_empty() {
            sock.write_all(&wire.take_output()).unwrap();
            let mut buf = [0u8; 4096];
            let n = sock.read(&mut buf).unwrap();
            assert!(wire.received(&buf[..n], &mut done));
        }
        done.pop().unwrap().1.unwrap()
    };
    let d = decide(&mut wire, 1, &CheckOptions::default());
    assert!(d.allowed);
    let id = d.lease_id().expect("a lease id").to_string();
    assert_eq!(server.command(&["ZSCORE", "tgw:slots:user:u1", &id]).map(|s| s.is_empty()).ok(), Some(false));
    let named = decide(&mut wire, 2, &CheckOptions { cost: 1, call_id: Some("w-2".into()) });
    assert_eq!(named.lease_id(), Some("w-2"));
    assert_eq!(l.release_blocking(&d).unwrap(), 1);
    assert_eq!(l.release_call_blocking(&[("user", "u1")], "w-2").unwrap(), 1);
    assert_eq!(server.command(&["EXISTS", "tgw:slots:user:u1"]).unwrap().trim_start_matches(':'), "0");
}
