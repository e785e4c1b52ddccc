#!/usr/bin/env node
// Latency per check under an open-loop load: throttlegate's `Limiter.check`
// on Redis next to rate-limiter-flexible's RateLimiterRedis over ioredis, in
// one run on the same Redis. Prints a markdown table.
//
//   npm run build        # release addon (the default of `npm install`)
//   node benches/node/latency.js [SECONDS] [--redis-url URL] [--json FILE] [--loads 25,50,90] [--samples N]
//
// Method:
//  1. Saturation: each library, warmed up, runs closed-loop with 64 checks in
//     flight, in two rounds of SECONDS / 2 (default 3 s in all) that
//     alternate the libraries; its better round's checks per second is its
//     saturation. The offered rates below are fractions of the LOWER of the
//     two, so that both libraries get exactly the same load at each level.
//  2. Open loop: at each load (default 25%, 50% and 90% of that saturation)
//     each library gets checks issued on a fixed schedule, check i at
//     t0 + i / rate, whether or not earlier checks have answered (so a slow
//     answer cannot hold back the next request: no coordinated omission).
//     The latency of a check runs from its *scheduled* send time to the
//     moment its answer reaches JavaScript, so a late send counts against the
//     library too. A point lasts SECONDS, or longer if needed to reach N
//     samples (--samples, default 20,000, enough for a p99.9 from the 20
//     slowest); the libraries take turns to go first from one load to the next.
//     Each load also gets a row "pacer alone": the same schedule with a check
//     that answers at once, the floor that the harness itself adds.
//  3. Percentiles p50, p99 and p99.9 (nearest rank over every sample, sorted
//     exactly: no histogram buckets) and the largest, in microseconds; and the
//     rate actually achieved (samples / time to the last answer), which falls
//     below the offered rate when a library cannot keep up.
//
// The schedule is kept by a pacer thread (see PACER) that sleeps until each
// send time and wakes the event loop with a message, like a request arriving
// from the network; the main thread then sends every check due by then. So
// sends are late by tens of microseconds rather than by a timer's
// millisecond, and nothing spins: the main thread sleeps in the event loop
// between wake-ups and answers, as a server's does.
//
// The scenario is bench.js's: 10,000 distinct clients, 1 rule of 1000
// requests per 60 s (throttlegate: the exact sliding-window log;
// RateLimiterRedis: a fixed window per key), so every check is admitted and
// both do their full work. Every point starts on fresh keys (a fresh key
// prefix) with a fresh limiter, warmed up with 1,000 checks before timing.
// Without --redis-url a private redis-server is started on a free loopback
// port (pinned to the first CPU, this process to the second, when `taskset`
// is available). --json FILE also writes
// { saturation: { throttlegate, 'rate-limiter-flexible', base, inFlight },
//   rows: [{ load, rate, library, samples, seconds, p50_us, p99_us, p999_us, max_us, achieved, maxInFlight }] }.
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const { Worker } = require('node:worker_threads');
const { Limiter } = require('throttlegate');
const { RateLimiterRedis } = require('rate-limiter-flexible');
const Redis = require('ioredis');
const { startRedis, pinToCpus } = require(path.join(__dirname, '..', '..', 'bindings', 'node', 'test', 'helpers.js'));

const CLIENTS = 10_000;
const LIMIT = 1000;
const WINDOW_S = 60;
const SATURATION_IN_FLIGHT = 64;
const WARM_CHECKS = 1000;
const OURS = 'throttlegate';
const THEIRS = 'rate-limiter-flexible';
const FLOOR = 'pacer alone';
// The floor: a check that answers at once (the pacer's wake-up and a resolved Promise).
const ANSWER = Promise.resolve({ allowed: true });
const answerAtOnce = () => ANSWER;

function usage(message) {
  console.error(`${message}\nusage: node benches/node/latency.js [SECONDS] [--redis-url URL] [--json FILE] [--loads 25,50,90] [--samples N]`);
  process.exit(2);
}

function parseArgs(argv) {
  const out = { seconds: 3, redisUrl: null, json: null, loads: [25, 50, 90], samples: 20_000 };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (['--redis-url', '--json', '--loads', '--samples'].includes(a)) {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      const v = argv[++i];
      if (a === '--json') out.json = v;
      else if (a === '--redis-url') out.redisUrl = v;
      else if (a === '--loads') {
        const items = v.split(',').map(Number);
        if (!items.length || items.some((x) => !(x > 0 && x <= 100))) usage(`--loads: expected percentages in (0, 100], got ${JSON.stringify(v)}`);
        out.loads = items;
      } else {
        const n = Number(v);
        if (!Number.isInteger(n) || n < 1000) usage(`--samples: expected a whole number of at least 1000, got ${JSON.stringify(v)}`);
        out.samples = n;
      }
    } else if (/^\d+(\.\d+)?$/.test(a) && Number(a) > 0) {
      out.seconds = Number(a);
    } else {
      usage(`unknown argument ${JSON.stringify(a)}`);
    }
  }
  return out;
}

const ARGS = parseArgs(process.argv.slice(2));

// Every client's attributes and key, made once: the benchmark measures the
// libraries, not string formatting.
const ATTRS = Array.from({ length: CLIENTS }, (_, n) => ({ ip: `10.${n >> 16}.${(n >> 8) & 255}.${n & 255}` }));
const KEYS = ATTRS.map((a) => a.ip);

const POLICY = { rules: [{ name: 'ip', key: 'ip:{ip}', limit: LIMIT, window: `${WINDOW_S}s` }] };

/** Closed loop, `inFlight` at a time, for `seconds` (or `maxCalls` calls): calls per second. */
async function closedLoop(call, inFlight, seconds, maxCalls = Infinity) {
  let made = 0;
  const end = performance.now() + seconds * 1000;
  async function worker() {
    while (made < maxCalls && performance.now() < end) {
      made += 1;
      const answer = await call(made);
      if (answer.allowed === false) throw new Error(`${OURS}: unexpected denial`);
    }
  }
  const t0 = performance.now();
  await Promise.all(Array.from({ length: inFlight }, worker));
  return (made * 1000) / (performance.now() - t0);
}

// The pacer: a worker thread that sleeps until each scheduled send time
// (Atomics.wait, a futex with a timeout: precise to tens of microseconds) and
// then wakes the main thread with a message, as a request arriving from the
// network would. It never spins, so it takes no CPU from the libraries (nor
// from throttlegate's I/O thread, on the same core).
const PACER = `
const { workerData, parentPort } = require('node:worker_threads');
const { base, interval, n } = workerData;
const rel = () => Number(process.hrtime.bigint() - base) / 1e6;
const cell = new Int32Array(new SharedArrayBuffer(4));
parentPort.once('message', (t0) => {
  let i = 0;
  while (i < n) {
    const wait = t0 + i * interval - rel();
    if (wait > 0) Atomics.wait(cell, 0, 0, wait);
    i = Math.min(n, Math.floor((rel() - t0) / interval) + 1);
    parentPort.postMessage(i);
  }
});
`;

/**
 * Open loop: `n` calls, call i due at t0 + i / rate whatever the earlier
 * calls are doing; on each wake-up from the pacer every call due by then is
 * sent. Resolves to each call's latency (ms, from its scheduled send time),
 * the time from t0 to the last answer and the most calls in flight.
 */
function openLoop(call, rate, n) {
  return new Promise((resolve, reject) => {
    const base = process.hrtime.bigint();
    const rel = () => Number(process.hrtime.bigint() - base) / 1e6;
    const lat = new Float64Array(n);
    const interval = 1000 / rate;
    let t0 = Infinity; // set once the pacer runs
    let sent = 0;
    let done = 0;
    let inFlight = 0;
    let maxInFlight = 0;
    let failed = false;
    const pacer = new Worker(PACER, { eval: true, workerData: { base, interval, n } });
    pacer.once('online', () => {
      t0 = rel() + 2;
      pacer.postMessage(t0);
    });
    const fail = (err) => {
      if (!failed) {
        failed = true;
        pacer.terminate();
        reject(err);
      }
    };
    pacer.on('error', fail);
    pacer.on('message', () => {
      const now = rel();
      while (sent < n && t0 + sent * interval <= now) {
        const i = sent;
        const due = t0 + i * interval;
        sent += 1;
        inFlight += 1;
        if (inFlight > maxInFlight) maxInFlight = inFlight;
        call(i).then((answer) => {
          lat[i] = rel() - due;
          inFlight -= 1;
          if (answer.allowed === false) return fail(new Error(`${OURS}: unexpected denial`));
          if (++done === n) resolve({ lat, elapsed: rel() - t0, maxInFlight });
        }, fail);
      }
    });
  });
}

/** Nearest-rank percentile of sorted values. */
function percentile(sorted, q) {
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];
}

async function main() {
  let redis = null;
  let url = ARGS.redisUrl;
  let pinned = false;
  if (!url) {
    redis = await startRedis();
    url = redis.url;
    pinned = await pinToCpus(redis);
  }
  const client = new Redis(url, { enableOfflineQueue: true, lazyConnect: false });
  const tag = `latency:${process.pid}:${Date.now()}`;
  let serial = 0;
  const open = [];
  // A fresh limiter of each library on fresh keys, warmed up: `call(i)` returns a Promise.
  const makers = {
    [OURS]: async () => {
      const limiter = new Limiter(POLICY, { url, keyPrefix: `${tag}:${serial++}:tg:`, timeout: 5000, onBackendError: 'error' });
      open.push(limiter);
      const call = (i) => limiter.check(ATTRS[i % CLIENTS]);
      await closedLoop(call, SATURATION_IN_FLIGHT, 60, WARM_CHECKS);
      return { call, close: () => open.splice(open.indexOf(limiter), 1)[0].close() };
    },
    [THEIRS]: async () => {
      const limiter = new RateLimiterRedis({ storeClient: client, keyPrefix: `${tag}:${serial++}:rlf`, points: LIMIT, duration: WINDOW_S });
      const call = (i) => limiter.consume(KEYS[i % CLIENTS], 1);
      await closedLoop(call, SATURATION_IN_FLIGHT, 60, WARM_CHECKS);
      return { call, close: async () => {} };
    },
  };
  const libs = [OURS, THEIRS];
  const saturation = {};
  const rows = [];
  try {
    const sat = {};
    for (const lib of libs) {
      sat[lib] = await makers[lib]();
      await closedLoop(sat[lib].call, SATURATION_IN_FLIGHT, Math.min(0.5, ARGS.seconds / 4)); // warm-up
      saturation[lib] = 0;
    }
    // Two rounds of half the time each, the libraries alternating, the better of each counting.
    for (const order of [libs, [...libs].reverse()]) {
      for (const lib of order) {
        saturation[lib] = Math.max(saturation[lib], await closedLoop(sat[lib].call, SATURATION_IN_FLIGHT, ARGS.seconds / 2));
      }
    }
    for (const lib of libs) {
      await sat[lib].close();
      process.stderr.write(`  saturation, ${lib}: ${Math.round(saturation[lib])} checks/s\n`);
    }
    const base = Math.min(...libs.map((l) => saturation[l]));
    for (const [k, load] of ARGS.loads.entries()) {
      const rate = (base * load) / 100;
      const n = Math.max(ARGS.samples, Math.round(rate * ARGS.seconds));
      for (const lib of [...(k % 2 === 0 ? libs : [...libs].reverse()), FLOOR]) {
        const s = lib === FLOOR ? { call: answerAtOnce, close: async () => {} } : await makers[lib]();
        const { lat, elapsed, maxInFlight } = await openLoop(s.call, rate, n);
        await s.close();
        lat.sort();
        const us = (q) => Math.round(percentile(lat, q) * 1000);
        rows.push({
          load, rate: Math.round(rate), library: lib, samples: n, seconds: Number((n / rate).toFixed(2)),
          p50_us: us(0.5), p99_us: us(0.99), p999_us: us(0.999), max_us: Math.round(lat[n - 1] * 1000),
          achieved: Math.round((n * 1000) / elapsed), maxInFlight,
        });
        const r = rows[rows.length - 1];
        process.stderr.write(`  ${load}% (${r.rate}/s), ${lib}: p50 ${r.p50_us} p99 ${r.p99_us} p99.9 ${r.p999_us} us\n`);
      }
    }
  } finally {
    await Promise.all(open.map((l) => l.close().catch(() => {})));
    client.disconnect();
    if (redis) await redis.stop();
  }
  const base = Math.min(...libs.map((l) => saturation[l]));
  if (ARGS.json) {
    const sat = { ...Object.fromEntries(libs.map((l) => [l, Math.round(saturation[l])])), base: Math.round(base), inFlight: SATURATION_IN_FLIGHT };
    fs.writeFileSync(ARGS.json, JSON.stringify({ saturation: sat, rows }, null, 2) + '\n');
  }
  const fmt = (x) => Math.round(x).toLocaleString('en-US');
  const where = ARGS.redisUrl ? 'the given Redis' : `a private redis-server${pinned ? ' (pinned to CPU 0, clients on CPU 1)' : ''}`;
  console.log(
    `node ${process.version}, ${where}, ${CLIENTS.toLocaleString('en-US')} clients, 1 rule of ${LIMIT} per ${WINDOW_S} s; ` +
      `saturation (closed loop, ${SATURATION_IN_FLIGHT} in flight, ${ARGS.seconds} s): ${OURS} ${fmt(saturation[OURS])}/s, ` +
      `${THEIRS} (RateLimiterRedis) ${fmt(saturation[THEIRS])}/s; offered rates are shares of the lower, ${fmt(base)}/s. ` +
      'Open loop, latency from the scheduled send time, microseconds (lower is better)\n',
  );
  console.log('| load | offered/s | library | samples | p50 | p99 | p99.9 | max | achieved/s |');
  console.log('|---:|---:|---|---:|---:|---:|---:|---:|---:|');
  for (const r of rows) {
    console.log(`| ${r.load}% | ${fmt(r.rate)} | ${r.library} | ${fmt(r.samples)} | ${fmt(r.p50_us)} | ${fmt(r.p99_us)} | ${fmt(r.p999_us)} | ${fmt(r.max_us)} | ${fmt(r.achieved)} |`);
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
