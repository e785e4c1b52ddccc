//! A loop of checks, for counting instructions per check under callgrind
//! (embedded) or system calls per check under strace (Redis):
//! `check_loop <rules: 1|4|bucket|fixed|governor> <metrics: on|off> <checks> [<redis url> <blocking|runtime>]`.
//!
//! `valgrind --tool=callgrind target/release/examples/check_loop 1 on 100000`
//!
//! `strace -f -c target/release/examples/check_loop 1 on 10000 redis://127.0.0.1:6379 blocking`
//! counts the blocking path (`check_blocking`: the calling thread's own
//! connection); `runtime` counts an async check driven by `runtime::block_on`
//! (the connection read and written by the runtime's thread).
//!
//! `CHECK_LOOP_KEYS=N` spreads the checks over N keys (default 1,000), for
//! throttlegate and governor alike: `CHECK_LOOP_KEYS=1` and `=100000` are the
//! key counts of the benchmark's embedded group.

use std::time::Duration;

use throttlegate::{CheckOptions, Limiter, Policy, Rule};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rules = args.get(1).map_or("1", String::as_str);
    let metrics = args.get(2).map_or("on", String::as_str) == "on";
    let n: usize = args.get(3).and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let keys: usize = std::env::var("CHECK_LOOP_KEYS").ok().and_then(|k| k.parse().ok()).unwrap_or(1_000).max(1);
    let names: Vec<String> =
        (0..keys).map(|i| format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255)).collect();
    let window = Duration::from_secs(60);
    let mut list = match rules {
        "bucket" => vec![Rule::token_bucket("per-ip", "ip:{ip}", 1_000_000, 1_000_000.0 / 60.0)],
        "fixed" => vec![Rule::fixed_window("per-ip", "ip:{ip}", 1_000_000, window)],
        _ => vec![Rule::sliding_window_log("per-ip", "ip:{ip}", 1_000_000, window)],
    };
    if rules == "4" {
        list.push(Rule::token_bucket("per-key", "key:{ip}", 1_000_000, 100_000.0));
        list.push(Rule::sliding_window_log("per-tenant", "tenant:{ip}", 1_000_000, window));
        list.push(Rule::token_bucket("per-route", "route:{ip}", 1_000_000, 100_000.0));
    }
    if rules == "governor" {
        // The in-process reference of the benchmarks, counted the same way:
        // governor's keyed GCRA on the same keys.
        let quota = governor::Quota::per_minute(std::num::NonZeroU32::new(1_000_000).unwrap());
        let gov = governor::RateLimiter::keyed(quota);
        let allowed = (0..n).filter(|i| gov.check_key(&names[i % names.len()]).is_ok()).count();
        println!("{allowed} of {n} allowed");
        return;
    }
    let url = args.get(4);
    let driven = args.get(5).map_or("blocking", String::as_str) == "runtime";
    let mut builder = Limiter::builder(Policy::new(list).unwrap()).metrics(metrics);
    if let Some(url) = url {
        builder = builder.url(url);
    }
    let l = builder.build().unwrap();
    let opts = CheckOptions::default();
    let mut allowed = 0;
    for i in 0..n {
        let attrs = [("ip", names[i % names.len()].as_str())];
        let d = match (url, driven) {
            (None, _) => l.check_in_process(&attrs, &opts).unwrap().unwrap(),
            (Some(_), false) => l.check_blocking(&attrs, &opts).unwrap(),
            (Some(_), true) => throttlegate::runtime::block_on(l.check(&attrs, 1)).unwrap().unwrap(),
        };
        allowed += d.allowed as usize;
    }
    println!("{allowed} of {n} allowed");
}
