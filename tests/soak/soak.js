// One participant of the cross-language soak test (tests/soak/run.sh):
// 64 promises in flight on random keys of the shared policy for SECONDS;
// prints, as JSON, how many requests it was admitted per key, how many calls
// failed, and its resident memory once a second.
//
//   node soak.js POLICY_FILE REDIS_URL SECONDS KEYS
'use strict';

const path = require('node:path');
const { Limiter } = require(path.join(__dirname, '..', '..'));

async function main() {
  const [policy, url, secondsArg, keysArg] = process.argv.slice(2);
  const seconds = Number(secondsArg);
  const keys = Number(keysArg);
  const limiter = new Limiter(policy, { url });
  const admitted = {};
  let calls = 0;
  let errors = 0;
  const deadline = Date.now() + seconds * 1000;
  const rss = [];
  const sampler = setInterval(() => rss.push(Math.round(process.memoryUsage().rss / 1024)), 1000);

  async function worker() {
    while (Date.now() < deadline) {
      const user = `u${Math.floor(Math.random() * keys)}`;
      try {
        const d = await limiter.check({ user });
        if (d.allowed) admitted[user] = (admitted[user] || 0) + 1;
      } catch (e) {
        errors += 1;
      }
      calls += 1;
    }
  }

  await Promise.all(Array.from({ length: 64 }, worker));
  clearInterval(sampler);
  await limiter.close();
  console.log(JSON.stringify({ lang: 'node', calls, errors, admitted, rss_kib: rss }));
}

main().catch((e) => {
  console.error(`soak.js: ${e.stack || e}`);
  process.exit(1);
});
