// The conformance vectors of tests/vectors/ (and this package's own under
// test/vectors/), replayed against the embedded backend, a real Redis and a
// real local Redis Cluster (3 primaries, 1 replica each) on a manual clock.
'use strict';

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { Limiter, ManualClock } = require('throttlegate');
const { startRedis, startCluster, freshPrefix } = require('./helpers.js');

const dirs = [path.resolve(__dirname, '..', '..', '..', 'tests', 'vectors'), path.join(__dirname, 'vectors')];
const files = dirs
  .filter((d) => fs.existsSync(d))
  .flatMap((d) => fs.readdirSync(d).filter((f) => f.endsWith('.json')).map((f) => path.join(d, f)))
  .sort();

function snake(d) {
  return {
    allowed: d.allowed,
    limit: d.limit,
    remaining: d.remaining,
    retry_after_ms: d.retryAfterMs,
    reset_after_ms: d.resetAfterMs,
    rule: d.rule,
    results: d.results.map((r) => ({
      rule: r.rule,
      allowed: r.allowed,
      shadow: r.shadow,
      limit: r.limit,
      remaining: r.remaining,
      retry_after_ms: r.retryAfterMs,
      reset_after_ms: r.resetAfterMs,
    })),
    headers: Object.entries(d.headers),
    degraded: d.degraded,
  };
}

/** The fields the vector states, from the decision; results compared on the fields they state. */
function pick(got, expect) {
  const out = {};
  for (const key of Object.keys(expect)) {
    if (key === 'results') {
      out.results = got.results.map((r, i) => {
        const want = expect.results[i] || {};
        return Object.fromEntries(Object.keys(want).map((k) => [k, r[k]]));
      });
    } else {
      out[key] = got[key];
    }
  }
  return out;
}

async function replay(file, url, sync = false) {
  const vector = JSON.parse(fs.readFileSync(file, 'utf8'));
  const clock = new ManualClock(vector.start_us);
  const limiter = new Limiter(vector.policy, { url, clock, keyPrefix: freshPrefix('v'), timeout: 5000 });
  const checks = new Map();
  try {
    for (const [i, step] of vector.steps.entries()) {
      const where = `${path.basename(file)} step ${i}`;
      if (step.advance_ms) clock.advance(step.advance_ms);
      const op = step.op || 'check';
      const options = { cost: step.cost === undefined ? 1 : step.cost };
      if (op === 'check' && step.call_id !== undefined) options.callId = step.call_id;
      let call;
      if (op === 'check') {
        // checkSync returns (or throws) at once; as a Promise, it compares like the others.
        call = sync
          ? new Promise((resolve) => resolve(limiter.checkSync(step.attributes || {}, options)))
          : limiter.check(step.attributes || {}, options);
        if (step.call_id !== undefined) {
          call = call.then((d) => {
            checks.set(step.call_id, { d, cost: options.cost, attributes: JSON.stringify(step.attributes || {}) });
            return d;
          });
        }
      } else if (op === 'peek') call = limiter.peek(step.attributes || {}, options);
      else if (op === 'reset') call = limiter.reset(step.attributes || {});
      else if (op === 'reload') {
        // Synchronous: a refusal throws; as a Promise, it compares like the others.
        // It returns what changed (checked to have its two lists; the vectors expect {}).
        call = new Promise((resolve) => resolve(limiter.reload(step.policy))).then((diff) => {
          assert.deepEqual(Object.keys(diff).sort(), ['rules', 'settings'], where);
          return {};
        });
      } else if (op === 'override_set') call = limiter.setOverride(step.rule, step.attributes || {}, step.limit).then(() => ({}));
      else if (op === 'override_clear') call = limiter.clearOverride(step.rule, step.attributes || {}).then((cleared) => ({ cleared }));
      else if (op === 'overrides') {
        call = limiter.overrides(step.rule).then((list) => ({
          overrides: list.map((o) => ({ attributes: o.attributes, limit: o.limit })),
        }));
      } else if (op === 'settle') {
        // The decision of the check when this step settles it as made, else by call id.
        const made = checks.get(step.call_id);
        if (made && made.cost === options.cost && made.attributes === JSON.stringify(step.attributes || {})) {
          call = limiter.settle(made.d, step.actual_cost);
        } else {
          call = limiter.settleCall(step.attributes || {}, step.call_id, options.cost, step.actual_cost);
        }
      } else if (op === 'metrics') {
        // Per rule, each counter under its snake_case name (the vectors' and the core's).
        const toSnake = (k) => k.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
        call = Promise.resolve({
          rules: limiter.metrics().rules.map((r) => Object.fromEntries(Object.entries(r).map(([k, v]) => [toSnake(k), v]))),
        });
      } else if (op === 'acquire') {
        call = limiter.acquire(step.attributes || {}, { cost: options.cost, timeout: step.timeout_ms });
      } else if (op === 'release' || op === 'extend') {
        // The decision of the check when this step releases (renews) it as made, else by call id.
        const made = checks.get(step.call_id);
        const byDecision = made && made.attributes === JSON.stringify(step.attributes || {});
        if (op === 'release') {
          call = byDecision ? limiter.release(made.d) : limiter.releaseCall(step.attributes || {}, step.call_id);
          call = call.then((released) => ({ released }));
        } else {
          call = byDecision
            ? limiter.extend(made.d, step.duration_ms)
            : limiter.extendCall(step.attributes || {}, step.call_id, step.duration_ms);
          call = call.then((extended) => ({ extended }));
        }
      } else throw new Error(`${where}: unknown op ${op}`);
      if (step.expect_error !== undefined) {
        await assert.rejects(call, (err) => {
          assert.ok(err instanceof Error, where);
          assert.equal(err.code, step.expect_error, `${where}: ${err.message}`);
          return true;
        });
        continue;
      }
      const got = await call;
      if (op === 'reload') {
        assert.deepEqual([got, step.expect], [{}, {}], where);
      } else if (op === 'reset') {
        assert.deepEqual({ deleted: got }, step.expect, where);
      } else if (op.startsWith('override') || op === 'metrics') {
        assert.deepEqual(got, step.expect, where);
      } else if (op === 'settle') {
        assert.deepEqual({ settled: got }, step.expect, where);
      } else if (op === 'release' || op === 'extend') {
        assert.deepEqual(got, step.expect, where);
      } else {
        assert.deepEqual(pick(snake(got), step.expect), step.expect, where);
      }
    }
  } finally {
    await limiter.close();
  }
}

describe('conformance vectors', () => {
  it('has vectors to replay', () => {
    assert.ok(files.length > 0, `no vector files in ${dirs.join(' or ')}`);
  });

  describe('embedded backend', () => {
    for (const file of files) {
      it(path.basename(file, '.json'), () => replay(file, undefined));
    }
  });

  // Every check through checkSync: the same decisions and errors, synchronously.
  describe('embedded backend, checkSync', () => {
    for (const file of files) {
      it(path.basename(file, '.json'), () => replay(file, undefined, true));
    }
  });

  describe('redis backend', () => {
    let redis;
    before(async () => {
      redis = await startRedis();
    });
    after(async () => {
      if (redis) await redis.stop();
    });
    for (const file of files) {
      it(path.basename(file, '.json'), () => replay(file, redis.url));
    }
  });

  // The rules of one check land in different hash slots here, so stacking
  // goes through the core's per-slot path; the answers must not change.
  describe('redis cluster backend', () => {
    let cluster;
    before(async () => {
      cluster = await startCluster(3);
    });
    after(async () => {
      if (cluster) await cluster.stop();
    });
    it('is a cluster limiter', async () => {
      const policy = { rules: [{ name: 'a', key: 'ip:{ip}', limit: 1, window: '1m' }] };
      const limiter = new Limiter(policy, { url: cluster.url, timeout: 5000 });
      assert.equal(limiter.backend, 'cluster');
      await limiter.ping();
      await limiter.close();
    });
    for (const file of files) {
      it(path.basename(file, '.json'), () => replay(file, cluster.url));
    }
  });
});
