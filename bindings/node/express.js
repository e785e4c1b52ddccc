// Express (and plain `node:http`) middleware over a throttlegate Limiter.
//
// The client address comes from the core's ClientIp rules (socket peer by
// default, forwarded headers only through trusted proxies); the decision,
// headers and problem body come from the core. This file only wires them to
// the request and the response.
'use strict';

const { Limiter, ClientIp } = require('./index.js');

function invalid(message) {
  const e = new Error(`rateLimit: ${message}`);
  e.code = 'invalid_argument';
  return e;
}

const KNOWN = new Set([
  'limiter', 'policy', 'limiterOptions', 'onBackendError', 'trustedProxies', 'ipv6Prefix',
  'attributes', 'cost', 'skip', 'headers', 'onDenied', 'onError',
]);

function defaultAttributes(req, clientIp) {
  return clientIp === null ? {} : { ip: clientIp };
}

function setHeaders(res, decision) {
  for (const [name, value] of Object.entries(decision.headers)) res.setHeader(name, value);
}

function defaultOnDenied(req, res, next, decision) {
  setHeaders(res, decision);
  res.statusCode = 429;
  res.setHeader('Content-Type', 'application/problem+json');
  res.end(decision.problemJson);
}

function defaultOnError(err, req, res, next) {
  next(err);
}

/**
 * Make a middleware that checks every request against a limiter.
 * See express.d.ts for the options.
 */
function rateLimit(options) {
  if (options === null || typeof options !== 'object') {
    throw invalid('expected an options object');
  }
  for (const key of Object.keys(options)) {
    if (!KNOWN.has(key)) throw invalid(`unknown option ${JSON.stringify(key)}`);
  }
  let limiter = options.limiter;
  if (limiter !== undefined) {
    if (!(limiter instanceof Limiter)) throw invalid('limiter: expected a Limiter');
    if (options.policy !== undefined || options.limiterOptions !== undefined || options.onBackendError !== undefined) {
      throw invalid('give either `limiter`, or `policy` with `limiterOptions`/`onBackendError`, not both ' +
        '(a Limiter carries its own onBackendError)');
    }
  } else if (options.policy !== undefined) {
    const limiterOptions = { ...(options.limiterOptions || {}) };
    if (options.onBackendError !== undefined) limiterOptions.onBackendError = options.onBackendError;
    limiter = new Limiter(options.policy, limiterOptions);
  } else {
    throw invalid('expected a `limiter` or a `policy`');
  }
  const clientIp = new ClientIp({ trustedProxies: options.trustedProxies, ipv6Prefix: options.ipv6Prefix });
  const attributes = options.attributes === undefined ? defaultAttributes : options.attributes;
  const cost = options.cost === undefined ? 1 : options.cost;
  const skip = options.skip;
  const sendHeaders = options.headers === undefined ? true : options.headers;
  const onDenied = options.onDenied === undefined ? defaultOnDenied : options.onDenied;
  const onError = options.onError === undefined ? defaultOnError : options.onError;
  for (const [name, fn] of [['attributes', attributes], ['onDenied', onDenied], ['onError', onError]]) {
    if (typeof fn !== 'function') throw invalid(`${name}: expected a function`);
  }
  if (skip !== undefined && typeof skip !== 'function') throw invalid('skip: expected a function');
  if (typeof cost !== 'function' && typeof cost !== 'number') throw invalid('cost: expected a number or a function');
  if (typeof sendHeaders !== 'boolean') throw invalid('headers: expected a boolean');

  async function middleware(req, res, next) {
    try {
      if (skip !== undefined && (await skip(req))) return next();
      const socket = req.socket || req.connection;
      const ip = clientIp.clientIp(
        socket ? socket.remoteAddress : null,
        req.headers.forwarded,
        req.headers['x-forwarded-for'],
      );
      const attrs = await attributes(req, ip);
      const units = typeof cost === 'function' ? await cost(req) : cost;
      const decision = await limiter.check(attrs, { cost: units });
      req.rateLimit = decision;
      if (!decision.allowed) return onDenied(req, res, next, decision);
      if (sendHeaders) setHeaders(res, decision);
      return next();
    } catch (err) {
      return onError(err, req, res, next);
    }
  }
  middleware.limiter = limiter;
  return middleware;
}

module.exports = { rateLimit };
