// The limiter's per-rule metrics in a prom-client registry:
//
//   const client = require('prom-client');
//   require('throttlegate/prometheus').registerMetrics(limiter, client.register);
//
// The numbers are the core's (`limiter.metrics()`), read on every scrape,
// under the names and labels of `limiter.metricsText()`. prom-client is an
// optional peer dependency; this module needs only the registry it is given.
'use strict';

const OUTCOMES = ['allowed', 'denied', 'shadowDenied', 'degradedAllowed', 'degradedDenied'];
const LABEL = {
  allowed: 'allowed',
  denied: 'denied',
  shadowDenied: 'shadow_denied',
  degradedAllowed: 'degraded_allowed',
  degradedDenied: 'degraded_denied',
};

function families(limiter, counterSuffix) {
  const counter = (name, help, values) => ({ name: name + counterSuffix, help, type: 'counter', values });
  const perRule = (name, help, field) =>
    counter(name, help, (m) => m.rules.map((r) => ({ labels: { rule: r.rule }, value: r[field] })));
  return [
    perRule('throttlegate_checks', 'Checks and peeks each rule applied to.', 'checks'),
    counter(
      'throttlegate_decisions',
      "How each rule's checks ended: its own verdict, or the failure policy's.",
      (m) =>
        m.rules.flatMap((r) =>
          OUTCOMES.map((o) => ({ labels: { rule: r.rule, outcome: LABEL[o] }, value: r[o] })),
        ),
    ),
    perRule('throttlegate_backend_errors', 'Backend failures returned as errors, per rule.', 'backendErrors'),
    perRule('throttlegate_timeouts', 'Backend calls that ran out of time, per rule.', 'timeouts'),
    counter('throttlegate_policy_reloads', 'Policies applied by a reload.', (m) => [{ labels: {}, value: m.reloads }]),
    counter('throttlegate_policy_reload_errors', 'Reloads refused; the policy in force stayed.', (m) => [
      { labels: {}, value: m.reloadErrors },
    ]),
    {
      name: 'throttlegate_backend_call_seconds',
      help: 'Time of backend calls (Redis round trips).',
      type: 'histogram',
      values: (m) => {
        const h = m.backendLatency;
        const name = 'throttlegate_backend_call_seconds';
        return [
          ...h.buckets.map((b) => ({ metricName: `${name}_bucket`, labels: { le: b.le }, value: b.count })),
          { metricName: `${name}_bucket`, labels: { le: '+Inf' }, value: h.count },
          { metricName: `${name}_sum`, labels: {}, value: h.sumSeconds },
          { metricName: `${name}_count`, labels: {}, value: h.count },
        ];
      },
    },
  ];
}

/**
 * Register `limiter`'s metrics in `registry` (a prom-client `Registry`, such
 * as `client.register`). Nothing is exposed while metrics are off. Returns
 * the names registered.
 */
function registerMetrics(limiter, registry) {
  if (!limiter || typeof limiter.metrics !== 'function') {
    throw new TypeError('registerMetrics: expected a throttlegate Limiter');
  }
  if (!registry || typeof registry.registerMetric !== 'function') {
    throw new TypeError('registerMetrics: expected a prom-client Registry (such as client.register)');
  }
  // prom-client adds `_total` to counters itself in OpenMetrics registries.
  const openMetrics = registry.contentType && registry.contentType.startsWith('application/openmetrics-text');
  const names = [];
  for (const family of families(limiter, openMetrics ? '' : '_total')) {
    const { values, ...descriptor } = family;
    registry.registerMetric({
      ...descriptor,
      aggregator: 'sum',
      get: async () => {
        const m = limiter.metrics();
        return { ...descriptor, aggregator: 'sum', values: m ? values(m) : [] };
      },
      reset() {},
    });
    names.push(family.name);
  }
  return names;
}

module.exports = { registerMetrics };
