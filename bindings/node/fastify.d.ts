// Types of `throttlegate/fastify` (hand-written: the plugin is JavaScript).
import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify';
import type { Decision, Limiter, LimiterOptions, Policy, PolicyObject } from './index';

type Attributes = Record<string, string | null | undefined>;

declare module 'fastify' {
  interface FastifyRequest {
    /**
     * The decision of the request's check: null when the route was not
     * checked, undefined outside the contexts the plugin is registered in.
     */
    rateLimit?: Decision | null;
    /** The attributes the request was checked with (null when it was not checked). */
    rateLimitAttributes?: Record<string, string | null | undefined> | null;
  }
  interface FastifyContextConfig {
    /**
     * `false`: this route is not checked; a rate string (`'5/minute'`): a
     * route limit; an object: a route limit's `rate`, `key` and `name`, and
     * the route's own attributes, cost or skip.
     */
    rateLimit?: false | string | throttlegate.RouteRateLimitOptions;
  }
}

declare namespace throttlegate {
  /**
   * What a route may set in `config.rateLimit`: a route limit (`rate`,
   * `key`, `name`), and its own `attributes`, `cost` and `skip`, replacing
   * the plugin's options of the same name.
   */
  export interface RouteRateLimitOptions extends RequestOptions {
    /**
     * A route limit (`'5/minute'`, `'100 per hour'`, `'10/30s'`) on this
     * route and its methods: it joins the limiter's policy when the route
     * is declared, and is checked with the policy's rules, in one round trip.
     */
    rate?: string;
    /** The route limit's key template (default `'{ip}'`). */
    key?: string;
    /** The route limit's rule name (default derived from the route and methods). */
    name?: string;
  }

  /** How requests are checked: set on the plugin, or per route in `config.rateLimit`. */
  export interface RequestOptions {
    /**
     * The attributes of the route's requests (default: the request model,
     * `Limiter.requestAttributes`: `ip`, `method`, `route`, `path`, `host`
     * and the headers the policy's `[attributes]` reads).
     */
    attributes?: (request: FastifyRequest, clientIp: string | null) => Attributes | Promise<Attributes>;
    /** Units a request to the route costs. */
    cost?: number | ((request: FastifyRequest) => number | Promise<number>);
    /** Requests of the route for which this returns true are not checked. */
    skip?: (request: FastifyRequest) => boolean | Promise<boolean>;
  }

  /** Options of the plugin: give a `limiter`, or a `policy` to build one (closed with the app). */
  export interface FastifyRateLimitOptions extends RequestOptions {
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
    /** Set the `RateLimit-*` headers on admitted responses (default true). */
    headers?: boolean;
    /** Answer a denied request. Default: 429 with the headers and a problem+json body. */
    onDenied?: (request: FastifyRequest, reply: FastifyReply, decision: Decision) => unknown;
    /**
     * Handle an error of the check. Default: rethrow it (Fastify's error
     * handler answers). A handler that neither answers nor throws lets the
     * request through.
     */
    onError?: (err: Error & { code?: string }, request: FastifyRequest, reply: FastifyReply) => unknown;
  }

  /** The plugin, also as a named export. */
  export const throttlegate: FastifyPluginAsync<FastifyRateLimitOptions>;
  export { throttlegate as default };
}

/** The plugin: `app.register(require('throttlegate/fastify'), { limiter })`. */
declare function throttlegate(
  ...params: Parameters<FastifyPluginAsync<throttlegate.FastifyRateLimitOptions>>
): ReturnType<FastifyPluginAsync<throttlegate.FastifyRateLimitOptions>>;

export = throttlegate;
