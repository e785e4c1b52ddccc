#!/usr/bin/env node
// Throughput of `Limiter.check` next to rate-limiter-flexible, in one run on
// the same machine: against Redis (with RateLimiterRedis over ioredis) and on
// the embedded backend (with RateLimiterMemory). 1 rule and 4 stacked rules
// (RateLimiterUnion of the same 4 limits), sequential and 64 checks in flight.
// Prints a markdown table.
//
//   npm run build        # release addon (the default of `npm install`)
//   node benches/node/bench.js [SECONDS] [--redis-url URL] [--json FILE] [--backend redis|memory]
//        [--algorithm NAME] [--rules 1,4] [--in-flight 1,64]
//
// SECONDS per case and library (default 2), in alternating rounds of which
// the best counts. Without --redis-url a private redis-server is
// started on a free loopback port (pinned to the first CPU, this process to
// the second, when `taskset` is available). --json FILE also writes the rows
// as a JSON array of { backend, rules, inFlight, ours, theirs } (checks per
// second). --algorithm NAME gives throttlegate's rules that algorithm
// (default sliding_window_log; sliding_window, fixed_window, quota with a
// period of a day, token_bucket with the same 1000 per 60 s), and --rules /
// --in-flight pick the cases (comma-separated); the JSON rows then carry
// `algorithm` too. `--algorithm fixed_window` compares like with like:
// RateLimiterRedis counts a fixed window per key too. `--sync` (with
// `--backend memory`) measures `Limiter.checkSync` instead of `check`: one
// synchronous loop of checks, no Promise and nothing in flight, next to
// rate-limiter-flexible at each --in-flight; the JSON rows then carry
// `api: 'checkSync'`.
//
// The setup of the performance issue: 10,000 distinct clients, every rule
// 1000 requests per 60 s for both libraries, so every check is admitted and
// both do their full work. The two libraries do not compute the same thing:
// throttlegate runs an exact sliding-window log (one member per admitted
// unit) and decides all rules in one atomic script; rate-limiter-flexible
// counts a fixed window per key and RateLimiterUnion consumes from each
// limiter separately.
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const { Limiter } = require('throttlegate');
const { RateLimiterRedis, RateLimiterMemory, RateLimiterUnion } = require('rate-limiter-flexible');
const Redis = require('ioredis');
const { startRedis, pinToCpus } = require(path.join(__dirname, '..', '..', 'bindings', 'node', 'test', 'helpers.js'));

const CLIENTS = 10_000;
const LIMIT = 1000;
const WINDOW_S = 60;
const NAMES = ['ip', 'api_key', 'tenant', 'route'];
// A run stops early rather than push a client past its limit (a denial is
// not the work being measured): at most this many checks per run.
const MAX_CALLS = Math.floor(CLIENTS * LIMIT * 0.9);
// Alternating measured rounds per case (see `compare`).
const ROUNDS = 3;
const ALGORITHMS = ['sliding_window_log', 'sliding_window', 'fixed_window', 'quota', 'token_bucket'];

function usage(message) {
  console.error(`${message}\nusage: node benches/node/bench.js [SECONDS] [--redis-url URL] [--json FILE] [--backend redis|memory] [--algorithm NAME] [--rules 1,4] [--in-flight 1,64] [--sync]`);
  process.exit(2);
}

function parseArgs(argv) {
  const out = { seconds: 2, redisUrl: null, json: null, backends: ['redis', 'memory'], algorithm: 'sliding_window_log', rules: [1, 4], inFlight: [1, 64], sync: false };
  const list = (a, v, allowed) => {
    const items = v.split(',').map(Number);
    if (!items.length || items.some((x) => !allowed.includes(x))) usage(`${a}: expected a comma-separated list of ${allowed.join(', ')}, got ${JSON.stringify(v)}`);
    return items;
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (['--redis-url', '--json', '--backend', '--algorithm', '--rules', '--in-flight'].includes(a)) {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      const v = argv[++i];
      if (a === '--json') out.json = v;
      else if (a === '--redis-url') out.redisUrl = v;
      else if (a === '--algorithm') {
        if (!ALGORITHMS.includes(v)) usage(`--algorithm: expected one of ${ALGORITHMS.join(', ')}, got ${JSON.stringify(v)}`);
        out.algorithm = v;
      } else if (a === '--rules') out.rules = list(a, v, [1, 4]);
      else if (a === '--in-flight') out.inFlight = list(a, v, [1, 64]);
      else if (v === 'redis' || v === 'memory') out.backends = [v];
      else usage(`--backend: expected redis or memory, got ${JSON.stringify(v)}`);
    } else if (a === '--sync') {
      out.sync = true;
    } else if (/^\d+(\.\d+)?$/.test(a)) {
      out.seconds = Number(a);
    } else {
      usage(`unknown argument ${JSON.stringify(a)}`);
    }
  }
  if (out.sync && out.backends.includes('redis')) usage('--sync needs --backend memory (checkSync is for the embedded backend)');
  return out;
}

const ARGS = parseArgs(process.argv.slice(2));

// Every client's attributes and key, made once: the benchmark measures the
// libraries, not string formatting.
const ATTRS = [1, 4].map((rules) =>
  Array.from({ length: CLIENTS }, (_, n) => {
    const all = { ip: `10.${n >> 16}.${(n >> 8) & 255}.${n & 255}`, api_key: `key-${n}`, tenant: `t-${n}`, route: `/r/${n}` };
    return Object.fromEntries(NAMES.slice(0, rules).map((k) => [k, all[k]]));
  }),
);
const KEYS = ATTRS[0].map((a) => a.ip);

function policy(rules) {
  const params = {
    sliding_window_log: { limit: LIMIT, window: `${WINDOW_S}s` },
    sliding_window: { algorithm: 'sliding_window', limit: LIMIT, window: `${WINDOW_S}s` },
    fixed_window: { algorithm: 'fixed_window', limit: LIMIT, window: `${WINDOW_S}s` },
    quota: { algorithm: 'quota', limit: LIMIT, period: 'day' },
    token_bucket: { algorithm: 'token_bucket', capacity: LIMIT, refill_rate: LIMIT / WINDOW_S },
  }[ARGS.algorithm];
  return {
    rules: NAMES.slice(0, rules).map((name) => ({ name, key: `${name}:{${name}}`, ...params })),
  };
}

/** A way to call one library: `call(i)` returns a Promise; `made` counts calls so far. */
function subject(call) {
  return { call, made: 0, sync: call.sync === true };
}

/**
 * Calls per second of `s.call(i)` for `seconds`, `inFlight` at a time. A
 * throttlegate denial stops the run (rate-limiter-flexible rejects).
 */
async function run(s, inFlight, seconds) {
  if (s.sync) return runSync(s, seconds);
  const start = s.made;
  const end = performance.now() + seconds * 1000;
  async function worker() {
    while (s.made < MAX_CALLS && performance.now() < end) {
      s.made += 1;
      const answer = await s.call(s.made);
      if (answer.allowed === false) throw new Error('throttlegate: unexpected denial');
    }
  }
  const t0 = performance.now();
  await Promise.all(Array.from({ length: inFlight }, worker));
  return ((s.made - start) * 1000) / (performance.now() - t0);
}

/** Calls per second of a synchronous `s.call(i)` for `seconds`, one after the other. */
function runSync(s, seconds) {
  const start = s.made;
  const t0 = performance.now();
  const end = t0 + seconds * 1000;
  while (s.made < MAX_CALLS && performance.now() < end) {
    for (let k = 0; k < 256; k++) {
      s.made += 1;
      if (s.call(s.made).allowed === false) throw new Error('throttlegate: unexpected denial');
    }
  }
  return ((s.made - start) * 1000) / (performance.now() - t0);
}

/**
 * Both libraries, each warmed up on keys of its own, then measured in
 * ROUNDS alternating rounds (SECONDS / ROUNDS each) on fresh keys: the best
 * round of each counts, so a burst of load from elsewhere on the machine
 * does not decide the ratio.
 */
async function compare(makeOurs, makeTheirs, inFlight) {
  const warm = Math.min(0.5, ARGS.seconds / 4);
  await run(subject(await makeOurs('warm')), inFlight, warm);
  await run(subject(await makeTheirs('warm')), inFlight, warm);
  const ours = subject(await makeOurs('run'));
  const theirs = subject(await makeTheirs('run'));
  const best = { ours: 0, theirs: 0 };
  for (let r = 0; r < ROUNDS; r++) {
    best.ours = Math.max(best.ours, await run(ours, inFlight, ARGS.seconds / ROUNDS));
    best.theirs = Math.max(best.theirs, await run(theirs, inFlight, ARGS.seconds / ROUNDS));
  }
  return best;
}

function throttlegateCall(limiter, rules) {
  const attrs = ATTRS[rules === 1 ? 0 : 1];
  if (ARGS.sync) {
    const call = (i) => limiter.checkSync(attrs[i % CLIENTS]);
    call.sync = true;
    return call;
  }
  return (i) => limiter.check(attrs[i % CLIENTS]);
}

function flexibleCall(limiters) {
  // RateLimiterUnion consumes the same key from every limiter; each has its
  // own key prefix, so one check touches one key per limit, as ours does.
  const target = limiters.length === 1 ? limiters[0] : new RateLimiterUnion(...limiters);
  return (i) => target.consume(KEYS[i % CLIENTS], 1);
}

async function main() {
  let redis = null;
  let url = ARGS.redisUrl;
  let pinned = false;
  if (!url && ARGS.backends.includes('redis')) {
    redis = await startRedis();
    url = redis.url;
    pinned = await pinToCpus(redis);
  }
  const client = url ? new Redis(url, { enableOfflineQueue: true, lazyConnect: false }) : null;
  const tag = `bench:${process.pid}:${Date.now()}`;
  const rows = [];
  try {
    for (const backend of ARGS.backends) {
      for (const rules of ARGS.rules) {
        for (const inFlight of ARGS.inFlight) {
          const limiters = [];
          const prefix = `${tag}:${backend}:${rules}:${inFlight}`;
          const { ours, theirs } = await compare(
            (phase) => {
              const limiter = new Limiter(policy(rules), {
                url: backend === 'redis' ? url : undefined,
                keyPrefix: `${prefix}:${phase}:tg:`,
                timeout: 5000,
                onBackendError: 'error',
              });
              limiters.push(limiter);
              return throttlegateCall(limiter, rules);
            },
            (phase) =>
              flexibleCall(
                NAMES.slice(0, rules).map((name) => {
                  const opts = { keyPrefix: `${prefix}:${phase}:rlf:${name}`, points: LIMIT, duration: WINDOW_S };
                  return backend === 'redis'
                    ? new RateLimiterRedis({ storeClient: client, ...opts })
                    : new RateLimiterMemory(opts);
                }),
              ),
            inFlight,
          );
          await Promise.all(limiters.map((l) => l.close()));
          rows.push({ backend, rules, inFlight, ours, theirs, algorithm: ARGS.algorithm, ...(ARGS.sync ? { api: 'checkSync' } : {}) });
          process.stderr.write('.');
        }
      }
    }
  } finally {
    if (client) client.disconnect();
    if (redis) await redis.stop();
  }
  process.stderr.write('\n');
  if (ARGS.json) fs.writeFileSync(ARGS.json, JSON.stringify(rows, null, 2) + '\n');
  const fmt = (n) => Math.round(n).toLocaleString('en-US');
  const where = !url
    ? 'no Redis'
    : ARGS.redisUrl
      ? 'the given Redis'
      : `a private redis-server${pinned ? ' (pinned to CPU 0, clients on CPU 1)' : ''}`;
  console.log(
    `node ${process.version}, ${where}, ${CLIENTS.toLocaleString('en-US')} clients, ` +
      `${LIMIT} per ${WINDOW_S} s per rule (throttlegate: ${ARGS.algorithm}${ARGS.sync ? ', checkSync' : ''}), ${ARGS.seconds} s per case and library (best of ${ROUNDS} ` +
      'alternating rounds), checks per second (higher is better)\n',
  );
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
