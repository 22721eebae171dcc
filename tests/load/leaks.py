"""A leak gate like E2B's sandbox-leaks: a snapshot before, a run, a snapshot after, and their diff."""

from __future__ import annotations

import gc
import glob
import os
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker


@dataclass(frozen=True)
class LeakSnapshot:
    containers: frozenset[str]
    volumes: frozenset[str]
    socket_dirs: frozenset[str]
    tmp_entries: frozenset[str]
    """/tmp/ocsb* entries that name this instance (other tests on the machine make their own)."""
    children: frozenset[str]
    """Descendant processes of this process: "pid command"."""
    fds: frozenset[str]
    """This process's open descriptors counted by kind ("socket#3" is the third socket): numbers and socket
    inodes change as connections are remade, counts do not unless something leaks."""

    def diff(self, later: LeakSnapshot) -> dict[str, list[str]]:
        """What `later` has that this one had not (a leak), per kind; empty when nothing leaked."""
        out: dict[str, list[str]] = {}
        for kind in self.__dataclass_fields__:
            extra = sorted(getattr(later, kind) - getattr(self, kind))
            if extra:
                out[kind] = extra
        return out


def take(instance: str, data_dir: Path, pooled: set[str]) -> LeakSnapshot:
    """`pooled`: the warm pool's sandbox ids, left out (the pool replaces what sessions take from it)."""
    gc.collect()
    engine = docker.from_env()
    try:
        label: dict[str, Any] = {"label": [f"ocsb.instance={instance}"]}
        listed = engine.containers.list(all=True, filters=label, ignore_removed=True)  # one may go meanwhile
        containers = {c.name or c.id or "" for c in listed}
        volumes = {v.name or "" for v in engine.volumes.list(filters=label)}
    finally:
        engine.close()
    sockets = data_dir / "sandboxes"
    socket_dirs = {p.name for p in sockets.iterdir()} if sockets.is_dir() else set()

    def mine(names: set[str]) -> frozenset[str]:
        return frozenset(n for n in names if not any(sandbox_id in n for sandbox_id in pooled))

    return LeakSnapshot(mine(containers), mine(volumes), mine(socket_dirs), mine(_tmp_entries(instance)),
                        _descendants(), mine(set(_fds())))  # a pooled agent's pinned socket is the pool's


def _tmp_entries(instance: str) -> set[str]:
    found = set()
    for entry in glob.glob("/tmp/ocsb*"):
        for labels in glob.glob(f"{entry}/sandboxes/*/labels.json"):
            try:
                if instance in Path(labels).read_text():
                    found.add(labels)
            except OSError:
                continue
    return found


def _descendants() -> frozenset[str]:
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:
            continue
        pid = int(text.split(" ", 1)[0])
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        parents[pid] = int(fields[1])
        commands[pid] = f"{fields[0]} {name}"
    mine: set[int] = set()
    frontier = {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - mine
        mine |= frontier
    return frozenset(f"{pid} {commands[pid]}" for pid in mine)


ENGINE_POOL = 10
"""docker-py keeps up to this many idle connections to the engine (requests' pool size): a bounded cache."""


def _unix_peers() -> dict[str, str]:
    """Socket inode -> the path its peer listens on ("" when the peer is unnamed)."""
    rows = subprocess.run(["ss", "-xanH"], capture_output=True, text=True, check=True).stdout.splitlines()
    named: dict[str, str] = {}
    peer_of: dict[str, str] = {}
    for row in rows:
        cols = row.split()
        if len(cols) >= 8:
            local_path, local_ino, peer_ino = cols[4], cols[5], cols[7]
            if local_path != "*":
                named[local_ino] = local_path
            peer_of[local_ino] = peer_ino
    return {ino: named.get(peer, "") for ino, peer in peer_of.items()}


def _fds() -> frozenset[str]:
    counts: Counter[str] = Counter()
    peers = _unix_peers()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the descriptor listdir itself used
        kind = target.split(":", 1)[0] if target.split(":", 1)[0] in ("socket", "pipe", "anon_inode") else target
        if kind == "socket" and peers.get(target[len("socket:[") : -1], "").endswith("/docker.sock"):
            kind = "engine-connection"
        counts[kind] += 1
    counts["engine-connection"] = min(counts["engine-connection"], ENGINE_POOL)
    return frozenset(f"{kind}#{n}" for kind, count in counts.items() for n in range(1, count + 1))
