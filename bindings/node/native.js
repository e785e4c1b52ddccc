// Finds and loads the native addon, in the napi-rs convention:
//
// 1. NAPI_RS_NATIVE_LIBRARY_PATH, when set: that file and nothing else;
// 2. ./throttlegate.node, built from a git checkout (`npm ci` runs the
//    `prepare` script, bindings/node/build.js);
// 3. ./throttlegate.<platform>.node next to this file;
// 4. the platform package `throttlegate-<platform>` (for example
//    `throttlegate-linux-x64-gnu`), which the published `throttlegate`
//    package lists in its optionalDependencies so that npm installs the one
//    that fits the machine.
//
// When none loads, the error names the platform package this machine needs
// and what was tried; when an addon was found but this glibc is too old for
// it, the error names the glibc it needs (npm's `libc: glibc` has no version,
// so npm installs a gnu package on any glibc).
'use strict';

const fs = require('node:fs');
const path = require('node:path');

/** The platforms with a published package (npm/<platform>/package.json). */
const PLATFORMS = [
  'linux-x64-gnu',
  'linux-arm64-gnu',
  'linux-x64-musl',
  'linux-arm64-musl',
  'darwin-x64',
  'darwin-arm64',
  'win32-x64-msvc',
];

/** The oldest glibc the published Linux gnu addons load on (scripts/dist.sh's GLIBC). */
const GLIBC_FLOOR = '2.17';

/** This process's glibc version, or null (not glibc, or unknown). */
function glibcRuntime() {
  const report = process.report && typeof process.report.getReport === 'function'
    ? process.report.getReport()
    : null;
  return (report && report.header && report.header.glibcVersionRuntime) || null;
}

/**
 * The error for an addon that needs a newer glibc than this one, from the
 * dynamic loader's message (``version `GLIBC_2.34' not found``), or null.
 */
function glibcError(platform, what, err) {
  const m = /version [`']GLIBC_([0-9.]+)' not found/.exec(err.message);
  if (!m) return null;
  const runtime = glibcRuntime();
  const floor = platform.endsWith('-gnu')
    ? ` (the published package throttlegate-${platform} needs glibc ${GLIBC_FLOOR} or later)`
    : '';
  const e = new Error(
    `throttlegate: the native addon ${what} needs glibc ${m[1]} or later, and this system has ` +
      `glibc ${runtime || 'of an unknown version'}${floor}: ${err.message.split('\n')[0]}`,
  );
  e.code = 'internal';
  return e;
}

/** Whether this Linux runs on musl (Alpine) rather than glibc. */
function isMusl() {
  try {
    return fs.readFileSync('/usr/bin/ldd', 'utf8').includes('musl');
  } catch {
    // No ldd script to read: ask the process report.
  }
  const report = process.report && typeof process.report.getReport === 'function'
    ? process.report.getReport()
    : null;
  if (report && report.header && report.header.glibcVersionRuntime) return false;
  if (report && Array.isArray(report.sharedObjects)) {
    return report.sharedObjects.some((f) => f.includes('libc.musl-') || f.includes('ld-musl-'));
  }
  return false;
}

/** The napi-rs name of this machine's platform, e.g. `linux-x64-gnu`. */
function platformName() {
  const { platform, arch } = process;
  if (platform === 'linux') return `linux-${arch}-${isMusl() ? 'musl' : 'gnu'}`;
  if (platform === 'win32') return `win32-${arch}-msvc`;
  return `${platform}-${arch}`;
}

function load() {
  const tried = [];
  const platform = platformName();
  let tooOld = null;
  const attempt = (what, fn) => {
    try {
      return fn();
    } catch (err) {
      tried.push(`${what}: ${err.message.split('\n')[0]}`);
      tooOld = tooOld || glibcError(platform, what, err);
      return null;
    }
  };
  const override = process.env.NAPI_RS_NATIVE_LIBRARY_PATH;
  if (override) {
    const binding = attempt(override, () => require(override));
    if (binding) return binding;
    if (tooOld) throw tooOld;
  } else {
    const pkg = `throttlegate-${platform}`;
    for (const file of ['throttlegate.node', `throttlegate.${platform}.node`]) {
      const full = path.join(__dirname, file);
      if (!fs.existsSync(full)) continue;
      const binding = attempt(full, () => require(full));
      if (binding) return binding;
    }
    const binding = attempt(pkg, () => require(pkg));
    if (binding) return binding;
    if (tooOld) throw tooOld;
    const supported = PLATFORMS.includes(platform)
      ? `install it with \`npm i ${pkg}\` (npm skips it when installed with --no-optional ` +
        'or --omit=optional, or when the lock file was made on another platform)'
      : `throttlegate has no prebuilt addon for ${platform} (there are: ${PLATFORMS.join(', ')}); ` +
        'build it from a git checkout with `npm ci` (needs a Rust toolchain)';
    const e = new Error(
      `throttlegate: the native addon for ${platform} is missing: the package ${pkg} ` +
        `is not installed or cannot be loaded; ${supported}. Tried: ${tried.join('; ')}`,
    );
    e.code = 'internal';
    throw e;
  }
  const e = new Error(`throttlegate: cannot load the native addon: ${tried.join('; ')}`);
  e.code = 'internal';
  throw e;
}

module.exports = load();
