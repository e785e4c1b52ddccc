#!/usr/bin/env node
// Instructions per check, for callgrind: a loop of N checks of one
// fixed-window rule over 10,000 clients (1,000,000 per 60 s, so every check
// is admitted), one at a time. Embedded: throttlegate's `check` (each
// awaited), its `checkSync`, or RateLimiterMemory's `consume` (each
// awaited). On Redis (REDIS_URL): throttlegate's `check` on its own
// connection, or RateLimiterRedis's `consume` over ioredis, each awaited,
// after 5,000 unmeasured checks that open the connection and load the
// script; what is counted is the client's side only.
//
//   valgrind --tool=callgrind --smc-check=all-non-file \
//     node --single-threaded benches/node/callgrind.js MODE N
//
// MODE is `check`, `checkSync`, `flexible`, `redis` or `redis-flexible`.
// Run it with N and 2N: the difference of the two totals over N is the cost
// of one check, start-up and JIT warm-up cancelling out.
// benches/node/callgrind.sh does that for every mode and prints the table.
'use strict';

const { Limiter } = require('throttlegate');
const { RateLimiterMemory, RateLimiterRedis } = require('rate-limiter-flexible');
const Redis = require('ioredis');

const CLIENTS = 10_000;
const LIMIT = 1_000_000;

function usage(message) {
  console.error(`${message}\nusage: [REDIS_URL=URL] node benches/node/callgrind.js check|checkSync|flexible|redis|redis-flexible N`);
  process.exit(2);
}

const [mode, count] = process.argv.slice(2);
const n = Number(count);
if (!['check', 'checkSync', 'flexible', 'redis', 'redis-flexible'].includes(mode)) usage(`unknown mode ${JSON.stringify(mode)}`);
if (!Number.isInteger(n) || n <= 0) usage(`N must be a positive integer, got ${JSON.stringify(count)}`);
const url = process.env.REDIS_URL;
if (mode.startsWith('redis') && !url) usage(`${mode} needs REDIS_URL`);
// Unmeasured checks before a Redis loop (the same in both runs, so they cancel out).
const REDIS_WARM = 5_000;

// Every client's attributes and key, made once (as bench.js does).
const ATTRS = Array.from({ length: CLIENTS }, (_, i) => ({ ip: `10.${i >> 16}.${(i >> 8) & 255}.${i & 255}` }));
const KEYS = ATTRS.map((a) => a.ip);

function denied() {
  throw new Error('unexpected denial');
}

async function main() {
  const prefix = `callgrind:${process.pid}:${Date.now()}:`;
  if (mode === 'redis-flexible') {
    const client = new Redis(url);
    const limiter = new RateLimiterRedis({ storeClient: client, keyPrefix: prefix, points: LIMIT, duration: 60 });
    for (let i = 0; i < REDIS_WARM + n; i++) await limiter.consume(KEYS[i % CLIENTS], 1).catch(denied);
    client.disconnect();
    return;
  }
  if (mode === 'redis') {
    const limiter = new Limiter(
      { rules: [{ name: 'ip', key: 'ip:{ip}', algorithm: 'fixed_window', limit: LIMIT, window: '60s' }] },
      { url, keyPrefix: prefix, timeout: 5000, onBackendError: 'error' },
    );
    for (let i = 0; i < REDIS_WARM + n; i++) if (!(await limiter.check(ATTRS[i % CLIENTS])).allowed) denied();
    await limiter.close();
    return;
  }
  if (mode === 'flexible') {
    const limiter = new RateLimiterMemory({ points: LIMIT, duration: 60 });
    for (let i = 0; i < n; i++) await limiter.consume(KEYS[i % CLIENTS], 1).catch(denied);
    return;
  }
  const limiter = new Limiter(
    { rules: [{ name: 'ip', key: 'ip:{ip}', algorithm: 'fixed_window', limit: LIMIT, window: '60s' }] },
  );
  if (mode === 'checkSync') {
    for (let i = 0; i < n; i++) if (!limiter.checkSync(ATTRS[i % CLIENTS]).allowed) denied();
  } else {
    for (let i = 0; i < n; i++) if (!(await limiter.check(ATTRS[i % CLIENTS])).allowed) denied();
  }
  await limiter.close();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
