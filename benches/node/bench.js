#!/usr/bin/env node
// Throughput of `Limiter.check` next to rate-limiter-flexible, in one run on
// the same machine: against a local redis-server this script starts (with
// RateLimiterRedis over ioredis) and on the embedded backend (with
// RateLimiterMemory). 1 and 4 rules, sequential and 64 checks in flight.
// Prints a markdown table.
//
//   npm run build        # release addon (the default of `npm install`)
//   node benches/node/bench.js [seconds per case, default 2]
//
// The two libraries do not compute the same thing: throttlegate runs an exact
// sliding-window log (one member per admitted unit) and decides all rules in
// one atomic script; rate-limiter-flexible counts a fixed window per key and
// RateLimiterUnion consumes from each limiter separately. Limits are set high
// enough that every request is admitted, so both do their full work.
'use strict';

const path = require('node:path');
const { Limiter } = require('throttlegate');
const { RateLimiterRedis, RateLimiterMemory, RateLimiterUnion } = require('rate-limiter-flexible');
const Redis = require('ioredis');
const { startRedis } = require(path.join(__dirname, '..', '..', 'bindings', 'node', 'test', 'helpers.js'));

const SECONDS = Number(process.argv[2] || 2);
const CLIENTS = 1000;
const LIMIT = 1_000_000_000;
const NAMES = ['ip', 'api_key', 'tenant', 'route'];

function attrs(i) {
  const n = i % CLIENTS;
  return { ip: `10.0.${n >> 8}.${n & 255}`, api_key: `key-${n}`, tenant: `t-${n % 50}`, route: `/r/${n % 10}` };
}

function policy(rules) {
  return {
    rules: NAMES.slice(0, rules).map((name) => ({ name, key: `${name}:{${name}}`, limit: LIMIT, window: '1h' })),
  };
}

/** Calls per second of `call(i)` for SECONDS, `inFlight` at a time (after a short warm-up). */
async function measure(call, inFlight) {
  const run = async (ms) => {
    let i = 0;
    const end = performance.now() + ms;
    async function worker() {
      while (performance.now() < end) {
        i += 1;
        await call(i);
      }
    }
    const t0 = performance.now();
    await Promise.all(Array.from({ length: inFlight }, worker));
    return (i * 1000) / (performance.now() - t0);
  };
  await run(200);
  return run(SECONDS * 1000);
}

function throttlegateCall(limiter) {
  return async (i) => {
    const d = await limiter.check(attrs(i));
    if (!d.allowed) throw new Error('unexpected denial');
  };
}

function flexibleCall(rules, make) {
  const limiters = NAMES.slice(0, rules).map((name) => make(name));
  if (rules === 1) {
    const [l] = limiters;
    return (i) => l.consume(attrs(i)[NAMES[0]], 1);
  }
  // RateLimiterUnion keys every limiter with the same key; give each its own
  // key through a prefix per limiter and a combined key, as an app would.
  const union = new RateLimiterUnion(...limiters);
  return (i) => {
    const a = attrs(i);
    return union.consume(`${a.ip}|${a.api_key}|${a.tenant}|${a.route}`, 1);
  };
}

async function main() {
  const redis = await startRedis();
  const client = new Redis({ host: '127.0.0.1', port: redis.port, enableOfflineQueue: true, lazyConnect: false });
  const rows = [];
  try {
    for (const backend of ['redis', 'memory']) {
      for (const rules of [1, 4]) {
        for (const inFlight of [1, 64]) {
          const prefix = `bench:${backend}:${rules}:${inFlight}:`;
          const limiter = new Limiter(policy(rules), {
            url: backend === 'redis' ? redis.url : undefined,
            keyPrefix: `${prefix}tg:`,
            timeout: 5000,
          });
          const ours = await measure(throttlegateCall(limiter), inFlight);
          await limiter.close();
          const theirs = await measure(
            flexibleCall(rules, (name) =>
              backend === 'redis'
                ? new RateLimiterRedis({ storeClient: client, keyPrefix: `${prefix}rlf:${name}`, points: LIMIT, duration: 3600 })
                : new RateLimiterMemory({ keyPrefix: `${prefix}rlf:${name}`, points: LIMIT, duration: 3600 }),
            ),
            inFlight,
          );
          rows.push({ backend, rules, inFlight, ours, theirs });
          process.stderr.write('.');
        }
      }
    }
  } finally {
    client.disconnect();
    await redis.stop();
  }
  process.stderr.write('\n');
  const fmt = (n) => Math.round(n).toLocaleString('en-US');
  console.log(`node ${process.version}, ${SECONDS} s per case, checks per second (higher is better)\n`);
  console.log('| backend | rules | in flight | throttlegate | rate-limiter-flexible | ratio |');
  console.log('|---|---:|---:|---:|---:|---:|');
  for (const r of rows) {
    const other = r.backend === 'redis' ? 'RateLimiterRedis' : 'RateLimiterMemory';
    const label = r.rules === 1 ? other : `RateLimiterUnion of ${r.rules} ${other}`;
    console.log(
      `| ${r.backend} | ${r.rules} | ${r.inFlight} | ${fmt(r.ours)} | ${fmt(r.theirs)} (${label}) | ${(r.ours / r.theirs).toFixed(2)} |`,
    );
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
