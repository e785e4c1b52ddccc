#!/usr/bin/env node
// The boundary-burst trace of benches/compare/burst.py (see there), for
// rate-limiter-flexible's RateLimiterRedis (a fixed window per key, over
// ioredis): the same LIMIT per WINDOW_MS, the same TRACE from a start
// aligned to a multiple of the window, the same count of the most admitted in
// any window of WINDOW_MS - TOLERANCE_MS.
//
//   node benches/compare/burst.js --redis-url URL [--json FILE]
//
// Writes [{ library, algorithm, admitted, max_in_window, over }] to --json.
'use strict';

const fs = require('node:fs');
const { RateLimiterRedis } = require('rate-limiter-flexible');
const Redis = require('ioredis');

const LIMIT = 50;
const WINDOW_MS = 2000;
const TOLERANCE_MS = 20;
const TRACE = [[0.0, 1], [0.9, LIMIT], [1.02, LIMIT], [1.5, LIMIT], [1.9, LIMIT], [2.02, LIMIT], [2.5, LIMIT]];

function maxInWindow(times, span) {
  let best = 0;
  let lo = 0;
  times.forEach((t, hi) => {
    while (times[lo] <= t - span) lo += 1;
    best = Math.max(best, hi - lo + 1);
  });
  return best;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));

async function main() {
  const argv = process.argv.slice(2);
  const get = (name) => (argv.includes(name) ? argv[argv.indexOf(name) + 1] : null);
  const url = get('--redis-url');
  if (!url) {
    console.error('usage: node benches/compare/burst.js --redis-url URL [--json FILE]');
    process.exit(2);
  }
  const client = new Redis(url);
  const limiter = new RateLimiterRedis({
    storeClient: client,
    keyPrefix: `burst-${process.pid}-${Date.now()}`,
    points: LIMIT,
    duration: WINDOW_MS / 1000,
  });
  await client.ping();
  const start = (Math.floor(Date.now() / WINDOW_MS) + 2) * WINDOW_MS;
  const times = [];
  for (const [offset, requests] of TRACE) {
    await sleep(start + offset * WINDOW_MS - Date.now());
    for (let i = 0; i < requests; i++) {
      try {
        await limiter.consume('k', 1);
        times.push(Date.now());
      } catch (err) {
        if (err instanceof Error) throw err; // a rejection is a RateLimiterRes, an Error is a failure
      }
    }
  }
  client.disconnect();
  const most = maxInWindow(times, WINDOW_MS - TOLERANCE_MS);
  const rows = [{ library: 'rate-limiter-flexible', algorithm: 'RateLimiterRedis', admitted: times.length, max_in_window: most, over: Math.max(0, most - LIMIT) }];
  console.log(`rate-limiter-flexible RateLimiterRedis: admitted ${times.length}, most in a window ${most}, over the limit ${rows[0].over}`);
  const json = get('--json');
  if (json) fs.writeFileSync(json, JSON.stringify(rows, null, 2) + '\n');
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
