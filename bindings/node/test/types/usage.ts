// Type-checked by `tsc --noEmit` (never run): the public API as a
// TypeScript user writes it.
import { ClientIp, ErrorCode, Limiter, ManualClock, METRICS_CONTENT_TYPE, parseRate, Policy, VERSION } from 'throttlegate';
import type { AcquireOptions, Decision, LimiterOptions, Metrics, Override, PolicyDiff, PolicyObject, Rate, RuleResult, Stats, TlsOptions } from 'throttlegate';
import { rateLimit } from 'throttlegate/express';
import type { RateLimitedRequest } from 'throttlegate/express';
import { registerMetrics } from 'throttlegate/prometheus';
import { createServer } from 'node:http';
import express from 'express';
import Fastify from 'fastify';
import throttlegateFastify from 'throttlegate/fastify';
import type { FastifyRateLimitOptions } from 'throttlegate/fastify';

const policy: PolicyObject = {
  prefix: 'app:',
  timeout: '100ms',
  on_backend_error: 'allow',
  rules: [
    { name: 'per-ip', key: 'ip:{ip}', limit: 100, window: '1m' },
    { name: 'per-key', key: 'key:{api_key}', algorithm: 'token_bucket', capacity: 20, refill_rate: 5 },
    { name: 'counters', key: 'c:{api_key}', algorithm: 'sliding_window', limit: 1000, window: '1m', precision: '1s' },
    { name: 'fixed', key: 'f:{ip}', algorithm: 'fixed_window', limit: 600, window: 60_000 },
    { name: 'monthly', key: 'm:{tenant}', algorithm: 'quota', limit: 1e12, period: 'month', utc_offset: '+02:00' },
    { name: 'login', key: 'login:{ip}', match: { route: '/login', method: ['POST'] }, limit: 5, window: 900_000 },
  ],
};

const options: LimiterOptions = {
  url: 'redis://127.0.0.1:6379',
  timeout: 50,
  onBackendError: 'deny',
  keyPrefix: 'svc:',
  clock: new ManualClock(1_000_000),
  keySecret: Buffer.from('secret'),
  legacyHeaders: true,
  denyCache: false,
};

const tls: TlsOptions = { ca: [Buffer.from('-----BEGIN CERTIFICATE-----'), 'pem'], cert: 'pem', key: Buffer.from('pem') };
const overTls: LimiterOptions = { url: 'rediss+cluster://127.0.0.1:7000,127.0.0.1:7001', tls };

async function main(): Promise<void> {
  const fromObject = new Limiter(policy);
  const fromFile = new Limiter('policy.toml', options);
  const fromPolicy = new Limiter(Policy.fromString('{"rules": []}'), { clock: 'system' });
  const secure = new Limiter(policy, overTls);
  const d: Decision = await fromObject.check({ ip: '203.0.113.7', api_key: undefined }, { cost: 1, callId: 'r1' });
  const now: Decision = fromObject.checkSync({ ip: '203.0.113.7' }, 2);
  const nowWithOptions: Decision = fromObject.checkSync({ ip: '203.0.113.7' }, { cost: 1, callId: 'r2' });
  console.log(now.allowed, nowWithOptions.remaining);
  const allowed: boolean = d.allowed;
  const wait: number = d.retryAfterMs + d.resetAfterMs + d.limit + d.remaining;
  const rule: string | null = d.rule;
  const results: RuleResult[] = d.results;
  const headers: Record<string, string> = d.headers;
  const degraded: boolean = d.degraded;
  const peeked: Decision = await fromObject.peek({ ip: '203.0.113.7' }, { cost: 2 });
  const deleted: number = await fromObject.reset({ ip: '203.0.113.7' });
  await fromObject.setOverride('per-key', { api_key: 'k1' }, 5000);
  const overrides: Override[] = await fromObject.overrides('per-key');
  const cleared: boolean = await fromObject.clearOverride('per-key', { api_key: 'k1' });
  console.log(overrides.map((o) => [o.rule, o.attributes.api_key, o.limit]), cleared);
  const keys: string[] = fromObject.keys({ ip: '203.0.113.7' });
  const stats: Stats = fromObject.stats();
  const backend: string = fromFile.backend;
  await fromPolicy.ping();
  await secure.close();
  await fromObject.close();
  try {
    await fromObject.check({ ip: 'x' });
  } catch (err) {
    if ((err as { code?: string }).code === ErrorCode.Closed) {
      console.log('closed');
    }
  }
  const ip: string | null = new ClientIp({ trustedProxies: ['10.0.0.0/8'], ipv6Prefix: 64 }).clientIp(
    '10.0.0.1',
    undefined,
    ['198.51.100.9'],
  );
  const middleware = rateLimit<RateLimitedRequest>({
    policy,
    limiterOptions: { url: 'redis://127.0.0.1:6379' },
    onBackendError: 'allow',
    trustedProxies: ['127.0.0.1'],
    attributes: (req, clientIp) => ({ ip: clientIp, route: req.url }),
    cost: () => 1,
    onDenied: (req, res, next, decision) => res.writeHead(429).end(decision.problemJson ?? ''),
  });
  createServer((req, res) => middleware(req, res, () => res.end('ok')));
  // On Express, `req.rateLimit` and `req.rateLimitAttributes` are typed on its own Request.
  const app = express();
  app.use(rateLimit({ policy }));
  app.get('/', (req, res) => {
    const decision: Decision | undefined = req.rateLimit;
    const checkedWith: Record<string, string | null | undefined> | undefined = req.rateLimitAttributes;
    res.json({ remaining: decision?.remaining ?? null, ip: checkedWith?.ip ?? null });
  });
  const loginLimit = middleware.limit('5/minute');
  const keyed = middleware.limit({ rate: '100 per hour', key: '{api_key}', name: 'api' });
  createServer((req, res) => loginLimit(req, res, () => keyed(req, res, () => res.end('ok'))));
  const model: Record<string, string> = fromObject.requestAttributes({
    ip: '203.0.113.7', method: 'GET', route: '/users/:id', path: '/users/7?x=1', host: 'example.com',
    headers: { 'x-api-key': 'k1', accept: ['a', 'b'] }, router: { caseInsensitive: true, ignoreTrailingSlash: true },
  });
  const sourced: string[] = fromObject.requestHeaders();
  const warnings: string[] = fromObject.attributeWarnings(['ip', 'method']).concat(fromObject.attributeWarnings());
  const added: string[] = fromObject.addRouteLimit({ rate: '5/minute', route: '/login', methods: ['POST'], key: '{ip}', name: 'login-route' });
  const rates: Rate[] = parseRate('10/30s');
  console.log(model, sourced, warnings, added, rates[0].limit + rates[0].windowMs);
  const metrics: Metrics | null = fromObject.metrics();
  const denied: number = metrics?.rules[0].denied ?? 0;
  const firstBound: number | undefined = metrics?.backendLatency.buckets[0].le;
  const text: string | null = fromObject.metricsText();
  const contentType: string = METRICS_CONTENT_TYPE;
  const names: string[] = registerMetrics(fromObject, { registerMetric: () => undefined });
  console.log(denied, firstBound, text, contentType, names);
  const changes: PolicyDiff = fromObject.reload({ rules: [{ name: 'a', key: '{ip}', limit: 1, window: '1m' }] });
  const kept: boolean[] = changes.rules.filter((r) => r.change !== 'removed').map((r) => r.stateKept);
  console.log(kept, changes.settings.map((s) => s.field));
  await middleware.limiter.close();
  const fastify = Fastify();
  const fastifyOptions: FastifyRateLimitOptions = {
    limiter: fromFile,
    trustedProxies: ['10.0.0.0/8'],
    attributes: (request, clientIp) => ({ ip: clientIp, route: request.routeOptions.url }),
    cost: async (request) => (request.headers['x-heavy'] ? 2 : 1),
    onDenied: (request, reply, decision) => reply.code(429).send(decision.problemJson),
    onError: (err, request, reply) => reply.code(503).send({ code: err.code }),
  };
  await fastify.register(throttlegateFastify, fastifyOptions);
  // @ts-expect-error a route limit is written on a route, not on the plugin
  const misplaced: FastifyRateLimitOptions = { limiter: fromFile, rate: '5/minute' };
  console.log(misplaced);
  await fastify.register(throttlegateFastify, { policy, limiterOptions: { url: 'redis://127.0.0.1:6379' }, onBackendError: 'deny' });
  fastify.get('/export', { config: { rateLimit: { cost: 5, skip: (request) => request.ip === '127.0.0.1' } } },
    async (request) => ({ remaining: request.rateLimit?.remaining ?? null }));
  fastify.get('/health', { config: { rateLimit: false } }, async () => 'ok');
  fastify.post('/login', { config: { rateLimit: '5/minute' } }, async (request) => request.rateLimitAttributes ?? {});
  fastify.post('/keys', { config: { rateLimit: { rate: '10/30s', key: '{api_key}', name: 'keys' } } }, async () => 'ok');
  await fastify.close();
  const estimated: Decision = await fromFile.check({ tenant: 't1' }, { cost: 100, callId: 'req-1' });
  const settled: number = await fromFile.settle(estimated, 42);
  const byId: number = await fromFile.settleCall({ tenant: 't1' }, 'req-1', 100, 42);
  const acquireOptions: AcquireOptions = { timeout: '5s', cost: 1 };
  const acquired: Decision = await fromFile.acquire({ ip: '203.0.113.7' }, acquireOptions);
  console.log(settled, byId, acquired.allowed);
  const lease: string | null = acquired.leaseId;
  const released: number = await fromFile.release(acquired);
  const extended: number = await fromFile.extend(acquired, 30000) + await fromFile.extend(acquired, '30s');
  if (lease !== null) {
    const byLease: number = await fromFile.releaseCall({ tenant: 't1' }, lease) + await fromFile.extendCall({ tenant: 't1' }, lease, 1000);
    console.log(byLease);
  }
  console.log(released, extended);
  console.log(VERSION, allowed, wait, rule, results, headers, degraded, peeked, deleted, keys, stats, backend, ip);
}

void main();
