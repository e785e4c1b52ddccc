//! An HTTP/1.1 load generator for benches/serve/run.sh: N keep-alive
//! connections, each sending `GET /` back to back with an `x-user` header
//! over 10,000 users, for SECONDS; prints one JSON line (requests/s, the
//! count of each status, latency percentiles).
//!
//!     cargo run --release -p throttlegate-server --example http_load -- ADDR SECONDS N

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One response's status, reading exactly its bytes (headers and a Content-Length body).
async fn exchange(conn: &mut TcpStream, buf: &mut Vec<u8>, user: u64) -> std::io::Result<u16> {
    let req = format!("GET / HTTP/1.1\r\nhost: bench\r\nx-user: u{user}\r\n\r\n");
    conn.write_all(req.as_bytes()).await?;
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let status: u16 = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = conn.read(&mut chunk).await?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Ok(status);
        }
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 3 {
        eprintln!("usage: http_load ADDR SECONDS N");
        std::process::exit(2);
    }
    let addr = args[0].clone();
    let until = Instant::now() + Duration::from_secs_f64(args[1].parse().expect("SECONDS"));
    let n: u64 = args[2].parse().expect("N");
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..n {
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
            let mut conn = TcpStream::connect(&addr).await.expect("connect");
            conn.set_nodelay(true).ok();
            let mut buf = Vec::new();
            let mut i = w * 7919;
            while Instant::now() < until {
                let t = Instant::now();
                let status = match exchange(&mut conn, &mut buf, i % 10_000).await {
                    Ok(s) => s,
                    Err(_) => {
                        conn = TcpStream::connect(&addr).await.expect("connect");
                        0
                    }
                };
                lat.push(t.elapsed().as_nanos() as u64);
                *statuses.entry(status).or_default() += 1;
                i += 1;
            }
            (lat, statuses)
        }));
    }
    let mut lat = Vec::new();
    let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
    for t in tasks {
        let (l, s) = t.await.expect("task");
        lat.extend(l);
        for (k, v) in s {
            *statuses.entry(k).or_default() += v;
        }
    }
    let took = start.elapsed().as_secs_f64();
    lat.sort_unstable();
    let pct = |p: f64| if lat.is_empty() { 0.0 } else { lat[((lat.len() as f64 - 1.0) * p).round() as usize] as f64 / 1000.0 };
    let statuses: serde_json::Map<String, serde_json::Value> =
        statuses.into_iter().map(|(k, v)| (k.to_string(), v.into())).collect();
    println!(
        "{}",
        serde_json::json!({
            "requests": lat.len(),
            "per_second": (lat.len() as f64 / took).round(),
            "statuses": statuses,
            "p50_us": pct(0.5),
            "p99_us": pct(0.99),
        })
    );
}
