// Reserved rules (`reserve`) shared by processes: child processes hammering
// one key on one Redis admit at most the limit in total, with restarts and a
// child killed (SIGKILL) while it holds a reservation.
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
};

// A child: `checks` checks on the hot key, its limiter made anew `restarts`
// times (closed in between), then prints how many were admitted; with
// `hold`, it prints after 3 checks and waits to be killed.
const CHILD = `
const { Limiter } = require('throttlegate');
const [url, prefix, rule, checks, restarts, hold] = JSON.parse(process.argv[1]);
(async () => {
  let admitted = 0;
  const per = Math.floor(checks / (restarts + 1));
  for (let r = 0; r <= restarts; r++) {
    const l = new Limiter({ rules: [{ name: 'hot', key: 'k:{k}', ...rule }] },
      { url, keyPrefix: prefix, timeout: 5000, onBackendError: 'error' });
    for (let i = 0; i < (hold ? 3 : per); i++) if ((await l.check({ k: 'hot' })).allowed) admitted++;
    if (hold) { process.stdout.write(admitted + '\\n'); setInterval(() => {}, 1000); return; }
    l.close();
  }
  process.stdout.write(admitted + '\\n');
})().catch((e) => { console.error(e); process.exit(1); });
`;

function child(args) {
  const p = spawn(process.execPath, ['-e', CHILD, JSON.stringify(args)], { cwd: ROOT, stdio: ['ignore', 'pipe', 'inherit'] });
  const line = new Promise((resolve, reject) => {
    let out = '';
    p.stdout.on('data', (b) => {
      out += b;
      if (out.includes('\n')) resolve(Number(out.trim()));
    });
    p.on('exit', (code) => (code === 0 ? resolve(Number(out.trim())) : reject(new Error(`child exited ${code}`))));
  });
  return { p, line };
}

describe('reserve across processes', () => {
  let redis;
  before(async () => {
    redis = await startRedis();
  });
  after(() => redis.stop());

  for (const [algorithm, rule] of Object.entries(RULES)) {
    it(`${algorithm}: child processes on one reserved key never admit more than the limit`, async () => {
      const prefix = freshPrefix();
      const victim = child([redis.url, prefix, rule, 3, 0, true]);
      const held = await victim.line;
      victim.p.kill('SIGKILL');
      const counts = await Promise.all(
        Array.from({ length: 6 }, (_, i) => child([redis.url, prefix, rule, 300, i % 3, false]).line),
      );
      const total = held + counts.reduce((a, b) => a + b, 0);
      assert.ok(total <= rule.limit, `admitted ${total} of ${rule.limit}`);
      assert.ok(total >= rule.limit - rule.reserve, `admitted only ${total}`);
      // A bulk reply, "$<len>\r\n<period end>:<units>\r\n", or "$-1\r\n" for no key.
      const stored = (await redis.command(['GET', `${prefix}hot:k:hot`])).split('\r\n')[1];
      const count = stored ? Number(stored.split(':')[1]) : 0;
      assert.ok(count >= total && count <= total + rule.reserve, `stored ${count}, admitted ${total}`);
    });
  }

  it('one limiter answers as without reserve', async () => {
    const prefix = freshPrefix();
    const plain = new Limiter({ rules: [{ name: 'p', key: 'k:{k}', algorithm: 'fixed_window', limit: 30, window: '1h' }] },
      { url: redis.url, keyPrefix: prefix });
    const reserved = new Limiter({ rules: [{ name: 'r', key: 'k:{k}', algorithm: 'fixed_window', limit: 30, window: '1h', reserve: 7 }] },
      { url: redis.url, keyPrefix: prefix });
    for (let i = 0; i < 40; i++) {
      const cost = 1 + (i % 4);
      const a = await plain.check({ k: 'x' }, { cost });
      const b = await reserved.check({ k: 'x' }, { cost });
      assert.deepEqual([a.allowed, a.remaining], [b.allowed, b.remaining], `step ${i}`);
    }
    plain.close();
    reserved.close();
  });
});
