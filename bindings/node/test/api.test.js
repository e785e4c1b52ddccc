// Wiring of the public API on the embedded backend: exports, module
// systems, policies in every accepted form, decisions, headers, clocks.
'use strict';

const { describe, it } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const tg = require('throttlegate');
const { Limiter, Policy, ManualClock, ClientIp, ErrorCode, VERSION } = tg;

const fixtures = path.join(__dirname, 'fixtures');
const START = 1_000_000_000_000;
const RULES = {
  rules: [
    { name: 'per-ip', key: 'ip:{ip}', limit: 3, window: '1m' },
    { name: 'per-key', key: 'key:{api_key}', algorithm: 'token_bucket', capacity: 2, refill_rate: 0.5 },
  ],
};

describe('exports', () => {
  it('CommonJS exports the classes, the error codes and the version', () => {
    for (const name of ['Limiter', 'Policy', 'ManualClock', 'ClientIp']) {
      assert.equal(typeof tg[name], 'function', name);
    }
    assert.equal(VERSION, require('../../../package.json').version);
    assert.deepEqual(Object.values(ErrorCode).sort(), [
      'backend', 'backend_unavailable', 'closed', 'internal', 'invalid_argument', 'invalid_policy', 'io', 'timeout',
    ]);
  });

  it('ES modules see the same objects', async () => {
    const esm = await import('throttlegate');
    assert.equal(esm.Limiter, Limiter);
    assert.equal(esm.default.Policy, Policy);
    assert.equal(esm.parseRate, require('throttlegate').parseRate);
    const express = await import('throttlegate/express');
    assert.equal(express.rateLimit, require('throttlegate/express').rateLimit);
  });
});

describe('policies', () => {
  it('accepts a Policy, a TOML path, a JSON path and a plain object alike', async () => {
    const forms = [
      new Policy(RULES),
      path.join(fixtures, 'policy.toml'),
      path.join(fixtures, 'policy.json'),
      RULES,
      Policy.fromFile(path.join(fixtures, 'policy.json')),
      Policy.fromString(JSON.stringify(RULES)),
    ];
    for (const form of forms) {
      const limiter = new Limiter(form, { clock: new ManualClock(START) });
      assert.deepEqual(limiter.policy.ruleNames, ['per-ip', 'per-key']);
      const d = await limiter.check({ ip: '203.0.113.7', api_key: 'k1' });
      assert.equal(d.allowed, true);
      assert.equal(d.rule, 'per-key');
      assert.equal(d.remaining, 1);
      await limiter.close();
    }
  });

  it('reads the file settings and lets options override them', () => {
    const file = path.join(fixtures, 'policy.toml');
    const fromFile = new Limiter(file).policy.toJSON();
    assert.equal(fromFile.prefix, 'fixture:');
    assert.equal(fromFile.timeout, '250ms');
    assert.equal(fromFile.on_backend_error, 'deny');
    const over = new Limiter(file, { keyPrefix: 'other:', timeout: 40, onBackendError: 'error' }).policy.toJSON();
    assert.equal(over.prefix, 'other:');
    assert.equal(over.timeout, '40ms');
    assert.equal(over.on_backend_error, 'error');
    assert.equal(new Limiter(file, { timeout: '2s' }).policy.toJSON().timeout, '2s');
  });

  it('round-trips through toJSON', () => {
    const p = new Policy(RULES);
    assert.deepEqual(new Policy(p.toJSON()).toJSON(), p.toJSON());
    assert.equal(JSON.parse(JSON.stringify(p)).rules[1].refill_rate, 0.5);
  });
});

describe('decisions', () => {
  it('has camelCase fields, per-rule results and ordered headers', async () => {
    const limiter = new Limiter(RULES, { clock: new ManualClock(START) });
    const d = await limiter.check({ ip: '203.0.113.7' }, { cost: 2 });
    // A Decision instance: its toJSON() is every field as a plain object.
    assert.deepEqual(d.toJSON(), {
      allowed: true,
      limit: 3,
      remaining: 1,
      retryAfterMs: 0,
      resetAfterMs: 60000,
      rule: 'per-ip',
      results: [
        { rule: 'per-ip', allowed: true, shadow: false, limit: 3, remaining: 1, retryAfterMs: 0, resetAfterMs: 60000, windowMs: 60000 },
      ],
      degraded: false,
      leaseId: null,
      headers: {
        'RateLimit-Limit': '3',
        'RateLimit-Remaining': '1',
        'RateLimit-Reset': '60',
        'RateLimit-Policy': '"per-ip";q=3;w=60',
        RateLimit: '"per-ip";r=1;t=60',
      },
      problemJson: null,
    });
    assert.deepEqual(Object.keys(d.headers), [
      'RateLimit-Limit', 'RateLimit-Remaining', 'RateLimit-Reset', 'RateLimit-Policy', 'RateLimit',
    ]);
    const denied = await limiter.check({ ip: '203.0.113.7' }, { cost: 2 });
    assert.equal(denied.allowed, false);
    assert.equal(denied.retryAfterMs, 60000);
    assert.equal(denied.headers['Retry-After'], '60');
    assert.deepEqual(JSON.parse(denied.problemJson).violated_rules, ['per-ip']);
    await limiter.close();
  });

  it('answers unlimited when no rule applies', async () => {
    const limiter = new Limiter(RULES);
    const d = await limiter.check({ route: '/' });
    assert.equal(d.allowed, true);
    assert.equal(d.rule, null);
    assert.deepEqual(d.results, []);
    assert.deepEqual(d.headers, {});
  });

  it('treats undefined and null attribute values as absent', async () => {
    const limiter = new Limiter(RULES);
    assert.deepEqual(limiter.keys({ ip: '198.51.100.1', api_key: undefined }), ['throttlegate:per-ip:ip:198.51.100.1']);
    assert.deepEqual(limiter.keys({ ip: null, api_key: 'k' }), ['throttlegate:per-key:key:k']);
  });

  it('peeks without consuming, resets, counts stats', async () => {
    const clock = new ManualClock(START);
    const limiter = new Limiter(RULES, { clock });
    const who = { ip: '192.0.2.1' };
    assert.equal((await limiter.peek(who)).remaining, 2);
    assert.equal((await limiter.peek(who)).remaining, 2);
    await limiter.check(who);
    await limiter.check(who);
    assert.equal((await limiter.peek(who, { cost: 2 })).allowed, false);
    assert.equal(await limiter.reset(who), 1);
    assert.equal(await limiter.reset(who), 0);
    assert.equal((await limiter.check(who)).remaining, 2);
    const s = limiter.stats();
    assert.equal(s.calls, 6);
    assert.equal(s.allowed, 5);
    assert.equal(s.denied, 1);
    assert.equal(s.degradedAllowed, 0);
  });

  it('follows the manual clock', async () => {
    const clock = new ManualClock(START);
    const limiter = new Limiter({ rules: [{ name: 'w', key: 'ip:{ip}', limit: 1, window: '1s' }] }, { clock });
    assert.equal((await limiter.check({ ip: 'a' })).allowed, true);
    clock.advance(999.5);
    assert.equal(clock.nowUs, START + 999_500);
    const d = await limiter.check({ ip: 'a' });
    assert.equal(d.allowed, false);
    assert.equal(d.retryAfterMs, 1);
    clock.advance(0.5);
    assert.equal((await limiter.check({ ip: 'a' })).allowed, true);
    clock.set(START);
    assert.equal(clock.nowUs, START);
    assert.equal(new ManualClock().nowUs, 0);
  });

  it('makes a retried call with the same callId count once', async () => {
    const limiter = new Limiter(RULES, { clock: new ManualClock(START) });
    const a = await limiter.check({ ip: 'c' }, { callId: 'req-1' });
    const b = await limiter.check({ ip: 'c' }, { callId: 'req-1' });
    assert.equal(a.remaining, 2);
    assert.equal(b.remaining, 2);
  });

  it('adds legacy headers on request and hashes values with a key secret', async () => {
    const limiter = new Limiter(RULES, { legacyHeaders: true, keySecret: 's3cret' });
    const d = await limiter.check({ ip: '203.0.113.9' });
    assert.equal(d.headers['X-RateLimit-Limit'], '3');
    assert.equal(d.headers['X-RateLimit-Remaining'], '2');
    const [key] = limiter.keys({ ip: '203.0.113.9' });
    assert.ok(!key.includes('203.0.113.9'), key);
    const buf = new Limiter(RULES, { keySecret: Buffer.from('s3cret') });
    assert.deepEqual(buf.keys({ ip: '203.0.113.9' }), [key]);
  });

  it('closes: every call then fails with code closed', async () => {
    const limiter = new Limiter(RULES);
    assert.equal(limiter.backend, 'memory');
    assert.equal(limiter.closed, false);
    await limiter.close();
    await limiter.close();
    assert.equal(limiter.closed, true);
    assert.equal(limiter.backend, 'closed');
    for (const call of [() => limiter.check({ ip: 'a' }), () => limiter.peek({ ip: 'a' }), () => limiter.reset({ ip: 'a' }), () => limiter.ping()]) {
      await assert.rejects(call(), { code: 'closed', message: 'the limiter is closed' });
    }
    // As in every language: the counters, keys and policy still answer.
    assert.equal(limiter.stats().calls, 0);
    assert.deepEqual(limiter.keys({ ip: 'a' }).length, 1);
    assert.ok(limiter.policy.ruleNames.length > 0);
  });
});

describe('client addresses', () => {
  it('uses the socket peer unless the proxy is trusted', () => {
    const plain = new ClientIp();
    assert.equal(plain.clientIp('203.0.113.7', null, '1.1.1.1'), '203.0.113.7');
    const proxied = new ClientIp({ trustedProxies: ['10.0.0.0/8'] });
    assert.equal(proxied.clientIp('10.0.0.1', undefined, '6.6.6.6, 198.51.100.9, 10.0.0.2'), '198.51.100.9');
    assert.equal(proxied.clientIp('10.0.0.1', undefined, ['6.6.6.6', '198.51.100.9']), '198.51.100.9');
    assert.equal(proxied.clientIp('10.0.0.1', 'for=192.0.2.60;proto=http', '9.9.9.9'), '192.0.2.60');
    assert.equal(proxied.clientIp('198.51.100.1', null, '1.2.3.4'), '198.51.100.1');
  });

  it('groups IPv6 by prefix and maps IPv4-mapped addresses', () => {
    assert.equal(new ClientIp().clientIp('2001:db8:1:2:3:4:5:6'), '2001:db8:1:2::/64');
    assert.equal(new ClientIp({ ipv6Prefix: 48 }).clientIp('2001:db8:1:2:3:4:5:6'), '2001:db8:1::/48');
    assert.equal(new ClientIp().clientIp('::ffff:192.0.2.1'), '192.0.2.1');
    assert.equal(new ClientIp().clientIp('/run/app.sock'), null);
    assert.equal(new ClientIp().clientIp(undefined), null);
  });
});
