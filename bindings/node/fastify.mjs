// ES module entry of `throttlegate/fastify`.
import plugin from './fastify.js';

export const { throttlegate } = plugin;
export default plugin;
