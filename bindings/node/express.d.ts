// Types of `throttlegate/express` (hand-written: the middleware is JavaScript).
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Decision, Limiter, LimiterOptions, Policy, PolicyObject } from './index';

/**
 * A request as the middleware sees it: `rateLimit` is set to the decision,
 * `rateLimitAttributes` to the attributes it was checked with.
 */
export type RateLimitedRequest = IncomingMessage & {
  rateLimit?: Decision;
  rateLimitAttributes?: Record<string, string | null | undefined>;
};

declare global {
  // Express's own Request (@types/express) merges this interface: on an
  // Express app, `req.rateLimit` and `req.rateLimitAttributes` are typed
  // without a cast (undefined before the middleware ran, or when it skipped
  // the request).
  namespace Express {
    interface Request {
      /** The decision of the throttlegate middleware for this request. */
      rateLimit?: Decision;
      /** The attributes the request was checked with. */
      rateLimitAttributes?: Record<string, string | null | undefined>;
    }
  }
}

/** Express's `next`. */
export type NextFunction = (err?: unknown) => void;

/** Options of {@link rateLimit}: give a `limiter`, or a `policy` to build one. */
export interface RateLimitOptions<Req extends IncomingMessage = IncomingMessage, Res extends ServerResponse = ServerResponse> {
  /** The limiter to check with (it carries its own `onBackendError`). */
  limiter?: Limiter;
  /** A policy to build a limiter from (a `Policy`, a file path or a plain object). */
  policy?: Policy | string | PolicyObject;
  /** Options of the limiter built from `policy` (for instance `url`). */
  limiterOptions?: LimiterOptions;
  /**
   * When the backend is down or too slow (only with `policy`): admit the
   * request (`'allow'`), deny it with 429 (`'deny'`), or pass the error to
   * `onError` (`'error'`). Both admitted and denied answers are marked `degraded`.
   */
  onBackendError?: 'allow' | 'deny' | 'error';
  /** Proxies whose `Forwarded` / `X-Forwarded-For` headers are believed (addresses or CIDR networks). */
  trustedProxies?: string[];
  /** Bits of an IPv6 client address that identify one client (default 64). */
  ipv6Prefix?: number;
  /**
   * The attributes of a request. Default: the request model
   * (`Limiter.requestAttributes`): `ip` (absent when the peer is not an IP
   * address, so IP rules do not apply), `method`, `route` (the template of
   * the route Express dispatches to, with mount prefixes, as `/users/{id}`),
   * `path`, `host` and the headers the policy's `[attributes]` reads.
   * Given, the start-up warnings about rules it cannot feed are not given.
   */
  attributes?: (req: Req, clientIp: string | null) => Record<string, string | null | undefined> | Promise<Record<string, string | null | undefined>>;
  /** Units a request costs (default 1). */
  cost?: number | ((req: Req) => number | Promise<number>);
  /** Requests for which this returns true are not checked. */
  skip?: (req: Req) => boolean | Promise<boolean>;
  /** Set the `RateLimit-*` headers on admitted responses (default true). */
  headers?: boolean;
  /** Answer a denied request. Default: 429 with the headers and a problem+json body. */
  onDenied?: (req: Req, res: Res, next: NextFunction, decision: Decision) => unknown;
  /** Handle an error of the check. Default: `next(err)`. */
  onError?: (err: Error & { code?: string }, req: Req, res: Res, next: NextFunction) => unknown;
}

/** A route limit: a rate string (`'5/minute'`, `'100 per hour'`, `'10/30s'`), or an object. */
export type RouteLimitOptions = string | {
  /** The rate string. */
  rate: string;
  /** The key template (default `'{ip}'`). */
  key?: string;
  /** The rule's name (default derived from the route and method). */
  name?: string;
};

/** The middleware; `limiter` is the limiter it checks with (close it on shutdown). */
export interface RateLimitMiddleware<Req extends IncomingMessage = IncomingMessage, Res extends ServerResponse = ServerResponse> {
  (req: Req, res: Res, next: NextFunction): void | Promise<void>;
  readonly limiter: Limiter;
  /**
   * A route limit, given to a route before its handler:
   * `app.post('/login', limited.limit('5/minute'), handler)`. It joins the
   * limiter's policy for that route and method, so the request is checked
   * once, in one round trip, with the policy's rules (by this middleware
   * when the app uses it, else by the route limit itself). Throws
   * (`code` `invalid_argument`) for a bad rate.
   */
  limit(rate: RouteLimitOptions): (req: Req, res: Res, next: NextFunction) => void | Promise<void>;
}

/** Make a middleware that checks every request against a limiter. */
export declare function rateLimit<Req extends IncomingMessage = IncomingMessage, Res extends ServerResponse = ServerResponse>(
  options: RateLimitOptions<Req, Res>,
): RateLimitMiddleware<Req, Res>;
