// Against real redis-servers: wiring, concurrency on one key, failure
// modes, and proof that waiting on Redis never blocks the event loop.
'use strict';

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { Limiter } = require('throttlegate');
const { startRedis, startRedisAt, startSilentServer, freePort, freshPrefix } = require('./helpers.js');

const RULES = { rules: [{ name: 'per-ip', key: 'ip:{ip}', limit: 100, window: '1h' }] };

/** Run `total` checks on one key, `inFlight` at a time; resolve to how many were admitted. */
async function hammer(limiter, total, inFlight) {
  let started = 0;
  let admitted = 0;
  async function worker() {
    while (started < total) {
      started += 1;
      const d = await limiter.check({ ip: '203.0.113.7' });
      if (d.allowed) admitted += 1;
    }
  }
  await Promise.all(Array.from({ length: inFlight }, worker));
  return admitted;
}

/** Count setInterval ticks while `promise` is pending. */
async function ticksWhile(promise) {
  let ticks = 0;
  const timer = setInterval(() => {
    ticks += 1;
  }, 5);
  try {
    const value = await promise;
    return { ticks, value };
  } finally {
    clearInterval(timer);
  }
}

describe('redis backend', () => {
  let redis;
  before(async () => {
    redis = await startRedis(['--enable-debug-command', 'yes']);
  });
  after(async () => {
    if (redis) await redis.stop();
  });

  it('checks, peeks and resets through Redis', async () => {
    const limiter = new Limiter(RULES, { url: redis.url, keyPrefix: freshPrefix('w'), timeout: 5000 });
    assert.equal(limiter.backend, 'redis');
    await limiter.ping();
    const d = await limiter.check({ ip: '192.0.2.1' }, { cost: 3 });
    assert.equal(d.allowed, true);
    assert.equal(d.remaining, 97);
    assert.equal(d.degraded, false);
    // a peek reports what a check of its cost would leave
    assert.equal((await limiter.peek({ ip: '192.0.2.1' })).remaining, 96);
    assert.equal(await limiter.reset({ ip: '192.0.2.1' }), 1);
    assert.equal((await limiter.check({ ip: '192.0.2.1' })).remaining, 99);
    await limiter.close();
    await assert.rejects(limiter.check({ ip: '192.0.2.1' }), { code: 'closed' });
  });

  it('admits exactly the limit from 64 concurrent promises on one key', async () => {
    const limiter = new Limiter(RULES, { url: redis.url, keyPrefix: freshPrefix('c'), timeout: 10000 });
    assert.equal(await hammer(limiter, 256, 64), 100);
    await limiter.close();
  });

  it('holds exactly the real costs after 16 concurrent promises check and settle', async () => {
    // A settle must come before 64 newer checks with call ids on its key (settled ids keep their
    // place, marked, so that a second settle counts nothing): 16 promises stay well within it.
    const rules = {
      rules: [
        { name: 'log', key: 'l:{ip}', limit: 150, window: '1h' },
        { name: 'bucket', key: 'b:{ip}', algorithm: 'token_bucket', capacity: 150, refill_rate: 0.0001 },
      ],
    };
    const limiter = new Limiter(rules, { url: redis.url, keyPrefix: freshPrefix('s'), timeout: 10000 });
    const a = { ip: '203.0.113.9' };
    let kept = 0;
    await Promise.all(
      Array.from({ length: 16 }, async (_, t) => {
        for (let i = 0; i < 16; i++) {
          const d = await limiter.check(a, { cost: 3, callId: `t${t}-${i}` });
          if (!d.allowed) continue;
          const real = (t + i) % 4;
          assert.equal(await limiter.settle(d, real), 2);
          assert.equal(await limiter.settle(d, 3), 0, 'a second settle counts nothing');
          kept += real;
        }
      }),
    );
    assert.ok(kept <= 150, `${kept} units kept of 150`);
    const d = await limiter.peek(a);
    assert.deepEqual(d.results.map((r) => r.remaining), Array(2).fill(Math.max(0, 150 - kept - 1)));
    await limiter.close();
  });

  it('keeps the event loop running while Redis is busy', async () => {
    const limiter = new Limiter(RULES, { url: redis.url, keyPrefix: freshPrefix('s'), timeout: 10000 });
    await limiter.ping();
    // DEBUG SLEEP blocks the server itself; the checks queue behind it.
    // Give the command time to reach the server before the checks are sent.
    const sleeping = redis.command(['DEBUG', 'SLEEP', '1']);
    await new Promise((r) => setTimeout(r, 100));
    const checks = Promise.all(Array.from({ length: 8 }, () => limiter.check({ ip: '198.51.100.4' })));
    const { ticks, value } = await ticksWhile(checks);
    await sleeping;
    assert.equal(value.length, 8);
    assert.ok(value.every((d) => d.allowed && !d.degraded));
    assert.ok(ticks >= 3, `timers fired ${ticks} times while checks waited`);
    await limiter.close();
  });
});

describe('embedded backend under concurrency', () => {
  it('admits exactly the limit from 64 concurrent promises on one key', async () => {
    const limiter = new Limiter(RULES);
    assert.equal(await hammer(limiter, 256, 64), 100);
  });
});

describe('backend failures', () => {
  let silent;
  let closedPort;
  before(async () => {
    silent = await startSilentServer();
    closedPort = await freePort();
  });
  after(async () => {
    if (silent) await silent.close();
  });

  it('answers from the failure policy when Redis hangs, without blocking timers', async () => {
    const allow = new Limiter(RULES, { url: silent.url, timeout: 300, onBackendError: 'allow' });
    const { ticks, value } = await ticksWhile(allow.check({ ip: '203.0.113.1' }));
    assert.equal(value.allowed, true);
    assert.equal(value.degraded, true);
    assert.ok(ticks >= 3, `timers fired ${ticks} times while the check waited`);
    assert.equal(allow.stats().timeouts, 1);
    assert.equal(allow.stats().degradedAllowed, 1);

    const deny = new Limiter(RULES, { url: silent.url, timeout: 100, onBackendError: 'deny' });
    const d = await deny.check({ ip: '203.0.113.1' });
    assert.equal(d.allowed, false);
    assert.equal(d.degraded, true);
    assert.ok(d.headers['Retry-After']);

    const error = new Limiter(RULES, { url: silent.url, timeout: 100, onBackendError: 'error' });
    await assert.rejects(error.check({ ip: '203.0.113.1' }), (err) => {
      assert.ok(err instanceof Error);
      assert.equal(err.code, 'timeout');
      assert.match(err.message, /100 ms/);
      return true;
    });
    await assert.rejects(error.ping(), { code: 'timeout' });
    await Promise.all([allow.close(), deny.close(), error.close()]);
  });

  // The limiter's own connection (the core's Wire, moved on this thread):
  // NOSCRIPT, a paused server and a restarted one.
  it('loads the script again after SCRIPT FLUSH, for every call of a tick', async () => {
    const redis = await startRedis();
    const limiter = new Limiter(RULES, { url: redis.url, keyPrefix: freshPrefix('f'), timeout: 5000, onBackendError: 'error' });
    try {
      assert.equal((await limiter.check({ ip: '192.0.2.9' })).remaining, 99);
      assert.equal(await redis.command(['SCRIPT', 'FLUSH']), '+OK\r\n');
      const tick = await Promise.all([limiter.check({ ip: '192.0.2.9' }), limiter.peek({ ip: '192.0.2.9' }), limiter.check({ ip: '192.0.2.9' })]);
      assert.deepEqual(tick.map((d) => d.remaining), [98, 97, 97]);
      assert.equal((await limiter.check({ ip: '192.0.2.9' }, { cost: 2 })).remaining, 95);
    } finally {
      await limiter.close();
      await redis.stop();
    }
  });

  it('checks over a Unix socket (redis+unix://), with the database the URL names', async () => {
    const sock = path.join(os.tmpdir(), `tg-${process.pid}-${Date.now()}.sock`);
    const server = await startRedis(['--unixsocket', sock, '--unixsocketperm', '700']);
    const limiter = new Limiter(RULES, { url: `redis+unix://${sock}?db=3`, keyPrefix: 'unix:', timeout: 5000, onBackendError: 'error' });
    try {
      assert.equal((await limiter.check({ ip: '192.0.2.12' }, { cost: 2 })).remaining, 98);
      assert.equal((await limiter.peek({ ip: '192.0.2.12' })).remaining, 97);
      // The state is in database 3, not 0.
      assert.equal(await server.command(['DBSIZE']), ':0\r\n');
      assert.notEqual(await server.command(['EVAL', "redis.call('SELECT', 3) return redis.call('DBSIZE')", '0']), ':0\r\n');
    } finally {
      await limiter.close();
      await server.stop();
      fs.rmSync(sock, { force: true });
    }
  });

  it('times out while Redis is paused, and answers again once it resumes', async () => {
    const paused = await startRedis();
    const limiter = new Limiter(RULES, { url: paused.url, keyPrefix: freshPrefix('p'), timeout: 200, onBackendError: 'error' });
    try {
      assert.equal((await limiter.check({ ip: '192.0.2.10' })).remaining, 99);
      process.kill(paused.pid, 'SIGSTOP');
      const late = await Promise.allSettled([limiter.check({ ip: '192.0.2.10' }), limiter.check({ ip: '192.0.2.10' })]);
      assert.deepEqual(late.map((r) => r.reason && r.reason.code), ['timeout', 'timeout']);
      assert.match(late[0].reason.message, /200 ms/);
      process.kill(paused.pid, 'SIGCONT');
      // The calls that timed out may still have been applied once Redis resumed.
      const d = await limiter.check({ ip: '192.0.2.10' });
      assert.equal(d.allowed, true);
      assert.ok([96, 97, 98].includes(d.remaining), `remaining ${d.remaining}`);
      assert.equal(limiter.stats().timeouts, 2);
    } finally {
      process.kill(paused.pid, 'SIGCONT');
      await limiter.close();
      await paused.stop();
    }
  });

  it('reconnects after Redis restarts, failing only the calls it could not send', async () => {
    let server = await startRedis();
    const port = server.port;
    const limiter = new Limiter(RULES, { url: server.url, keyPrefix: freshPrefix('r'), timeout: 2000, onBackendError: 'error' });
    try {
      assert.equal((await limiter.check({ ip: '192.0.2.11' })).remaining, 99);
      await server.stop();
      await assert.rejects(limiter.check({ ip: '192.0.2.11' }), { code: 'backend_unavailable' });
      server = await startRedisAt(port);
      assert.ok(server, 'redis-server came back on its port');
      // A new server: no state, no script loaded.
      assert.equal((await limiter.check({ ip: '192.0.2.11' })).remaining, 99);
      assert.equal((await limiter.check({ ip: '192.0.2.11' })).remaining, 98);
    } finally {
      await limiter.close();
      if (server) await server.stop();
    }
  });

  it('reports an unreachable Redis as backend_unavailable', async () => {
    const url = `redis://127.0.0.1:${closedPort}`;
    const error = new Limiter(RULES, { url, timeout: 2000, onBackendError: 'error' });
    await assert.rejects(error.check({ ip: '203.0.113.2' }), { code: 'backend_unavailable' });
    const allow = new Limiter(RULES, { url, timeout: 2000 });
    const d = await allow.check({ ip: '203.0.113.2' });
    assert.equal(d.allowed, true);
    assert.equal(d.degraded, true);
    await Promise.all([error.close(), allow.close()]);
  });
});
