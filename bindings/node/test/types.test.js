// The TypeScript declarations: a user of the API type-checks with tsc, and a
// misuse does not.
'use strict';

const { describe, it } = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const root = path.resolve(__dirname, '..', '..', '..');
const tsc = path.join(root, 'node_modules', 'typescript', 'bin', 'tsc');
const project = path.join(__dirname, 'types');

function typecheck(files) {
  const args = [tsc, '--noEmit', '--strict', '--module', 'Node16', '--moduleResolution', 'Node16',
    '--target', 'ES2022', '--types', 'node', ...files];
  return spawnSync(process.execPath, args, { cwd: root, encoding: 'utf8' });
}

describe('TypeScript declarations', () => {
  it('type-check a user of the whole API', () => {
    const r = typecheck([path.join(project, 'usage.ts')]);
    assert.equal(r.status, 0, r.stdout + r.stderr);
  });

  it('reject misuse: wrong field types, unknown options, bad failure modes, tls values of the wrong type, Express req.rateLimit as another type', () => {
    const bad = path.join(project, `misuse-${process.pid}.ts`);
    fs.writeFileSync(
      bad,
      [
        "import { Limiter } from 'throttlegate';",
        "import { rateLimit } from 'throttlegate/express';",
        "const l = new Limiter({ rules: [] }, { onBackendError: 'maybe' });",
        "async function f(): Promise<void> { const d = await l.check({ ip: '1' }); const s: string = d.allowed; console.log(s); }",
        "rateLimit({ policy: 'p.toml', cost: 'two' });",
        "new Limiter({ rules: [] }, { tls: { ca: 42 } });",
        "import Fastify from 'fastify';",
        "import throttlegateFastify from 'throttlegate/fastify';",
        "const app = Fastify();",
        "void app.register(throttlegateFastify, { limiter: l, headers: 'yes' });",
        "app.get('/x', { config: { rateLimit: { cost: 'two' } } }, async () => 'x');",
        "import express from 'express';",
        "express().get('/', (req) => { const n: number | undefined = req.rateLimit; console.log(n); });",
        'void f();',
        '',
      ].join('\n'),
    );
    try {
      const r = typecheck([bad]);
      assert.notEqual(r.status, 0);
      const out = r.stdout + r.stderr;
      assert.match(out, /'"maybe"' is not assignable/);
      assert.match(out, /Type 'boolean' is not assignable to type 'string'/);
      assert.match(out, /'string' is not assignable to type 'number \| \(\(req/);
      assert.match(out, /Type 'number' is not assignable to type 'string \| Buffer/);
      assert.match(out, /Type 'string' is not assignable to type 'boolean/);
      assert.match(out, /is not assignable to type 'RouteRateLimitOptions & \{ cost: string; \}'/);
      assert.match(out, /Type 'Decision \| undefined' is not assignable to type 'number \| undefined'/);
    } finally {
      fs.rmSync(bad, { force: true });
    }
  });
});
