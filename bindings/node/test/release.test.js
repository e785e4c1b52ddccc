// Express and Fastify give back the concurrency slot a request holds when
// its response is finished: after a normal response, after the handler
// threw, and when the client disconnects in the middle of a streamed
// response. Real HTTP servers on loopback, a real redis-server, one slot per
// client address and a lease far longer than the test: a next request is
// admitted only because the integration released the slot. And the API
// itself on every backend and call path (embedded in place, the limiter's
// own Redis connection, a Cluster's queued calls, acquire): the lease id on
// decisions, idempotent releases, renewals, bad input.
'use strict';

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');
const express = require('express');
const Fastify = require('fastify');
const { Limiter } = require('throttlegate');
const { rateLimit } = require('throttlegate/express');
const throttlegate = require('throttlegate/fastify');
const { startRedis, startCluster, freshPrefix } = require('./helpers.js');

const POLICY = { rules: [{ name: 'one-at-a-time', key: 'busy:{ip}', algorithm: 'concurrency', limit: 1, lease: '10m' }] };
// How long a released slot may take to be seen free (the release runs as the response ends).
const SETTLE_MS = 10000;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The status of one GET over a fresh connection. */
async function get(url, path) {
  const res = await fetch(`${url}${path}`, { headers: { connection: 'close' } });
  await res.arrayBuffer();
  return res.status;
}

/**
 * The status of `path` once it is not refused for the slot (429), tried for
 * SETTLE_MS: the previous response's slot may still be on its way back (the
 * release runs as the response ends, when the client may have it already).
 * 429 if always refused; each refused try holds nothing.
 */
async function onceAdmitted(url, path) {
  const deadline = Date.now() + SETTLE_MS;
  for (;;) {
    const status = await get(url, path);
    if (status !== 429 || Date.now() > deadline) return status;
    await sleep(20);
  }
}

/** Whether `/ok` is admitted within SETTLE_MS. */
async function admittedAgain(url) {
  const status = await onceAdmitted(url, '/ok');
  assert.ok(status === 200 || status === 429, String(status));
  return status === 200;
}

/** A connection asking for `/stream`, and its response up to the first chunk (or a refusal's head). */
function openStream(url) {
  const { hostname, port } = new URL(url);
  const sock = net.connect(Number(port), hostname);
  return new Promise((resolve, reject) => {
    let seen = '';
    sock.once('error', reject);
    sock.on('data', (chunk) => {
      seen += chunk;
      if (seen.includes('\r\n\r\n') && (!seen.startsWith('HTTP/1.1 200') || seen.includes('chunk'))) resolve([sock, seen]);
    });
    sock.write(`GET /stream HTTP/1.1\r\nHost: ${hostname}\r\nConnection: close\r\n\r\n`);
  });
}

/** Start `/stream`, read its first chunk, check the slot is held, then reset the connection. */
async function abandonStream(url) {
  const deadline = Date.now() + SETTLE_MS;
  let sock;
  let head;
  for (;;) {
    [sock, head] = await openStream(url);
    if (!head.startsWith('HTTP/1.1 429') || Date.now() > deadline) break;
    sock.destroy(); // the last /ok's slot is still on its way back
    await sleep(20);
  }
  try {
    assert.ok(head.startsWith('HTTP/1.1 200'), head);
    assert.equal(await get(url, '/ok'), 429, 'the slot was not held while streaming');
  } finally {
    sock.resetAndDestroy();
  }
}

/** A handler streaming a chunk every 20 ms until the response is closed. */
function streamUntilGone(res) {
  res.writeHead(200, { 'content-type': 'text/plain' });
  const timer = setInterval(() => res.write('chunk\n'), 20);
  res.write('chunk\n');
  res.on('close', () => clearInterval(timer));
}

function expressServer(limiter) {
  const app = express();
  app.use(rateLimit({ limiter }));
  app.get('/ok', (req, res) => res.send('ok'));
  app.get('/boom', () => {
    throw new Error('boom');
  });
  app.get('/boom-async', async () => {
    throw new Error('boom');
  });
  app.get('/stream', (req, res) => streamUntilGone(res));
  // Express's default handler logs the error: an error handler of the app's own answers quietly.
  app.use((err, req, res, next) => res.status(500).send('failed'));
  return new Promise((resolve) => {
    const server = app.listen(0, '127.0.0.1', () => {
      resolve({
        url: `http://127.0.0.1:${server.address().port}`,
        close: () => {
          const closed = new Promise((r) => server.close(r));
          server.closeAllConnections();
          return closed;
        },
      });
    });
  });
}

async function fastifyServer(limiter) {
  const app = Fastify();
  await app.register(throttlegate, { limiter });
  app.get('/ok', async () => 'ok');
  app.get('/boom', async () => {
    throw new Error('boom');
  });
  app.get('/boom-async', async () => {
    throw new Error('boom');
  });
  app.get('/stream', (request, reply) => {
    reply.hijack();
    streamUntilGone(reply.raw);
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  return { url: `http://127.0.0.1:${app.server.address().port}`, close: () => app.close() };
}

describe('integrations release concurrency slots', () => {
  let redis;
  before(async () => {
    redis = await startRedis();
  });
  after(async () => {
    await redis.stop();
  });

  for (const [name, serve] of [['express', expressServer], ['fastify', fastifyServer]]) {
    for (const backend of ['memory', 'redis']) {
    it(`${name} on ${backend}: after a response, an error and a client disconnect`, async () => {
      const url = backend === 'redis' ? redis.url : undefined;
      const limiter = new Limiter(POLICY, { url, keyPrefix: freshPrefix('rel') });
      const srv = await serve(limiter);
      try {
        assert.equal(await get(srv.url, '/ok'), 200);
        assert.ok(await admittedAgain(srv.url), 'the slot of a normal response was not released');
        for (const failing of ['/boom', '/boom-async']) {
          assert.equal(await onceAdmitted(srv.url, failing), 500);
          assert.ok(await admittedAgain(srv.url), `the slot of ${failing} was not released`);
        }
        await abandonStream(srv.url);
        assert.ok(await admittedAgain(srv.url), 'the slot of an abandoned stream was not released');
      } finally {
        await srv.close();
        await limiter.close();
      }
    });
    }
  }

  it('rate rules alone hold no lease and need no release', async () => {
    const limiter = new Limiter({ rules: [{ name: 'per-ip', key: 'ip:{ip}', limit: 5, window: '1m' }] },
      { url: redis.url, keyPrefix: freshPrefix('rel') });
    try {
      const d = await limiter.check({ ip: '203.0.113.7' });
      assert.equal(d.allowed, true);
      assert.equal(d.leaseId, null);
      assert.equal(await limiter.release(d), 0);
    } finally {
      await limiter.close();
    }
  });
});

describe('release and extend on every backend', () => {
  const SLOTS = { rules: [{ name: 'slots', key: 'slots:{job}', algorithm: 'concurrency', limit: 2, lease: '1h' }] };
  const JOB = { job: 'export' };
  let redis;
  let cluster;
  before(async () => {
    redis = await startRedis();
    cluster = await startCluster(3);
  });
  after(async () => {
    await redis.stop();
    await cluster.stop();
  });

  for (const backend of ['memory', 'redis', 'cluster']) {
    it(`${backend}: lease ids, releases once, renewals`, async () => {
      const url = backend === 'memory' ? undefined : backend === 'redis' ? redis.url : cluster.url;
      const limiter = new Limiter(SLOTS, { url, keyPrefix: freshPrefix('lease') });
      try {
        // Two checks in one tick (one batch on the queued paths) and one on its own.
        const [a, b] = await Promise.all([limiter.check(JOB), limiter.check(JOB)]);
        assert.equal(a.allowed && b.allowed, true);
        assert.match(a.leaseId, /^[0-9a-f]{32}$/);
        assert.notEqual(a.leaseId, b.leaseId);
        assert.equal(JSON.parse(JSON.stringify(a)).leaseId, a.leaseId);
        const denied = await limiter.check(JOB);
        assert.equal(denied.allowed, false);
        assert.equal(denied.leaseId, null);
        assert.equal(await limiter.release(denied), 0);
        assert.equal(await limiter.extend(a, 60000), 1);
        assert.equal(await limiter.extend(a, '2m'), 1);
        assert.equal(await limiter.release(a), 1);
        assert.equal(await limiter.release(a), 0);
        assert.equal(await limiter.extend(a, 1000), 0);
        // By call id: the call id is the lease id.
        const c = await limiter.check(JOB, { callId: 'job-1' });
        assert.equal(c.leaseId, 'job-1');
        assert.equal(await limiter.extendCall(JOB, 'job-1', 30000), 1);
        assert.equal(await limiter.releaseCall(JOB, 'job-1'), 1);
        assert.equal(await limiter.releaseCall(JOB, 'job-1'), 0);
        // acquire holds a slot like a check.
        const d = await limiter.acquire(JOB, { timeout: 1000 });
        assert.match(d.leaseId, /^[0-9a-f]{32}$/);
        assert.equal((await limiter.check(JOB)).allowed, false);
        assert.equal(await limiter.release(d), 1);
        assert.equal(await limiter.release(b), 1);
      } finally {
        await limiter.close();
      }
    });
  }

  it('bad input: coded errors with the core\'s message', async () => {
    const limiter = new Limiter(SLOTS);
    const d = await limiter.check(JOB);
    await assert.rejects(limiter.extend(d, 0), { code: 'invalid_argument', message: 'duration: must be between 1ms and 366d, not 0' });
    await assert.rejects(limiter.extend(d, -1), (e) => e.code === 'invalid_argument' && e.message.startsWith('duration: '));
    await assert.rejects(limiter.extendCall(JOB, 'x', 'soon'), (e) => e.code === 'invalid_argument' && e.message.startsWith('duration: '));
    await assert.rejects(limiter.releaseCall(JOB, ''), { code: 'invalid_argument', message: 'call_id: "" must be 1-64 characters from A-Z a-z 0-9 _ -' });
    await assert.rejects(limiter.releaseCall(JOB, 7), (e) => e.code === 'invalid_argument' && e.message.includes('callId'));
    await assert.rejects(limiter.release({ allowed: true }), { code: 'invalid_argument', message: 'decision: expected a Decision' });
    await limiter.close();
    await assert.rejects(limiter.release(d), { code: 'closed' });
  });
});
