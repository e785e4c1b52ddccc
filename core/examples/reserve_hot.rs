//! One process of the hot-key benchmark (`benches/compare/reserve.py --rust`,
//! part `reserve` of `make compare`): checks one key as fast as it can from
//! `<threads>` threads, each with a limiter of its own (as separate processes
//! would have), from the UNIX time `<start>` for `<seconds>`, then prints one
//! JSON line per thread: `{"checks": N, "windows": {...}, "times": [...]}`
//! (the admissions' times and fixed windows, when `<record>` is 1).
//!
//! `reserve_hot <redis url> '<policy JSON>' <seconds> <start> <record: 0|1> [<threads>]`
//!
//! Under callgrind (the local-answer path, once warm):
//! `valgrind --tool=callgrind target/release/examples/reserve_hot redis://127.0.0.1:6379 '{"rules": [...]}' 2 0 0`

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use throttlegate::{CheckOptions, Limiter, Policy};

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 6 {
        eprintln!("usage: reserve_hot <redis url> '<policy JSON>' <seconds> <start> <record: 0|1> [<threads>]");
        std::process::exit(2);
    }
    let url = args[1].clone();
    let policy = Policy::from_json_str(&args[2]).unwrap_or_else(|e| {
        eprintln!("reserve_hot: {e}");
        std::process::exit(2)
    });
    let seconds: f64 = args[3].parse().expect("seconds");
    let start: f64 = args[4].parse().expect("start");
    let record = args[5] == "1";
    let threads: usize = args.get(6).and_then(|t| t.parse().ok()).unwrap_or(1).max(1);
    let fixed = policy.rules()[0].algorithm.name() == "fixed_window";

    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let limiter = Limiter::builder(policy.clone()).url(url.clone()).build().expect("limiter");
            std::thread::spawn(move || {
                let attrs = [("k", "hot")];
                let opts = CheckOptions::default();
                let wait = start - unix_now();
                if wait > 0.0 {
                    std::thread::sleep(Duration::from_secs_f64(wait));
                }
                let end = start + seconds;
                let (mut checks, mut times, mut windows) = (0u64, Vec::new(), std::collections::BTreeMap::new());
                // The clock is read once per 64 checks when nothing is recorded.
                loop {
                    if (record || checks % 64 == 0) && unix_now() >= end {
                        break;
                    }
                    let d = limiter.check_blocking(&attrs, &opts).expect("check");
                    checks += 1;
                    if d.allowed && record {
                        let now = unix_now();
                        times.push(now);
                        if fixed {
                            // The end of the window that counted it, in whole seconds (1 s windows).
                            let end = (now + d.reset_after.as_secs_f64()).round() as i64;
                            *windows.entry(end).or_insert(0u64) += 1;
                        }
                    }
                }
                limiter.close();
                serde_json::json!({ "checks": checks, "windows": windows, "times": times })
            })
        })
        .collect();
    for w in workers {
        println!("{}", w.join().expect("worker"));
    }
}
