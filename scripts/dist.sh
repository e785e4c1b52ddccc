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
#   GLIBC         the oldest glibc the Linux gnu artifacts run on (2.17):
#                 the extension, the addon, the library and the command are
#                 linked with zig for it (scripts/glibc-floor.sh), their
#                 dependencies built as for make test; empty: the build
#                 machine's linker and glibc
#   PY_COMPAT     maturin --compatibility (default: manylinux_2_17 from
#                 GLIBC; with GLIBC empty, the lowest manylinux policy
#                 maturin's audit finds the extension meets)
#   DIST          output folder (dist)
#   PYTHON        the Python of the build tools (default: TOOLS_VENV's,
#                 made when missing); maturin and, for GLIBC, PyPI's
#                 ziglang and cargo-zigbuild are installed into it
#   TOOLS_VENV    that venv (.venv, the one make test uses)
#   SIZES_DOC     a page whose artifact table gets the measured sizes
#                 (make dist: docs/getting-started/install.md)
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
# The glibc floor of the Linux gnu artifacts: 2.17 (CentOS 7, manylinux2014),
# whatever the build machine's glibc.
case "$TARGET" in
  *-linux-gnu) GLIBC=${GLIBC-2.17} ;;
  *) GLIBC="" ;;
esac
# The wheel's platform tag: maturin audits the extension (the glibc symbol
# versions it needs, the libraries it links) and, with `--auditwheel check`,
# fails rather than repair; PY_COMPAT (manylinux_2_17 from GLIBC) makes it
# refuse an extension that needs more. With neither, it tags the lowest
# policy the extension meets.
PY_COMPAT=${PY_COMPAT:-${GLIBC:+manylinux_${GLIBC/./_}}}

PARTS=("$@")
if [ ${#PARTS[@]} -eq 0 ]; then PARTS=(python node c cli); fi

# The build tools in a local venv, as make test installs its own (a clean
# clone has none): maturin for the wheel, zig for GLIBC (LINK_ARGS: the
# rustc arguments that link the final artifacts for it).
LINK_ARGS=()
if [[ " ${PARTS[*]} " == *" python "* || -n $GLIBC ]]; then
  if [ -z "${PYTHON:-}" ]; then
    TOOLS_VENV=${TOOLS_VENV:-$ROOT/.venv}
    if [ ! -x "$TOOLS_VENV/bin/python" ]; then python3 -m venv "$TOOLS_VENV"; fi
    PYTHON=$TOOLS_VENV/bin/python
  fi
  "$PYTHON" -m pip install --quiet --disable-pip-version-check "maturin>=1.9,<2"
  . scripts/glibc-floor.sh
  glibc_floor "$TARGET" "$GLIBC" "$PYTHON"
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
  if [ ${#LINK_ARGS[@]} -gt 0 ]; then args+=(-- "${LINK_ARGS[@]}"); fi
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
  if [ ${#LINK_ARGS[@]} -gt 0 ]; then
    # The addon crate alone linked for GLIBC (build.js builds it as
    # `npm ci` does, with the toolchain's linker).
    cargo_args "$PROFILE"
    "$CARGO" rustc -q -p throttlegate-node --lib "${CARGO_ARGS[@]}" -- "${LINK_ARGS[@]}"
    install -m 0755 "$(out_dir "$PROFILE")/libthrottlegate_node.so" "$addon"
  else
    if [ "$TARGET" != "$HOST" ]; then cross=(CARGO_BUILD_TARGET="$TARGET"); fi
    env "${cross[@]}" "${CDYLIB_ENV[@]}" THROTTLEGATE_BUILD_PROFILE="$PROFILE" THROTTLEGATE_ADDON_OUT="$addon" \
      node bindings/node/build.js
  fi
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
  if [ ${#LINK_ARGS[@]} -gt 0 ]; then
    "$CARGO" rustc -q -p throttlegate-c --lib "${CARGO_ARGS[@]}" -- "${LINK_ARGS[@]}"
  else
    env "${CDYLIB_ENV[@]}" "$CARGO" build -q -p throttlegate-c "${CARGO_ARGS[@]}"
  fi
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
  if [ ${#LINK_ARGS[@]} -gt 0 ]; then
    "$CARGO" rustc -q -p throttlegate-cli --bin throttlegate "${CARGO_ARGS[@]}" -- "${LINK_ARGS[@]}"
  else
    "$CARGO" build -q -p throttlegate-cli --bin throttlegate "${CARGO_ARGS[@]}"
  fi
  out=$(out_dir "$PROFILE")
  rm -rf "$dir"
  mkdir -p "$dir"
  install -m 0755 "$out/$exe" "$dir/$exe"
  strip_binary "$dir/$exe"
  install -m 0644 README.md LICENSE-MIT LICENSE-APACHE "$dir/"
  tarball "$name"
}

for part in "${PARTS[@]}"; do
  case "$part" in
    python) python_dist ;;
    node) node_dist ;;
    c) c_dist ;;
    cli) cli_dist ;;
    *) echo "dist: unknown part $part (python, node, c, cli)" >&2; exit 2 ;;
  esac
done
# The sizes and glibc floors of what was built, measured (dist/sizes.md);
# SIZES_DOC (make dist: the install page) gets the table.
if [ "$OS" = linux ]; then
  step "sizes"
  python3 scripts/artifact-sizes.py "$DIST" "$VERSION" "$ARCHIVE" "$PLATFORM" ${SIZES_DOC:+--update "$SIZES_DOC"}
fi
step "done"
ls -l "$DIST"
