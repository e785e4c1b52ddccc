// Fastify plugin over a throttlegate Limiter:
//
//   app.register(require('throttlegate/fastify'), { limiter });
//
// An `onRequest` hook checks each request of the context the plugin is
// registered in (fastify-plugin: the registering context and its children,
// never a sibling). The options are the Express middleware's; a route may
// turn the check off with `config: { rateLimit: false }` or give its own
// `attributes`, `cost` or `skip` in `config: { rateLimit: { ... } }`.
// The client address comes from the core's ClientIp rules on the socket peer
// (Fastify's own `trustProxy` is not consulted); the decision, headers and
// problem body come from the core. This file only wires them to Fastify.
'use strict';

const fp = require('fastify-plugin');
const { invalid, resolveOptions, checkFunctions, clientAddress } = require('./middleware.js');

const WHERE = 'throttlegate/fastify';
const ROUTE_KEYS = new Set(['attributes', 'cost', 'skip']);

function defaultOnDenied(request, reply, decision) {
  // A Buffer: Fastify would add `; charset=utf-8` to a string's type, and the
  // type is the Express middleware's, byte for byte.
  return reply.code(429).headers(decision.headers).type('application/problem+json')
    .send(Buffer.from(decision.problemJson));
}

function defaultOnError(err) {
  throw err;
}

/** The route's `config.rateLimit`, validated: undefined, false or an object of ROUTE_KEYS. */
function routeSettings(config, url) {
  const own = config ? config.rateLimit : undefined;
  if (own === undefined || own === false) return own;
  const where = `${WHERE}: route ${url}: config.rateLimit`;
  if (own === null || typeof own !== 'object') throw invalid(where, 'expected false or an object');
  for (const key of Object.keys(own)) {
    if (!ROUTE_KEYS.has(key)) throw invalid(where, `unknown option ${JSON.stringify(key)}`);
  }
  checkFunctions(where, own);
  return own;
}

async function throttlegatePlugin(fastify, options) {
  const o = resolveOptions(WHERE, options, { onDenied: defaultOnDenied, onError: defaultOnError });
  if (!fastify.hasRequestDecorator('rateLimit')) fastify.decorateRequest('rateLimit', null);

  // A route's settings are checked when it is declared, not on its first request.
  fastify.addHook('onRoute', (route) => {
    routeSettings(route.config, route.url);
  });

  fastify.addHook('onRequest', async function onRequest(request, reply) {
    const routeOptions = request.routeOptions;
    const own = routeOptions ? routeOptions.config && routeOptions.config.rateLimit : undefined;
    if (own === false) return;
    const route = own || {};
    const attributes = route.attributes || o.attributes;
    const cost = route.cost === undefined ? o.cost : route.cost;
    const skip = route.skip || o.skip;
    try {
      if (skip !== undefined && (await skip(request))) return;
      const ip = clientAddress(o.clientIp, request.raw);
      const attrs = await attributes(request, ip);
      const units = typeof cost === 'function' ? await cost(request) : cost;
      const decision = await o.limiter.check(attrs, { cost: units });
      request.rateLimit = decision;
      if (!decision.allowed) {
        await o.onDenied(request, reply, decision);
        return reply;
      }
      if (o.headers) reply.headers(decision.headers);
    } catch (err) {
      // A handler that neither answers nor throws lets the request through.
      await o.onError(err, request, reply);
      if (reply.sent) return reply;
    }
  });

  // A limiter the plugin built from `policy` is closed with the app.
  if (options.limiter === undefined) fastify.addHook('onClose', () => o.limiter.close());
}

const plugin = fp(throttlegatePlugin, { fastify: '4.x || 5.x', name: 'throttlegate' });

module.exports = plugin;
module.exports.default = plugin;
module.exports.throttlegate = plugin;
