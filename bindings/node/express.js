// Express (and plain `node:http`) middleware over a throttlegate Limiter.
//
// The client address comes from the core's ClientIp rules (socket peer by
// default, forwarded headers only through trusted proxies); the decision,
// headers and problem body come from the core. This file only wires them to
// the request and the response.
'use strict';

const { resolveOptions, clientAddress } = require('./middleware.js');

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
  const { limiter, clientIp, attributes, cost, skip, headers: sendHeaders, onDenied, onError } = resolveOptions(
    'rateLimit', options, { onDenied: defaultOnDenied, onError: defaultOnError });

  async function middleware(req, res, next) {
    try {
      if (skip !== undefined && (await skip(req))) return next();
      const ip = clientAddress(clientIp, req);
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
