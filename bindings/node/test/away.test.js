// Redis away: the timeout bounds every call (the limiter's own connection,
// and the native queue of a cluster) against a black-hole server, a paused
// Redis and a refused port; a check that timed out never counts once Redis
// resumes; degraded decisions claim no count; outages reach the `logger`
// once, with their cause, and once when they end; `strict` fails fast.
'use strict';

const { describe, it } = require('node:test');
const assert = require('node:assert/strict');
const { Limiter } = require('throttlegate');
const { startRedis, startSilentServer, freePort, redisCommand } = require('./helpers.js');

// The units a sliding-window log holds: the sum of its entries' ("<time>" one unit,
// "<time>:<units>"), after the header if any (lua/sliding_window_log.lua).
const LOG_UNITS = "local n = 0 for _, e in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do if string.sub(e, 1, 1) ~= '-' then n = n + (tonumber(string.match(e, ':(%d+)$')) or 1) end end return n";

// What a call may take beyond its timeout on a shared, noisy machine.
const SLACK_MS = 80;
const BIG = { rules: [{ name: 'big', key: 'ip:{ip}', limit: 1000000, window: '1h' }] };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function limiter(url, timeout, extra = {}) {
  return new Limiter(BIG, { url, timeout, onBackendError: 'allow', logger: null, ...extra });
}

/** The longest of three degraded checks, in ms. */
async function longest(l) {
  let worst = 0;
  for (let i = 0; i < 3; i++) {
    const started = performance.now();
    const d = await l.check({ ip: 'a' });
    worst = Math.max(worst, performance.now() - started);
    assert.ok(d.degraded && d.allowed, JSON.stringify(d));
  }
  return worst;
}

describe('the timeout bounds every call', () => {
  for (const timeout of [100, 300]) {
    it(`within ${timeout} ms and the slack`, async () => {
      const hole = await startSilentServer();
      const paused = await startRedis();
      try {
        const targets = [
          ['black hole', hole.url],
          ['refused', `redis://127.0.0.1:${await freePort()}`],
          ['paused', paused.url],
          ['cluster black hole', `redis+cluster://127.0.0.1:${hole.port}`],
        ];
        for (const [name, url] of targets) {
          const l = limiter(url, timeout);
          if (name === 'paused') {
            assert.equal((await l.check({ ip: 'a' })).degraded, false);
            process.kill(paused.pid, 'SIGSTOP');
          }
          try {
            const worst = await longest(l);
            console.log(`  ${name}: timeout ${timeout} ms, longest call ${worst.toFixed(1)} ms`);
            assert.ok(worst <= timeout + SLACK_MS, `${name}: ${worst} ms`);
          } finally {
            if (name === 'paused') process.kill(paused.pid, 'SIGCONT');
            l.close();
          }
        }
      } finally {
        await hole.close();
        await paused.stop();
      }
    });
  }
});

describe('a timed-out check never counts', () => {
  it('counts in Redis equal the admissions callers saw, after SIGSTOP and SIGCONT', async () => {
    const redis = await startRedis();
    const l = limiter(redis.url, 100, { keyPrefix: 'away:' });
    const IN_FLIGHT = 8;
    let admitted = 0;
    let degraded = 0;
    let stop = false;
    async function worker() {
      while (!stop) {
        const d = await l.check({ ip: 'x' });
        if (d.degraded) degraded += 1;
        else if (d.allowed) admitted += 1;
      }
    }
    try {
      const workers = Array.from({ length: IN_FLIGHT }, worker);
      await sleep(150);
      process.kill(redis.pid, 'SIGSTOP');
      await sleep(400);
      process.kill(redis.pid, 'SIGCONT');
      await sleep(150);
      stop = true;
      await Promise.all(workers);
      await l.ping();
      const counted = Number((await redisCommand(redis.port, ['EVAL', LOG_UNITS, '1', 'away:big:ip:x'])).slice(1));
      assert.ok(degraded >= 2 * IN_FLIGHT, `the pause timed calls out (${degraded})`);
      // Every admission counts; a timed-out check counts only when its script
      // ran just before Redis stopped and its reply was held (the remaining
      // window: at most one per caller in flight). Without the deadline, every
      // check that timed out during the pause would count.
      assert.ok(counted >= admitted && counted <= admitted + IN_FLIGHT, `${counted} counted, ${admitted} admitted, ${degraded} degraded`);
    } finally {
      l.close();
      await redis.stop();
    }
  });
});

describe('degraded decisions', () => {
  it('claim no count, keep Retry-After on a denial and say degraded in the body', async () => {
    const down = `redis://127.0.0.1:${await freePort()}`;
    const allow = await limiter(down, 200, { legacyHeaders: true }).check({ ip: 'a' });
    assert.ok(allow.degraded && allow.allowed);
    assert.deepEqual(allow.headers, {
      'RateLimit-Limit': '1000000',
      'RateLimit-Policy': '"big";q=1000000;w=3600',
      'X-RateLimit-Limit': '1000000',
    });
    const deny = await new Limiter(BIG, { url: down, timeout: 200, onBackendError: 'deny', logger: null }).check({ ip: 'a' });
    assert.ok(deny.degraded && !deny.allowed);
    assert.equal(deny.headers['Retry-After'], '1');
    assert.equal(deny.headers['RateLimit-Remaining'], undefined);
    assert.equal(deny.headers.RateLimit, undefined);
    const body = JSON.parse(deny.problemJson);
    assert.equal(body.degraded, true);
    assert.deepEqual(body.violated_rules, ['big']);
  });
});

/** A logger that keeps its lines. */
function recorder() {
  const lines = { warn: [], info: [] };
  return { lines, logger: { warn: (m) => lines.warn.push(m), info: (m) => lines.info.push(m) } };
}

describe('outages are logged once', () => {
  it('refused: one warning for many failing calls', async () => {
    const { lines, logger } = recorder();
    const l = limiter(`redis://127.0.0.1:${await freePort()}`, 200, { logger });
    for (let i = 0; i < 20; i++) assert.ok((await l.check({ ip: 'a' })).degraded);
    await sleep(20);
    assert.equal(lines.warn.length, 1, lines.warn.join('\n'));
    assert.match(lines.warn[0], /outage \(refused\)/);
    assert.equal(lines.info.length, 0);
    l.close();
  });

  it('paused: one warning (timeout), one line when Redis is back', async () => {
    const redis = await startRedis();
    const { lines, logger } = recorder();
    const l = limiter(redis.url, 100, { logger });
    try {
      assert.equal((await l.check({ ip: 'a' })).degraded, false);
      process.kill(redis.pid, 'SIGSTOP');
      try {
        for (let i = 0; i < 5; i++) assert.ok((await l.check({ ip: 'a' })).degraded);
      } finally {
        process.kill(redis.pid, 'SIGCONT');
      }
      const until = Date.now() + 5000;
      while ((await l.check({ ip: 'a' })).degraded) assert.ok(Date.now() < until);
      await sleep(20);
      assert.equal(lines.warn.length, 1, lines.warn.join('\n'));
      assert.match(lines.warn[0], /outage \(timeout\)/);
      assert.equal(lines.info.length, 1);
      assert.match(lines.info[0], /recovered/);
    } finally {
      l.close();
      await redis.stop();
    }
  });

  it('by default: one process warning of type ThrottlegateWarning', async () => {
    const warnings = [];
    const listener = (w) => {
      if (w.name === 'ThrottlegateWarning') warnings.push(w.message);
    };
    process.on('warning', listener);
    try {
      const l = new Limiter(BIG, { url: `redis://127.0.0.1:${await freePort()}`, timeout: 200 });
      for (let i = 0; i < 10; i++) await l.check({ ip: 'a' });
      await sleep(50);
      assert.equal(warnings.length, 1, warnings.join('\n'));
      assert.match(warnings[0], /outage \(refused\)/);
      l.close();
    } finally {
      process.off('warning', listener);
    }
  });

  it('refuses a logger without warn', () => {
    assert.throws(() => new Limiter(BIG, { logger: { info() {} } }), { code: 'invalid_argument', message: /options\.logger/ });
    assert.throws(() => new Limiter(BIG, { logger: 'console' }), { code: 'invalid_argument' });
  });
});

describe('strict', () => {
  it('fails fast on a wrong URL, password or ACL', async () => {
    const redis = await startRedis();
    const hole = await startSilentServer();
    try {
      new Limiter(BIG, { url: redis.url, strict: true }).close();
      // Off by default: made whatever the URL.
      new Limiter(BIG, { url: `redis://127.0.0.1:${await freePort()}`, logger: null }).close();
      const refused = `redis://127.0.0.1:${await freePort()}`;
      assert.throws(() => new Limiter(BIG, { url: refused, strict: true }), {
        code: 'backend_unavailable',
        message: /^strict: /,
      });
      const started = performance.now();
      assert.throws(() => new Limiter(BIG, { url: hole.url, timeout: 300, strict: true }), { code: 'timeout' });
      assert.ok(performance.now() - started <= 300 + SLACK_MS);
      assert.match(await redis.command(['ACL', 'SETUSER', 'node-strict', 'on', '>right', '~*', '+@all']), /^\+OK/);
      const wrong = `redis://node-strict:wrong@127.0.0.1:${redis.port}`;
      assert.throws(() => new Limiter(BIG, { url: wrong, strict: true }), { code: 'backend', message: /PING/ });
      // Scripts denied by ACL: the core's one message names the cause and the fix, at start-up and at the first check.
      assert.match(await redis.command(['ACL', 'SETUSER', 'node-strict', '-evalsha', '-eval']), /^\+OK/);
      const right = `redis://node-strict:right@127.0.0.1:${redis.port}`;
      assert.throws(() => new Limiter(BIG, { url: right, strict: true }), {
        code: 'backend',
        message: /check script.*refuses scripts: .*NOPERM.*\+evalsha \+eval \+script\|load/,
      });
      const lazy = new Limiter(BIG, { url: right, onBackendError: 'error', logger: null });
      await assert.rejects(lazy.check({ ip: '203.0.113.1' }), { code: 'backend', message: /^redis refuses scripts: .*Lua module/ });
    } finally {
      await hole.close();
      await redis.stop();
    }
  });
});
