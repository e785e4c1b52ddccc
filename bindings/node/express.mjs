// ES module entry of `throttlegate/express`.
import express from './express.js';

export const { rateLimit } = express;
export default express;
