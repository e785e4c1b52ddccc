#!/usr/bin/env node
// Builds the native addon from source (the `install` script of the npm
// package): `cargo build` of the throttlegate-node crate, then the library is
// copied next to the JavaScript loader as `throttlegate.node`.
//
// THROTTLEGATE_BUILD_PROFILE=dev builds without optimisations (tests);
// CARGO_TARGET_DIR is honoured, so builds can share a target directory.
'use strict';

const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const root = path.resolve(__dirname, '..', '..');
const out = path.join(__dirname, 'throttlegate.node');

// An installed copy of the package holds only some workspace members; cargo
// refuses a workspace whose members are missing, so list the ones present.
function trimWorkspace() {
  const manifest = path.join(root, 'Cargo.toml');
  const text = fs.readFileSync(manifest, 'utf8');
  const m = text.match(/members\s*=\s*\[([^\]]*)\]/);
  if (!m) return;
  const members = [...m[1].matchAll(/"([^"]+)"/g)].map((x) => x[1]);
  const present = members.filter((d) => fs.existsSync(path.join(root, d, 'Cargo.toml')));
  if (present.length === members.length) return;
  const list = present.map((d) => JSON.stringify(d)).join(', ');
  fs.writeFileSync(manifest, text.replace(m[0], `members = [${list}]`));
}

// npm does not pack symbolic links: restore the core's view of the Lua scripts.
function restoreLua() {
  const link = path.join(root, 'core', 'lua');
  if (fs.existsSync(path.join(link, 'check.lua'))) return;
  fs.rmSync(link, { recursive: true, force: true });
  fs.cpSync(path.join(root, 'lua'), link, { recursive: true });
}

function main() {
  trimWorkspace();
  restoreLua();
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
