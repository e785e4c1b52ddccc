// Fastify plugin over a throttlegate Limiter:
//
//   app.register(require('throttlegate/fastify'), { limiter });
//   app.post('/login', { config: { rateLimit: '5/minute' } }, handler);
//
// An `onRequest` hook checks each request of the context the plugin is
// registered in (fastify-plugin: the registering context and its children,
// never a sibling). The attributes of a request are the core's request
// model (`Limiter.requestAttributes`): the client address per the core's
// ClientIp rules on the socket peer (Fastify's own `trustProxy` is not
// consulted), the method, the route Fastify dispatched to
// (`request.routeOptions.url`, with its prefix), the path and host as
// received and the headers the policy's `[attributes]` reads, normalised by
// the core under the router's `caseSensitive` and `ignoreTrailingSlash`.
// A route's `config.rateLimit` is `false` (not checked), a rate string
// (`'5/minute'`, a route limit), or an object with a route limit's `rate`,
// `key` and `name` and its own `attributes`, `cost` or `skip`. Route limits
// join the limiter's policy (`Limiter.addRouteLimit`) when the route is
// declared, so each request is checked once, in one round trip, against
// the policy's rules and its route's limits. The decision, headers and
// problem body come from the core; this file only wires them to Fastify.
// A decision holding concurrency slots releases them when the response is
// finished: the raw response's 'finish' (Fastify's onResponse) or 'close'
// (a request aborted by the client, Fastify's onRequestAbort), whichever
// comes first.
'use strict';

// fastify-plugin is an optional peer dependency, as fastify itself: the
// package does not install it for Express users. Without it, registering
// the plugin fails with an error that names it.
let fp = null;
try {
  fp = require('fastify-plugin');
} catch (err) {
  if (err.code !== 'MODULE_NOT_FOUND' || !String(err.message).includes("'fastify-plugin'")) throw err;
}
const {
  invalid, resolveOptions, checkFunctions, clientAddress, requestModel, startupWarnings, denial, routeLimitSpec,
  addRouteLimit, releaseWhenFinished,
} = require('./middleware.js');

const WHERE = 'throttlegate/fastify';
const ROUTE_KEYS = ['attributes', 'cost', 'skip'];

function defaultOnDenied(request, reply, decision) {
  // The Express middleware's answer, byte for byte (a Buffer: Fastify would
  // add `; charset=utf-8` to a string's type).
  const answer = denial(decision);
  reply.code(answer.status);
  for (const [name, value] of answer.headers) reply.header(name, value);
  return reply.send(answer.body);
}

function defaultOnError(err) {
  throw err;
}

/**
 * The route's `config.rateLimit`, validated: undefined, false, or
 * `{ limit, settings }`: the route limit (`{ rate, key, name }` or null)
 * and the route's own `attributes`, `cost` and `skip`.
 */
function routeSettings(config, url) {
  const own = config ? config.rateLimit : undefined;
  if (own === undefined || own === false) return own;
  const where = `${WHERE}: route ${url}: config.rateLimit`;
  if (typeof own !== 'string' && (own === null || typeof own !== 'object')) {
    throw invalid(where, 'expected false, a rate string or an object');
  }
  const limit = routeLimitSpec(where, own, ROUTE_KEYS);
  const settings = typeof own === 'string' ? {} : own;
  checkFunctions(where, settings);
  return { limit, settings };
}

/** The router's comparison rules from Fastify's options (its router's own, or the older top-level ones). */
function routerRules(fastify) {
  const config = fastify.initialConfig || {};
  const router = config.routerOptions || {};
  const caseSensitive = router.caseSensitive ?? config.caseSensitive ?? true;
  const ignoreTrailingSlash = router.ignoreTrailingSlash ?? config.ignoreTrailingSlash ?? false;
  return { caseInsensitive: !caseSensitive, ignoreTrailingSlash };
}

async function throttlegatePlugin(fastify, options) {
  const o = resolveOptions(WHERE, options, { onDenied: defaultOnDenied, onError: defaultOnError });
  if (!fastify.hasRequestDecorator('rateLimit')) fastify.decorateRequest('rateLimit', null);
  if (!fastify.hasRequestDecorator('rateLimitAttributes')) fastify.decorateRequest('rateLimitAttributes', null);
  startupWarnings(WHERE, o.limiter, o.attributes);
  const rules = routerRules(fastify);

  // The route limits in the limiter's policy, by `METHOD,... url`.
  const added = new Set();
  function addLimit(limit, url, method) {
    const methods = Array.isArray(method) ? method : [method];
    const id = `${methods.join(',')} ${url}`;
    if (added.has(id)) return;
    addRouteLimit(WHERE, o.limiter, limit, url, methods, o.attributes);
    added.add(id);
  }

  // A route's settings are checked, and its limit joins the limiter's
  // policy, when it is declared, not on its first request.
  fastify.addHook('onRoute', (route) => {
    const own = routeSettings(route.config, route.url);
    if (own && own.limit !== null) addLimit(own.limit, route.url, route.method);
  });

  fastify.addHook('onRequest', async function onRequest(request, reply) {
    const routeOptions = request.routeOptions;
    const own = routeOptions ? routeOptions.config && routeOptions.config.rateLimit : undefined;
    if (own === false) return;
    const route = own !== null && typeof own === 'object' ? own : {};
    const attributes = route.attributes || o.attributes;
    const cost = route.cost === undefined ? o.cost : route.cost;
    const skip = route.skip || o.skip;
    try {
      if ((typeof own === 'string' || route.rate !== undefined) && !added.has(`${routeOptions.method} ${routeOptions.url}`)) {
        // A route declared before the plugin loaded (`register` not awaited)
        // was not seen by `onRoute`: its limit joins on its first request.
        addLimit(routeSettings(routeOptions.config, routeOptions.url).limit, routeOptions.url, routeOptions.method);
      }
      if (skip !== undefined && (await skip(request))) return;
      const ip = clientAddress(o.clientIp, request.raw);
      const raw = request.raw;
      const attrs = attributes === null
        ? requestModel(o.limiter, raw, ip, (routeOptions && routeOptions.url) ?? null, raw.url, rules)
        : await attributes(request, ip);
      const units = typeof cost === 'function' ? await cost(request) : cost;
      const decision = await o.limiter.check(attrs, { cost: units });
      request.rateLimit = decision;
      request.rateLimitAttributes = attrs;
      if (!decision.allowed) {
        await o.onDenied(request, reply, decision);
        return reply;
      }
      releaseWhenFinished(o.limiter, decision, reply.raw);
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

// Async, so that Fastify's loader turns the error into a failed register()
// / ready() rather than an uncaught exception.
async function missingFastifyPlugin() {
  const e = new Error(
    `${WHERE} needs the package fastify-plugin, which is not installed: ` +
      'install it beside fastify (`npm i fastify-plugin`; fastify-plugin 4 for fastify 4, 5 or later for fastify 5)',
  );
  e.code = 'MODULE_NOT_FOUND';
  throw e;
}

const plugin = fp
  ? fp(throttlegatePlugin, { fastify: '4.x || 5.x', name: 'throttlegate' })
  : missingFastifyPlugin;

module.exports = plugin;
module.exports.default = plugin;
module.exports.throttlegate = plugin;
