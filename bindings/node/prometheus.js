// The limiter's per-rule metrics in a prom-client registry:
//
//   const client = require('prom-client');
//   require('throttlegate/prometheus').registerMetrics(limiter, client.register);
//
// The numbers are the core's (`limiter.metrics()`), read on every scrape,
// under the core's families (`metricFamilies()`: the names, help texts, types
// and labels of `limiter.metricsText()`); this module only maps them into
// prom-client's shapes. prom-client is an
// optional peer dependency; this module needs only the registry it is given.
'use strict';

const { metricFamilies } = require('./index.js');

// prom-client's samples of `family` in metrics `m`: the core's numbers, put
// into prom-client's shapes (labels by name; a histogram's buckets, sum, count).
function values(family, m) {
  if (family.type === 'histogram') {
    const h = m.backendLatency;
    return [
      ...h.buckets.map((b) => ({ metricName: `${family.name}_bucket`, labels: { le: b.le }, value: b.count })),
      { metricName: `${family.name}_bucket`, labels: { le: '+Inf' }, value: h.count },
      { metricName: `${family.name}_sum`, labels: {}, value: h.sumSeconds },
      { metricName: `${family.name}_count`, labels: {}, value: h.count },
    ];
  }
  const counter = m.counters.find((c) => c.name === family.name);
  return counter.samples.map((s) => ({
    labels: Object.fromEntries(family.labels.map((label, i) => [label, s.labels[i]])),
    value: s.value,
  }));
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
  for (const family of metricFamilies()) {
    const suffix = family.type === 'counter' && !openMetrics ? '_total' : '';
    const descriptor = { name: family.name + suffix, help: family.help, type: family.type };
    registry.registerMetric({
      ...descriptor,
      aggregator: 'sum',
      get: async () => {
        const m = limiter.metrics();
        return { ...descriptor, aggregator: 'sum', values: m ? values(family, m) : [] };
      },
      reset() {},
    });
    names.push(descriptor.name);
  }
  return names;
}

module.exports = { registerMetrics };
