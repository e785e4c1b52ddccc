# Sourced by scripts/dist.sh: link the Linux gnu artifacts for an old glibc
# with zig.
#
# glibc_floor TARGET GLIBC PYTHON
#   For a *-linux-gnu TARGET and a GLIBC such as 2.17, installs PyPI's
#   ziglang and cargo-zigbuild into PYTHON's environment (a venv: .venv),
#   writes target/zig/cc-<arch>-linux-gnu.<GLIBC>, a linker that runs
#   `zig cc -target <arch>-linux-gnu.<GLIBC>` (through cargo-zigbuild, which
#   adapts rustc's arguments to zig), and sets LINK_ARGS to the rustc
#   arguments that link with it (`-C linker=...`). Every symbol then resolves
#   against that glibc's own symbol versions, so what links runs on it and
#   later. Only the final artifact (the extension, the addon, the library,
#   the command) is linked so: dist.sh passes LINK_ARGS to that crate alone
#   (`cargo rustc ... -- LINK_ARGS`, `maturin build ... LINK_ARGS`), so its
#   dependencies stay those that make test builds (cargo would rebuild every
#   crate for a linker set for all), and only that crate is compiled again.
#   The tools' paths come from the environment, so the linker's path and
#   content are fixed per target and glibc. An empty GLIBC, or another
#   target, leaves LINK_ARGS empty: the toolchain's linker, and the build
#   machine's glibc as the floor.
LINK_ARGS=()
glibc_floor() { # target glibc python
  local target=$1 glibc=$2 python=$3 root wrapper arch zig
  LINK_ARGS=()
  case "$target" in *-linux-gnu) ;; *) return 0 ;; esac
  [ -n "$glibc" ] || return 0
  [[ $glibc =~ ^2\.[0-9]+$ ]] || { echo "GLIBC=$glibc: expected a version such as 2.17" >&2; return 1; }
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  "$python" -m pip install --quiet --disable-pip-version-check "ziglang==0.17.1" "cargo-zigbuild==0.24.1"
  zig=$("$python" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
  [ -x "$zig" ] || { echo "glibc_floor: no zig in PyPI's ziglang ($zig)" >&2; return 1; }
  arch=${target%%-*}
  wrapper=$root/target/zig/cc-$arch-linux-gnu.$glibc
  mkdir -p "$root/target/zig"
  cat >"$wrapper.tmp" <<EOF
#!/bin/sh
# Written by scripts/glibc-floor.sh: the linker for glibc $glibc.
exec "\$THROTTLEGATE_CARGO_ZIGBUILD" zig cc -- -target $arch-linux-gnu.$glibc -g "\$@"
EOF
  chmod +x "$wrapper.tmp"
  if cmp -s "$wrapper.tmp" "$wrapper"; then rm -f "$wrapper.tmp"; else mv "$wrapper.tmp" "$wrapper"; fi
  export CARGO_ZIGBUILD_ZIG_PATH=$zig THROTTLEGATE_CARGO_ZIGBUILD
  THROTTLEGATE_CARGO_ZIGBUILD=$(dirname "$python")/cargo-zigbuild
  LINK_ARGS=(-C "linker=$wrapper")
  echo "linking for glibc $glibc with $wrapper"
}
