// Redis behind Sentinel: a redis+sentinel:// URL goes through the core's
// Sentinel path (the failover itself is tested in the core,
// core/tests/sentinel.rs).
'use strict';

const { describe, it } = require('node:test');
const assert = require('node:assert/strict');
const { Limiter } = require('throttlegate');
const { startRedis, startSentinel } = require('./helpers.js');

const POLICY = { rules: [{ name: 'r', key: 'ip:{ip}', limit: 2, window: '1m' }] };

describe('Sentinel', () => {
  it('checks on the primary the sentinel names', async () => {
    const redis = await startRedis();
    const sentinel = await startSentinel(redis.port);
    try {
      const limiter = new Limiter(POLICY, { url: sentinel.url, prefix: 'node-sentinel', strict: true, onBackendError: 'error' });
      const allowed = [];
      for (let i = 0; i < 3; i++) allowed.push((await limiter.check({ ip: '1.2.3.4' })).allowed);
      assert.deepEqual(allowed, [true, true, false]);
      assert.match(await redis.command(['KEYS', 'node-sentinel*']), /node-sentinel/);
      const other = new Limiter(POLICY, { url: sentinel.url.replace('/tg', '/nosuch'), timeout: 500, onBackendError: 'error', logger: null });
      await assert.rejects(other.check({ ip: '1.2.3.4' }), { message: /no primary from the sentinels/ });
    } finally {
      await sentinel.stop();
      await redis.stop();
    }
  });

  it('refuses a bad Sentinel URL, naming the form', () => {
    assert.throws(() => new Limiter(POLICY, { url: 'redis+sentinel://127.0.0.1:26379' }), {
      code: 'invalid_argument',
      message: /no SERVICE.*redis\+sentinel:\/\/\[user:password@\]host:port/,
    });
  });
});
