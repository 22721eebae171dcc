#!/usr/bin/env bash
# Make sure PostgreSQL's server binaries (initdb, postgres) are on this machine: install Debian's
# `postgresql` when they are missing. Nothing is started here: the tests run their own throwaway
# server as an unprivileged user (tests/store/pg_server.py). Prints the bin dir on success.
set -euo pipefail

log() { printf 'ensure-postgres: %s\n' "$*" >&2; }

find_bindir() {
  local dir
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$dir/initdb" ] && [ -x "$dir/postgres" ]; then
      echo "$dir"
      return 0
    fi
  done
  return 1
}

if bindir=$(find_bindir); then
  echo "$bindir"
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  log "PostgreSQL is not installed and installing it needs root (apt-get install postgresql)"
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
log "installing postgresql from Debian's packages"
apt-get update -qq
# The package's post-install starts a cluster on port 5432 where a service manager runs; the
# tests never use it (they run their own server on a Unix socket only).
apt-get install -y -qq --no-install-recommends postgresql >/dev/null
if bindir=$(find_bindir); then
  log "installed ($("$bindir/postgres" --version))"
  echo "$bindir"
  exit 0
fi
log "postgresql installed but no initdb under /usr/lib/postgresql/*/bin"
exit 1
