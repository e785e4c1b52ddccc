// Express (and plain `node:http`) middleware over a throttlegate Limiter.
//
//   const limiter = rateLimit({ policy: 'rules.toml' });
//   app.use(limiter);                                          // every request
//   app.post('/login', limiter.limit('5/minute'), handler);    // a route limit
//
// The attributes of a request are the core's request model
// (`Limiter.requestAttributes`): the client address per the core's ClientIp
// rules, the method, the route Express will dispatch to (resolved here with
// Express's own matcher: the layers of the app's router and of the routers
// mounted in it), the path and host as received, and the headers the
// policy's `[attributes]` reads; normalising them (case, trailing slash,
// percent-encoding, HEAD as GET) is the core's, under the app's `case
// sensitive routing` and `strict routing` settings. Route limits
// (`limit(rate)`) join the limiter's policy (`Limiter.addRouteLimit`), so a
// request is checked once, in one round trip, against the policy's rules
// and its route's limits. The decision, headers and problem body come from
// the core; this file only wires them to the request and the response.
// A decision holding concurrency slots releases them when the response is
// finished: its 'finish' or 'close' event, whichever comes first (a handler
// that threw is answered by Express's error handler, then finishes; a
// client that went away closes it).
'use strict';

const {
  invalid, resolveOptions, clientAddress, requestModel, startupWarnings, denial, routeLimitSpec, addRouteLimit,
  targetPath, releaseWhenFinished,
} = require('./middleware.js');
const { parseRate } = require('./index.js');

const WHERE = 'throttlegate/express';
// The middleware state that checked a request (a request is checked once per middleware).
const kChecked = Symbol('throttlegate.checked');
// On a route limit's middleware: its spec and the state it belongs to.
const kRouteLimit = Symbol('throttlegate.routeLimit');
// Routers are nested this deep at most when routes are resolved.
const MAX_DEPTH = 32;

function setHeaders(res, decision) {
  for (const [name, value] of Object.entries(decision.headers)) res.setHeader(name, value);
}

function defaultOnDenied(req, res, next, decision) {
  const answer = denial(decision);
  res.statusCode = answer.status;
  for (const [name, value] of answer.headers) res.setHeader(name, value);
  res.end(answer.body);
}

function defaultOnError(err, req, res, next) {
  next(err);
}

// --- Express's router, read as it dispatches (Express 5's `router`; Express 4's own) ---

/** The app a request entered: mounted apps lead to their top parent. */
function rootApp(req) {
  let app = req.app;
  if (app === undefined || app === null) return null;
  for (let i = 0; app.parent && i < MAX_DEPTH; i++) app = app.parent;
  return app;
}

/** The app's router: Express 4 keeps it in `_router`, Express 5 in `router`. */
function routerOf(app) {
  if (app === null || typeof app !== 'function') return null;
  if (app._router && Array.isArray(app._router.stack)) return app._router;
  try {
    const router = app.router;
    return router && Array.isArray(router.stack) ? router : null;
  } catch {
    return null; // Express 4 throws on `app.router`
  }
}

/** The router's comparison rules from the app's settings. */
function routerRules(app) {
  if (app === null || typeof app.enabled !== 'function') return undefined;
  return {
    caseInsensitive: !app.enabled('case sensitive routing'),
    ignoreTrailingSlash: !app.enabled('strict routing'),
  };
}

/** The path of a request target, without query or fragment (what Express's router matches). */
function pathname(url) {
  const path = targetPath(url);
  const end = path.search(/[?#]/);
  return end === -1 ? path : path.slice(0, end);
}

/** A layer's match of `path`: `{ path, pattern }`, or null. */
function layerMatch(layer, path) {
  let m;
  try {
    m = layer.match(path);
  } catch {
    return null; // a parameter that does not decode: Express answers 400, no handler runs
  }
  if (!m) return null;
  if (m === true) {
    // Express 4: the layer keeps what it matched.
    return { path: layer.path || '', pattern: layer.route ? layer.route.path : null };
  }
  return { path: m.path || '', pattern: m.pattern };
}

/** A route or mount pattern as text (a RegExp route has no template but its source). */
function patternText(pattern) {
  if (pattern === null || pattern === undefined) return '';
  return typeof pattern === 'string' ? pattern : String(pattern);
}

/** `prefix` then `pattern`, with one slash between them. */
function join(prefix, pattern) {
  const p = patternText(pattern);
  if (p === '' || p === '/') return prefix === '' ? p : prefix;
  return prefix.replace(/\/+$/, '') + p;
}

/** Whether `route` handles `method` as Express dispatches it (HEAD reaches GET). */
function handles(route, method) {
  if (typeof route._handlesMethod === 'function') return route._handlesMethod(method);
  if (typeof route._handles_method === 'function') return route._handles_method(method);
  return true;
}

/** A layer whose handle is a router (`app.use('/api', router)`). */
function mountedRouter(layer) {
  const handle = layer.handle;
  return !layer.route && handle && Array.isArray(handle.stack) && typeof handle.handle === 'function' ? handle : null;
}

/**
 * The template (with mount prefixes) of the route `router` dispatches
 * `method path` to, as Express does: the first route layer that matches the
 * path and handles the method, looking into mounted routers in order.
 * Null when none does.
 */
function resolveRoute(router, method, path, prefix = '', depth = 0) {
  for (const layer of router.stack) {
    const m = layerMatch(layer, path);
    if (m === null) continue;
    if (layer.route) {
      if (handles(layer.route, method)) return join(prefix, m.pattern);
      continue;
    }
    const inner = mountedRouter(layer);
    if (inner === null || depth >= MAX_DEPTH) continue;
    const matched = m.path;
    if (matched.length !== 0) {
      // Express trims a prefix only where the path breaks on a slash.
      if (path.slice(0, matched.length) !== matched) continue;
      const c = path[matched.length];
      if (c !== undefined && c !== '/') continue;
    }
    let rest = path.slice(matched.length);
    if (rest[0] !== '/') rest = `/${rest}`;
    // The mount's pattern (a RegExp as its source), so every spelling gives one route;
    // Express 4 keeps none: the text it matched.
    const mount = m.pattern !== null && m.pattern !== undefined ? m.pattern : matched;
    const found = resolveRoute(inner, method, rest, join(prefix, mount), depth + 1);
    if (found !== null) return found;
  }
  return null;
}

/**
 * The route limits of this middleware (`limit(...)`) found in `router`'s
 * routes and its mounted routers: `[middleware, route template, methods]`.
 */
function findLimits(state, router, prefix, depth, out) {
  for (const layer of router.stack) {
    const route = layer.route;
    if (route) {
      const paths = Array.isArray(layer.rawPath) ? layer.rawPath : [route.path];
      for (const handler of route.stack || []) {
        const own = handler.handle && handler.handle[kRouteLimit];
        if (own === undefined || own.state !== state) continue;
        const methods = handler.method ? [handler.method.toUpperCase()] : [];
        for (const p of paths) out.push([own, join(prefix, p), methods]);
      }
      continue;
    }
    const inner = mountedRouter(layer);
    // Express 4 keeps no mount pattern: its mounted routes register on their first request.
    if (inner === null || depth >= MAX_DEPTH || layer.rawPath === undefined) continue;
    for (const mount of Array.isArray(layer.rawPath) ? layer.rawPath : [layer.rawPath]) {
      if (typeof mount === 'string' || mount instanceof RegExp) findLimits(state, inner, join(prefix, mount), depth + 1, out);
    }
  }
  return out;
}

/** Register a route limit with the limiter once per route template. */
function register(state, own, route, methods) {
  const id = `${methods.join(',')} ${route}`;
  if (own.routes.has(id)) return;
  addRouteLimit(WHERE, state.limiter, own.spec, route, methods, state.attributes);
  own.routes.add(id);
}

/**
 * Put the route limits declared since the last look into the limiter's
 * policy (once per new `limit(...)` and app: a look walks the routers of
 * the app the request entered, and of the mounted app it is in, if any).
 */
function registerLimits(state, req) {
  const root = rootApp(req);
  for (const app of req.app && req.app !== root ? [root, req.app] : [root]) {
    if (app === null || state.seen.get(app) === state.made) continue;
    const router = routerOf(app);
    if (router === null) continue;
    state.seen.set(app, state.made);
    const mount = app !== root && typeof app.path === 'function' ? app.path() : '';
    for (const [own, route, methods] of findLimits(state, router, mount, 0, [])) register(state, own, route, methods);
  }
}

/**
 * The template of the route Express dispatches `req` to, per its own
 * matcher, from the app the request entered (and, in a mounted app, whose
 * routes the parent's router cannot see into, from that app under its
 * mount path); null when none.
 */
function routeOf(req) {
  const app = rootApp(req);
  const router = routerOf(app);
  let route = router === null ? null : resolveRoute(router, req.method, pathname(req.originalUrl || req.url));
  if (route === null && req.app && req.app !== app) {
    const own = routerOf(req.app);
    const mount = typeof req.app.path === 'function' ? req.app.path() : '';
    if (own !== null) route = resolveRoute(own, req.method, pathname(req.url), mount);
  }
  return route;
}

/**
 * Make a middleware that checks every request against a limiter.
 * See express.d.ts for the options.
 */
function rateLimit(options) {
  const o = resolveOptions(WHERE, options, { onDenied: defaultOnDenied, onError: defaultOnError });
  const { limiter, clientIp, cost, skip, headers: sendHeaders, onDenied, onError } = o;
  startupWarnings(WHERE, limiter, o.attributes);
  // `made`: route limits made; `seen`: per app, `made` when its routers were last looked at.
  const state = { limiter, attributes: o.attributes, made: 0, seen: new WeakMap() };

  /**
   * The request model of `req`: the route Express dispatches it to, per its
   * own matcher, from the app the request entered (and, in a mounted app,
   * whose routes the parent's router cannot see into, from that app under
   * its mount path).
   */
  function modelOf(req, ip) {
    const app = rootApp(req);
    const url = req.originalUrl || req.url;
    return requestModel(limiter, req, ip, routeOf(req), url, routerRules(app));
  }

  async function checkRequest(req, res, next) {
    req[kChecked] = state;
    try {
      if (skip !== undefined && (await skip(req))) return next();
      registerLimits(state, req);
      const ip = clientAddress(clientIp, req);
      const attrs = o.attributes === null ? modelOf(req, ip) : await o.attributes(req, ip);
      const units = typeof cost === 'function' ? await cost(req) : cost;
      const decision = await limiter.check(attrs, { cost: units });
      req.rateLimit = decision;
      req.rateLimitAttributes = attrs;
      if (!decision.allowed) return onDenied(req, res, next, decision);
      releaseWhenFinished(limiter, decision, res);
      if (sendHeaders) setHeaders(res, decision);
      return next();
    } catch (err) {
      return onError(err, req, res, next);
    }
  }

  function middleware(req, res, next) {
    if (req[kChecked] === state) return next();
    return checkRequest(req, res, next);
  }

  /**
   * A route limit: `app.post('/login', limiter.limit('5/minute'), handler)`.
   * `rate` is a rate string, or `{ rate, key, name }`. The limit joins the
   * limiter's policy; the request is checked once, by the app-level
   * middleware when it is in use, else here.
   */
  function limit(rate) {
    const spec = routeLimitSpec(`${WHERE}: limit`, rate);
    if (spec === null) throw invalid(`${WHERE}: limit`, 'expected a rate');
    // The rate's grammar is checked now, where the limit is written.
    try {
      parseRate(spec.rate);
    } catch (err) {
      throw invalid(`${WHERE}: limit`, err.message);
    }
    const own = { state, spec, routes: new Set() };
    state.made += 1;
    function routeLimit(req, res, next) {
      try {
        registerLimits(state, req);
        if (own.routes.size === 0) {
          // A route the walk of the routers did not find (Express 4's mounts keep no
          // pattern): registered as the request model resolves it, from this request on.
          if (!req.route) throw invalid(`${WHERE}: limit`, 'give it to a route: app.post(path, limit(rate), handler)');
          const route = routeOf(req);
          if (route === null) {
            throw invalid(`${WHERE}: limit`, `cannot resolve the route of ${req.method} ${req.originalUrl} ` +
              'from the app\'s routers, so its limit would never apply');
          }
          const methods = Object.keys(req.route.methods || {}).filter((m) => m !== '_all').map((m) => m.toUpperCase());
          register(state, own, route, methods);
        }
        if (req[kChecked] === state && o.attributes === null && req.rateLimitAttributes
          && req.rateLimitAttributes.route === undefined) {
          // Checked before Express reached this route, without it: the limit was not in that check.
          throw invalid(`${WHERE}: limit`, `the middleware checked ${req.method} ${req.originalUrl} before it ` +
            'could see its route (a route of a mounted app): mount an express.Router instead, or give the ' +
            'mounted app a rateLimit of its own');
        }
      } catch (err) {
        return onError(err, req, res, next);
      }
      if (req[kChecked] === state) return next();
      return checkRequest(req, res, next);
    }
    Object.defineProperty(routeLimit, kRouteLimit, { value: own });
    return routeLimit;
  }

  middleware.limiter = limiter;
  middleware.limit = limit;
  return middleware;
}

module.exports = { rateLimit };
