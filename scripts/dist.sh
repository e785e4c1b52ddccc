#!/usr/bin/env bash
# Builds the release artifacts into dist/ (`make dist`; the release workflow
# runs it on every target):
#
#   python  throttlegate-V-cp39-abi3-<platform>.whl (stripped; py.typed, .pyi)
#           and throttlegate-V.tar.gz, the sdist
#   node    throttlegate-V.tgz (JavaScript and types; its optionalDependencies
#           name every npm/<platform> package) and
#           throttlegate-<platform>-V.tgz (the prebuilt addon)
#   c       throttlegate-V-<target>.tar.gz (x86_64-linux-gnu, ...): include/throttlegate.h,
#           lib/libthrottlegate.so.0 (+ .so link), lib/libthrottlegate.a,
#           lib/pkgconfig/throttlegate.pc (relocatable: ${pcfiledir}),
#           share/doc/throttlegate/README.md, share/licenses/throttlegate/LICENSE-*
#   cli     throttlegate-cli-V-<target>.tar.gz: the `throttlegate` command
#
# Usage: scripts/dist.sh [python] [node] [c] [cli]   (none: all four)
# Environment:
#   PROFILE       cargo profile (release; make test reuses its dev builds)
#   PY_PROFILE    cargo profile of the wheel (PROFILE)
#   TARGET        target triple (the host's); cross builds pass --target
#   PY_COMPAT     maturin --compatibility (default: the lowest manylinux
#                 policy maturin's audit finds the extension meets)
#   DIST          output folder (dist)
#   PYTHON        a Python with maturin (.venv/bin/python when present)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CARGO=${CARGO:-cargo}
PROFILE=${PROFILE:-release}
PY_PROFILE=${PY_PROFILE:-$PROFILE}
DIST=${DIST:-dist}
mkdir -p "$DIST"
DIST=$(cd "$DIST" && pwd)
HOST=$(rustc -vV | sed -n 's/^host: //p')
TARGET=${TARGET:-$HOST}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
STAGE=$ROOT/target/dist-stage/$TARGET
# The wheel's platform tag: maturin audits the extension (the glibc symbol
# versions it needs, the libraries it links) and tags it with the lowest
# manylinux policy it meets (here, on glibc 2.36: manylinux_2_34);
# `--auditwheel check` makes it fail rather than repair. PY_COMPAT asks for
# a policy of your own (maturin refuses one the extension does not meet).
PY_COMPAT=${PY_COMPAT:-}
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi

step() { printf '\n== dist: %s\n' "$*"; }

# Cargo's arguments for the profile and target (into CARGO_ARGS), and where
# the outputs land.
cargo_args() { # profile
  CARGO_ARGS=(--profile "$1")
  if [ "$TARGET" != "$HOST" ]; then CARGO_ARGS+=(--target "$TARGET"); fi
}
out_dir() { # profile
  local dir=$1
  if [ "$dir" = dev ]; then dir=debug; fi
  if [ "$TARGET" != "$HOST" ]; then echo "$ROOT/target/$TARGET/$dir"; else echo "$ROOT/target/$dir"; fi
}

# napi-rs's platform name of a target triple (the npm/<platform> folder).
case "$TARGET" in
  x86_64-unknown-linux-gnu) PLATFORM=linux-x64-gnu ;;
  aarch64-unknown-linux-gnu) PLATFORM=linux-arm64-gnu ;;
  x86_64-unknown-linux-musl) PLATFORM=linux-x64-musl ;;
  aarch64-unknown-linux-musl) PLATFORM=linux-arm64-musl ;;
  x86_64-apple-darwin) PLATFORM=darwin-x64 ;;
  aarch64-apple-darwin) PLATFORM=darwin-arm64 ;;
  x86_64-pc-windows-msvc) PLATFORM=win32-x64-msvc ;;
  *) echo "dist: no release artifacts for target $TARGET" >&2; exit 1 ;;
esac
# The tarballs' name for the target: the triple without its vendor
# "unknown" (x86_64-linux-gnu, aarch64-apple-darwin, x86_64-pc-windows-msvc).
ARCHIVE=${TARGET/-unknown-/-}
case "$TARGET" in
  *-linux-*) OS=linux ;;
  *-apple-*) OS=macos ;;
  *-windows-*) OS=windows ;;
esac

# musl targets link statically by default, which rules out shared libraries:
# the addon and libthrottlegate.so link musl dynamically; the command stays
# a static binary.
CDYLIB_ENV=()
if [[ $TARGET == *-musl ]]; then CDYLIB_ENV=(RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=-crt-static"); fi

# Strip a shared library or program of its symbols and debug information
# (the release profile keeps line tables for the benchmarks).
strip_binary() {
  case "$OS" in
    linux) strip --strip-unneeded "$1" ;;
    macos) strip -x "$1" ;;
    windows) ;;  # the debug information is in a separate .pdb
  esac
}

# A tarball of one folder of $STAGE, with stable owners and order.
tarball() { # folder name
  local name=$1
  tar -C "$STAGE" --owner=0 --group=0 --numeric-owner --sort=name -czf "$DIST/$name.tar.gz" "$name" 2>/dev/null \
    || tar -C "$STAGE" -czf "$DIST/$name.tar.gz" "$name"   # bsdtar (macOS, Windows)
}

python_dist() {
  step "Python wheel ($PY_PROFILE profile) and sdist"
  local args=(build --profile "$PY_PROFILE" --out "$DIST" --interpreter "$PYTHON")
  if [ "$PY_PROFILE" = release ]; then args=(build --release --out "$DIST" --interpreter "$PYTHON"); fi
  if [ "$TARGET" != "$HOST" ]; then args+=(--target "$TARGET"); fi
  if [ "$OS" = linux ]; then args+=(--auditwheel check); fi
  if [ -n "$PY_COMPAT" ]; then args+=(--compatibility "$PY_COMPAT"); fi
  rm -f "$DIST"/throttlegate-"$VERSION"-*.whl
  "$PYTHON" -m maturin "${args[@]}"
  rm -f "$DIST/throttlegate-$VERSION.tar.gz"
  "$PYTHON" -m maturin sdist --out "$DIST"
}

node_dist() {
  step "Node: the $PLATFORM package ($PROFILE profile) and the main package"
  local pkg=$ROOT/npm/$PLATFORM addon
  addon=$pkg/throttlegate.$PLATFORM.node
  local cross=()
  if [ "$TARGET" != "$HOST" ]; then cross=(CARGO_BUILD_TARGET="$TARGET"); fi
  env "${cross[@]}" "${CDYLIB_ENV[@]}" THROTTLEGATE_BUILD_PROFILE="$PROFILE" THROTTLEGATE_ADDON_OUT="$addon" \
    node bindings/node/build.js
  strip_binary "$addon"
  rm -f "$DIST/throttlegate-$PLATFORM-$VERSION.tgz" "$DIST/throttlegate-$VERSION.tgz"
  npm pack "$pkg" --pack-destination "$DIST" --ignore-scripts --silent >/dev/null
  # The main package: the files of package.json's `files`, the Node README,
  # the licenses, and a package.json without the checkout's scripts and
  # development dependencies, whose optionalDependencies name every platform
  # package at this version (what `napi prepublish` adds at publish time).
  local main=$STAGE/node-main
  rm -rf "$main"
  mkdir -p "$main"
  node - "$ROOT" "$main" <<'EOF'
const fs = require('node:fs');
const path = require('node:path');
const [root, main] = process.argv.slice(2);
const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));
for (const f of pkg.files) {
  fs.cpSync(path.join(root, f), path.join(main, f), { recursive: true });
}
fs.copyFileSync(path.join(root, 'bindings/node/README.md'), path.join(main, 'README.md'));
for (const f of ['LICENSE-MIT', 'LICENSE-APACHE']) {
  fs.copyFileSync(path.join(root, f), path.join(main, f));
  pkg.files.push(f);
}
delete pkg.scripts;
delete pkg.devDependencies;
pkg.optionalDependencies = {};
for (const dir of fs.readdirSync(path.join(root, 'npm')).sort()) {
  const p = JSON.parse(fs.readFileSync(path.join(root, 'npm', dir, 'package.json'), 'utf8'));
  pkg.optionalDependencies[p.name] = p.version;
}
fs.writeFileSync(path.join(main, 'package.json'), JSON.stringify(pkg, null, 2) + '\n');
EOF
  npm pack "$main" --pack-destination "$DIST" --ignore-scripts --silent >/dev/null
}

c_dist() {
  step "C library ($PROFILE profile)"
  local name=throttlegate-$VERSION-$ARCHIVE out
  local dir=$STAGE/$name
  cargo_args "$PROFILE"
  env "${CDYLIB_ENV[@]}" "$CARGO" build -q -p throttlegate-c "${CARGO_ARGS[@]}"
  out=$(out_dir "$PROFILE")
  rm -rf "$dir"
  mkdir -p "$dir/include" "$dir/lib/pkgconfig"
  install -m 0644 bindings/c/include/throttlegate.h "$dir/include/"
  case "$OS" in
    linux)
      install -m 0755 "$out/libthrottlegate_c.so" "$dir/lib/libthrottlegate.so.0"
      strip_binary "$dir/lib/libthrottlegate.so.0"
      ln -s libthrottlegate.so.0 "$dir/lib/libthrottlegate.so"
      install -m 0644 "$out/libthrottlegate_c.a" "$dir/lib/libthrottlegate.a"
      strip --strip-debug "$dir/lib/libthrottlegate.a"
      ;;
    macos)
      install -m 0755 "$out/libthrottlegate_c.dylib" "$dir/lib/libthrottlegate.0.dylib"
      install_name_tool -id @rpath/libthrottlegate.0.dylib "$dir/lib/libthrottlegate.0.dylib"
      strip_binary "$dir/lib/libthrottlegate.0.dylib"
      ln -s libthrottlegate.0.dylib "$dir/lib/libthrottlegate.dylib"
      install -m 0644 "$out/libthrottlegate_c.a" "$dir/lib/libthrottlegate.a"
      ;;
    windows)
      mkdir -p "$dir/bin"
      install -m 0755 "$out/throttlegate_c.dll" "$dir/bin/throttlegate.dll"
      install -m 0644 "$out/throttlegate_c.dll.lib" "$dir/lib/throttlegate.dll.lib"
      install -m 0644 "$out/throttlegate_c.lib" "$dir/lib/throttlegate.lib"
      ;;
  esac
  # Relocatable: the prefix is found from the .pc file's own folder.
  sed -e 's|@PREFIX@|${pcfiledir}/../..|' -e "s|@VERSION@|$VERSION|" \
    bindings/c/throttlegate.pc.in >"$dir/lib/pkgconfig/throttlegate.pc"
  # Unpacked into a prefix (/usr/local) with --strip-components=1, only
  # include/, lib/ and share/ land there.
  install -d "$dir/share/doc/throttlegate" "$dir/share/licenses/throttlegate"
  install -m 0644 bindings/c/README.md "$dir/share/doc/throttlegate/"
  install -m 0644 LICENSE-MIT LICENSE-APACHE "$dir/share/licenses/throttlegate/"
  tarball "$name"
}

cli_dist() {
  step "the throttlegate command ($PROFILE profile)"
  local name=throttlegate-cli-$VERSION-$ARCHIVE exe=throttlegate out
  local dir=$STAGE/$name
  if [ "$OS" = windows ]; then exe=throttlegate.exe; fi
  cargo_args "$PROFILE"
  "$CARGO" build -q -p throttlegate-cli --bin throttlegate "${CARGO_ARGS[@]}"
  out=$(out_dir "$PROFILE")
  rm -rf "$dir"
  mkdir -p "$dir"
  install -m 0755 "$out/$exe" "$dir/$exe"
  strip_binary "$dir/$exe"
  install -m 0644 README.md LICENSE-MIT LICENSE-APACHE "$dir/"
  tarball "$name"
}

PARTS=("$@")
if [ ${#PARTS[@]} -eq 0 ]; then PARTS=(python node c cli); fi
for part in "${PARTS[@]}"; do
  case "$part" in
    python) python_dist ;;
    node) node_dist ;;
    c) c_dist ;;
    cli) cli_dist ;;
    *) echo "dist: unknown part $part (python, node, c, cli)" >&2; exit 2 ;;
  esac
done
step "done"
ls -l "$DIST"
