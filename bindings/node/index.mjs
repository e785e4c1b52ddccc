// ES module entry: the same objects as the CommonJS entry.
import native from './index.js';

export const {
  ClientIp,
  ErrorCode,
  Limiter,
  ManualClock,
  METRICS_CONTENT_TYPE,
  metricFamilies,
  metricOutcomes,
  parseRate,
  Policy,
  VERSION,
} = native;
export default native;
