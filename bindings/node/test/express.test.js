// The Express example and the middleware, behind real HTTP servers on
// loopback, driven by a real HTTP client (fetch).
'use strict';

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const express = require('express');
const { Limiter, ManualClock } = require('throttlegate');
const { rateLimit } = require('throttlegate/express');
const { startRedis, startSilentServer, freshPrefix } = require('./helpers.js');

const { createApp } = require(path.resolve(__dirname, '..', '..', '..', 'examples', 'express_app.js'));

/** Listen on a free loopback port; resolve to `{ url, close() }`. */
function serve(app) {
  return new Promise((resolve) => {
    const server = app.listen(0, '127.0.0.1', () => {
      resolve({
        url: `http://127.0.0.1:${server.address().port}`,
        close: () => new Promise((r) => server.close(() => r())),
      });
    });
  });
}

async function exerciseExample(options) {
  const { app, limiter, tokens } = createApp(options);
  const srv = await serve(app);
  try {
    for (let i = 0; i < 10; i++) {
      const res = await fetch(`${srv.url}/`);
      assert.equal(res.status, 200);
      assert.equal(res.headers.get('ratelimit-limit'), '10');
      assert.equal(res.headers.get('ratelimit-remaining'), String(9 - i));
      assert.equal(res.headers.get('ratelimit-policy'), '"per-ip";q=10;w=60');
      assert.equal(res.headers.get('retry-after'), null);
      assert.deepEqual(await res.json(), { hello: 'world', remaining: 9 - i });
    }
    const denied = await fetch(`${srv.url}/`);
    assert.equal(denied.status, 429);
    assert.equal(denied.headers.get('content-type'), 'application/problem+json');
    assert.equal(denied.headers.get('retry-after'), '60');
    assert.equal(denied.headers.get('ratelimit-remaining'), '0');
    const body = await denied.json();
    assert.equal(body.status, 429);
    assert.deepEqual(body.violated_rules, ['per-ip']);
    // /metrics: the limiter's per-rule metrics for Prometheus, never limited.
    for (let i = 0; i < 2; i++) {
      const metrics = await fetch(`${srv.url}/metrics`);
      assert.equal(metrics.status, 200);
      assert.match(metrics.headers.get('content-type'), /^application\/openmetrics-text/);
      assert.equal(metrics.headers.get('ratelimit-limit'), null);
      const text = await metrics.text();
      assert.ok(text.includes('throttlegate_checks_total{rule="per-ip"} 11\n'), text);
      assert.ok(text.includes('throttlegate_decisions_total{rule="per-ip",outcome="denied"} 1\n'), text);
      assert.ok(text.endsWith('# EOF\n'));
    }
  } finally {
    await srv.close();
    await limiter.close();
    await tokens.close();
  }
}

describe('examples/express_app.js', () => {
  let redis;
  before(async () => {
    redis = await startRedis();
  });
  after(async () => {
    if (redis) await redis.stop();
  });

  it('limits clients on the embedded backend', () => exerciseExample({ clock: new ManualClock(1e12) }));

  it('limits clients on Redis', () => exerciseExample({ url: redis.url, keyPrefix: freshPrefix('x'), timeout: 5000 }));

  it('settles the real cost of /generate after the response', async () => {
    const { app, limiter, tokens } = createApp({ clock: new ManualClock(1e12) });
    const srv = await serve(app);
    try {
      const generate = (prompt) =>
        fetch(`${srv.url}/generate`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-tenant': 't1' },
          body: JSON.stringify({ prompt }),
        });
      // 3 words cost 30 of the estimated 100: 70 come back.
      let res = await generate('one two three');
      assert.equal(res.status, 200);
      assert.deepEqual(await res.json(), { estimated: 100, used: 30, settled: 1 });
      // 15 words cost 150: 50 more than estimated are taken after the response.
      res = await generate('w '.repeat(15));
      assert.deepEqual(await res.json(), { estimated: 100, used: 150, settled: 1 });
      assert.equal((await tokens.peek({ tenant: 't1' }, { cost: 20 })).remaining, 0);
      // 20 tokens are left: the next estimate of 100 does not fit.
      res = await generate('hello');
      assert.equal(res.status, 429);
      assert.equal(res.headers.get('ratelimit-remaining'), '20');
      assert.deepEqual((await res.json()).violated_rules, ['tokens']);
    } finally {
      await srv.close();
      await limiter.close();
      await tokens.close();
    }
  });

  it('limits login attempts per client behind a trusted proxy, however /login is spelled', async () => {
    const { app, limiter, tokens } = createApp({ trustedProxies: ['127.0.0.1'] });
    const srv = await serve(app);
    try {
      const login = (client, target = '/login') =>
        fetch(`${srv.url}${target}`, { method: 'POST', headers: { 'X-Forwarded-For': client } });
      for (const target of ['/login', '/LOGIN', '/Login/']) assert.equal((await login('198.51.100.1', target)).status, 200);
      for (const target of ['/login', '/login/', '/LOGIN?x=1']) {
        const denied = await login('198.51.100.1', target);
        assert.equal(denied.status, 429);
        assert.deepEqual((await denied.json()).violated_rules, ['login']);
      }
      // Another client behind the same proxy has its own budget.
      assert.equal((await login('198.51.100.2')).status, 200);
      // GETs are not login attempts.
      assert.equal((await fetch(`${srv.url}/`, { headers: { 'X-Forwarded-For': '198.51.100.1' } })).status, 200);
    } finally {
      await srv.close();
      await limiter.close();
      await tokens.close();
    }
  });

  it('limits signups with the route limit written on the route', async () => {
    const { app, limiter, tokens } = createApp({ clock: new ManualClock(1e12) });
    const srv = await serve(app);
    try {
      const signup = () => fetch(`${srv.url}/signup`, { method: 'POST' });
      for (let i = 0; i < 2; i++) {
        const res = await signup();
        assert.equal(res.status, 200);
        // The policy's per-ip rule and the route limit, in one check.
        assert.match(res.headers.get('ratelimit-policy'), /"per-ip";q=10;w=60, "[^"]+";q=2;w=60/);
      }
      const denied = await signup();
      assert.equal(denied.status, 429);
      assert.equal((await denied.json()).violated_rules.length, 1);
      // The denied signup took nothing from the per-ip budget: 2 of 10 used.
      assert.equal((await fetch(`${srv.url}/`)).headers.get('ratelimit-remaining'), '7');
    } finally {
      await srv.close();
      await limiter.close();
      await tokens.close();
    }
  });
});

describe('rateLimit middleware', () => {
  const RULES = { rules: [{ name: 'per-ip', key: 'ip:{ip}', limit: 2, window: '1m' }] };

  async function withApp(middleware, fn) {
    const app = express();
    app.use(middleware);
    app.get('/', (req, res) => res.send('ok'));
    const srv = await serve(app);
    try {
      await fn(srv.url);
    } finally {
      await srv.close();
      await middleware.limiter.close();
    }
  }

  it('ignores forwarded headers from an untrusted peer', async () => {
    await withApp(rateLimit({ policy: RULES }), async (url) => {
      for (const client of ['1.1.1.1', '2.2.2.2']) {
        assert.equal((await fetch(url, { headers: { 'X-Forwarded-For': client } })).status, 200);
      }
      assert.equal((await fetch(url, { headers: { 'X-Forwarded-For': '3.3.3.3' } })).status, 429);
    });
  });

  it('lets the app choose attributes, cost, skipping and headers', async () => {
    const mw = rateLimit({
      policy: { rules: [{ name: 'per-key', key: 'key:{api_key}', limit: 4, window: '1m' }] },
      attributes: (req) => ({ api_key: req.headers['x-api-key'] }),
      cost: (req) => (req.headers['x-heavy'] ? 2 : 1),
      skip: (req) => req.headers['x-internal'] === 'yes',
      headers: false,
    });
    await withApp(mw, async (url) => {
      const res = await fetch(url, { headers: { 'x-api-key': 'k1', 'x-heavy': '1' } });
      assert.equal(res.status, 200);
      assert.equal(res.headers.get('ratelimit-limit'), null);
      assert.equal((await fetch(url, { headers: { 'x-api-key': 'k1', 'x-heavy': '1' } })).status, 200);
      assert.equal((await fetch(url, { headers: { 'x-api-key': 'k1' } })).status, 429);
      assert.equal((await fetch(url, { headers: { 'x-api-key': 'k1', 'x-internal': 'yes' } })).status, 200);
      // No api key: the rule does not apply.
      assert.equal((await fetch(url)).status, 200);
    });
  });

  it('denies with 429 when the backend fails and onBackendError is deny', async () => {
    const silent = await startSilentServer();
    try {
      const mw = rateLimit({ policy: RULES, limiterOptions: { url: silent.url, timeout: 100 }, onBackendError: 'deny' });
      await withApp(mw, async (url) => {
        const res = await fetch(url);
        assert.equal(res.status, 429);
        assert.equal(res.headers.get('retry-after'), '1');
      });
      const allow = rateLimit({ policy: RULES, limiterOptions: { url: silent.url, timeout: 100 }, onBackendError: 'allow' });
      await withApp(allow, async (url) => {
        assert.equal((await fetch(url)).status, 200);
      });
      const error = rateLimit({
        policy: RULES,
        limiterOptions: { url: silent.url, timeout: 100 },
        onBackendError: 'error',
        onError: (err, req, res) => res.status(503).json({ code: err.code }),
      });
      await withApp(error, async (url) => {
        const res = await fetch(url);
        assert.equal(res.status, 503);
        assert.deepEqual(await res.json(), { code: 'timeout' });
      });
    } finally {
      await silent.close();
    }
  });

  it('passes errors to Express by default', async () => {
    const limiter = new Limiter(RULES);
    await withApp(rateLimit({ limiter, attributes: () => ({ ip: 42 }) }), async (url) => {
      assert.equal((await fetch(url)).status, 500);
    });
  });

  it('rejects bad options', () => {
    const limiter = new Limiter(RULES);
    for (const [options, message] of [
      [undefined, /options object/],
      [{}, /limiter.*policy/],
      [{ limiter: {} }, /Limiter/],
      [{ limiter, onBackendError: 'deny' }, /not both/],
      [{ policy: RULES, attributes: 'ip' }, /attributes/],
      [{ policy: RULES, cost: '2' }, /cost/],
      [{ policy: RULES, trustedProxies: ['x'] }, /trusted_proxies/],
      [{ policy: RULES, colour: 'red' }, /unknown option "colour"/],
    ]) {
      assert.throws(() => rateLimit(options), (err) => {
        assert.equal(err.code, 'invalid_argument');
        assert.match(err.message, message);
        return true;
      });
    }
  });
});
