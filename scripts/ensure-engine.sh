#!/usr/bin/env bash
# Make sure a Docker engine answers: install Debian's docker.io when dockerd is missing, start
# dockerd when nothing answers (clearing a stale pid file a killed daemon left), wait for it.
set -euo pipefail

log() { printf 'ensure-engine: %s\n' "$*" >&2; }

here=$(cd "$(dirname "$0")" && pwd)
if docker info >/dev/null 2>&1; then
  bash "$here/ensure-runsc.sh"
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]} from Debian's packages"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# Only the default daemon's pid file counts: other dockerds (a test cluster's worker in its own
# network namespace) have their own sockets and must not stop this one from being started.
pidfile=/var/run/docker.pid
running=""
if [ -f "$pidfile" ]; then
  pid=$(cat "$pidfile" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    log "dockerd (pid $pid) is running but not answering yet"
    running=1
  else
    log "removing stale $pidfile"
    rm -f "$pidfile"
  fi
fi

if [ -z "$running" ]; then
  log "starting dockerd"
  mkdir -p /var/log
  # In a session of its own: stopping whatever started it (make run, a test run) must not stop Docker.
  bash "$here/detached.sh" dockerd >/var/log/dockerd.log 2>&1
fi

for _ in $(seq 1 120); do
  if docker info >/dev/null 2>&1; then
    log "engine ready ($(docker version --format '{{.Server.Version}}'))"
    bash "$here/ensure-runsc.sh"
    exit 0
  fi
  sleep 0.5
done
log "dockerd did not answer within 60 s; see /var/log/dockerd.log"
tail -n 20 /var/log/dockerd.log >&2 || true
exit 1
