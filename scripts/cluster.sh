#!/usr/bin/env bash
# A real two-node Docker Swarm on one machine: the main engine is the manager, a second dockerd
# in a network namespace of our own (reached over a veth pair) joins as a worker.
#   cluster.sh up      idempotent; also copies the sandbox image to a worker that lacks it
#   cluster.sh down    removes everything `up` made, and only that
#   cluster.sh check   exit 0 when this machine can run the cluster (root, netns, nsenter, dockerd)
#   cluster.sh status  prints the state file (sourced by the cluster tests)
# Everything made here is named `ocsb*`; what we found already present (a swarm, docker_gwbridge)
# is recorded in the state file and left alone by `down`.
set -euo pipefail

DIR=${OCSB_CLUSTER_DIR:-/var/lib/ocsb-cluster}
RUN=${OCSB_CLUSTER_RUN:-/run/ocsb-cluster}   # short: the worker's sockets live here
NETNS=ocsb-worker
VETH_HOST=ocsb-h0
VETH_NS=ocsb-w0
HOST_ADDR=${OCSB_CLUSTER_HOST_ADDR:-192.168.213.1}
WORKER_ADDR=${OCSB_CLUSTER_WORKER_ADDR:-192.168.213.2}
PREFIX=30
NODE_ROOT=${OCSB_NODE_ROOT:-/var/lib/ocsb/run}   # per-node agent socket dirs (see docs/swarm.md)
IMAGE=${OCSB_IMAGE:-ocsb-sandbox:latest}
STATE=$DIR/state.env
WORKER_SOCK=unix://$RUN/docker.sock
WORKER_PID=$RUN/dockerd.pid
HERE=$(cd "$(dirname "$0")" && pwd)

log() { printf 'cluster: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
wdocker() { docker -H "$WORKER_SOCK" "$@"; }

state_get() { [ -f "$STATE" ] && sed -n "s/^$1=//p" "$STATE" | tail -n1 || true; }
state_set() {
  mkdir -p "$DIR"
  touch "$STATE"
  sed -i "/^$1=/d" "$STATE"
  printf '%s=%s\n' "$1" "$2" >>"$STATE"
}

# Why this machine cannot run the cluster, or nothing.
unsupported() {
  [ "$(id -u)" = 0 ] || { echo "needs root (network namespaces, a second dockerd)"; return; }
  for tool in ip nsenter dockerd docker; do
    command -v "$tool" >/dev/null 2>&1 || { echo "missing $tool"; return; }
  done
  if ! ip netns list >/dev/null 2>&1; then echo "ip netns is not usable here"; return; fi
  if ! ip netns list | grep -w "$NETNS" >/dev/null; then
    if ! ip netns add ocsb-probe 2>/dev/null; then echo "cannot create a network namespace"; return; fi
    ip netns del ocsb-probe
  fi
}

cmd_check() {
  local why
  why=$(unsupported)
  if [ -n "$why" ]; then echo "cluster unsupported: $why"; exit 2; fi
  echo "cluster supported"
}

worker_alive() {
  [ -f "$WORKER_PID" ] && kill -0 "$(cat "$WORKER_PID")" 2>/dev/null && wdocker info >/dev/null 2>&1
}

up_network() {
  ip netns list | grep -w "$NETNS" >/dev/null || ip netns add "$NETNS"
  if ! ip link show "$VETH_HOST" >/dev/null 2>&1; then
    ip link add "$VETH_HOST" type veth peer name "$VETH_NS"
    ip link set "$VETH_NS" netns "$NETNS"
  fi
  ip addr show dev "$VETH_HOST" | grep "inet $HOST_ADDR/" >/dev/null || ip addr add "$HOST_ADDR/$PREFIX" dev "$VETH_HOST"
  ip link set "$VETH_HOST" up
  ip -n "$NETNS" addr show dev "$VETH_NS" | grep "inet $WORKER_ADDR/" >/dev/null \
    || ip -n "$NETNS" addr add "$WORKER_ADDR/$PREFIX" dev "$VETH_NS"
  ip -n "$NETNS" link set "$VETH_NS" up
  ip -n "$NETNS" link set lo up
}

up_worker() {
  worker_alive && return 0
  if [ -f "$WORKER_PID" ] && kill -0 "$(cat "$WORKER_PID")" 2>/dev/null; then
    log "worker dockerd (pid $(cat "$WORKER_PID")) is running but not answering yet"
  else
    rm -f "$WORKER_PID"
    mkdir -p "$DIR/worker/data" "$RUN/exec"
    log "starting the worker dockerd in netns $NETNS"
    # `nsenter --net`, not `ip netns exec` (which remounts /sys and breaks the cgroup mounts).
    # --bridge none and --iptables=false are safe ONLY because this daemon has its own netns.
    # Named ocsb-dockerd so that `pgrep -x dockerd` (ensure-engine.sh) never mistakes it for the
    # main engine and skips starting that one.
    ln -sf "$(command -v dockerd)" "$RUN/ocsb-dockerd"
    nohup nsenter --net="/var/run/netns/$NETNS" "$RUN/ocsb-dockerd" \
      --data-root "$DIR/worker/data" --exec-root "$RUN/exec" --pidfile "$WORKER_PID" \
      -H "$WORKER_SOCK" --bridge none --iptables=false --ip-masq=false \
      --label ocsb.cluster=worker >"$DIR/worker/dockerd.log" 2>&1 &
  fi
  for _ in $(seq 1 240); do
    worker_alive && { log "worker dockerd ready"; return 0; }
    sleep 0.5
  done
  tail -n 20 "$DIR/worker/dockerd.log" >&2 || true
  die "the worker dockerd did not answer within 120 s (log: $DIR/worker/dockerd.log)"
}

up_swarm() {
  local node_state
  node_state=$(docker info --format '{{.Swarm.LocalNodeState}}')
  if [ "$node_state" = inactive ]; then
    if ! docker network inspect docker_gwbridge >/dev/null 2>&1; then state_set GWBRIDGE_OURS 1; fi
    log "initialising a swarm on the main engine (advertise $HOST_ADDR)"
    docker swarm init --advertise-addr "$HOST_ADDR" --listen-addr "$HOST_ADDR:2377" >/dev/null
    state_set SWARM_OURS 1
  elif [ "$(docker info --format '{{.Swarm.ControlAvailable}}')" != true ]; then
    die "the main engine is in a swarm but not a manager ($node_state); leave it first"
  else
    [ -n "$(state_get SWARM_OURS)" ] || state_set SWARM_OURS 0
  fi
  local manager_node worker_state
  manager_node=$(docker info --format '{{.Swarm.NodeID}}')
  state_set MANAGER_NODE "$manager_node"
  worker_state=$(wdocker info --format '{{.Swarm.LocalNodeState}}')
  if [ "$worker_state" != active ]; then
    [ "$worker_state" = inactive ] || wdocker swarm leave --force >/dev/null 2>&1 || true
    local manager_addr token
    manager_addr=$(docker info --format '{{(index .Swarm.RemoteManagers 0).Addr}}')
    token=$(docker swarm join-token -q worker)
    log "joining the worker to $manager_addr"
    wdocker swarm join --token "$token" --advertise-addr "$WORKER_ADDR" \
      --listen-addr "$WORKER_ADDR:2377" "$manager_addr" >/dev/null
  fi
  local worker_node
  worker_node=$(wdocker info --format '{{.Swarm.NodeID}}')
  state_set WORKER_NODE "$worker_node"
  for _ in $(seq 1 60); do
    [ "$(docker node inspect "$worker_node" --format '{{.Status.State}}')" = ready ] && break
    sleep 0.5
  done
  docker node update --label-add ocsb.node=manager "$manager_node" >/dev/null
  docker node update --label-add ocsb.node=worker "$worker_node" >/dev/null
  # Stale nodes of earlier runs (a worker that was torn down without `down`) confuse placement.
  docker node ls --filter role=worker --format '{{.ID}} {{.Status}}' | while read -r id status; do
    if [ "$id" != "$worker_node" ] && [ "$status" = Down ] \
      && [ "$(docker node inspect "$id" --format '{{index .Spec.Labels "ocsb.node"}}')" = worker ]; then
      docker node rm --force "$id" >/dev/null || true
    fi
  done
}

# The image must be on every node (there is no registry); `up` on a running cluster re-syncs it.
sync_image() {
  local want have
  want=$(docker image inspect "$IMAGE" --format '{{.Id}}' 2>/dev/null) \
    || die "image $IMAGE is not on the main engine; build it with \`make image\`"
  have=$(wdocker image inspect "$IMAGE" --format '{{.Id}}' 2>/dev/null || true)
  if [ "$want" != "$have" ]; then
    log "copying $IMAGE to the worker"
    docker save "$IMAGE" | wdocker load >/dev/null
  fi
}

cmd_up() {
  local why
  why=$(unsupported)
  [ -z "$why" ] || { echo "cluster unsupported: $why" >&2; exit 2; }
  bash "$HERE/ensure-engine.sh"
  mkdir -p "$DIR" "$RUN"
  [ -d "$NODE_ROOT" ] || { mkdir -p "$NODE_ROOT"; state_set NODE_ROOT_OURS 1; }
  chmod 0700 "$NODE_ROOT"
  state_set NETNS "$NETNS"
  state_set HOST_ADDR "$HOST_ADDR"
  state_set WORKER_ADDR "$WORKER_ADDR"
  state_set WORKER_SOCK "$WORKER_SOCK"
  state_set WORKER_PID "$WORKER_PID"
  state_set NODE_ROOT "$NODE_ROOT"
  up_network
  up_worker
  up_swarm
  sync_image
  state_set UP 1
  log "up: manager $(state_get MANAGER_NODE) ($HOST_ADDR), worker $(state_get WORKER_NODE) ($WORKER_ADDR)"
}

stop_worker() {
  local pid
  if [ -f "$WORKER_PID" ]; then
    pid=$(cat "$WORKER_PID")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$WORKER_PID"
  fi
  # Whatever still runs in our namespace is ours (a killed daemon leaves containerd and shims).
  # Never the default engine or anything in the host's network namespace, whatever `ip` reports.
  if ip netns list | grep -w "$NETNS" >/dev/null; then
    local host_net main
    host_net=$(readlink /proc/self/ns/net)
    main=$(cat /var/run/docker.pid 2>/dev/null || true)
    for pid in $(ip netns pids "$NETNS"); do
      [ "$pid" = "$main" ] && continue
      [ "$(readlink "/proc/$pid/ns/net" 2>/dev/null)" = "$host_net" ] && continue
      kill -KILL "$pid" 2>/dev/null || true
    done
  fi
}

unmount_under() {
  local root=$1
  awk -v r="$root" '$2 == r || index($2, r "/") == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
}

cmd_down() {
  local swarm_ours worker_node
  swarm_ours=$(state_get SWARM_OURS)
  worker_node=$(state_get WORKER_NODE)
  if [ -S "$RUN/docker.sock" ] && wdocker info >/dev/null 2>&1; then
    wdocker swarm leave --force >/dev/null 2>&1 || true
  fi
  stop_worker
  if docker info >/dev/null 2>&1; then
    if [ "$swarm_ours" = 1 ]; then
      log "leaving the swarm we created"
      docker swarm leave --force >/dev/null 2>&1 || true
      if [ "$(state_get GWBRIDGE_OURS)" = 1 ]; then
        for _ in $(seq 1 20); do
          docker network rm docker_gwbridge >/dev/null 2>&1 && break
          docker network inspect docker_gwbridge >/dev/null 2>&1 || break
          sleep 0.5
        done
      fi
    elif [ -n "$worker_node" ]; then
      docker node rm --force "$worker_node" >/dev/null 2>&1 || true
      local manager_node
      manager_node=$(state_get MANAGER_NODE)
      [ -z "$manager_node" ] || docker node update --label-rm ocsb.node "$manager_node" >/dev/null 2>&1 || true
    fi
  fi
  unmount_under "$RUN"
  unmount_under "$DIR"
  ip link del "$VETH_HOST" 2>/dev/null || true
  ip netns list | grep -w "$NETNS" >/dev/null && ip netns del "$NETNS"
  if [ "$(state_get NODE_ROOT_OURS)" = 1 ]; then rm -rf "$NODE_ROOT"; rmdir "$(dirname "$NODE_ROOT")" 2>/dev/null || true; fi
  rm -rf "$RUN" "$DIR"
  log "down"
}

cmd_status() {
  [ -f "$STATE" ] || { echo "UP="; exit 0; }
  cat "$STATE"
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  check) cmd_check ;;
  status) cmd_status ;;
  stop-worker) stop_worker ;;   # the failure test: the worker's daemon dies
  *) echo "usage: $0 up|down|check|status" >&2; exit 64 ;;
esac
