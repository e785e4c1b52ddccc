// What the Express middleware and the Fastify plugin share: their options,
// the limiter they check with, and the client address of a Node request
// (`IncomingMessage`) through the core's ClientIp rules. Internal: the public
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

function defaultAttributes(req, clientIp) {
  return clientIp === null ? {} : { ip: clientIp };
}

/**
 * Validate the options of an integration named `where` and resolve them:
 * the limiter (given, or built from `policy`), the ClientIp, and the
 * functions with their defaults. `defaults` gives `onDenied` and `onError`.
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
    attributes: options.attributes === undefined ? defaultAttributes : options.attributes,
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
  for (const name of ['attributes', 'onDenied', 'onError']) {
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

module.exports = { invalid, resolveOptions, checkFunctions, clientAddress };
