// A concurrency rule on a real redis-server when a holder dies: a process
// holding every slot is killed with SIGKILL (it never releases); the slots
// come back when their lease ends, not before; and 64 concurrent tasks
// contending for them, each counting itself in and out of a Redis counter
// while it holds a slot, never see more than `limit` holders at once.
'use strict';

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { Limiter } = require('throttlegate');
const { startRedis, freshPrefix, redisCommand } = require('./helpers.js');

const LIMIT = 4;
const LEASE_MS = 2000;
const POLICY = { rules: [{ name: 'slots', key: 'slots:{job}', algorithm: 'concurrency', limit: LIMIT, lease: '2s' }] };
const ATTRS = { job: 'crash' };
const WORKERS = 64;
const ROOT = path.resolve(__dirname, '..', '..', '..');

// The holder: takes every slot, says so, then waits to be killed.
const HOLDER = `
const { Limiter } = require('throttlegate');
const [url, keyPrefix] = process.argv.slice(1);
const limiter = new Limiter(${JSON.stringify(POLICY)}, { url, keyPrefix });
(async () => {
  for (let i = 0; i < ${LIMIT}; i++) {
    const d = await limiter.check(${JSON.stringify(ATTRS)});
    if (!d.allowed) throw new Error('not admitted');
  }
  process.stdout.write('held\\n');
  setInterval(() => {}, 1000);
})();
`;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function redisInt(port, args) {
  const reply = await redisCommand(port, args);
  assert.ok(reply.startsWith(':'), reply);
  return Number(reply.slice(1).trim());
}

describe('concurrency slots of a killed holder', () => {
  let redis;
  before(async () => {
    redis = await startRedis();
  });
  after(async () => {
    await redis.stop();
  });

  it('come back after the lease, never more than the limit held', async () => {
    const keyPrefix = freshPrefix('crash');
    const counter = `${keyPrefix}holders`;
    const started = Date.now();
    const holder = spawn(process.execPath, ['-e', HOLDER, redis.url, keyPrefix], { cwd: ROOT, stdio: ['ignore', 'pipe', 'inherit'] });
    try {
      await new Promise((resolve, reject) => {
        let out = '';
        holder.stdout.on('data', (c) => {
          out += c;
          if (out.includes('held')) resolve();
        });
        holder.once('exit', (code) => reject(new Error(`the holder exited (${code}) before holding`)));
      });
    } finally {
      const gone = new Promise((r) => holder.once('exit', r));
      holder.kill('SIGKILL');
      await gone;
    }

    const limiter = new Limiter(POLICY, { url: redis.url, keyPrefix });
    let most = 0;
    let admitted = 0;
    let firstAdmission = null;
    const until = Date.now() + 30000;
    const worker = async () => {
      while (admitted < 20 * LIMIT && Date.now() < until) {
        const d = await limiter.check(ATTRS);
        if (!d.allowed) {
          await sleep(50);
          continue;
        }
        if (firstAdmission === null) firstAdmission = Date.now();
        admitted += 1;
        most = Math.max(most, await redisInt(redis.port, ['INCR', counter]));
        await sleep(5);
        await redisInt(redis.port, ['DECR', counter]);
        assert.equal(await limiter.release(d), 1);
      }
    };
    try {
      await Promise.all(Array.from({ length: WORKERS }, worker));
    } finally {
      await limiter.close();
    }
    assert.notEqual(firstAdmission, null, 'the killed holder\'s slots never came back');
    // Not before the lease: the holder took its slots after `started`.
    assert.ok(firstAdmission - started >= LEASE_MS, `admitted ${firstAdmission - started} ms after the holder started`);
    assert.ok(admitted >= 20 * LIMIT, `only ${admitted} admissions`);
    assert.ok(most >= 1 && most <= LIMIT, `${most} holders at once`);
    // Every holder counted itself out.
    assert.equal(await redisCommand(redis.port, ['GET', counter]), '$1\r\n0\r\n');
  });
});
