// Limiter.reload and reloadOnChange, on the embedded backend and a real
// Redis: state kept by rule identity, refusals leave the old policy, rule
// names right across reloads (new rules, more rules than before), counters.
'use strict';

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { Limiter } = require('throttlegate');
const { startRedis, freshPrefix } = require('./helpers.js');

const rule = (limit) => ({ name: 'per-ip', key: 'ip:{ip}', limit, window: '1h' });
const toml = (limit) => `[[rules]]\nname = "per-ip"\nkey = "ip:{ip}"\nlimit = ${limit}\nwindow = "1h"\n`;
const IP = { ip: '198.51.100.5' };

function write(file, text) {
  fs.writeFileSync(`${file}.tmp`, text);
  fs.renameSync(`${file}.tmp`, file);
}

async function waitFor(limiter, key, value) {
  const deadline = Date.now() + 10000;
  for (;;) {
    const s = limiter.reloadStatus();
    if (s[key] === value || Date.now() > deadline) return s;
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('reload', () => {
  let redis;
  let dir;
  before(async () => {
    redis = await startRedis();
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tg-reload-'));
  });
  after(async () => {
    if (redis) await redis.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  for (const backend of ['memory', 'redis']) {
    it(`keeps the state of kept rules and refuses bad policies (${backend})`, async () => {
      const url = backend === 'redis' ? redis.url : undefined;
      const limiter = new Limiter({ rules: [rule(3)] }, { url, keyPrefix: freshPrefix('r') });
      await limiter.check(IP);
      await limiter.check(IP);
      assert.deepEqual(limiter.reload({ rules: [rule(5)] }), {
        rules: [{ name: 'per-ip', change: 'changed', stateKept: true, fields: ['limit'] }],
        settings: [],
      });
      assert.equal(limiter.reload({ rules: [rule(5)] }).rules[0].change, 'unchanged');
      const other = { name: 'other', key: 'u:{u}', limit: 1, window: '1s' };
      assert.deepEqual(
        limiter.reload({ rules: [rule(5), other] }).rules.map((r) => [r.name, r.change, r.stateKept]),
        [['per-ip', 'unchanged', true], ['other', 'added', false]],
      );
      assert.deepEqual(limiter.reload({ rules: [rule(5)] }).rules[1], {
        name: 'other', change: 'removed', stateKept: false, fields: [],
      });
      let d = await limiter.check(IP);
      assert.deepEqual([d.limit, d.remaining, d.rule], [5, 2, 'per-ip']);
      const bucket = { name: 'per-ip', key: 'ip:{ip}', algorithm: 'token_bucket', capacity: 5, refill_rate: 1 };
      assert.throws(() => limiter.reload({ rules: [bucket] }), {
        code: 'invalid_policy',
        message: /changed from sliding_window_log to token_bucket/,
      });
      const bad = path.join(dir, `bad-${backend}.toml`);
      fs.writeFileSync(bad, toml(0));
      assert.throws(() => limiter.reload(bad), {
        code: 'invalid_policy',
        message: /bad-\w+\.toml: rules\[0\] \("per-ip"\): limit: must be between 1 and 1000000000, not 0$/,
      });
      const s = limiter.reloadStatus();
      assert.deepEqual([s.reloads, s.errors, s.watching], [4, 2, undefined]);
      assert.match(s.lastError, /limit: must be between/);
      d = await limiter.check(IP);
      assert.deepEqual([d.limit, d.remaining], [5, 1], 'the old policy and its state stayed');
      assert.match(limiter.metricsText(), /throttlegate_policy_reload_errors_total 2\n/);
      // New rules, more of them than before: names and results stay right,
      // also for a check made before the reload (planned when it is made, on
      // the policy then in force: answered at once on the embedded backend,
      // its command made at once for Redis and sent at the end of the tick).
      const before = limiter.check(IP);
      limiter.reload({
        rules: [
          { name: 'a', key: 'a:{ip}', limit: 9, window: '1h' },
          { name: 'b', key: 'b:{ip}', limit: 8, window: '1h' },
          rule(10),
        ],
      });
      d = await before;
      assert.equal(d.rule, 'per-ip');
      assert.deepEqual(d.results.map((r) => r.rule), ['per-ip']);
      d = await limiter.check(IP);
      assert.deepEqual(d.results.map((r) => r.rule), ['a', 'b', 'per-ip']);
      assert.deepEqual([d.rule, d.remaining, d.results[2].remaining], ['per-ip', 4, 4], '6 of 10: the state was kept');
      assert.deepEqual(limiter.policy.ruleNames, ['a', 'b', 'per-ip']);
      limiter.close();
      assert.throws(() => limiter.reload({ rules: [rule(3)] }), { code: 'closed' });
    });

    it(`reloadOnChange follows the file (${backend})`, async () => {
      const url = backend === 'redis' ? redis.url : undefined;
      const keyPrefix = freshPrefix('w');
      assert.throws(() => new Limiter({ rules: [rule(3)] }, { url, keyPrefix, reloadOnChange: true }), {
        code: 'invalid_argument',
        message: 'reload_on_change: the policy was not read from a file; read it with a policy-from-file call',
      });
      const file = path.join(dir, `watched-${backend}.toml`);
      write(file, toml(3));
      const limiter = new Limiter(file, { url, keyPrefix, reloadOnChange: true });
      assert.equal(limiter.reloadStatus().watching, file);
      await limiter.check(IP);
      write(file, toml(7));
      assert.equal((await waitFor(limiter, 'reloads', 1)).reloads, 1);
      const d = await limiter.check(IP);
      assert.deepEqual([d.limit, d.remaining], [7, 5]);
      write(file, toml('"seven"'));
      const s = await waitFor(limiter, 'errors', 1);
      assert.deepEqual([s.reloads, s.errors], [1, 1]);
      assert.match(s.lastError, /limit: expected a positive integer, got a string$/);
      assert.equal((await limiter.check(IP)).limit, 7, 'the policy in force stayed');
      limiter.close();
    });
  }
});
