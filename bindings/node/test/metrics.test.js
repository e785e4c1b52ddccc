// Per-rule metrics: the core's numbers, the OpenMetrics text and the
// prom-client registration, on the embedded backend and a real Redis.
'use strict';

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const client = require('prom-client');
const { Limiter, METRICS_CONTENT_TYPE, metricFamilies, metricOutcomes } = require('throttlegate');
const { registerMetrics } = require('throttlegate/prometheus');
const { startRedis, freePort, freshPrefix } = require('./helpers.js');

const POLICY = {
  rules: [
    { name: 'per-ip', key: 'ip:{ip}', limit: 2, window: '1m' },
    { name: 'shadow-bucket', key: 'b:{ip}', algorithm: 'token_bucket', capacity: 1, refill_rate: 0.001, shadow: true },
  ],
};

async function threeChecks(limiter, ip) {
  for (let i = 0; i < 3; i++) await limiter.check({ ip });
}

describe('metrics', () => {
  let redis;
  before(async () => {
    redis = await startRedis();
  });
  after(async () => {
    if (redis) await redis.stop();
  });

  for (const backend of ['memory', 'redis']) {
    it(`counts decisions per rule and outcome (${backend})`, async () => {
      const url = backend === 'redis' ? redis.url : undefined;
      const limiter = new Limiter(POLICY, { url, keyPrefix: freshPrefix('m') });
      await threeChecks(limiter, '198.51.100.1');
      const m = limiter.metrics();
      const [ip, bucket] = m.rules;
      assert.deepEqual([ip.rule, ip.checks, ip.allowed, ip.denied], ['per-ip', 3, 2, 1]);
      assert.deepEqual([bucket.checks, bucket.allowed, bucket.shadowDenied], [3, 1, 2]);
      assert.equal(m.backendLatency.count, backend === 'redis' ? 3 : 0);
      assert.equal(m.backendLatency.buckets.length, 14);
      const text = limiter.metricsText();
      assert.ok(text.includes('throttlegate_decisions_total{rule="per-ip",outcome="denied"} 1\n'), text);
      assert.ok(text.includes(`throttlegate_backend_call_seconds_count ${m.backendLatency.count}\n`), text);
      assert.ok(!text.includes('198.51.100.1'), 'no attribute value in a label');
      assert.ok(text.endsWith('# EOF\n'));
      assert.match(METRICS_CONTENT_TYPE, /^application\/openmetrics-text/);
      await limiter.close();
    });
  }

  it('registers in a prom-client registry in one line', async () => {
    const limiter = new Limiter(POLICY, { url: redis.url, keyPrefix: freshPrefix('m') });
    await threeChecks(limiter, '198.51.100.2');
    const registry = new client.Registry();
    registerMetrics(limiter, registry);
    const text = await registry.metrics();
    assert.ok(text.includes('throttlegate_checks_total{rule="per-ip"} 3'), text);
    assert.ok(text.includes('throttlegate_decisions_total{rule="shadow-bucket",outcome="shadow_denied"} 2'), text);
    assert.ok(text.includes('throttlegate_backend_call_seconds_bucket{le="+Inf"} 3'), text);
    assert.ok(text.includes('throttlegate_backend_call_seconds_count 3'), text);
    assert.ok(text.includes('throttlegate_policy_reloads_total 0'), text);
    assert.ok(text.includes('throttlegate_policy_reload_errors_total 0'), text);
    const open = new client.Registry(client.Registry.OPENMETRICS_CONTENT_TYPE);
    registerMetrics(limiter, open);
    assert.ok((await open.metrics()).includes('throttlegate_checks_total{rule="per-ip"} 3'));
    // The families are the core's, in both expositions: names, help texts, types.
    const core = limiter.metricsText();
    const families = metricFamilies();
    assert.deepEqual(
      families.map((f) => [f.name, f.type, f.labels]),
      [
        ['throttlegate_checks', 'counter', ['rule']],
        ['throttlegate_decisions', 'counter', ['rule', 'outcome']],
        ['throttlegate_backend_errors', 'counter', ['rule']],
        ['throttlegate_timeouts', 'counter', ['rule']],
        ['throttlegate_settles', 'counter', ['rule']],
        ['throttlegate_settle_refunded', 'counter', ['rule']],
        ['throttlegate_settle_debited', 'counter', ['rule']],
        ['throttlegate_reserve_trips', 'counter', ['rule']],
        ['throttlegate_reserve_local', 'counter', ['rule']],
        ['throttlegate_reserve_reserved_units', 'counter', ['rule']],
        ['throttlegate_reserve_returned_units', 'counter', ['rule']],
        ['throttlegate_reserve_dropped_units', 'counter', ['rule']],
        ['throttlegate_policy_reloads', 'counter', []],
        ['throttlegate_policy_reload_errors', 'counter', []],
        ['throttlegate_backend_call_seconds', 'histogram', []],
      ],
    );
    for (const f of families) {
      assert.ok(core.includes(`# HELP ${f.name} ${f.help}\n`), f.name);
      assert.ok(core.includes(`# TYPE ${f.name} ${f.type}\n`), f.name);
      const name = f.type === 'counter' ? `${f.name}_total` : f.name;
      assert.ok(text.includes(`# HELP ${name} ${f.help}\n`), name);
      assert.ok(text.includes(`# TYPE ${name} ${f.type}\n`), name);
    }
    assert.deepEqual(metricOutcomes(), ['allowed', 'denied', 'shadow_denied', 'degraded_allowed', 'degraded_denied']);
    const decisions = limiter.metrics().counters.find((c) => c.name === 'throttlegate_decisions');
    assert.deepEqual(
      decisions.samples.map((s) => s.labels),
      ['per-ip', 'shadow-bucket'].flatMap((r) => metricOutcomes().map((o) => [r, o])),
    );
    assert.throws(() => registerMetrics({}, registry), /expected a throttlegate Limiter/);
    assert.throws(() => registerMetrics(limiter, {}), /expected a prom-client Registry/);
    await limiter.close();
  });

  // Each family of an exposition by name (a counter's without `_total`): its
  // help, type and samples, labels sorted and `le` read as a number.
  function families(text) {
    const out = new Map();
    let current;
    for (const line of text.split('\n')) {
      const meta = /^# (HELP|TYPE) (\S+) (.*)$/.exec(line);
      if (meta) {
        const name = meta[2].replace(/_total$/, '');
        if (!out.has(name)) out.set(name, { help: null, type: null, samples: [] });
        current = out.get(name);
        current[meta[1].toLowerCase()] = meta[3];
        continue;
      }
      const sample = /^(\w+)(?:\{(.*)\})? (\S+)$/.exec(line);
      if (!sample) continue;
      const labels = [...(sample[2] || '').matchAll(/(\w+)="([^"]*)"/g)]
        .map(([, k, v]) => [k, k === 'le' ? Number(v.replace('+Inf', 'Infinity')) : v])
        .sort(([a], [b]) => a.localeCompare(b));
      current.samples.push(JSON.stringify([sample[1], labels, Number(sample[3])]));
    }
    for (const f of out.values()) f.samples.sort();
    return out;
  }

  it("gives prom-client exactly the core's exposition", async () => {
    const policy = {
      rules: [...POLICY.rules, { name: 'bucket', key: 'k:{ip}', algorithm: 'token_bucket', capacity: 5, refill_rate: 0.001 }],
    };
    const limiter = new Limiter(policy, { url: redis.url, keyPrefix: freshPrefix('m') });
    await threeChecks(limiter, '198.51.100.6');
    const d = await limiter.check({ ip: '198.51.100.7' }, { callId: 'one' });
    assert.equal(await limiter.settle(d, 0), 3);
    limiter.reload(policy);
    const registry = new client.Registry();
    registerMetrics(limiter, registry);
    const collected = families(await registry.metrics());
    const core = families(limiter.metricsText());
    assert.deepEqual([...core.keys()], metricFamilies().map((f) => f.name));
    assert.deepEqual(collected, core);
    assert.deepEqual(core.get('throttlegate_settles').samples, [
      '["throttlegate_settles_total",[["rule","bucket"]],1]',
      '["throttlegate_settles_total",[["rule","per-ip"]],1]',
      '["throttlegate_settles_total",[["rule","shadow-bucket"]],1]',
    ]);
    assert.deepEqual(core.get('throttlegate_policy_reloads').samples, ['["throttlegate_policy_reloads_total",[],1]']);
    await limiter.close();
  });

  it('counts failures for every rule of the call', async () => {
    const port = await freePort();
    const limiter = new Limiter(POLICY, { url: `redis://127.0.0.1:${port}`, timeout: 300, onBackendError: 'error' });
    await assert.rejects(limiter.check({ ip: '198.51.100.3' }), { code: 'backend_unavailable' });
    assert.deepEqual(
      limiter.metrics().rules.map((r) => [r.checks, r.backendErrors]),
      [[1, 1], [1, 1]],
    );
    await limiter.close();
  });

  it('can be turned off; the option is checked', async () => {
    const limiter = new Limiter(POLICY, { metrics: false });
    await limiter.check({ ip: '198.51.100.4' });
    assert.equal(limiter.metrics(), null);
    assert.equal(limiter.metricsText(), null);
    assert.equal(limiter.stats().calls, 1);
    const registry = new client.Registry();
    registerMetrics(limiter, registry);
    assert.ok(!(await registry.metrics()).includes('throttlegate_checks_total{'));
    assert.throws(() => new Limiter(POLICY, { metrics: 'yes' }), {
      code: 'invalid_argument',
      message: 'options.metrics: expected a boolean, got a string',
    });
  });
});
