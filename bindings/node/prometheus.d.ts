import type { Limiter } from './index';

/** The part of a prom-client `Registry` this module uses. */
export interface MetricsRegistry {
  registerMetric(metric: unknown): void;
  readonly contentType?: string;
}

/**
 * Register `limiter`'s per-rule metrics in a prom-client registry (such as
 * `client.register`), read from `limiter.metrics()` on every scrape, under
 * the core's families (`metricFamilies()`: the names, help texts, types and
 * labels of `limiter.metricsText()`). Returns the names registered.
 */
export function registerMetrics(limiter: Limiter, registry: MetricsRegistry): string[];
