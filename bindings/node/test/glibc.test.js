// An addon that needs a newer glibc than the system's: the loader's error
// names the glibc it needs. The addon is a real shared object that the real
// dynamic loader refuses: it needs the symbol version GLIBC_2.99 of
// libc.so.6, taken at link time from a stand-in libc.so.6 (built with cc)
// that defines it; at load time the system's libc.so.6 has no such version.
'use strict';

const { describe, it } = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const glibc = process.platform === 'linux' && process.report.getReport().header.glibcVersionRuntime;
const native = path.join(__dirname, '..', 'native.js');

function cc(args, cwd) {
  const r = spawnSync(process.env.CC || 'cc', args, { cwd, encoding: 'utf8' });
  assert.equal(r.status, 0, `cc ${args.join(' ')}: ${r.stderr}`);
}

describe('an addon for a newer glibc', { skip: !glibc && 'not a glibc Linux' }, () => {
  it('fails to load with an error naming the glibc it needs', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tg-glibc-'));
    try {
      const platform = `linux-${process.arch}-gnu`;
      fs.mkdirSync(path.join(dir, 'stub'));
      fs.writeFileSync(path.join(dir, 'stub', 'new.c'), 'int tg_in_glibc_2_99(void) { return 0; }\n');
      fs.writeFileSync(path.join(dir, 'stub', 'new.map'), 'GLIBC_2.99 { global: tg_in_glibc_2_99; local: *; };\n');
      cc(['-shared', '-fPIC', '-o', 'libc.so.6', '-Wl,-soname,libc.so.6', '-Wl,--version-script=new.map', 'new.c'],
        path.join(dir, 'stub'));
      fs.writeFileSync(path.join(dir, 'addon.c'), 'int tg_in_glibc_2_99(void);\nint f(void) { return tg_in_glibc_2_99(); }\n');
      // The loader as published, and the platform package as npm installs it.
      fs.copyFileSync(native, path.join(dir, 'native.js'));
      const pkg = path.join(dir, 'node_modules', `throttlegate-${platform}`);
      fs.mkdirSync(pkg, { recursive: true });
      fs.copyFileSync(path.join(__dirname, '..', '..', '..', 'npm', platform, 'package.json'), path.join(pkg, 'package.json'));
      cc(['-shared', '-fPIC', '-o', path.join(pkg, `throttlegate.${platform}.node`), 'addon.c', 'stub/libc.so.6'], dir);

      const r = spawnSync(process.execPath, ['-e', `require(${JSON.stringify(path.join(dir, 'native.js'))})`], {
        encoding: 'utf8',
        env: { ...process.env, NAPI_RS_NATIVE_LIBRARY_PATH: '' },
      });
      assert.notEqual(r.status, 0, 'the addon loaded');
      assert.match(r.stderr, new RegExp(
        `throttlegate: the native addon throttlegate-${platform} needs glibc 2\\.99 or later, ` +
          `and this system has glibc ${glibc.replace(/\./g, '\\.')} \\(the published package ` +
          `throttlegate-${platform} needs glibc 2\\.17 or later\\): .*GLIBC_2\\.99' not found`,
      ));
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
