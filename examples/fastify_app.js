// A Fastify app limited by throttlegate.
//
//   node examples/fastify_app.js                      # embedded backend
//   REDIS_URL=redis://127.0.0.1:6379 PORT=3000 node examples/fastify_app.js
//
// Every client may make 10 requests a minute (the same rule as
// examples/express_app.js), and 3 login attempts per 15 minutes (the
// policy's `login` rule, matched on the route Fastify dispatches to); POST
// /signup has a route limit in its config, 2 a minute per client on top of
// the policy's rules, in the same check; /health is not checked, and the /admin routes (a context of their own) get a stricter
// limit of 2 a minute on top. Behind a reverse proxy, list it in
// TRUSTED_PROXIES (comma-separated addresses or networks) so X-Forwarded-For
// is believed. ON_BACKEND_ERROR (allow | deny | error) says what happens when
// Redis is down.
'use strict';

const Fastify = require('fastify');
const { Limiter } = require('throttlegate');

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

const ADMIN_POLICY = { rules: [{ name: 'admin', key: 'admin:{ip}', limit: 2, window: '1m' }] };

/**
 * Build the app. `options.url` picks the backend (embedded when absent);
 * the other options are the Limiter's (`prefix`, `clock`, `onBackendError`, ...).
 */
function createApp({ url, trustedProxies = [], ...limiterOptions } = {}) {
  const limiter = new Limiter(POLICY, { url, ...limiterOptions });
  const app = Fastify();
  app.register(require('throttlegate/fastify'), { limiter, trustedProxies });
  app.get('/', async (request) => ({ hello: 'world', remaining: request.rateLimit.remaining }));
  app.post('/login', async () => ({ loggedIn: true }));
  app.post('/signup', { config: { rateLimit: '2/minute' } }, async () => ({ signedUp: true }));
  app.get('/health', { config: { rateLimit: false } }, async () => ({ ok: true }));
  // Encapsulated: this limiter checks only the routes of this context.
  app.register(async (admin) => {
    admin.register(require('throttlegate/fastify'), {
      policy: ADMIN_POLICY,
      limiterOptions: { url, prefix: limiterOptions.prefix, clock: limiterOptions.clock },
      trustedProxies,
    });
    admin.get('/admin/stats', async () => ({ stats: true }));
  });
  app.addHook('onClose', async () => limiter.close());
  return { app, limiter };
}

module.exports = { createApp, POLICY };

if (require.main === module) {
  const trustedProxies = (process.env.TRUSTED_PROXIES || '').split(',').filter(Boolean);
  const options = { url: process.env.REDIS_URL, trustedProxies };
  if (process.env.ON_BACKEND_ERROR) options.onBackendError = process.env.ON_BACKEND_ERROR;
  if (process.env.KEY_PREFIX) options.prefix = process.env.KEY_PREFIX;
  const { app, limiter } = createApp(options);
  app.listen({ port: Number(process.env.PORT || 3000), host: '127.0.0.1' }).then((address) => {
    console.log(`listening on ${address} (${limiter.backend} backend)`);
  });
  process.on('SIGINT', () => app.close());
  process.on('SIGTERM', () => app.close());
}
