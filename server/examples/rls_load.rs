//! A load generator for `throttlegate serve`: `ShouldRateLimit` calls over
//! one HTTP/2 connection (as Envoy makes them), closed loop at N in flight
//! or open loop at a fixed rate, printing one JSON line of throughput and
//! latency percentiles. Used by benches/serve/run.sh (`make compare`).
//!
//!     cargo run --release -p throttlegate-server --example rls_load -- ADDR SECONDS closed N
//!     cargo run --release -p throttlegate-server --example rls_load -- ADDR SECONDS open RATE

use std::sync::Arc;
use std::time::{Duration, Instant};

use throttlegate_server::grpc::SHOULD_RATE_LIMIT;
use throttlegate_server::rls::{Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse};
use tokio::sync::Mutex;
use tonic::codegen::http::uri::PathAndQuery;

type Client = tonic::client::Grpc<tonic::transport::Channel>;

async fn one(client: &mut Client, i: u64) -> bool {
    let req = RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry { key: "user".into(), value: format!("u{}", i % 10_000) }],
            limit: None,
            hits_addend: None,
        }],
        hits_addend: 0,
    };
    if let Err(e) = client.ready().await {
        let _ = FIRST_ERROR.set(e.to_string());
        return false;
    }
    let codec = tonic_prost::ProstCodec::<RateLimitRequest, RateLimitResponse>::default();
    match client.unary(tonic::Request::new(req), PathAndQuery::from_static(SHOULD_RATE_LIMIT), codec).await {
        Ok(_) => true,
        Err(e) => {
            let _ = FIRST_ERROR.set(format!("{:?}: {}", e.code(), e.message()));
            false
        }
    }
}

/// The first failure, reported with the figures.
static FIRST_ERROR: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 4 {
        eprintln!("usage: rls_load ADDR SECONDS closed N | open RATE");
        std::process::exit(2);
    }
    let secs: f64 = args[1].parse().expect("SECONDS");
    let n: f64 = args[3].parse().expect("N or RATE");
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", args[0]))
        .expect("ADDR")
        .tcp_nodelay(true)
        .connect()
        .await
        .expect("connect");
    let client = Client::new(channel);
    let lat = Arc::new(Mutex::new(Vec::<u64>::new()));
    let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    if args[2] == "closed" {
        for w in 0..n as u64 {
            let (mut client, lat, errors) = (client.clone(), lat.clone(), errors.clone());
            tasks.push(tokio::spawn(async move {
                let mut mine = Vec::new();
                let mut i = w * 1_000_003;
                while Instant::now() < until {
                    let t = Instant::now();
                    if !one(&mut client, i).await {
                        errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    mine.push(t.elapsed().as_nanos() as u64);
                    i += 1;
                }
                lat.lock().await.extend(mine);
            }));
        }
    } else {
        // Open loop: calls start on schedule whatever the answers' pace; latency counts from the scheduled start.
        let interval = Duration::from_secs_f64(1.0 / n);
        let mut i = 0u64;
        loop {
            let due = start + interval * i as u32;
            if due >= until {
                break;
            }
            // The timer's resolution is a millisecond: sleep only when the next
            // call is further off than that, and yield otherwise.
            let now = Instant::now();
            if due > now + Duration::from_millis(2) {
                tokio::time::sleep_until((due - Duration::from_millis(1)).into()).await;
                continue;
            } else if due > now {
                tokio::task::yield_now().await;
                continue;
            }
            let (mut client, lat, errors) = (client.clone(), lat.clone(), errors.clone());
            tasks.push(tokio::spawn(async move {
                if !one(&mut client, i).await {
                    errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                lat.lock().await.push(due.elapsed().as_nanos() as u64);
            }));
            i += 1;
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    let took = start.elapsed().as_secs_f64();
    let mut lat = lat.lock().await.clone();
    lat.sort_unstable();
    println!(
        "{{\"mode\":\"{}\",\"n\":{},\"calls\":{},\"errors\":{},\"per_second\":{:.0},\"p50_us\":{:.1},\"p99_us\":{:.1},\"p999_us\":{:.1},\"first_error\":{}}}",
        args[2],
        n,
        lat.len(),
        errors.load(std::sync::atomic::Ordering::Relaxed),
        lat.len() as f64 / took,
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        pct(&lat, 0.999),
        serde_json::Value::from(FIRST_ERROR.get().cloned().unwrap_or_default())
    );
}
