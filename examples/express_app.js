// An Express app limited by throttlegate.
//
//   node examples/express_app.js                      # embedded backend
//   REDIS_URL=redis://127.0.0.1:6379 PORT=3000 node examples/express_app.js
//
// Every client may make 10 requests a minute, and 3 login attempts per
// 15 minutes (the policy's `login` rule, matched on the route Express
// dispatches to, whatever the spelling: /login, /LOGIN, /login/). POST
// /signup has a route limit written on the route: 2 a minute per client, on
// top of the policy's rules, in the same check. POST /generate spends a
// tenant's daily budget of 200 tokens (a limiter of its own): it checks at an
// estimate, does the work, then settles at the real cost. Behind a reverse
// proxy, list it in TRUSTED_PROXIES (comma-separated addresses or networks)
// so X-Forwarded-For is believed.
'use strict';

const crypto = require('node:crypto');
const express = require('express');
const { Limiter, METRICS_CONTENT_TYPE } = require('throttlegate');
const { rateLimit } = require('throttlegate/express');

const POLICY = {
  rules: [
    { name: 'per-ip', key: 'ip:{ip}', limit: 10, window: '1m' },
    {
      name: 'login',
      key: 'login:{ip}',
      match: { route: '/login', method: ['POST'] },
      limit: 3,
      window: '15m',
    },
  ],
};

// Tokens per tenant and day, for /generate: its own limiter, since no
// request carries a tenant for the middleware to limit.
const TOKENS_POLICY = {
  rules: [{ name: 'tokens', key: 'tokens:{tenant}', algorithm: 'quota', limit: 200, period: 'day' }],
};

/** The most tokens a /generate call may use: what its check reserves. */
const ESTIMATE = 100;

/**
 * Build the app. `options.url` picks the backend (embedded when absent);
 * the other options are the Limiter's (`prefix`, `clock`, ...).
 */
function createApp({ url, trustedProxies = [], ...limiterOptions } = {}) {
  const limiter = new Limiter(POLICY, { url, ...limiterOptions });
  const tokens = new Limiter(TOKENS_POLICY, { url, ...limiterOptions });
  const app = express();
  // The limiter's per-rule metrics, for Prometheus: served before the rate
  // limit, so scrapes are never limited.
  app.get('/metrics', (req, res) => {
    res.type(METRICS_CONTENT_TYPE).send(limiter.metricsText() ?? '');
  });
  // Costs known only after the response: check at the estimate (with a call
  // id, so the check can be settled), do the work, settle at the real cost.
  app.post('/generate', express.json(), async (req, res, next) => {
    try {
      const tenant = req.get('x-tenant') || 'anonymous';
      const callId = crypto.randomUUID().replace(/-/g, '');
      const d = await tokens.check({ tenant }, { cost: ESTIMATE, callId });
      if (!d.allowed) {
        res.status(429).set(d.headers).type('application/problem+json').send(d.problemJson);
        return;
      }
      const words = String((req.body && req.body.prompt) || '').split(/\s+/).filter(Boolean);
      const used = 10 * words.length; // the work's real cost, known only now
      const settled = await tokens.settle(d, used);
      res.json({ estimated: ESTIMATE, used, settled });
    } catch (err) {
      next(err);
    }
  });
  // Every request below: checked against the policy (and the route limits).
  const limited = rateLimit({ limiter, trustedProxies });
  app.use(limited);
  app.get('/', (req, res) => {
    res.json({ hello: 'world', remaining: req.rateLimit.remaining });
  });
  app.post('/login', (req, res) => {
    res.json({ loggedIn: true });
  });
  app.post('/signup', limited.limit('2/minute'), (req, res) => {
    res.json({ signedUp: true });
  });
  return { app, limiter, tokens };
}

module.exports = { createApp, POLICY, TOKENS_POLICY };

if (require.main === module) {
  const trustedProxies = (process.env.TRUSTED_PROXIES || '').split(',').filter(Boolean);
  const { app, limiter, tokens } = createApp({ url: process.env.REDIS_URL, trustedProxies });
  const port = Number(process.env.PORT || 3000);
  const server = app.listen(port, '127.0.0.1', () => {
    console.log(`listening on http://127.0.0.1:${server.address().port} (${limiter.backend} backend)`);
  });
  process.on('SIGINT', () => server.close(() => Promise.all([limiter.close(), tokens.close()])));
}
