// ES module entry of `throttlegate/prometheus`.
import prometheus from './prometheus.js';

export const { registerMetrics } = prometheus;
export default prometheus;
