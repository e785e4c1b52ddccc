import type { Limiter } from './index';

/** The part of a prom-client `Registry` this module uses. */
export interface MetricsRegistry {
  registerMetric(metric: unknown): void;
  readonly contentType?: string;
}

/**
 * Register `limiter`'s per-rule metrics in a prom-client registry (such as
 * `client.register`), read from `limiter.metrics()` on every scrape:
 * `throttlegate_checks_total{rule}`, `throttlegate_decisions_total{rule,outcome}`,
 * `throttlegate_backend_errors_total{rule}`, `throttlegate_timeouts_total{rule}`
 * and the `throttlegate_backend_call_seconds` histogram. Returns the names registered.
 */
export function registerMetrics(limiter: Limiter, registry: MetricsRegistry): string[];
