# Sourced by the scripts that need Debian packages beyond redis-server.
#
# need TOOL PACKAGE: install Debian's PACKAGE when TOOL is not on PATH
# (apt-get update first; sudo when not root); fails if TOOL is still missing.
need() {
  command -v "$1" >/dev/null 2>&1 && return 0
  echo "$1 not found: installing Debian's $2 package" >&2
  local sudo=""
  if [ "$(id -u)" != "0" ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$2" >/dev/null
  command -v "$1" >/dev/null
}
