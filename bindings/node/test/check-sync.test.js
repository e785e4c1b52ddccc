// Limiter.checkSync: the embedded check answered synchronously, and a typed
// error (never a blocking network call) on a Redis limiter.
'use strict';

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { Limiter, ManualClock, ErrorCode } = require('throttlegate');
const { startRedis } = require('./helpers.js');

const START = 1_000_000_000_000;
const POLICY = { rules: [{ name: 'per-ip', key: 'ip:{ip}', limit: 3, window: '1m', algorithm: 'fixed_window' }] };

describe('checkSync', () => {
  it('returns the decision check would resolve to, consuming the same units', async () => {
    const a = new Limiter(POLICY, { clock: new ManualClock(START) });
    const b = new Limiter(POLICY, { clock: new ManualClock(START) });
    for (let i = 0; i < 5; i++) {
      const sync = a.checkSync({ ip: '10.0.0.1' });
      assert.ok(!(sync instanceof Promise));
      const async = await b.check({ ip: '10.0.0.1' });
      for (const field of ['allowed', 'limit', 'remaining', 'retryAfterMs', 'resetAfterMs', 'rule', 'degraded']) {
        assert.equal(sync[field], async[field], `check ${i}: ${field}`);
      }
      assert.deepEqual(sync.results, async.results);
      assert.deepEqual(sync.headers, async.headers);
    }
    // checkSync and check share the limiter's state.
    assert.equal((await a.peek({ ip: '10.0.0.1' })).remaining, 0);
    await a.close();
    await b.close();
  });

  it('reads each call\'s attributes under their own names, however the names change from call to call', async () => {
    const policy = {
      rules: [
        { name: 'ip', key: 'ip:{ip}', limit: 5, window: '1m', algorithm: 'fixed_window' },
        { name: 'user', key: 'user:{user}', limit: 5, window: '1m', algorithm: 'fixed_window' },
      ],
    };
    const l = new Limiter(policy, { clock: new ManualClock(START) });
    const other = new Limiter(policy, { clock: new ManualClock(START) });
    const applied = (d) => d.results.map((r) => `${r.rule}:${r.remaining}`).join(',');
    // The same names twice, then others of the same number, then in another order.
    assert.equal(applied(l.checkSync({ ip: 'a' })), 'ip:4');
    assert.equal(applied(l.checkSync({ ip: 'a' })), 'ip:3');
    assert.equal(applied(l.checkSync({ user: 'a' })), 'user:4');
    assert.equal(applied(other.checkSync({ ip: 'a' })), 'ip:4');
    assert.equal(applied(l.checkSync({ user: 'a' })), 'user:3');
    assert.equal(applied(l.checkSync({ user: 'b', ip: 'a' })), 'ip:2,user:4');
    assert.equal(applied(l.checkSync({ ip: 'a', user: 'b' })), 'ip:1,user:3');
    assert.equal(applied(l.checkSync({ ip: 'a', user: 'b' }, { cost: 1 })), 'ip:0,user:2');
    // A peek says what a check would leave, and consumes nothing.
    assert.equal(applied(await l.peek({ user: 'b' })), 'user:1');
    assert.equal(applied(await l.check({ user: 'b', region: 'x' })), 'user:1');
    assert.equal(applied(l.checkSync({ user: 'b', region: 'x' })), 'user:0');
    // A value that is not a string is reported under its own name.
    assert.throws(() => l.checkSync({ user: 5 }), /attributes\.user: expected a string/);
    assert.equal(applied(l.checkSync({ ip: 'c' })), 'ip:4');
    // An option's getter that checks other names on the same limiter, during the call.
    const options = {
      get cost() {
        assert.equal(applied(l.checkSync({ user: 'c' })), 'user:4');
        return 1;
      },
    };
    assert.equal(applied(l.checkSync({ ip: 'c' }, options)), 'ip:3');
    assert.equal(applied(l.checkSync({ ip: 'c' })), 'ip:2');
    assert.equal(applied(l.checkSync({ user: 'c' })), 'user:3');
    await l.close();
    await other.close();
  });

  it('takes a cost as a number or in the options of check', async () => {
    const l = new Limiter(POLICY, { clock: new ManualClock(START) });
    assert.equal(l.checkSync({ ip: 'a' }, 2).remaining, 1);
    assert.equal(l.checkSync({ ip: 'a' }, { cost: 2 }).allowed, false);
    assert.equal(l.checkSync({ ip: 'a' }, { cost: 1 }).remaining, 0);
    await l.close();
  });

  it('gives decisions that settle by their call id', async () => {
    const l = new Limiter(POLICY, { clock: new ManualClock(START) });
    const d = l.checkSync({ ip: 'b' }, { cost: 3, callId: 'call-1' });
    assert.equal(d.remaining, 0);
    assert.equal(await l.settle(d, 1), 1);
    // 2 units back: a check of 2 more is admitted, and uses them up.
    assert.equal(l.checkSync({ ip: 'b' }, 2).remaining, 0);
    await l.close();
  });

  it('gives decisions holding concurrency slots their lease id, which release frees', async () => {
    const l = new Limiter({ rules: [{ name: 'jobs', key: 'jobs:{t}', algorithm: 'concurrency', limit: 1, lease: '30s' }] });
    const d = l.checkSync({ t: 'a' });
    assert.equal(d.allowed, true);
    assert.equal(typeof d.leaseId, 'string');
    assert.equal(l.checkSync({ t: 'a' }).allowed, false);
    assert.equal(await l.release(d), 1);
    const byId = l.checkSync({ t: 'a' }, { callId: 'job-7' });
    assert.equal(byId.leaseId, 'job-7');
    assert.equal(await l.releaseCall({ t: 'a' }, 'job-7'), 1);
    assert.equal(l.checkSync({ t: 'a' }).allowed, true);
    l.close();
  });

  it('keeps each call its own attributes when an options getter checks again', async () => {
    const l = new Limiter(POLICY, { clock: new ManualClock(START) });
    const inner = [];
    const options = {
      get cost() {
        inner.push(l.checkSync({ ip: 'inner', route: 'r' }).remaining);
        return 1;
      },
    };
    assert.equal(l.checkSync({ ip: 'outer', route: 'r' }, options).remaining, 2);
    assert.equal((await l.check({ ip: 'outer' }, options)).remaining, 1);
    assert.deepEqual(inner, [2, 1]);
    assert.equal(l.checkSync({ ip: 'inner' }).remaining, 0);
    assert.equal(l.checkSync({ ip: 'outer' }).remaining, 0);
    await l.close();
  });

  it('throws bad arguments, with code, instead of rejecting', async () => {
    const l = new Limiter(POLICY, { clock: new ManualClock(START) });
    assert.throws(() => l.checkSync({ ip: 'a' }, { cost: -1 }), (err) => err.code === ErrorCode.InvalidArgument);
    assert.throws(() => l.checkSync('nope'), (err) => err.code === ErrorCode.InvalidArgument);
    await l.close();
    assert.throws(() => l.checkSync({ ip: 'a' }), (err) => err.code === ErrorCode.Closed);
  });

  describe('on Redis', () => {
    let redis;
    before(async () => {
      redis = await startRedis();
    });
    after(async () => {
      if (redis) await redis.stop();
    });

    it('throws invalid_argument naming the reason, and leaves check working', async () => {
      const l = new Limiter(POLICY, { url: redis.url, timeout: 5000 });
      assert.equal(l.backend, 'redis');
      assert.throws(
        () => l.checkSync({ ip: 'a' }),
        (err) => err.code === ErrorCode.InvalidArgument && /embedded backend/.test(err.message)
          && /'redis'/.test(err.message) && /block the event loop/.test(err.message),
      );
      assert.equal((await l.check({ ip: 'a' })).remaining, 2);
      assert.throws(() => l.checkSync({ ip: 'a' }), (err) => err.code === ErrorCode.InvalidArgument);
      await l.close();
    });
  });
});
