// The fast paths of check and peek: calls of one tick batched for Redis and
// settled each on its own, embedded calls answered in place, attributes
// packed into one string, and decisions whose results, headers and problem
// body are built by the core when first read. Every decision and error is
// compared with the expected one (fixtures/batch-steps.json, every field of
// every outcome of STEPS), on the embedded backend and on a real Redis.
'use strict';

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { Limiter, ManualClock } = require('throttlegate');
const { startRedis, freePort, freshPrefix } = require('./helpers.js');

const START = 1_000_000_000_000;
const POLICY = {
  rules: [
    { name: 'per-ip', key: 'ip:{ip}', limit: 3, window: '1m' },
    { name: 'per-key', key: 'key:{api_key}', algorithm: 'token_bucket', capacity: 2, refill_rate: 0.5 },
    { name: 'watch', key: 'ip:{ip}', limit: 2, window: '10s', shadow: true },
    { name: 'admin', key: 'route:{route}', limit: 2, window: '1s', match: { route: ['/admin'] } },
  ],
};
const FIELDS = [
  'allowed', 'limit', 'remaining', 'retryAfterMs', 'resetAfterMs', 'rule', 'results', 'degraded', 'leaseId', 'headers', 'problemJson',
];

/** The outcome of a settled call, comparable across paths: the decision's fields, or the error's code and message. */
function outcome(settled) {
  if (settled.status === 'rejected') {
    const e = settled.reason;
    assert.ok(e instanceof Error, `not an Error: ${e}`);
    return { code: e.code, message: e.message };
  }
  const d = settled.value;
  return typeof d.toJSON === 'function' ? d.toJSON() : d;
}

/** Every operation of `steps` against `limiter`, issued one tick at a time or all in one tick. */
async function play(limiter, steps, clock, { oneTick = false } = {}) {
  const call = (s) => {
    if (s.advance) {
      clock.advance(s.advance);
      return null;
    }
    return s.peek ? limiter.peek(s.attrs, s.options) : limiter.check(s.attrs, s.options);
  };
  if (oneTick) return (await Promise.allSettled(steps.map(call).filter((p) => p !== null))).map(outcome);
  const out = [];
  for (const s of steps) {
    const p = call(s);
    if (p !== null) out.push(outcome((await Promise.allSettled([p]))[0]));
  }
  return out;
}

const STEPS = [
  { attrs: { ip: '203.0.113.7', api_key: 'k1' } },
  { attrs: { ip: '203.0.113.7', api_key: 'k1' }, peek: true },
  { attrs: { ip: '203.0.113.7', api_key: 'k1' } },
  { attrs: { ip: '203.0.113.7', api_key: 'k1' }, options: { cost: 2 } },
  { attrs: { ip: '203.0.113.7' } },
  { attrs: { ip: '203.0.113.7' } },
  { advance: 1500.25 },
  { attrs: { ip: '203.0.113.7', api_key: 'k1', route: '/admin' } },
  { attrs: { ip: '198.51.100.1', route: '/admin' }, options: { cost: 2, callId: 'req-1' } },
  { attrs: { ip: '198.51.100.1', route: '/admin' }, options: { cost: 2, callId: 'req-1' } },
  { attrs: { ip: '198.51.100.1', route: '/admin' } },
  { attrs: { route: '/' } },
  { attrs: {} },
  { attrs: { ip: '203.0.113.7', api_key: null, tenant: undefined } },
  { attrs: { ip: 7 } },
  { attrs: 'ip' },
  { attrs: ['ip'] },
  { attrs: null },
  { attrs: { ip: 'x' }, options: { cost: 0 } },
  { attrs: { ip: 'x' }, options: { cost: 4 } },
  { attrs: { ip: 'x' }, options: { cost: '1' } },
  { attrs: { ip: 'x' }, options: { callId: 'has space' } },
  { attrs: { ip: 'x' }, options: { colour: 'red' } },
  { attrs: { ip: 'x' }, options: { callId: 'x' }, peek: true },
  { attrs: { ip: 'x' }, options: 5 },
  { advance: 60_000 },
  { attrs: { ip: '203.0.113.7', api_key: 'k1' }, options: { cost: 3 } },
  { attrs: { ip: '203.0.113.7', api_key: 'k1' } },
];

// The outcome of each call of STEPS (a decision, or an error's code and message).
const EXPECTED = require('./fixtures/batch-steps.json');

/** An expected outcome with `legacyHeaders`: the `X-RateLimit-*` copies added. */
function withLegacyHeaders(o) {
  if (!o.headers || !('RateLimit-Limit' in o.headers)) return o;
  const legacy = {};
  for (const h of ['Limit', 'Remaining', 'Reset']) legacy[`X-RateLimit-${h}`] = o.headers[`RateLimit-${h}`];
  return { ...o, headers: { ...o.headers, ...legacy } };
}

function makeLimiter(url, clock, extra = {}) {
  return new Limiter(POLICY, { url, clock, keyPrefix: freshPrefix('b'), timeout: 5000, ...extra });
}

async function playsAsExpected(url, extra = {}) {
  const clock = new ManualClock(START);
  const l = makeLimiter(url, clock, extra);
  try {
    const got = await play(l, STEPS, clock);
    // TG_UPDATE_FIXTURES=1 rewrites the fixture from the embedded backend (review the change).
    if (process.env.TG_UPDATE_FIXTURES && url === undefined && Object.keys(extra).length === 0) {
      require('node:fs').writeFileSync(require.resolve('./fixtures/batch-steps.json'), `${JSON.stringify(got, null, 2)}\n`);
    }
    const want = extra.legacyHeaders ? EXPECTED.map(withLegacyHeaders) : EXPECTED;
    assert.equal(got.length, want.length);
    for (let i = 0; i < got.length; i++) assert.deepEqual(got[i], want[i], `call ${i}`);
    // denials, shadow rules, buckets, unlimited decisions and errors all came up
    assert.ok(got.some((o) => o.allowed === false && o.problemJson));
    assert.ok(got.some((o) => o.results && o.results.some((r) => r.shadow && !r.allowed)));
    assert.ok(got.some((o) => o.rule === null && o.allowed));
    assert.ok(got.some((o) => o.code === 'invalid_argument'));
  } finally {
    await l.close();
  }
}

/** Attributes that the packed form cannot carry as they are, or that read oddly. */
function oddAttributes() {
  const withGetter = {};
  Object.defineProperty(withGetter, 'ip', { enumerable: true, get: () => 'from-getter' });
  const inherited = Object.create({ ip: 'inherited' });
  inherited.api_key = 'own';
  return [
    { ip: 'a\u0000b' },
    { 'i\u0000p': 'x', ip: 'nul-in-a-name' },
    { ip: 'é✓😀' },
    { ip: '\ud800lone' },
    { ip: '' },
    { ip: 'x'.repeat(5000) },
    { 7: 'seven', ip: 'numeric-name' },
    withGetter,
    inherited,
    Object.assign(Object.create(null), { ip: 'no-prototype' }),
    new Map([['ip', 'a-map']]),
  ];
}

async function oddAttributesKeepTheirKeys(url) {
  const limiter = new Limiter(
    { rules: [{ name: 'one', key: 'ip:{ip}', limit: 1, window: '1h' }, { name: 'k', key: 'key:{api_key}', limit: 1, window: '1h' }] },
    { url, keyPrefix: freshPrefix('o'), timeout: 5000 },
  );
  try {
    for (const attrs of oddAttributes()) {
      const first = await limiter.check(attrs);
      const again = await limiter.check(attrs);
      // keys() and reset() read the object itself: they must find the keys the checks used
      if (first.rule === null) {
        assert.equal(again.rule, null, JSON.stringify(attrs));
        assert.deepEqual(limiter.keys(attrs), [], JSON.stringify(attrs));
        continue;
      }
      assert.equal(first.allowed, true, JSON.stringify(attrs));
      assert.equal(again.allowed, false, JSON.stringify(attrs));
      assert.equal(limiter.keys(attrs).length, first.results.length, JSON.stringify(attrs));
      assert.equal(await limiter.reset(attrs), limiter.keys(attrs).length);
    }
  } finally {
    await limiter.close();
  }
}

describe('decisions', () => {
  it('serialise every field, in order, with JSON.stringify and toJSON', async () => {
    const limiter = new Limiter(POLICY, { clock: new ManualClock(START), legacyHeaders: true });
    const d = await limiter.check({ ip: '192.0.2.1', api_key: 'k' }, { cost: 2 });
    const json = JSON.parse(JSON.stringify(d));
    assert.deepEqual(Object.keys(json), FIELDS);
    assert.deepEqual(json, d.toJSON());
    assert.deepEqual(json.headers, {
      'RateLimit-Limit': '2',
      'RateLimit-Remaining': '0',
      'RateLimit-Reset': '4',
      'RateLimit-Policy': '"per-ip";q=3;w=60, "per-key";q=2;w=4',
      RateLimit: '"per-ip";r=1;t=60, "per-key";r=0;t=4',
      'X-RateLimit-Limit': '2',
      'X-RateLimit-Remaining': '0',
      'X-RateLimit-Reset': '4',
    });
    assert.deepEqual(json.results.map((r) => r.rule), ['per-ip', 'per-key', 'watch']);
    assert.equal(json.problemJson, null);
    // the headline fields are plain properties; the lazy ones are made once and kept
    assert.deepEqual(Object.keys(d), ['allowed', 'limit', 'remaining', 'retryAfterMs', 'resetAfterMs', 'rule', 'degraded', 'leaseId']);
    assert.equal(d.headers, d.headers);
    assert.equal(d.results, d.results);
    for (const field of FIELDS) assert.ok(field in d, field);
    assert.match(require('node:util').inspect(d), /RateLimit-Policy/);
    // and can be replaced, as plain properties could
    d.headers = { 'X-Own': '1' };
    assert.deepEqual(d.toJSON().headers, { 'X-Own': '1' });
  });

  it('keep their own numbers while many more decisions are made', async () => {
    const limiter = new Limiter(POLICY, { clock: new ManualClock(START) });
    const first = await limiter.check({ ip: '192.0.2.9', api_key: 'k' });
    const want = (await new Limiter(POLICY, { clock: new ManualClock(START) }).check({ ip: '192.0.2.9', api_key: 'k' })).toJSON();
    for (let i = 0; i < 5000; i++) await limiter.check({ ip: `10.0.${i >> 8}.${i & 255}` });
    // nothing lazy was read before: the numbers behind it were its own
    assert.deepEqual(first.toJSON(), want);
  });
});

describe('embedded backend, answered in place', () => {
  it('gives the expected decisions and errors', async () => {
    await playsAsExpected(undefined);
    await playsAsExpected(undefined, { legacyHeaders: true, keySecret: 's3cret' });
  });

  it('gives the same outcomes when every call is issued in one tick', async () => {
    const clock = new ManualClock(START);
    const steps = STEPS.filter((s) => !s.advance);
    const got = await play(makeLimiter(undefined, clock), steps, clock, { oneTick: true });
    const want = await play(makeLimiter(undefined, clock), steps, clock);
    assert.deepEqual(got, want);
    assert.ok(got.some((o) => o.allowed === false) && got.some((o) => o.code));
  });

  it('reads attributes the packed form cannot carry from the object itself', async () => {
    await oddAttributesKeepTheirKeys(undefined);
  });

  it('reads packed attributes whole, whatever character meets the end of a buffer', async () => {
    const limiter = new Limiter({ rules: [{ name: 'one', key: 'ip:{ip}', limit: 1, window: '1h' }] });
    for (let n = 0; n < 700; n++) {
      // the `\0` inside sends the call to the object, unless the packed text
      // was read cut short before the emoji (a prefix holding as many `\0`s as a packed pair)
      const attrs = { ip: `a\u0000${'x'.repeat(n)}\u{1F600}` };
      assert.equal((await limiter.check(attrs)).allowed, true, `length ${n}`);
      assert.equal(await limiter.reset(attrs), 1, `length ${n}`);
    }
  });

  it('answers a limiter closed before its first call with code closed', async () => {
    const limiter = new Limiter(POLICY);
    await limiter.close();
    await assert.rejects(limiter.check({ ip: 'a' }), { code: 'closed', message: 'the limiter is closed' });
    await assert.rejects(limiter.peek({ ip: 'a' }), { code: 'closed' });
  });
});

describe('redis backend, calls of one tick batched', () => {
  let redis;
  before(async () => {
    redis = await startRedis();
  });
  after(async () => {
    if (redis) await redis.stop();
  });

  it('gives the expected decisions and errors, as the embedded backend does', async () => {
    await playsAsExpected(redis.url);
    await playsAsExpected(redis.url, { legacyHeaders: true });
  });

  it('settles each call of a tick on its own: mixed arguments, kinds and outcomes', async () => {
    const limiter = new Limiter(POLICY, { url: redis.url, keyPrefix: freshPrefix('t'), timeout: 5000 });
    const reference = new Limiter(POLICY); // errors are the same on every backend, and answered in place there
    try {
      const mixed = [
        ['check', { ip: 'a' }],
        ['check', { ip: 7 }],
        ['check', { ip: 'a' }, { cost: 0 }],
        ['check', { ip: 'a' }, { cost: 50 }],
        ['check', { ip: 'a' }, { callId: 'bad id!' }],
        ['peek', { ip: 'a' }],
        ['check', { ip: 'a' }],
        ['peek', { ip: 'a' }, { callId: 'x' }],
        ['check', { ip: 'a' }],
        ['check', undefined],
        ['check', { route: '/' }],
        ['check', { ip: 'a' }],
        ['check', { ip: 'b' }, { cost: 2 }],
        ['check', { ip: 'b' }, { cost: 2 }],
      ];
      const issue = (l) => mixed.map(([op, attrs, options]) => l[op](attrs, options));
      const got = (await Promise.allSettled(issue(limiter))).map(outcome);
      const errors = (await Promise.allSettled(issue(reference))).map(outcome);
      for (const i of [1, 2, 3, 4, 7, 9]) {
        assert.ok(got[i].code, `call ${i} should fail`);
        assert.deepEqual(got[i], errors[i], `call ${i}`);
      }
      // four checks of cost 1 on `a` against a limit of 3: three admitted, one denied
      const onA = [0, 6, 8, 11].map((i) => got[i]);
      assert.equal(onA.filter((d) => d.allowed).length, 3);
      const denied = onA.find((d) => !d.allowed);
      assert.equal(denied.rule, 'per-ip');
      assert.ok(denied.headers['Retry-After']);
      assert.deepEqual(JSON.parse(denied.problemJson).violated_rules, ['per-ip']);
      assert.equal(typeof got[5].allowed, 'boolean');
      assert.equal(got[10].rule, null);
      // twice cost 2 on `b` against 3: whichever ran first took what the other needed
      assert.equal([got[12], got[13]].filter((d) => d.allowed).length, 1);
      // the failed calls consumed nothing: `a` is full, `b` too
      assert.equal((await limiter.peek({ ip: 'a' })).allowed, false);
      assert.equal(await limiter.reset({ ip: 'a' }), limiter.keys({ ip: 'a' }).length);
      assert.equal((await limiter.check({ ip: 'a' }, { cost: 2 })).remaining, 1);
    } finally {
      await limiter.close();
    }
  });

  it('admits exactly the limit from hundreds of calls issued in one tick', async () => {
    const limiter = new Limiter(POLICY, { url: redis.url, keyPrefix: freshPrefix('h'), timeout: 10000 });
    try {
      const all = await Promise.all(Array.from({ length: 300 }, (_, i) => limiter.check({ ip: `c${i % 10}` })));
      assert.equal(all.filter((d) => d.allowed).length, 30);
      const stats = limiter.stats();
      assert.equal(stats.calls, 300);
      assert.equal(stats.allowed, 30);
    } finally {
      await limiter.close();
    }
  });

  it('reads attributes the packed form cannot carry from the object itself', async () => {
    await oddAttributesKeepTheirKeys(redis.url);
  });

  it('rejects with code closed the calls queued when the limiter closes', async () => {
    const limiter = new Limiter(POLICY, { url: redis.url, keyPrefix: freshPrefix('c'), timeout: 5000 });
    await limiter.ping();
    const queued = [limiter.check({ ip: 'a' }), limiter.peek({ ip: 'a' })];
    const closing = limiter.close();
    for (const r of await Promise.allSettled(queued)) {
      assert.equal(r.status, 'rejected');
      assert.equal(r.reason.code, 'closed');
    }
    await closing;
  });

  it('remembers denials with denyCache: no round trip while they last, forgotten by reset', async () => {
    const evalCalls = async () => Number(/cmdstat_evalsha:calls=(\d+)/.exec(await redis.command(['INFO', 'commandstats']))[1]);
    const rules = { rules: [{ name: 'per-ip', key: 'ip:{ip}', limit: 2, window: '1h' }] };
    const limiter = new Limiter(rules, { url: redis.url, keyPrefix: freshPrefix('d'), timeout: 5000, denyCache: true });
    try {
      const who = { ip: '203.0.113.50' };
      assert.deepEqual([(await limiter.check(who)).allowed, (await limiter.check(who)).allowed], [true, true]);
      const denied = await limiter.check(who);
      assert.equal(denied.allowed, false);
      const sent = await evalCalls();
      const again = await Promise.all(Array.from({ length: 20 }, () => limiter.check(who)));
      assert.ok(again.every((d) => !d.allowed && d.rule === 'per-ip' && d.headers['Retry-After']));
      assert.equal(await evalCalls(), sent);
      assert.equal(await limiter.reset(who), 1);
      assert.equal((await limiter.check(who)).allowed, true);
      assert.equal(await evalCalls(), sent + 1);
    } finally {
      await limiter.close();
    }
  });

  it('fails or degrades each call of a tick when Redis cannot be reached', async () => {
    const url = `redis://127.0.0.1:${await freePort()}`;
    const error = new Limiter(POLICY, { url, timeout: 2000, onBackendError: 'error', logger: null });
    const calls = await Promise.allSettled(Array.from({ length: 5 }, () => error.check({ ip: 'a' })));
    assert.deepEqual(calls.map((r) => r.reason && r.reason.code), Array(5).fill('backend_unavailable'));
    const deny = new Limiter(POLICY, { url, timeout: 2000, onBackendError: 'deny', clock: new ManualClock(START), logger: null });
    const denials = await Promise.all(Array.from({ length: 5 }, () => deny.check({ ip: 'a', api_key: 'k' })));
    // every rule denies for a second, none has a state to report
    const results = POLICY.rules.slice(0, 3).map((r) => ({
      rule: r.name,
      allowed: false,
      shadow: Boolean(r.shadow),
      limit: r.limit || r.capacity,
      remaining: 0,
      retryAfterMs: 1000,
      resetAfterMs: 0,
      windowMs: { 'per-ip': 60_000, 'per-key': 4000, watch: 10_000 }[r.name],
    }));
    for (const d of denials) {
      assert.deepEqual(d.toJSON(), {
        allowed: false,
        limit: 3,
        remaining: 0,
        retryAfterMs: 1000,
        resetAfterMs: 0,
        rule: 'per-ip',
        results,
        degraded: true,
        leaseId: null,
        // Degraded: no count is claimed that Redis never gave.
        headers: {
          'RateLimit-Limit': '3',
          'RateLimit-Policy': '"per-ip";q=3;w=60, "per-key";q=2;w=4',
          'Retry-After': '1',
        },
        problemJson: JSON.stringify({
          degraded: true,
          detail: 'rate limit backend unavailable; denied by the failure policy of: per-ip, per-key',
          retry_after: 1,
          status: 429,
          title: 'Too Many Requests',
          type: 'about:blank',
          violated_rules: ['per-ip', 'per-key'],
        }),
      });
    }
    await Promise.all([error.close(), deny.close()]);
  });
});
