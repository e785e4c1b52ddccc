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
