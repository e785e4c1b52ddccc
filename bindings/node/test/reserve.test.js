// Reserved rules (`reserve`) shared by processes: child processes hammering
// one key on one Redis admit at most the limit in total (a bucket: its
// capacity plus its refill over the run), for every algorithm that takes
// reserve, with restarts and a child killed (SIGKILL) while it holds a reservation.
'use strict';

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const path = require('node:path');
const { Limiter } = require('throttlegate');
const { startRedis, freshPrefix } = require('./helpers.js');

const ROOT = path.resolve(__dirname, '..', '..', '..');
const RULES = {
  fixed_window: { algorithm: 'fixed_window', limit: 600, window: '1h', reserve: 40 },
  quota: { algorithm: 'quota', limit: 500, period: 'day', reserve: 100, reserve_for: '200ms' },
  sliding_window_log: { algorithm: 'sliding_window_log', limit: 500, window: '1h', reserve: 40, reserve_for: '300ms' },
  sliding_window: { algorithm: 'sliding_window', limit: 500, window: '1h', reserve: 40 },
  token_bucket: { algorithm: 'token_bucket', capacity: 300, refill_rate: 50, reserve: 40 },
};

// What the rule admits at most over `seconds`.
const bound = (rule, seconds) => (rule.algorithm === 'token_bucket' ? rule.capacity + rule.refill_rate * seconds : rule.limit);

// A child: for every case [prefix, rule] at once, `checks` checks on the
// hot key, its limiter made anew `restarts` times (closed in between), then
// prints the admitted counts (one per case, as JSON); with `hold`, it prints
// after 3 checks of each case and waits to be killed.
const CHILD = `
const { Limiter } = require('throttlegate');
const [url, cases, checks, restarts, hold] = JSON.parse(process.argv[1]);
const one = async ([prefix, rule]) => {
  let admitted = 0;
  const per = Math.floor(checks / (restarts + 1));
  for (let r = 0; r <= restarts; r++) {
    const l = new Limiter({ rules: [{ name: 'hot', key: 'k:{k}', ...rule }] },
      { url, keyPrefix: prefix, timeout: 5000, onBackendError: 'error' });
    for (let i = 0; i < (hold ? 3 : per); i++) if ((await l.check({ k: 'hot' })).allowed) admitted++;
    if (hold) return admitted;
    l.close();
  }
  return admitted;
};
Promise.all(cases.map(one)).then((counts) => {
  process.stdout.write(JSON.stringify(counts) + '\\n');
  if (hold) setInterval(() => {}, 1000);
}, (e) => { console.error(e); process.exit(1); });
`;

function child(args) {
  const p = spawn(process.execPath, ['-e', CHILD, JSON.stringify(args)], { cwd: ROOT, stdio: ['ignore', 'pipe', 'inherit'] });
  const line = new Promise((resolve, reject) => {
    let out = '';
    p.stdout.on('data', (b) => {
      out += b;
      if (out.includes('\n')) resolve(JSON.parse(out.trim()));
    });
    p.on('exit', (code) => (code === 0 ? resolve(JSON.parse(out.trim())) : reject(new Error(`child exited ${code}`))));
  });
  return { p, line };
}

describe('reserve across processes', () => {
  let redis;
  // Every algorithm at once, each on a key of its own: a child killed
  // (SIGKILL) while it holds a reservation of each, then 4 children with
  // 0 to 2 restarts hammering all of them; per algorithm, the admitted total
  // and the seconds it took.
  const cases = Object.entries(RULES).map(([algorithm, rule]) => [algorithm, freshPrefix(), rule]);
  let totals;
  let seconds;
  before(async () => {
    redis = await startRedis();
    const started = process.hrtime.bigint();
    const args = cases.map(([, prefix, rule]) => [prefix, rule]);
    const victim = child([redis.url, args, 3, 0, true]);
    const held = await victim.line;
    victim.p.kill('SIGKILL');
    const counts = await Promise.all([0, 1, 2, 1].map((restarts) => child([redis.url, args, 300, restarts, false]).line));
    seconds = Number(process.hrtime.bigint() - started) / 1e9;
    totals = held.map((h, i) => h + counts.reduce((a, c) => a + c[i], 0));
  });
  after(() => redis.stop());

  cases.forEach(([algorithm, prefix, rule], i) => {
    it(`${algorithm}: child processes on one reserved key never admit more than the limit`, async () => {
      const total = totals[i];
      const most = bound(rule, seconds);
      assert.ok(total <= most, `admitted ${total} of ${most}`);
      if (algorithm === 'token_bucket') return;
      assert.ok(total >= rule.limit - rule.reserve, `admitted only ${total}`);
      if (algorithm !== 'fixed_window' && algorithm !== 'quota') return;
      // A bulk reply, "$<len>\r\n<period end>:<units>\r\n", or "$-1\r\n" for no key.
      const stored = (await redis.command(['GET', `${prefix}hot:k:hot`])).split('\r\n')[1];
      const count = stored ? Number(stored.split(':')[1]) : 0;
      assert.ok(count >= total && count <= total + rule.reserve, `stored ${count}, admitted ${total}`);
    });
  });

  for (const algorithm of ['fixed_window', 'sliding_window', 'token_bucket', 'sliding_window_log']) {
    it(`${algorithm}: one limiter answers as without reserve`, async () => {
      const prefix = freshPrefix();
      const rule = algorithm === 'token_bucket'
        ? { algorithm, capacity: 30, refill_rate: 0.001 }
        : { algorithm, limit: 30, window: '1h' };
      const plain = new Limiter({ rules: [{ name: 'p', key: 'k:{k}', ...rule }] }, { url: redis.url, keyPrefix: prefix });
      const reserved = new Limiter({ rules: [{ name: 'r', key: 'k:{k}', ...rule, reserve: 7, reserve_for: '1h' }] },
        { url: redis.url, keyPrefix: prefix });
      for (let i = 0; i < 40; i++) {
        const cost = 1 + (i % 4);
        const a = await plain.check({ k: 'x' }, { cost });
        const b = await reserved.check({ k: 'x' }, { cost });
        assert.equal(a.allowed, b.allowed, `step ${i}`);
        // A log answers from its reservation with the count of its last trip: never more.
        if (algorithm === 'sliding_window_log') assert.ok(b.remaining <= a.remaining, `step ${i}`);
        else assert.equal(a.remaining, b.remaining, `step ${i}`);
      }
      const stats = reserved.reserveStats();
      assert.deepEqual(Object.keys(stats).sort(), ['dropped', 'local', 'reserved', 'returned', 'trips']);
      assert.ok(stats.local > 0 && stats.reserved > 0, JSON.stringify(stats));
      plain.close();
      reserved.close();
    });
  }
});
