// The request model, the bypass matrix, route limits in each framework's
// idiom, the answer shape and the start-up warnings of the Express
// middleware and the Fastify plugin, behind real HTTP servers on loopback,
// driven over raw sockets (so every spelling of a request target reaches
// the server as written). The tables are tests/http/*.json, shared with the
// Python integrations.
'use strict';

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');
const express = require('express');
const Fastify = require('fastify');
const { Limiter, ManualClock, parseRate } = require('throttlegate');
const { rateLimit } = require('throttlegate/express');
const throttlegate = require('throttlegate/fastify');
const { startRedis, freshPrefix } = require('./helpers.js');

const TABLES = path.resolve(__dirname, '..', '..', '..', 'tests', 'http');
const MODEL = JSON.parse(fs.readFileSync(path.join(TABLES, 'request-model.json'), 'utf8'));
const BYPASS = JSON.parse(fs.readFileSync(path.join(TABLES, 'bypass.json'), 'utf8'));
const START_US = 1_700_000_000_000_000;

/**
 * Send one raw HTTP/1.1 request (the target exactly as given) and read the
 * whole answer: `{ status, headers: [[lower-case name, value], ...], body }`.
 */
function raw(port, method, target, headers = {}) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    const chunks = [];
    sock.on('data', (c) => chunks.push(c));
    sock.once('error', reject);
    sock.on('end', () => {
      const all = Buffer.concat(chunks);
      const split = all.indexOf('\r\n\r\n');
      const head = all.subarray(0, split).toString('latin1').split('\r\n');
      const status = Number(head[0].split(' ')[1]);
      const list = head.slice(1).map((line) => {
        const colon = line.indexOf(':');
        return [line.slice(0, colon).toLowerCase(), line.slice(colon + 1).trim()];
      });
      resolve({ status, headers: list, body: all.subarray(split + 4) });
    });
    const lines = [`${method} ${target} HTTP/1.1`];
    const names = Object.keys(headers).map((n) => n.toLowerCase());
    if (!names.includes('host')) lines.push(`Host: 127.0.0.1:${port}`);
    for (const [name, value] of Object.entries(headers)) lines.push(`${name}: ${value}`);
    lines.push('Connection: close', 'Content-Length: 0', '', '');
    sock.write(lines.join('\r\n'));
  });
}

function header(res, name) {
  const found = res.headers.find(([n]) => n === name);
  return found === undefined ? undefined : found[1];
}

/** Listen on a free loopback port: `{ port, close() }`. */
function serveExpress(app) {
  return new Promise((resolve) => {
    const server = app.listen(0, '127.0.0.1', () => {
      resolve({ port: server.address().port, close: () => new Promise((r) => server.close(() => r())) });
    });
  });
}

async function serveFastify(app) {
  await app.listen({ port: 0, host: '127.0.0.1' });
  return { port: app.server.address().port, close: () => app.close() };
}

/** The attributes an app echoed in `x-attributes`. */
function echoed(res) {
  const value = header(res, 'x-attributes');
  assert.ok(value !== undefined, `no x-attributes in a ${res.status} answer`);
  return JSON.parse(value);
}

// --- the native API the integrations use ------------------------------------

describe('Limiter: requestAttributes, requestHeaders, attributeWarnings, addRouteLimit', () => {
  const POLICY = {
    attributes: { api_key: 'header:X-Api-Key' },
    rules: [
      { name: 'per-ip', key: '{ip}', limit: 5, window: '1m' },
      { name: 'per-tenant', key: '{tenant}', limit: 5, window: '1m' },
    ],
  };

  it('makes the request model from raw parts, under the router\'s rules', async () => {
    const limiter = new Limiter(POLICY);
    try {
      assert.deepEqual(limiter.requestHeaders(), ['x-api-key']);
      assert.deepEqual(limiter.requestAttributes({
        ip: '203.0.113.7', method: 'head', route: '/users/:id', path: '/Users//7/?page=2', host: 'API.example:8080',
        headers: { 'x-api-key': ['k1', 'k2'], 'x-other': 'no' }, router: { caseInsensitive: true, ignoreTrailingSlash: true },
      }), { ip: '203.0.113.7', method: 'GET', route: '/users/{id}', path: '/users/7', host: 'api.example', api_key: 'k1,k2' });
      assert.deepEqual(limiter.requestAttributes({ ip: null, method: 'GET', route: null, path: '/A/' }), { method: 'GET', path: '/A/' });
      for (const [request, message] of [
        [null, /^request: expected an object/],
        [{ method: 5, path: '/' }, /^request\.method: expected a string, got a number/],
        [{ method: 'GET' }, /^request\.path: expected a string/],
        [{ method: 'GET', path: '/', router: { caseInsensitive: 'yes' } }, /^request\.router\.caseInsensitive: expected a boolean/],
        [{ method: 'GET', path: '/', headers: { 'x-api-key': 5 } }, /^request\.headers\["x-api-key"\]: expected a string/],
      ]) {
        assert.throws(() => limiter.requestAttributes(request), (err) => err.code === 'invalid_argument' && message.test(err.message));
      }
    } finally {
      await limiter.close();
    }
  });

  it('takes `prefix` (one name in every language), and `keyPrefix`, its old name', async () => {
    const rules = { rules: [{ name: 'r', key: '{ip}', limit: 1, window: '1m' }] };
    for (const options of [{ prefix: 'app:' }, { keyPrefix: 'app:' }]) {
      const limiter = new Limiter(rules, options);
      assert.deepEqual(limiter.keys({ ip: '1.2.3.4' }), ['app:r:1.2.3.4']);
      await limiter.close();
    }
    assert.throws(() => new Limiter(rules, { prefix: 'a:', keyPrefix: 'b:' }),
      (err) => err.code === 'invalid_argument' && /give `prefix` only/.test(err.message));
  });

  it('names the rules a set of attributes can never feed', async () => {
    const limiter = new Limiter(POLICY);
    try {
      const [warning, ...more] = limiter.attributeWarnings();
      assert.deepEqual(more, []);
      assert.match(warning, /"per-tenant".*"tenant"/);
      assert.deepEqual(limiter.attributeWarnings(['ip', 'tenant']), []);
      assert.equal(limiter.attributeWarnings(['tenant']).length, 1);
      assert.throws(() => limiter.attributeWarnings('ip'), /^Error: provided: expected an array of strings/);
    } finally {
      await limiter.close();
    }
  });

  it('adds route limits to the policy in force, once, across reloads', async () => {
    const limiter = new Limiter(POLICY, { clock: new ManualClock(START_US) });
    try {
      const names = limiter.addRouteLimit({ rate: '1/minute', route: '/login', methods: ['post', 'POST'] });
      assert.deepEqual(names, ['route.POST.login']);
      assert.deepEqual(limiter.addRouteLimit({ rate: '1/minute', route: '/login', methods: ['POST'] }), names);
      assert.deepEqual(limiter.addRouteLimit({ rate: '5/minute;100/hour', route: '/users/:id' }),
        ['route.users.id.1m', 'route.users.id.1h']);
      limiter.reload({ rules: [{ name: 'other', key: '{ip}', limit: 9, window: '1m' }] });
      assert.deepEqual(limiter.policy.toJSON().rules.map((r) => r.name),
        ['other', 'route.POST.login', 'route.users.id.1m', 'route.users.id.1h']);
      const attrs = limiter.requestAttributes({ ip: '203.0.113.7', method: 'POST', route: '/login', path: '/login' });
      assert.equal((await limiter.check(attrs)).allowed, true);
      const denied = await limiter.check(attrs);
      assert.equal(denied.allowed, false);
      assert.equal(denied.rule, 'route.POST.login');
      for (const [limit, message] of [
        [{ rate: 'often', route: '/x' }, /^rate "often": /],
        [{ rate: '5/minute', route: '/x', key: '{' }, /^route limit "5\/minute" on "\/x": .*key/],
        [{ rate: '5/minute', route: '/x', name: 'other' }, /"other" is used by another rule/],
        [{ route: '/x' }, /^limit\.rate: expected a string/],
        [{ rate: '5/minute', route: '/x', methods: 'GET' }, /^limit\.methods: expected an array of strings/],
        [{ rate: '5/minute', route: '/x', methods: ['G T'] }, /is not an HTTP method/],
      ]) {
        assert.throws(() => limiter.addRouteLimit(limit), (err) => err.code === 'invalid_argument' && message.test(err.message));
      }
      assert.deepEqual(parseRate('5 per 2 hours;1/s'), [{ limit: 5, windowMs: 7_200_000 }, { limit: 1, windowMs: 1000 }]);
      assert.throws(() => parseRate(''), (err) => err.code === 'invalid_argument' && /empty rate/.test(err.message));
    } finally {
      await limiter.close();
    }
  });
});

// --- the request model: tests/http/request-model.json -----------------------

function modelExpressApp() {
  const app = express();
  const mw = rateLimit({ policy: MODEL.policy });
  app.use(mw);
  const echo = (req, res) => {
    res.setHeader('x-attributes', JSON.stringify(req.rateLimitAttributes));
    res.end('ok');
  };
  for (const route of MODEL.routes) {
    for (const method of route.methods) app[method.toLowerCase()](route.express, echo);
  }
  // Not a route: what no route matches ends here.
  app.use((req, res) => {
    res.statusCode = 404;
    echo(req, res);
  });
  return { app, limiter: mw.limiter };
}

async function modelFastifyApp() {
  const app = Fastify();
  await app.register(throttlegate, { policy: MODEL.policy });
  const echo = async (request, reply) => {
    reply.header('x-attributes', JSON.stringify(request.rateLimitAttributes));
    return 'ok';
  };
  for (const route of MODEL.routes) app.route({ method: route.methods, url: route.fastify, handler: echo });
  app.setNotFoundHandler(async (request, reply) => {
    reply.code(404);
    return echo(request, reply);
  });
  return app;
}

/**
 * Where a framework's own router dispatches a case elsewhere than the table
 * says, what it does instead: Express matches the path before decoding it,
 * so `/%6Cogin` is a 404 there (no route; the core still decodes the path).
 */
const DISPATCHED = {
  express: { 'percent-encoding is decoded': { route: null } },
  fastify: {},
};

async function replayModel(port, framework) {
  let replayed = 0;
  for (const c of MODEL.cases) {
    if ((c.skip || []).some((s) => s.startsWith('node:'))) continue;
    const headers = c.request.headers || {};
    const res = await raw(port, c.request.method, c.request.target, headers);
    const got = echoed(res);
    const want = { ip: '127.0.0.1' };
    const expect = { ...c.expect, ...DISPATCHED[framework][c.name] };
    for (const [name, value] of Object.entries(expect)) if (value !== null) want[name] = value;
    if (want.host === undefined) want.host = '127.0.0.1';
    assert.deepEqual(got, want, c.name);
    replayed += 1;
  }
  assert.ok(replayed >= MODEL.cases.length - 1);
}

describe('the request model (tests/http/request-model.json)', () => {
  it('Express gives each case its attributes', async () => {
    const { app, limiter } = modelExpressApp();
    const srv = await serveExpress(app);
    try {
      await replayModel(srv.port, 'express');
    } finally {
      await srv.close();
      await limiter.close();
    }
  });

  it('Fastify gives each case its attributes', async () => {
    const app = await modelFastifyApp();
    const srv = await serveFastify(app);
    await replayModel(srv.port, 'fastify').finally(() => srv.close());
  });

  it('Express resolves routes in mounted routers, with their prefix', async () => {
    const app = express();
    const mw = rateLimit({ policy: MODEL.policy });
    app.use(mw);
    const router = express.Router();
    const echo = (req, res) => {
      res.setHeader('x-attributes', JSON.stringify(req.rateLimitAttributes));
      res.end('ok');
    };
    router.get('/users/:id', echo);
    const inner = express.Router();
    inner.post('/files/:name', echo);
    router.use('/v1', inner);
    app.use('/api', router);
    app.use(echo);
    const srv = await serveExpress(app);
    try {
      const route = async (method, target) => echoed(await raw(srv.port, method, target)).route;
      assert.equal(await route('GET', '/api/users/3'), '/api/users/{id}');
      assert.equal(await route('HEAD', '/API/Users/3/'), '/api/users/{id}');
      assert.equal(await route('POST', '/api/v1/files/x'), '/api/v1/files/{name}');
      // A method the route does not take, a path no route has: no route.
      assert.equal(await route('POST', '/api/users/3'), undefined);
      assert.equal(await route('GET', '/apix/users/3'), undefined);
    } finally {
      await srv.close();
      await mw.limiter.close();
    }
  });

  it('Express applies the app\'s case sensitive and strict routing settings', async () => {
    const app = express();
    app.enable('case sensitive routing');
    app.enable('strict routing');
    const mw = rateLimit({ policy: MODEL.policy });
    app.use(mw);
    app.use((req, res) => {
      res.setHeader('x-attributes', JSON.stringify(req.rateLimitAttributes));
      res.end('ok');
    });
    const srv = await serveExpress(app);
    try {
      assert.equal(echoed(await raw(srv.port, 'GET', '/A/b/')).path, '/A/b/');
    } finally {
      await srv.close();
      await mw.limiter.close();
    }
  });
});

// --- no bypass: tests/http/bypass.json ------------------------------------

/**
 * Send every spelling `rounds` times to `port`, with `prefix` in front;
 * resolve to how often the handler ran (`count()`).
 */
async function sendSpellings(port, prefix) {
  for (let round = 0; round < BYPASS.rounds; round++) {
    for (const s of BYPASS.spellings) await raw(port, s.method, `${prefix}${s.target}`);
    // The absolute form, which Node's server accepts and both routers dispatch by its path.
    await raw(port, 'POST', `http://127.0.0.1${prefix}/Login/`);
    await raw(port, 'POST', `http://127.0.0.1${prefix}/login`);
  }
}

/** A GET route's spellings, HEAD among them. */
const GET_SPELLINGS = ['GET /profile', 'HEAD /profile', 'HEAD /PROFILE/', 'GET /Profile/', 'HEAD /profile?x=1'];

async function sendGetSpellings(port) {
  for (let round = 0; round < BYPASS.rounds; round++) {
    for (const s of GET_SPELLINGS) {
      const [method, target] = s.split(' ');
      await raw(port, method, target);
    }
  }
}

function bypassExpressApp(limiterOptions) {
  const runs = { root: 0, mounted: 0, profile: 0 };
  const app = express();
  const mw = rateLimit({ policy: BYPASS.policy, limiterOptions });
  app.use(mw);
  const rate = BYPASS.protected.rate;
  app.post('/login', mw.limit(rate), (req, res) => {
    runs.root += 1;
    res.end('in');
  });
  app.get('/profile', mw.limit(rate), (req, res) => {
    runs.profile += 1;
    res.end('me');
  });
  const api = express.Router();
  api.post('/login', mw.limit(rate), (req, res) => {
    runs.mounted += 1;
    res.end('in');
  });
  app.use(BYPASS.mounted.prefix, api);
  return { app, runs, limiter: mw.limiter };
}

async function bypassFastifyApp(options, limiterOptions) {
  const runs = { root: 0, mounted: 0, profile: 0 };
  const app = Fastify(options);
  await app.register(throttlegate, { policy: BYPASS.policy, limiterOptions });
  const config = { rateLimit: BYPASS.protected.rate };
  app.post('/login', { config }, async () => {
    runs.root += 1;
    return 'in';
  });
  app.get('/profile', { config }, async () => {
    runs.profile += 1;
    return 'me';
  });
  app.register(async (api) => {
    api.post('/login', { config }, async () => {
      runs.mounted += 1;
      return 'in';
    });
  }, { prefix: BYPASS.mounted.prefix });
  return { app, runs };
}

async function proveNoBypass(port, runs) {
  await sendSpellings(port, '');
  await sendSpellings(port, BYPASS.mounted.prefix);
  await sendGetSpellings(port);
  assert.ok(runs.root >= 1 && runs.root <= BYPASS.limit, `POST /login ran ${runs.root} times`);
  assert.ok(runs.mounted >= 1 && runs.mounted <= BYPASS.limit, `POST /api/login ran ${runs.mounted} times`);
  assert.ok(runs.profile >= 1 && runs.profile <= BYPASS.limit, `GET /profile ran ${runs.profile} times`);
}

describe('no bypass (tests/http/bypass.json)', () => {
  let redis;
  before(async () => {
    redis = await startRedis();
  });
  after(async () => {
    if (redis) await redis.stop();
  });

  it('Express runs a limited handler at most `limit` times, whatever the spelling', async () => {
    const { app, runs, limiter } = bypassExpressApp();
    const srv = await serveExpress(app);
    try {
      await proveNoBypass(srv.port, runs);
      // Express routes these to the handler: it ran for the first of them.
      assert.equal(runs.root, BYPASS.limit);
    } finally {
      await srv.close();
      await limiter.close();
    }
  });

  it('Express on Redis, the same', async () => {
    const { app, runs, limiter } = bypassExpressApp({ url: redis.url, keyPrefix: freshPrefix('by') });
    const srv = await serveExpress(app);
    try {
      await proveNoBypass(srv.port, runs);
    } finally {
      await srv.close();
      await limiter.close();
    }
  });

  it('/LOGIN, /login/ and /Login/ are the same login to Express after the 429', async () => {
    const { app, runs, limiter } = bypassExpressApp();
    const srv = await serveExpress(app);
    try {
      for (let i = 0; i < BYPASS.limit; i++) assert.equal((await raw(srv.port, 'POST', '/login')).status, 200);
      for (const target of ['/LOGIN', '/login/', '/Login/', '/login', 'http://127.0.0.1/Login']) {
        assert.equal((await raw(srv.port, 'POST', target)).status, 429, target);
      }
      assert.equal(runs.root, BYPASS.limit);
    } finally {
      await srv.close();
      await limiter.close();
    }
  });

  it('Fastify runs a limited handler at most `limit` times, whatever the spelling', async () => {
    const { app, runs } = await bypassFastifyApp();
    const srv = await serveFastify(app);
    await proveNoBypass(srv.port, runs).finally(() => srv.close());
  });

  it('Fastify with a case-insensitive router that ignores trailing slashes, on Redis', async () => {
    const { app, runs } = await bypassFastifyApp(
      { routerOptions: { caseSensitive: false, ignoreTrailingSlash: true } },
      { url: redis.url, keyPrefix: freshPrefix('by') },
    );
    const srv = await serveFastify(app);
    try {
      await proveNoBypass(srv.port, runs);
      for (const target of ['/LOGIN', '/Login/']) {
        assert.equal((await raw(srv.port, 'POST', target)).status, 429, target);
      }
    } finally {
      await srv.close();
    }
  });
});

// --- route limits in each framework's idiom, stacked with a file rule -----

const STACKED = { rules: [{ name: 'per-ip', key: 'ip:{ip}', limit: 5, window: '1m' }] };

/** The `ratelimit` header's remaining for rule `name`. */
function remainingOf(res, name) {
  const value = header(res, 'ratelimit') || '';
  const m = new RegExp(`"${name}";r=(\\d+)`).exec(value);
  return m === null ? undefined : Number(m[1]);
}

async function proveStacked(port, loginRule) {
  const login = () => raw(port, 'POST', '/login');
  const home = () => raw(port, 'GET', '/');
  // Each admitted login takes one from both rules, once.
  let res = await login();
  assert.equal(res.status, 200);
  assert.equal(remainingOf(res, 'per-ip'), 4);
  assert.equal(remainingOf(res, loginRule), 1);
  res = await login();
  assert.equal(remainingOf(res, 'per-ip'), 3);
  assert.equal(remainingOf(res, loginRule), 0);
  // The route limit denies: nothing is taken from the file's rule.
  res = await login();
  assert.equal(res.status, 429);
  assert.deepEqual(JSON.parse(res.body).violated_rules, [loginRule]);
  res = await home();
  assert.equal(res.status, 200);
  assert.equal(remainingOf(res, 'per-ip'), 2);
  assert.equal(remainingOf(res, loginRule), undefined);
  await home();
  await home();
  // The file's rule denies: nothing is taken from the route limit.
  res = await home();
  assert.equal(res.status, 429);
  assert.deepEqual(JSON.parse(res.body).violated_rules, ['per-ip']);
}

describe('route limits', () => {
  it('parseRate reads the core\'s rate grammar and names what is wrong', () => {
    assert.deepEqual(parseRate('5/minute'), [{ limit: 5, windowMs: 60_000 }]);
    assert.deepEqual(parseRate('100 per hour'), [{ limit: 100, windowMs: 3_600_000 }]);
    assert.deepEqual(parseRate('10/30s'), [{ limit: 10, windowMs: 30_000 }]);
    assert.throws(() => parseRate('5 a minute'), (err) => err.code === 'invalid_argument' && /5 a minute/.test(err.message));
  });

  it('Express: limit(rate) stacks with the file\'s rules in one check, all or nothing', async () => {
    const app = express();
    const mw = rateLimit({ policy: STACKED, limiterOptions: { clock: new ManualClock(START_US) } });
    app.use(mw);
    app.get('/', (req, res) => res.end('home'));
    app.post('/login', mw.limit({ rate: '2/minute', name: 'login' }), (req, res) => res.end('in'));
    const srv = await serveExpress(app);
    try {
      await proveStacked(srv.port, 'login');
      assert.equal(mw.limiter.stats().calls, 7);
    } finally {
      await srv.close();
      await mw.limiter.close();
    }
  });

  it('Express: limit(rate) without the app-level middleware checks the route itself', async () => {
    const app = express();
    const mw = rateLimit({ policy: STACKED, limiterOptions: { clock: new ManualClock(START_US) } });
    let runs = 0;
    app.post('/login', mw.limit('2/minute'), (req, res) => {
      runs += 1;
      res.end('in');
    });
    const srv = await serveExpress(app);
    try {
      const statuses = [];
      for (let i = 0; i < 4; i++) statuses.push((await raw(srv.port, 'POST', '/LOGIN/')).status);
      assert.deepEqual(statuses, [200, 200, 429, 429]);
      assert.equal(runs, 2);
      assert.equal(mw.limiter.stats().calls, 4);
    } finally {
      await srv.close();
      await mw.limiter.close();
    }
  });

  it('Express: a route limit under a router mounted at several paths, or at a RegExp', async () => {
    const app = express();
    const mw = rateLimit({ policy: STACKED, limiterOptions: { clock: new ManualClock(START_US) } });
    app.use(mw);
    const router = express.Router();
    router.post('/login', mw.limit('1/minute'), (req, res) => {
      res.setHeader('x-attributes', JSON.stringify(req.rateLimitAttributes));
      res.end('in');
    });
    app.use(['/a', '/b'], router);
    app.use(/^\/re(?=\/)/i, router);
    const srv = await serveExpress(app);
    try {
      for (const [target, again] of [['/a/login', '/A/login/'], ['/b/login', '/b/LOGIN'], ['/re/login', '/RE/login']]) {
        const first = await raw(srv.port, 'POST', target);
        assert.equal(first.status, 200, target);
        assert.equal((await raw(srv.port, 'POST', again)).status, 429, again);
      }
    } finally {
      await srv.close();
      await mw.limiter.close();
    }
  });

  it('Express: a route limit in a mounted app, with a middleware of its own', async () => {
    const app = express();
    const sub = express();
    const mw = rateLimit({ policy: STACKED, limiterOptions: { clock: new ManualClock(START_US) } });
    sub.use(mw);
    sub.post('/login', mw.limit({ rate: '2/minute', name: 'login' }), (req, res) => {
      res.setHeader('x-attributes', JSON.stringify(req.rateLimitAttributes));
      res.end('in');
    });
    app.use('/sub', sub);
    const srv = await serveExpress(app);
    try {
      const first = await raw(srv.port, 'POST', '/sub/login');
      assert.equal(first.status, 200);
      assert.equal(echoed(first).route, '/sub/login');
      const statuses = [];
      for (let i = 0; i < 3; i++) statuses.push((await raw(srv.port, 'POST', '/SUB/Login/')).status);
      assert.deepEqual(statuses, [200, 429, 429]);
    } finally {
      await srv.close();
      await mw.limiter.close();
    }
  });

  it('Express: a route limit the app-level middleware cannot see is an error, not a bypass', async () => {
    const app = express();
    const sub = express();
    const mw = rateLimit({ policy: STACKED });
    app.use(mw);
    sub.post('/login', mw.limit('2/minute'), (req, res) => res.end('in'));
    app.use('/sub', sub);
    let seen = null;
    app.use((err, req, res, next) => {
      seen = err;
      res.statusCode = 500;
      res.end();
    });
    const srv = await serveExpress(app);
    try {
      assert.equal((await raw(srv.port, 'POST', '/sub/login')).status, 500);
      assert.equal(seen.code, 'invalid_argument');
      assert.match(seen.message, /before it could see its route .*express\.Router/);
    } finally {
      await srv.close();
      await mw.limiter.close();
    }
  });

  it('Express: skip and a custom attributes function apply to route limits too', async () => {
    const app = express();
    const mw = rateLimit({
      policy: STACKED,
      skip: (req) => req.headers['x-internal'] === 'yes',
      attributes: (req, ip) => ({ ip, route: req.headers['x-route'], method: req.method }),
    });
    app.post('/login', mw.limit('1/minute'), (req, res) => res.end('in'));
    const srv = await serveExpress(app);
    try {
      for (let i = 0; i < 3; i++) assert.equal((await raw(srv.port, 'POST', '/login', { 'X-Internal': 'yes' })).status, 200);
      // The app's attributes decide which route a request is: here, a header.
      assert.equal((await raw(srv.port, 'POST', '/login', { 'X-Route': '/elsewhere' })).status, 200);
      assert.equal((await raw(srv.port, 'POST', '/login', { 'X-Route': '/login' })).status, 200);
      assert.equal((await raw(srv.port, 'POST', '/login', { 'X-Route': '/login' })).status, 429);
    } finally {
      await srv.close();
      await mw.limiter.close();
    }
  });

  it('Express: a bad key template is an error on the first request, naming the route', async () => {
    const app = express();
    const mw = rateLimit({ policy: STACKED });
    app.use(mw);
    app.post('/login', mw.limit({ rate: '1/minute', key: '{' }), (req, res) => res.end('in'));
    let seen = null;
    app.use((err, req, res, next) => {
      seen = err;
      res.statusCode = 500;
      res.end();
    });
    const srv = await serveExpress(app);
    try {
      assert.equal((await raw(srv.port, 'POST', '/login')).status, 500);
      assert.equal(seen.code, 'invalid_argument');
      assert.match(seen.message, /^throttlegate\/express: route \/login: .*key/);
    } finally {
      await srv.close();
      await mw.limiter.close();
    }
  });

  it('Express: a bad rate is refused where the limit is written', () => {
    const mw = rateLimit({ policy: STACKED });
    assert.throws(() => mw.limit('5 a minute'), (err) => err.code === 'invalid_argument' && /limit: .*5 a minute/.test(err.message));
    assert.throws(() => mw.limit({ rate: '5/minute', colour: 'red' }), /unknown option "colour"/);
    assert.throws(() => mw.limit(5), /expected a rate string or an object/);
    return mw.limiter.close();
  });

  it('Fastify: config.rateLimit stacks with the file\'s rules in one check, all or nothing', async () => {
    const limiter = new Limiter(STACKED, { clock: new ManualClock(START_US) });
    const app = Fastify();
    await app.register(throttlegate, { limiter });
    app.get('/', async () => 'home');
    app.post('/login', { config: { rateLimit: { rate: '2/minute', name: 'login' } } }, async () => 'in');
    const srv = await serveFastify(app);
    try {
      await proveStacked(srv.port, 'login');
      assert.equal(limiter.stats().calls, 7);
    } finally {
      await srv.close();
      await limiter.close();
    }
  });

  it('Fastify: the string form, and the object form keyed on another attribute', async () => {
    const app = Fastify();
    // Not awaited: the routes below are declared before the plugin loads.
    app.register(throttlegate, { policy: STACKED, limiterOptions: { clock: new ManualClock(START_US) } });
    app.post('/a', { config: { rateLimit: '1/minute' } }, async () => 'a');
    app.post('/b', { config: { rateLimit: { rate: '1/minute', key: 'host:{host}' } } }, async () => 'b');
    const srv = await serveFastify(app);
    try {
      assert.equal((await raw(srv.port, 'POST', '/a')).status, 200);
      assert.equal((await raw(srv.port, 'POST', '/a')).status, 429);
      // Keyed on the host: each host has its own budget, the same client or not.
      assert.equal((await raw(srv.port, 'POST', '/b', { Host: 'one.example' })).status, 200);
      assert.equal((await raw(srv.port, 'POST', '/b', { Host: 'ONE.example:80' })).status, 429);
      assert.equal((await raw(srv.port, 'POST', '/b', { Host: 'two.example' })).status, 200);
    } finally {
      await srv.close();
    }
  });

  it('Fastify: a bad route limit is refused when the app starts, naming the route', async () => {
    for (const [rateLimitConfig, message] of [
      ['5 a minute', /route \/x: .*5 a minute/],
      [{ rate: 5 }, /route \/x: config.rateLimit: rate: expected a rate string/],
      [{ rate: '5/minute', colour: 'red' }, /unknown option "colour"/],
    ]) {
      const app = Fastify();
      app.register(throttlegate, { policy: STACKED });
      app.register(async (child) => {
        child.post('/x', { config: { rateLimit: rateLimitConfig } }, async () => 'x');
      });
      await assert.rejects(app.ready(), message);
      await app.close();
    }
  });
});

// --- one answer shape -------------------------------------------------------

/** What an answer says, without what the server adds on its own. */
function shape(res) {
  const transport = new Set(['date', 'connection', 'keep-alive', 'x-powered-by', 'transfer-encoding']);
  return { status: res.status, headers: res.headers.filter(([n]) => !transport.has(n)), body: res.body.toString('latin1') };
}

describe('one answer shape', () => {
  const POLICY = {
    rules: [
      { name: 'per-ip', key: 'ip:{ip}', limit: 3, window: '1m' },
      { name: 'bucket', key: 'b:{ip}', algorithm: 'token_bucket', capacity: 5, refill_rate: 0.5 },
    ],
  };

  async function drive(port) {
    const out = [];
    for (let i = 0; i < 4; i++) out.push(shape(await raw(port, 'GET', '/')));
    for (let i = 0; i < 2; i++) out.push(shape(await raw(port, 'POST', '/login')));
    return out;
  }

  it('Express and Fastify deny with the same status, headers and problem+json bytes', async () => {
    const app = express();
    const mw = rateLimit({ policy: POLICY, limiterOptions: { clock: new ManualClock(START_US) } });
    app.use(mw);
    app.get('/', (req, res) => res.end());
    app.post('/login', mw.limit({ rate: '1/minute', name: 'login' }), (req, res) => res.end());
    const e = await serveExpress(app);
    let reference;
    try {
      reference = await drive(e.port);
    } finally {
      await e.close();
      await mw.limiter.close();
    }
    assert.deepEqual(reference.map((r) => r.status), [200, 200, 200, 429, 429, 429]);
    const denied = reference[3];
    assert.deepEqual(denied.headers.slice(0, 2), [
      ['content-type', 'application/problem+json'], ['content-length', String(Buffer.byteLength(denied.body))],
    ]);
    assert.equal(JSON.parse(denied.body).status, 429);
    const fastify = Fastify();
    await fastify.register(throttlegate, { policy: POLICY, limiterOptions: { clock: new ManualClock(START_US) } });
    fastify.get('/', async (request, reply) => reply.send());
    fastify.post('/login', { config: { rateLimit: { rate: '1/minute', name: 'login' } } }, async (request, reply) => reply.send());
    const f = await serveFastify(fastify);
    try {
      const got = await drive(f.port);
      // The admitted answers differ in what each framework adds to an empty body; the denials are identical.
      for (let i = 0; i < got.length; i++) {
        if (reference[i].status === 429) assert.deepEqual(got[i], reference[i], `answer ${i}`);
        else assert.deepEqual(got[i].headers.filter(([n]) => /^ratelimit/.test(n)),
          reference[i].headers.filter(([n]) => /^ratelimit/.test(n)), `answer ${i}`);
      }
    } finally {
      await f.close();
    }
  });
});

// --- start-up warnings --------------------------------------------------------

/** The ThrottlegateWarnings `fn` emits (they are emitted on the next tick). */
async function warningsOf(fn) {
  const seen = [];
  const listen = (w) => {
    if (w.name === 'ThrottlegateWarning') seen.push(w);
  };
  process.on('warning', listen);
  try {
    await fn();
    await new Promise((r) => setImmediate(r));
  } finally {
    process.off('warning', listen);
  }
  return seen;
}

describe('start-up warnings', () => {
  const POLICY = {
    rules: [
      { name: 'per-ip', key: 'ip:{ip}', limit: 10, window: '1m' },
      { name: 'per-tenant', key: 't:{tenant}', limit: 10, window: '1m' },
    ],
  };

  it('Express warns once per rule the request model cannot feed', async () => {
    const limiter = new Limiter(POLICY);
    const first = await warningsOf(() => rateLimit({ limiter }));
    assert.equal(first.length, 1);
    assert.equal(first[0].code, 'THROTTLEGATE_ATTRIBUTE');
    assert.match(first[0].message, /^throttlegate\/express: .*per-tenant.*tenant/);
    // Once: another middleware on the same limiter does not warn again.
    assert.deepEqual(await warningsOf(() => rateLimit({ limiter })), []);
    // Not when the app gives the attributes.
    const other = new Limiter(POLICY);
    assert.deepEqual(await warningsOf(() => rateLimit({ limiter: other, attributes: () => ({}) })), []);
    // Not for a policy whose attributes all come from the model or its [attributes].
    const fed = new Limiter({ ...POLICY, attributes: { tenant: 'header:x-tenant' } });
    assert.deepEqual(await warningsOf(() => rateLimit({ limiter: fed })), []);
    await Promise.all([limiter.close(), other.close(), fed.close()]);
  });

  it('Fastify warns once per rule the request model cannot feed', async () => {
    const seen = await warningsOf(async () => {
      const app = Fastify();
      await app.register(throttlegate, { policy: POLICY });
      await app.ready();
      await app.close();
    });
    assert.equal(seen.length, 1);
    assert.match(seen[0].message, /^throttlegate\/fastify: .*per-tenant.*tenant/);
    const none = await warningsOf(async () => {
      const app = Fastify();
      await app.register(throttlegate, { policy: POLICY, attributes: () => ({}) });
      await app.ready();
      await app.close();
    });
    assert.deepEqual(none, []);
  });

  it('a route limit keyed on an attribute the model never gives warns too', async () => {
    const rules = { rules: [{ name: 'per-ip', key: '{ip}', limit: 10, window: '1m' }] };
    const fastifyWarnings = await warningsOf(async () => {
      const app = Fastify();
      await app.register(throttlegate, { policy: rules });
      app.post('/t', { config: { rateLimit: { rate: '1/minute', key: '{tenant}', name: 'per-tenant' } } }, async () => 't');
      await app.ready();
      await app.close();
    });
    assert.equal(fastifyWarnings.length, 1);
    assert.match(fastifyWarnings[0].message, /^throttlegate\/fastify: .*"per-tenant".*"tenant"/);
    const app = express();
    const mw = rateLimit({ policy: rules });
    app.use(mw);
    app.post('/t', mw.limit({ rate: '1/minute', key: '{tenant}', name: 'per-tenant' }), (req, res) => res.end());
    const srv = await serveExpress(app);
    try {
      const expressWarnings = await warningsOf(async () => {
        // Found on the first request (Express has no start-up hook).
        for (let i = 0; i < 2; i++) assert.equal((await raw(srv.port, 'POST', '/t')).status, 200);
      });
      assert.equal(expressWarnings.length, 1);
      assert.match(expressWarnings[0].message, /^throttlegate\/express: .*"per-tenant".*"tenant"/);
    } finally {
      await srv.close();
      await mw.limiter.close();
    }
  });
});
