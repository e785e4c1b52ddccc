// What the Express middleware and the Fastify plugin share: their options,
// the limiter they check with, the client address of a Node request
// (`IncomingMessage`) through the core's ClientIp rules, the request model
// (the core's `Limiter.requestAttributes` over the framework's raw parts),
// the start-up warnings, the 429 answer's parts and the release of a
// decision's concurrency slots when its response is finished. Internal: the public
// entries are `throttlegate/express` and `throttlegate/fastify`.
'use strict';

const { Limiter, ClientIp } = require('./index.js');

/** An `invalid_argument` error of the named integration. */
function invalid(where, message) {
  const e = new Error(`${where}: ${message}`);
  e.code = 'invalid_argument';
  return e;
}

const COMMON = [
  'limiter', 'policy', 'limiterOptions', 'onBackendError', 'trustedProxies', 'ipv6Prefix',
  'attributes', 'cost', 'skip', 'headers', 'onDenied', 'onError',
];

/**
 * Validate the options of an integration named `where` and resolve them:
 * the limiter (given, or built from `policy`), the ClientIp, and the
 * functions with their defaults. `defaults` gives `onDenied` and `onError`.
 * `attributes` is null when the integration's request model is used.
 */
function resolveOptions(where, options, defaults) {
  if (options === null || typeof options !== 'object') {
    throw invalid(where, 'expected an options object');
  }
  const known = new Set(COMMON);
  for (const key of Object.keys(options)) {
    if (!known.has(key)) throw invalid(where, `unknown option ${JSON.stringify(key)}`);
  }
  let limiter = options.limiter;
  if (limiter !== undefined) {
    if (!(limiter instanceof Limiter)) throw invalid(where, 'limiter: expected a Limiter');
    if (options.policy !== undefined || options.limiterOptions !== undefined || options.onBackendError !== undefined) {
      throw invalid(where, 'give either `limiter`, or `policy` with `limiterOptions`/`onBackendError`, not both ' +
        '(a Limiter carries its own onBackendError)');
    }
  } else if (options.policy !== undefined) {
    const limiterOptions = { ...(options.limiterOptions || {}) };
    if (options.onBackendError !== undefined) limiterOptions.onBackendError = options.onBackendError;
    limiter = new Limiter(options.policy, limiterOptions);
  } else {
    throw invalid(where, 'expected a `limiter` or a `policy`');
  }
  const resolved = {
    limiter,
    clientIp: new ClientIp({ trustedProxies: options.trustedProxies, ipv6Prefix: options.ipv6Prefix }),
    attributes: options.attributes === undefined ? null : options.attributes,
    cost: options.cost === undefined ? 1 : options.cost,
    skip: options.skip,
    headers: options.headers === undefined ? true : options.headers,
    onDenied: options.onDenied === undefined ? defaults.onDenied : options.onDenied,
    onError: options.onError === undefined ? defaults.onError : options.onError,
  };
  checkFunctions(where, resolved);
  return resolved;
}

/** Type checks of the functions and values in `o` (a whole or partial set of options). */
function checkFunctions(where, o) {
  if ('attributes' in o && o.attributes !== null && typeof o.attributes !== 'function') {
    throw invalid(where, 'attributes: expected a function');
  }
  for (const name of ['onDenied', 'onError']) {
    if (name in o && typeof o[name] !== 'function') throw invalid(where, `${name}: expected a function`);
  }
  if (o.skip !== undefined && typeof o.skip !== 'function') throw invalid(where, 'skip: expected a function');
  if ('cost' in o && typeof o.cost !== 'function' && typeof o.cost !== 'number') {
    throw invalid(where, 'cost: expected a number or a function');
  }
  if ('headers' in o && typeof o.headers !== 'boolean') throw invalid(where, 'headers: expected a boolean');
}

/** The client address of a Node request per the core's rules (null for a non-IP peer). */
function clientAddress(clientIp, req) {
  const socket = req.socket || req.connection;
  return clientIp.clientIp(socket ? socket.remoteAddress : null, req.headers.forwarded, req.headers['x-forwarded-for']);
}

/**
 * The request model of a Node request (`IncomingMessage`): the core makes
 * the attributes from the raw parts. `route` is the framework's template of
 * the route it dispatches to (null when none), `path` the request target as
 * received, `router` the router's comparison rules.
 */
function requestModel(limiter, req, ip, route, path, router) {
  // `Limiter.requestAttributes` with the parts as arguments and the
  // attributes as a flat array: the same core function, for less per request.
  const flags = router === undefined ? 0 : (router.caseInsensitive ? 1 : 0) | (router.ignoreTrailingSlash ? 2 : 0);
  const flat = limiter._requestModel(ip, req.method, route, targetPath(path), req.headers.host, req.headers, flags);
  const attributes = {};
  for (let i = 0; i < flat.length; i += 2) attributes[flat[i]] = flat[i + 1];
  return attributes;
}

const ABSOLUTE_FORM = /^[A-Za-z][A-Za-z0-9+.-]*:\/\/[^/?#]*/;

/**
 * The path part of a request target as received (query and all): an
 * absolute-form target (`POST http://host/login`, which Node's server
 * accepts and both routers dispatch by its path) without its scheme and
 * authority.
 */
function targetPath(url) {
  const m = ABSOLUTE_FORM.exec(url);
  if (m === null) return url;
  const rest = url.slice(m[0].length);
  return rest === '' || rest[0] !== '/' ? `/${rest}` : rest;
}

// The warnings already given, per limiter: each is given once per process.
const warned = new WeakMap();

/**
 * Warn once, at start-up, about each rule the integration's request model
 * can never feed (`Limiter.attributeWarnings`), through
 * `process.emitWarning` (type `ThrottlegateWarning`, code
 * `THROTTLEGATE_ATTRIBUTE`). Nothing when the app gives its own
 * `attributes` function: the integration cannot know what it returns.
 */
function startupWarnings(where, limiter, attributes) {
  if (attributes !== null) return;
  let given = warned.get(limiter);
  if (given === undefined) {
    given = new Set();
    warned.set(limiter, given);
  }
  for (const message of limiter.attributeWarnings()) {
    if (given.has(message)) continue;
    given.add(message);
    process.emitWarning(`${where}: ${message}`, { type: 'ThrottlegateWarning', code: 'THROTTLEGATE_ATTRIBUTE' });
  }
}

const PROBLEM_JSON = 'application/problem+json';

/**
 * The 429 answer to a denied decision, as every integration sends it (and
 * the Python ones): the status, the headers in order (the body's type and
 * length, then the core's rate-limit headers) and the core's problem+json body.
 */
function denial(decision) {
  const body = Buffer.from(decision.problemJson || '');
  const headers = [['Content-Type', PROBLEM_JSON], ['Content-Length', String(body.length)]];
  for (const [name, value] of Object.entries(decision.headers)) headers.push([name, value]);
  return { status: 429, headers, body };
}

/**
 * A route limit's options, validated: a rate string, or an object with
 * `rate` and optional `key` and `name`. `extra` lists other keys the object
 * may have (Fastify's per-route `attributes`, `cost`, `skip`).
 */
function routeLimitSpec(where, value, extra = []) {
  if (typeof value === 'string') return { rate: value };
  if (value === null || typeof value !== 'object') throw invalid(where, 'expected a rate string or an object');
  const known = new Set(['rate', 'key', 'name', ...extra]);
  for (const key of Object.keys(value)) {
    if (!known.has(key)) throw invalid(where, `unknown option ${JSON.stringify(key)}`);
  }
  if (value.rate === undefined) return null;
  if (typeof value.rate !== 'string') throw invalid(where, 'rate: expected a rate string such as "5/minute"');
  for (const name of ['key', 'name']) {
    if (value[name] !== undefined && typeof value[name] !== 'string') throw invalid(where, `${name}: expected a string`);
  }
  const spec = { rate: value.rate };
  if (value.key !== undefined) spec.key = value.key;
  if (value.name !== undefined) spec.name = value.name;
  return spec;
}

/**
 * Add a route limit to the limiter's policy (errors name the route), then
 * warn about it, as at start-up, if its key needs an attribute the request
 * model never gives (`attributes`: the integration's option, see
 * `startupWarnings`).
 */
function addRouteLimit(where, limiter, spec, route, methods, attributes) {
  let names;
  try {
    names = limiter.addRouteLimit({ ...spec, route, methods });
  } catch (err) {
    err.message = `${where}: route ${route}: ${err.message}`;
    throw err;
  }
  startupWarnings(where, limiter, attributes);
  return names;
}

/**
 * Release the concurrency slots an admitted `decision` holds once the
 * response `res` (a `ServerResponse`) is finished: on its 'finish' (sent in
 * full) or 'close' (also when the client went away first, and after an
 * error), whichever comes first; once. A decision holding no slot (a
 * denial, rate rules only) needs nothing and costs no round trip. A failed
 * release (the backend is down) is dropped: the slots come back when their
 * lease ends.
 */
function releaseWhenFinished(limiter, decision, res) {
  if (!decision.allowed || decision.leaseId == null) return;
  let done = false;
  const release = () => {
    if (done) return;
    done = true;
    res.removeListener('finish', release);
    res.removeListener('close', release);
    limiter.release(decision).catch(() => {});
  };
  if (res.writableFinished || res.destroyed) {
    release();
    return;
  }
  res.once('finish', release);
  res.once('close', release);
}

module.exports = {
  invalid, resolveOptions, checkFunctions, clientAddress, requestModel, startupWarnings, denial,
  routeLimitSpec, addRouteLimit, targetPath, releaseWhenFinished,
};
