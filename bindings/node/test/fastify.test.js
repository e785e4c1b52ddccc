// The Fastify plugin and examples/fastify_app.js, behind real HTTP servers on
// loopback (the example as its own process), driven by real HTTP clients.
'use strict';

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const path = require('node:path');
const { spawn } = require('node:child_process');
const express = require('express');
const Fastify = require('fastify');
const { Limiter, ManualClock } = require('throttlegate');
const { rateLimit } = require('throttlegate/express');
const throttlegate = require('throttlegate/fastify');
const { startRedis, startSilentServer, freshPrefix, freePort } = require('./helpers.js');

const EXAMPLE = path.resolve(__dirname, '..', '..', '..', 'examples', 'fastify_app.js');
const RULES = { rules: [{ name: 'per-ip', key: 'ip:{ip}', limit: 2, window: '1m' }] };

/** GET (or another method) with node:http: status, raw header pairs as sent, body. */
function request(url, { method = 'GET', headers = {} } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method, headers }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c) => { body += c; });
      res.on('end', () => {
        const raw = [];
        for (let i = 0; i < res.rawHeaders.length; i += 2) raw.push([res.rawHeaders[i], res.rawHeaders[i + 1]]);
        resolve({ status: res.statusCode, headers: res.headers, raw, body });
      });
    });
    req.once('error', reject);
    req.end();
  });
}

/** Run the example as its own process; resolve to `{ url, stop() }` once it listens. */
async function startExample(env) {
  const port = await freePort();
  const child = spawn(process.execPath, [EXAMPLE], {
    env: { ...process.env, PORT: String(port), ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (c) => { stderr += c; });
  await new Promise((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`example exited with ${code}: ${stderr}`)));
    child.stdout.on('data', (c) => { if (String(c).includes('listening on')) resolve(); });
  });
  child.removeAllListeners('exit');
  return {
    url: `http://127.0.0.1:${port}`,
    stop: () => new Promise((resolve) => {
      if (child.exitCode !== null) return resolve();
      child.once('exit', () => resolve());
      child.kill('SIGKILL');
    }),
  };
}

async function withExample(env, fn) {
  const srv = await startExample(env);
  try {
    await fn(srv.url);
  } finally {
    await srv.stop();
  }
}

function checkDenial(res, rule) {
  assert.equal(res.status, 429);
  assert.equal(res.headers['content-type'], 'application/problem+json');
  assert.ok(Number(res.headers['retry-after']) >= 1);
  assert.equal(res.headers['ratelimit-remaining'], '0');
  const body = JSON.parse(res.body);
  assert.equal(body.status, 429);
  assert.deepEqual(body.violated_rules, [rule]);
}

/** Listen on a free loopback port; resolve to the base URL. */
async function listen(app) {
  await app.listen({ port: 0, host: '127.0.0.1' });
  return `http://127.0.0.1:${app.server.address().port}`;
}

async function withFastify(setup, fn) {
  const app = Fastify();
  await setup(app);
  const url = await listen(app);
  try {
    await fn(url, app);
  } finally {
    await app.close();
  }
}

describe('examples/fastify_app.js', () => {
  let redis;
  before(async () => {
    redis = await startRedis();
  });
  after(async () => {
    if (redis) await redis.stop();
  });

  async function exercise(env, proxied) {
    await withExample(env, async (url) => {
      const client = { 'X-Forwarded-For': '198.51.100.7' };
      for (let i = 0; i < 3; i++) assert.equal((await request(`${url}/health`, { headers: client })).status, 200);
      const health = await request(`${url}/health`);
      assert.equal(health.headers['ratelimit-limit'], undefined);
      for (let i = 0; i < 10; i++) {
        const res = await request(`${url}/`, { headers: client });
        assert.equal(res.status, 200);
        assert.equal(res.headers['ratelimit-limit'], '10');
        assert.equal(res.headers['ratelimit-remaining'], String(9 - i));
        assert.equal(res.headers['ratelimit-policy'], '"per-ip";q=10;w=60');
        assert.equal(res.headers['retry-after'], undefined);
        assert.deepEqual(JSON.parse(res.body), { hello: 'world', remaining: 9 - i });
      }
      const denied = await request(`${url}/`, { headers: client });
      checkDenial(denied, 'per-ip');
      assert.equal(denied.headers['retry-after'], '60');
      // Without a trusted proxy, another X-Forwarded-For is a spoof of the same client.
      const other = await request(`${url}/`, { headers: { 'X-Forwarded-For': '198.51.100.8' } });
      if (proxied) {
        assert.equal(other.status, 200);
        assert.equal(other.headers['ratelimit-remaining'], '9');
      } else {
        checkDenial(other, 'per-ip');
      }
    });
  }

  it('limits clients on the embedded backend, ignoring spoofed X-Forwarded-For', () => exercise({}, false));

  it('limits clients on Redis behind a trusted proxy', () =>
    exercise({ REDIS_URL: redis.url, KEY_PREFIX: freshPrefix('fy'), TRUSTED_PROXIES: '127.0.0.1' }, true));

  it('limits logins, and the /admin context on its own', async () => {
    await withExample({ REDIS_URL: redis.url, KEY_PREFIX: freshPrefix('fy'), TRUSTED_PROXIES: '127.0.0.1' }, async (url) => {
      const login = (ip) => request(`${url}/login`, { method: 'POST', headers: { 'X-Forwarded-For': ip } });
      for (let i = 0; i < 3; i++) assert.equal((await login('198.51.100.1')).status, 200);
      checkDenial(await login('198.51.100.1'), 'login');
      // Spellings Fastify routes to the handler are the same login; the others are 404s.
      checkDenial(await request(`${url}/%6Cogin?x=1`, { method: 'POST', headers: { 'X-Forwarded-For': '198.51.100.1' } }), 'login');
      assert.equal((await request(`${url}/LOGIN`, { method: 'POST', headers: { 'X-Forwarded-For': '198.51.100.1' } })).status, 404);
      assert.equal((await login('198.51.100.2')).status, 200);
      // POST /signup: its route limit (config.rateLimit '2/minute') on top of the policy's rules.
      const signup = () => request(`${url}/signup`, { method: 'POST', headers: { 'X-Forwarded-For': '198.51.100.4' } });
      for (let i = 0; i < 2; i++) assert.equal((await signup()).status, 200);
      const denied = await signup();
      assert.equal(denied.status, 429);
      assert.equal(JSON.parse(denied.body).violated_rules.length, 1);
      const admin = (ip) => request(`${url}/admin/stats`, { headers: { 'X-Forwarded-For': ip } });
      for (let i = 0; i < 2; i++) {
        const res = await admin('198.51.100.3');
        assert.equal(res.status, 200);
        assert.equal(res.headers['ratelimit-policy'], '"admin";q=2;w=60');
      }
      checkDenial(await admin('198.51.100.3'), 'admin');
      // The admin limiter does not reach the sibling routes.
      const root = await request(`${url}/`, { headers: { 'X-Forwarded-For': '198.51.100.3' } });
      assert.equal(root.status, 200);
      assert.equal(root.headers['ratelimit-remaining'], '6');
    });
  });

  it('handles Redis being down per onBackendError', async () => {
    const down = `redis://127.0.0.1:${await freePort()}`;
    await withExample({ REDIS_URL: down, ON_BACKEND_ERROR: 'allow' }, async (url) => {
      for (let i = 0; i < 12; i++) assert.equal((await request(`${url}/`)).status, 200);
    });
    await withExample({ REDIS_URL: down, ON_BACKEND_ERROR: 'deny' }, async (url) => {
      const res = await request(`${url}/`);
      assert.equal(res.status, 429);
      assert.equal(res.headers['retry-after'], '1');
      assert.equal(res.headers['content-type'], 'application/problem+json');
    });
    await withExample({ REDIS_URL: down, ON_BACKEND_ERROR: 'error' }, async (url) => {
      const res = await request(`${url}/`);
      assert.equal(res.status, 500);
      assert.equal(JSON.parse(res.body).code, 'backend_unavailable');
    });
  });
});

describe('throttlegate/fastify', () => {
  const POLICY = {
    rules: [
      { name: 'per-ip', key: 'ip:{ip}', limit: 3, window: '1m' },
      { name: 'bucket', key: 'b:{ip}', algorithm: 'token_bucket', capacity: 5, refill_rate: 0.5 },
    ],
  };
  const START_US = 1_700_000_000_000_000;
  const RATE = /^(x-)?ratelimit|^retry-after$/i;

  async function drive(url) {
    const out = [];
    for (let i = 0; i < 5; i++) {
      const res = await request(url);
      const denied = res.status === 429;
      out.push({
        status: res.status,
        headers: res.raw.filter(([k]) => RATE.test(k)).map(([k, v]) => [k.toLowerCase(), v]),
        type: denied ? res.headers['content-type'] : '',
        body: denied ? res.body : '',
      });
    }
    return out;
  }

  it('sends the same header bytes as the Express middleware for the same state', async () => {
    const app = express();
    const mw = rateLimit({ policy: POLICY, limiterOptions: { clock: new ManualClock(START_US) } });
    app.use(mw);
    app.get('/', (req, res) => res.send('ok'));
    const server = await new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)); });
    let reference;
    try {
      reference = await drive(`http://127.0.0.1:${server.address().port}/`);
    } finally {
      await new Promise((r) => server.close(() => r()));
      await mw.limiter.close();
    }
    assert.deepEqual(reference.map((r) => r.status), [200, 200, 200, 429, 429]);
    assert.deepEqual(reference[0].headers, [
      ['ratelimit-limit', '3'], ['ratelimit-remaining', '2'], ['ratelimit-reset', '60'],
      ['ratelimit-policy', '"per-ip";q=3;w=60, "bucket";q=5;w=10'],
      ['ratelimit', '"per-ip";r=2;t=60, "bucket";r=4;t=2'],
    ]);
    await withFastify(async (fastify) => {
      fastify.register(throttlegate, { policy: POLICY, limiterOptions: { clock: new ManualClock(START_US) } });
      fastify.get('/', async () => 'ok');
    }, async (url) => {
      assert.deepEqual(await drive(`${url}/`), reference);
    });
  });

  it('respects encapsulation: a context limits its own routes and its children only', async () => {
    await withFastify(async (fastify) => {
      fastify.get('/open', async () => 'open');
      fastify.register(async (child) => {
        child.register(throttlegate, { policy: RULES });
        child.get('/limited', async (request) => ({ remaining: request.rateLimit.remaining }));
        child.register(async (grandchild) => {
          grandchild.get('/limited/deeper', async () => 'deeper');
        });
      });
      fastify.register(async (sibling) => {
        sibling.get('/sibling', async (request) => ({ checked: request.rateLimit != null }));
      });
    }, async (url) => {
      assert.deepEqual(JSON.parse((await request(`${url}/limited`)).body), { remaining: 1 });
      assert.equal((await request(`${url}/limited/deeper`)).status, 200);
      assert.equal((await request(`${url}/limited`)).status, 429);
      for (let i = 0; i < 4; i++) {
        const open = await request(`${url}/open`);
        assert.equal(open.status, 200);
        assert.equal(open.headers['ratelimit-limit'], undefined);
        assert.deepEqual(JSON.parse((await request(`${url}/sibling`)).body), { checked: false });
      }
    });
  });

  it('takes per-route attributes, cost, skip, and rateLimit: false', async () => {
    await withFastify(async (fastify) => {
      fastify.register(throttlegate, {
        policy: { rules: [{ name: 'per-key', key: 'key:{api_key}', limit: 4, window: '1m' }] },
        attributes: (request) => ({ api_key: request.headers['x-api-key'] }),
        headers: false,
      });
      fastify.get('/', async () => 'ok');
      fastify.get('/heavy', { config: { rateLimit: { cost: (request) => Number(request.query.units) } } }, async () => 'heavy');
      fastify.get('/by-tenant', {
        config: { rateLimit: { attributes: (request) => ({ api_key: `tenant-${request.headers['x-tenant']}` }) } },
      }, async () => 'tenant');
      fastify.get('/internal', { config: { rateLimit: { skip: (request) => request.headers['x-internal'] === 'yes' } } },
        async () => 'internal');
      fastify.get('/free', { config: { rateLimit: false } }, async (request) => ({ checked: request.rateLimit !== null }));
    }, async (url) => {
      const k1 = { 'x-api-key': 'k1' };
      const heavy = await request(`${url}/heavy?units=3`, { headers: k1 });
      assert.equal(heavy.status, 200);
      assert.equal(heavy.headers['ratelimit-limit'], undefined); // headers: false
      assert.equal((await request(`${url}/`, { headers: k1 })).status, 200);
      assert.equal((await request(`${url}/`, { headers: k1 })).status, 429);
      for (let i = 0; i < 4; i++) {
        assert.equal((await request(`${url}/by-tenant`, { headers: { ...k1, 'x-tenant': 'a' } })).status, 200);
      }
      assert.equal((await request(`${url}/by-tenant`, { headers: { ...k1, 'x-tenant': 'a' } })).status, 429);
      assert.equal((await request(`${url}/internal`, { headers: { ...k1, 'x-internal': 'yes' } })).status, 200);
      assert.equal((await request(`${url}/internal`, { headers: k1 })).status, 429);
      assert.deepEqual(JSON.parse((await request(`${url}/free`, { headers: k1 })).body), { checked: false });
    });
  });

  it('lets onDenied and onError answer, and a backend failure follow onBackendError', async () => {
    const silent = await startSilentServer();
    try {
      await withFastify(async (fastify) => {
        fastify.register(throttlegate, {
          policy: RULES,
          limiterOptions: { url: silent.url, timeout: 100 },
          onBackendError: 'error',
          onError: (err, request, reply) => reply.code(503).send({ code: err.code }),
        });
        fastify.get('/', async () => 'ok');
      }, async (url) => {
        const res = await request(url);
        assert.equal(res.status, 503);
        assert.deepEqual(JSON.parse(res.body), { code: 'timeout' });
      });
      await withFastify(async (fastify) => {
        fastify.register(throttlegate, {
          policy: RULES,
          limiterOptions: { url: silent.url, timeout: 100 },
          onBackendError: 'deny',
          onDenied: (request, reply, decision) => reply.code(503).header('retry-after', '5').send({ degraded: decision.degraded }),
        });
        fastify.get('/', async () => 'ok');
      }, async (url) => {
        const res = await request(url);
        assert.equal(res.status, 503);
        assert.equal(res.headers['retry-after'], '5');
        assert.deepEqual(JSON.parse(res.body), { degraded: true });
      });
    } finally {
      await silent.close();
    }
  });

  it('never closes a limiter it was given; checks in nested contexts stack', async () => {
    const given = new Limiter(RULES);
    let built;
    const app = Fastify();
    app.register(throttlegate, { limiter: given });
    app.register(async (child) => {
      child.register(throttlegate, { policy: RULES, onBackendError: 'allow' });
      child.get('/', async (request) => {
        built = request.rateLimit;
        return 'ok';
      });
    });
    const url = await listen(app);
    assert.equal((await request(url)).status, 200);
    assert.equal(built.allowed, true);
    await app.close();
    assert.equal(given.backend, 'memory');
    await given.close();
  });

  it('rejects bad options and bad route configs when the app starts', async () => {
    const limiter = new Limiter(RULES);
    for (const [options, message] of [
      [{}, /limiter.*policy/],
      [{ limiter: {} }, /Limiter/],
      [{ limiter, onBackendError: 'deny' }, /not both/],
      [{ policy: RULES, attributes: 'ip' }, /attributes/],
      [{ policy: RULES, cost: '2' }, /cost/],
      [{ policy: RULES, colour: 'red' }, /unknown option "colour"/],
    ]) {
      const app = Fastify();
      app.register(throttlegate, options);
      await assert.rejects(app.ready(), (err) => {
        assert.equal(err.code, 'invalid_argument');
        assert.match(err.message, /^throttlegate\/fastify: /);
        assert.match(err.message, message);
        return true;
      });
      await app.close();
    }
    for (const [config, message] of [
      [{ rateLimit: 5 }, /route \/x: config.rateLimit: expected false, a rate string or an object/],
      [{ rateLimit: 'off' }, /route \/x: .*off/],
      [{ rateLimit: { limit: 3 } }, /unknown option "limit"/],
      [{ rateLimit: { cost: 'x' } }, /cost: expected a number or a function/],
    ]) {
      const app = Fastify();
      app.register(throttlegate, { limiter });
      app.register(async (child) => {
        child.get('/x', { config }, async () => 'x');
      });
      await assert.rejects(app.ready(), message);
      await app.close();
    }
    await limiter.close();
  });
});
