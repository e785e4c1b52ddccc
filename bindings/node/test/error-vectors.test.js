// The bad-input conformance vectors of tests/vectors/errors/ (format in
// tests/vectors/README.md): each malformed policy text given to
// Policy.fromString, each bad option given to new Limiter, each bad call made
// on the embedded backend and a real Redis. Every failure must be an Error
// whose `code` is the expected kind and whose `message` is the core's, byte
// for byte.
'use strict';

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { Limiter, Policy } = require('throttlegate');
const { startRedis, freshPrefix } = require('./helpers.js');

const dir = path.resolve(__dirname, '..', '..', '..', 'tests', 'vectors', 'errors');
const cases = fs
  .readdirSync(dir)
  .filter((f) => f.endsWith('.json'))
  .sort()
  .flatMap((f) => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8')).cases.map((c) => ({ ...c, file: f })));

// The vector's option names as Limiter options.
const OPTION_NAMES = { url: 'url', prefix: 'keyPrefix' };

/** What `fn` threw or rejected with: `{ error, code, message }`, or 'no error'. */
async function outcome(fn) {
  try {
    await fn();
  } catch (err) {
    return { error: err instanceof Error, code: err.code, message: err.message };
  }
  return 'no error';
}

function wanted(want) {
  return { error: true, code: want.expect_error, message: want.message };
}

function limiterFor(c, url) {
  const options = { url, keyPrefix: freshPrefix('e'), timeout: 10000, onBackendError: 'error' };
  for (const [name, value] of Object.entries(c.options || {})) options[OPTION_NAMES[name]] = value;
  return new Limiter(c.policy, options);
}

async function replaySteps(c, url) {
  const limiter = limiterFor(c, url);
  const mismatches = [];
  try {
    for (const [i, step] of c.steps.entries()) {
      const op = step.op || 'check';
      if (op === 'close') {
        await limiter.close();
        continue;
      }
      const attrs = step.attributes || {};
      const options = { cost: step.cost === undefined ? 1 : step.cost };
      if (op === 'check' && step.call_id !== undefined) options.callId = step.call_id;
      const got = await outcome(() => {
        if (op === 'check') return limiter.check(attrs, options);
        if (op === 'peek') return limiter.peek(attrs, options);
        if (op === 'reset') return limiter.reset(attrs);
        if (op === 'reload') return limiter.reload(step.policy);
        if (op === 'override_set') return limiter.setOverride(step.rule || '', attrs, step.limit || 0);
        if (op === 'override_clear') return limiter.clearOverride(step.rule || '', attrs);
        if (op === 'overrides') return limiter.overrides(step.rule || '');
        if (op === 'settle') return limiter.settleCall(attrs, step.call_id, options.cost, step.actual_cost);
        if (op === 'acquire') return limiter.acquire(attrs, { cost: options.cost, timeout: step.timeout_ms });
        if (op === 'release') return limiter.releaseCall(attrs, step.call_id);
        if (op === 'extend') return limiter.extendCall(attrs, step.call_id, step.duration_ms);
        throw new Error(`unknown op ${op}`);
      });
      try {
        assert.deepEqual(got, wanted(step));
      } catch {
        mismatches.push(`step ${i}: expected ${JSON.stringify(wanted(step))}, got ${JSON.stringify(got)}`);
      }
    }
  } finally {
    await limiter.close();
  }
  assert.ok(mismatches.length === 0, mismatches.join('\n'));
}

function optionAndCallCases(url) {
  for (const c of cases.filter((c) => c.options !== undefined)) {
    it(`option ${c.file} ${c.name}`, async () => {
      assert.deepEqual(await outcome(() => limiterFor(c, url())), wanted(c));
    });
  }
  for (const c of cases.filter((c) => c.steps !== undefined)) {
    it(`calls ${c.file} ${c.name}`, () => replaySteps(c, url()));
  }
}

describe('bad-input vectors', () => {
  it('has cases to replay', () => {
    assert.ok(cases.length >= 30, `only ${cases.length} cases in ${dir}`);
  });

  describe('policy texts', () => {
    for (const c of cases.filter((c) => c.policy_text !== undefined)) {
      it(`${c.file} ${c.name}`, async () => {
        assert.deepEqual(await outcome(() => Policy.fromString(c.policy_text)), wanted(c));
      });
    }
  });

  describe('embedded backend', () => {
    optionAndCallCases(() => undefined);
  });

  describe('redis backend', () => {
    let redis;
    before(async () => {
      redis = await startRedis();
    });
    after(async () => {
      if (redis) await redis.stop();
    });
    optionAndCallCases(() => redis.url);
  });
});
