// Error shapes and bad input: every failure is an Error with a stable
// `code` and a message naming what is wrong; nothing crashes the process.
'use strict';

const { describe, it } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { Limiter, Policy, ManualClock, ClientIp, ErrorCode } = require('throttlegate');

const fixtures = path.join(__dirname, 'fixtures');
const RULES = { rules: [{ name: 'per-ip', key: 'ip:{ip}', limit: 3, window: '1m' }] };

/** `fn()` throws an Error with `code` and a message matching `message`. */
function throwsCode(fn, code, message) {
  assert.throws(fn, (err) => {
    assert.ok(err instanceof Error, `not an Error: ${err}`);
    assert.equal(err.code, code, err.message);
    if (message) assert.match(err.message, message);
    return true;
  });
}

async function rejectsCode(promise, code, message) {
  assert.ok(promise instanceof Promise, 'expected a Promise');
  await assert.rejects(promise, (err) => {
    assert.ok(err instanceof Error, `not an Error: ${err}`);
    assert.equal(err.code, code, err.message);
    if (message) assert.match(err.message, message);
    return true;
  });
}

describe('policies', () => {
  it('rejects malformed policy objects with invalid_policy naming the field', () => {
    throwsCode(() => new Policy({ rules: [] }), ErrorCode.InvalidPolicy, /rules/);
    throwsCode(() => new Policy({ rules: [{ name: 'a', key: 'ip:{ip}', limit: 0, window: '1m' }] }), 'invalid_policy', /limit/);
    throwsCode(() => new Policy({ rules: [{ name: 'a', key: 'ip:{ip}', limit: 1, window: '1m', colour: 'red' }] }), 'invalid_policy', /colour/);
    throwsCode(() => new Policy({ rules: [{ name: 'a', key: 'ip:{ip}', algorithm: 'leaky', limit: 1, window: '1m' }] }), 'invalid_policy', /algorithm/);
    throwsCode(() => new Policy({ rules: [{ name: 'a', key: 'ip:{ip}', algorithm: 'token_bucket', capacity: 1, refill_rate: -1 }] }), 'invalid_policy', /refill_rate/);
    throwsCode(() => new Policy({ rules: [{ name: 'a', key: 'ip:{ip}', limit: 1.5, window: '1m' }] }), 'invalid_policy', /limit/);
    throwsCode(() => new Policy({ rules: [{ name: 'a', key: 'ip:{ip', limit: 1, window: '1m' }] }), 'invalid_policy', /key/);
    throwsCode(() => new Policy({ rules: [{ name: 'x'.repeat(10_000), key: 'ip:{ip}', limit: 1, window: '1m' }] }), 'invalid_policy', /name/);
    throwsCode(() => new Policy({ rules: [{ name: 'a', key: 'ip:{ip}', limit: 1, window: 'soon' }] }), 'invalid_policy', /window/);
    throwsCode(() => new Policy({ rules: 'none' }), 'invalid_policy', /rules/);
  });

  it('rejects values that are not policies', () => {
    for (const bad of [undefined, null, 42, true, [], () => 1]) {
      throwsCode(() => new Policy(bad), 'invalid_policy', /policy: expected an object/);
    }
    for (const bad of [undefined, null, 42, true, () => 1, Symbol('p')]) {
      throwsCode(() => new Limiter(bad), 'invalid_argument', /policy: expected a Policy, a path/);
    }
    throwsCode(() => new Limiter([]), 'invalid_policy', /array/);
    throwsCode(() => new Limiter(new ManualClock()), 'invalid_policy', /policy/);
    throwsCode(() => Policy.fromFile(42), 'invalid_argument', /path: expected a string/);
    throwsCode(() => Policy.fromString(undefined), 'invalid_argument', /text: expected a string/);
  });

  it('reports bad files: missing, malformed, unknown fields, not UTF-8, a directory', () => {
    throwsCode(() => new Limiter(path.join(fixtures, 'missing.toml')), 'io', /missing\.toml/);
    throwsCode(() => Policy.fromFile(path.join(fixtures, 'malformed.toml')), 'invalid_policy', /malformed\.toml.*TOML/s);
    throwsCode(() => new Limiter(path.join(fixtures, 'unknown-field.json')), 'invalid_policy', /colour/);
    throwsCode(() => new Limiter(path.join(fixtures, 'not-utf8.toml')), 'invalid_policy', /UTF-8/);
    throwsCode(() => new Limiter(fixtures), 'io', /fixtures/);
    throwsCode(() => Policy.fromString('{"rules": ['), 'invalid_policy', /JSON/);
  });
});

describe('limiter options', () => {
  it('rejects wrong types and unknown options, naming the option', () => {
    throwsCode(() => new Limiter(RULES, 42), 'invalid_argument', /options: expected an object/);
    throwsCode(() => new Limiter(RULES, { url: 42 }), 'invalid_argument', /options\.url: expected a string/);
    throwsCode(() => new Limiter(RULES, { url: 'http://127.0.0.1' }), 'invalid_argument', /url/);
    throwsCode(() => new Limiter(RULES, { timeout: -1 }), 'invalid_argument', /options\.timeout/);
    throwsCode(() => new Limiter(RULES, { timeout: 0 }), 'invalid_argument', /timeout/);
    throwsCode(() => new Limiter(RULES, { timeout: 'forever' }), 'invalid_argument', /options\.timeout/);
    throwsCode(() => new Limiter(RULES, { timeout: NaN }), 'invalid_argument', /finite/);
    throwsCode(() => new Limiter(RULES, { onBackendError: 'ignore' }), 'invalid_argument', /onBackendError/);
    throwsCode(() => new Limiter(RULES, { keyPrefix: 7 }), 'invalid_argument', /keyPrefix/);
    throwsCode(() => new Limiter(RULES, { keyPrefix: 'p'.repeat(1000) }), 'invalid_argument', /prefix/);
    throwsCode(() => new Limiter(RULES, { clock: 'lunar' }), 'invalid_argument', /options\.clock/);
    throwsCode(() => new Limiter(RULES, { clock: new Policy(RULES) }), 'invalid_argument', /options\.clock/);
    throwsCode(() => new Limiter(RULES, { keySecret: '' }), 'invalid_argument', /key_secret/);
    throwsCode(() => new Limiter(RULES, { keySecret: 5 }), 'invalid_argument', /keySecret/);
    throwsCode(() => new Limiter(RULES, { legacyHeaders: 'yes' }), 'invalid_argument', /legacyHeaders/);
    throwsCode(() => new Limiter(RULES, { denyCache: 1 }), 'invalid_argument', /options\.denyCache: expected a boolean, got a number/);
    throwsCode(() => new Limiter(RULES, { prefix: 7 }), 'invalid_argument', /options\.prefix/);
    throwsCode(() => new Limiter(RULES, { key_prefix: 'x:' }), 'invalid_argument', /unknown option "key_prefix"/);
    // undefined options and undefined values are "not given"
    assert.equal(new Limiter(RULES, undefined).backend, 'memory');
    assert.equal(new Limiter(RULES, { url: undefined, timeout: undefined }).backend, 'memory');
    assert.equal(new Limiter(RULES, { clock: 'system' }).backend, 'memory');
  });

  it('rejects bad clocks and client address options', () => {
    throwsCode(() => new ManualClock('now'), 'invalid_argument', /startUs/);
    throwsCode(() => new ManualClock(1.5), 'invalid_argument', /whole number/);
    throwsCode(() => new ManualClock().advance(-1), 'invalid_argument', /negative/);
    throwsCode(() => new ManualClock().advance(undefined), 'invalid_argument', /ms: expected a number/);
    throwsCode(() => new ManualClock().set(undefined), 'invalid_argument', /us/);
    throwsCode(() => new ClientIp({ trustedProxies: ['nope'] }), 'invalid_argument', /nope/);
    throwsCode(() => new ClientIp({ trustedProxies: '10.0.0.0/8' }), 'invalid_argument', /trustedProxies/);
    throwsCode(() => new ClientIp({ trustedProxies: [10] }), 'invalid_argument', /trustedProxies\[0\]/);
    throwsCode(() => new ClientIp({ ipv6Prefix: 0 }), 'invalid_argument', /options\.ipv6Prefix: must be between 1 and 128, not 0/);
    throwsCode(() => new ClientIp({ ipv6Prefix: 999 }), 'invalid_argument', /ipv6Prefix/);
    throwsCode(() => new ClientIp().clientIp(42), 'invalid_argument', /peer/);
    throwsCode(() => new ClientIp().clientIp('1.2.3.4', 5), 'invalid_argument', /forwarded/);
  });
});

describe('calls', () => {
  it('rejects (never throws) bad attributes and options', async () => {
    const limiter = new Limiter(RULES);
    await rejectsCode(limiter.check(), 'invalid_argument', /attributes: expected an object, got undefined/);
    await rejectsCode(limiter.check(null), 'invalid_argument', /attributes/);
    await rejectsCode(limiter.check('203.0.113.7'), 'invalid_argument', /attributes: expected an object, got a string/);
    await rejectsCode(limiter.check(['ip']), 'invalid_argument', /got an array/);
    await rejectsCode(limiter.check({ ip: 7 }), 'invalid_argument', /attributes\.ip: expected a string, got a number/);
    await rejectsCode(limiter.check({ ip: {} }), 'invalid_argument', /attributes\.ip/);
    await rejectsCode(limiter.check({ ip: 'a' }, 3), 'invalid_argument', /options/);
    await rejectsCode(limiter.check({ ip: 'a' }, { cost: 0 }), 'invalid_argument', /cost/);
    await rejectsCode(limiter.check({ ip: 'a' }, { cost: -1 }), 'invalid_argument', /cost/);
    await rejectsCode(limiter.check({ ip: 'a' }, { cost: 1.5 }), 'invalid_argument', /cost/);
    await rejectsCode(limiter.check({ ip: 'a' }, { cost: '1' }), 'invalid_argument', /cost/);
    await rejectsCode(limiter.check({ ip: 'a' }, { cost: 4 }), 'invalid_argument', /per-ip/);
    await rejectsCode(limiter.check({ ip: 'a' }, { cost: Number.MAX_VALUE }), 'invalid_argument', /cost/);
    await rejectsCode(limiter.check({ ip: 'a' }, { callId: 'has space' }), 'invalid_argument', /call_id/);
    await rejectsCode(limiter.check({ ip: 'a' }, { callId: 5 }), 'invalid_argument', /callId/);
    await rejectsCode(limiter.check({ ip: 'a' }, { costs: 1 }), 'invalid_argument', /unknown option "costs"/);
    await rejectsCode(limiter.peek({ ip: 'a' }, { callId: 'x' }), 'invalid_argument', /unknown option "callId"/);
    await rejectsCode(limiter.reset(undefined), 'invalid_argument', /attributes/);
    throwsCode(() => limiter.keys(5), 'invalid_argument', /attributes/);
    // nothing was consumed by the failed calls
    assert.equal((await limiter.check({ ip: 'a' })).remaining, 2);
  });

  it('copes with huge strings: keys stay bounded, the limiter keeps working', async () => {
    const limiter = new Limiter(RULES);
    const huge = 'x'.repeat(4 * 1024 * 1024);
    const d = await limiter.check({ ip: huge, [huge]: huge });
    assert.equal(d.allowed, true);
    assert.equal(d.remaining, 2);
    const [key] = limiter.keys({ ip: huge });
    assert.ok(key.length <= 128, `key of ${key.length} bytes`);
    assert.equal((await limiter.check({ ip: huge })).remaining, 1);
    assert.equal((await limiter.check({ ip: 'é\u0000{}:' })).allowed, true);
  });

  it('a failure in one call leaves the others unaffected', async () => {
    const limiter = new Limiter(RULES);
    const results = await Promise.allSettled([
      limiter.check({ ip: 'z' }),
      limiter.check({ ip: 3 }),
      limiter.check({ ip: 'z' }, { cost: 99 }),
      limiter.check({ ip: 'z' }),
    ]);
    assert.deepEqual(results.map((r) => r.status), ['fulfilled', 'rejected', 'rejected', 'fulfilled']);
  });
});

describe('errors and their codes', () => {
  it('every code is one of ErrorCode', async () => {
    const codes = new Set(Object.values(ErrorCode));
    const seen = [];
    try {
      new Limiter(path.join(os.tmpdir(), `tg-missing-${process.pid}.toml`));
    } catch (e) {
      seen.push(e.code);
    }
    try {
      new Policy({});
    } catch (e) {
      seen.push(e.code);
    }
    const l = new Limiter(RULES);
    await l.close();
    await l.check({}).catch((e) => seen.push(e.code));
    assert.deepEqual(seen, ['io', 'invalid_policy', 'closed']);
    for (const c of seen) assert.ok(codes.has(c), c);
  });

  it('keeps policy files it can read after a failed read', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tg-node-'));
    const file = path.join(dir, 'p.json');
    throwsCode(() => new Limiter(file), 'io');
    fs.writeFileSync(file, JSON.stringify(RULES));
    assert.equal(new Limiter(file).backend, 'memory');
    fs.rmSync(dir, { recursive: true, force: true });
  });
});
