#!/usr/bin/env bash
# gVisor as a second runtime of the running engine (issue 22, part 4): installs Debian's `runsc` and
# registers it in /etc/docker/daemon.json, then asks dockerd to reload (SIGHUP; never a restart, never a
# second daemon). Its options are the ones that work on the build machine: `--network=none` (the sandbox
# has no network anyway, and gVisor's netstack is not needed) and `--host-uds=all`, without which gVisor
# refuses the agent's Unix socket in the bind-mounted host dir. Never fatal: where runsc cannot be had or
# registered, the gVisor tests skip and say why (tests/runtimes.py).
set -uo pipefail

log() { printf 'ensure-runsc: %s\n' "$*" >&2; }
daemon_json=${OCSB_DAEMON_JSON:-/etc/docker/daemon.json}

registered() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; }

if registered; then
  exit 0
fi
if ! command -v runsc >/dev/null 2>&1; then
  log "installing runsc from Debian's packages"
  if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runsc >/dev/null 2>&1 \
         || { apt-get update -qq >/dev/null 2>&1 \
              && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runsc >/dev/null 2>&1; }; }
  then
    log "runsc is not installable here: the gVisor runs will be skipped"
    exit 0
  fi
fi
runsc_path=$(command -v runsc)
mkdir -p "$(dirname "$daemon_json")"
python3 - "$daemon_json" "$runsc_path" <<'PY'
import json, os, sys
path, runsc = sys.argv[1], sys.argv[2]
try:
    with open(path) as f:
        config = json.load(f)
except FileNotFoundError:
    config = {}
config.setdefault("runtimes", {})["runsc"] = {"path": runsc, "runtimeArgs": ["--network=none", "--host-uds=all"]}
tmp = path + ".tmp"
with open(tmp, "w") as f:
    json.dump(config, f, indent=2)
os.replace(tmp, path)
PY
pid=$(cat /var/run/docker.pid 2>/dev/null || true)
if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
  log "no dockerd pid to reload; runsc is registered for its next start"
  exit 0
fi
kill -HUP "$pid"
for _ in $(seq 1 40); do
  if registered; then
    log "runsc registered with dockerd ($runsc_path)"
    exit 0
  fi
  sleep 0.25
done
log "dockerd did not take the runsc runtime after a reload; the gVisor runs will be skipped"
exit 0
