#!/usr/bin/env node
// Builds the native addon from a git checkout (the `prepare` script, which
// `npm ci` and `npm install` run there; the published package has no install
// script and takes the addon from its platform package): `cargo build` of the
// throttlegate-node crate, then the library is copied next to the JavaScript
// loader as `throttlegate.node`, which native.js prefers.
//
// THROTTLEGATE_BUILD_PROFILE=dev builds without optimisations (tests), any
// other value names a cargo profile; THROTTLEGATE_ADDON_OUT writes the addon
// elsewhere (scripts/dist.sh puts it in its npm/<platform> package);
// CARGO_TARGET_DIR and CARGO_BUILD_TARGET are honoured, so builds can share a
// target directory and cross-compile.
'use strict';

const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const root = path.resolve(__dirname, '..', '..');
const out = process.env.THROTTLEGATE_ADDON_OUT || path.join(__dirname, 'throttlegate.node');

function main() {
  const profile = process.env.THROTTLEGATE_BUILD_PROFILE || 'release';
  const args = ['build', '-p', 'throttlegate-node', '--message-format=json-render-diagnostics'];
  if (profile === 'release') args.push('--release');
  else if (profile !== 'dev') args.push('--profile', profile);
  const cargo = process.env.CARGO || 'cargo';
  const r = spawnSync(cargo, args, {
    cwd: root,
    stdio: ['ignore', 'pipe', 'inherit'],
    maxBuffer: 256 * 1024 * 1024,
    encoding: 'utf8',
  });
  if (r.error) {
    console.error(`throttlegate: cannot run ${cargo} (${r.error.message}); ` +
      'building the addon needs a Rust toolchain (https://rustup.rs)');
    process.exit(1);
  }
  if (r.status !== 0) {
    console.error(`throttlegate: cargo build failed (exit ${r.status})`);
    process.exit(r.status || 1);
  }
  let lib = null;
  for (const line of r.stdout.split('\n')) {
    if (!line.startsWith('{')) continue;
    const msg = JSON.parse(line);
    if (msg.reason === 'compiler-artifact' && msg.target && msg.target.name === 'throttlegate_node') {
      lib = msg.filenames.find((f) => /\.(so|dylib|dll)$/.test(f)) || lib;
    }
  }
  if (!lib) {
    console.error('throttlegate: cargo did not report the throttlegate_node library');
    process.exit(1);
  }
  // Copy to a temporary name, then rename: a process that has the old addon
  // loaded keeps its mapping, and nobody ever sees a half-written file.
  const tmp = `${out}.${process.pid}.tmp`;
  fs.copyFileSync(lib, tmp);
  fs.renameSync(tmp, out);
}

main();
