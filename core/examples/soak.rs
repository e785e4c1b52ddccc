//! One participant of the cross-language soak test (`tests/soak/run.sh`):
//! hammers random keys of a shared policy for a while and prints, as JSON,
//! how many requests it was admitted per key and its memory use.
//!
//! `cargo run -p throttlegate --example soak -- POLICY_FILE REDIS_URL SECONDS KEYS`

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use throttlegate::{FailureMode, Limiter, Policy};

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        eprintln!("usage: soak POLICY_FILE REDIS_URL SECONDS KEYS");
        std::process::exit(2);
    }
    let policy = Policy::from_file(&args[1]).unwrap_or_else(|e| {
        eprintln!("soak: {e}");
        std::process::exit(2)
    });
    let seconds: u64 = args[3].parse().expect("SECONDS");
    let keys: u64 = args[4].parse().expect("KEYS");
    let limiter = Limiter::builder(policy)
        .url(&args[2])
        .timeout(Duration::from_secs(2))
        .on_backend_error(FailureMode::Error)
        .build()
        .expect("limiter");
    let admitted: Arc<Mutex<HashMap<u64, u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut rss = Vec::new();
    let tasks: Vec<_> = (0..32u64)
        .map(|t| {
            let (limiter, admitted, stop) = (limiter.clone(), admitted.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut calls, mut errors) = (0u64, 0u64);
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1) ^ std::process::id() as u64;
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let k = x % keys;
                    let user = format!("u{k}");
                    match limiter.check(&[("user", user.as_str())], 1).await {
                        Ok(d) if d.allowed => *admitted.lock().unwrap().entry(k).or_default() += 1,
                        Ok(_) => {}
                        Err(_) => errors += 1,
                    }
                    calls += 1;
                }
                (calls, errors)
            })
        })
        .collect();
    while started.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss.push(rss_kib());
    }
    stop.store(true, Ordering::Relaxed);
    let (mut calls, mut errors) = (0, 0);
    for t in tasks {
        let (c, e) = t.await.unwrap();
        calls += c;
        errors += e;
    }
    let admitted = admitted.lock().unwrap();
    let per_key: HashMap<String, u64> = admitted.iter().map(|(k, v)| (format!("u{k}"), *v)).collect();
    let out = serde_json::json!({
        "lang": "rust",
        "calls": calls,
        "errors": errors,
        "admitted": per_key,
        "rss_kib": rss,
    });
    println!("{out}");
}
