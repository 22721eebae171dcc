"""A block of unprivileged ids of its own for every sandbox, from a range no host account uses.

The kernel counts some resources per uid, host-wide and across containers: inotify instances and
watches, RLIMIT_NPROC, keyring quotas, POSIX message queue bytes. With one tool uid for every sandbox
(as the image's `tool` user, 1000, was), 128 `inotify_init1` calls in one tenant's sandbox made the call
fail in every other sandbox and for the host user with that uid. So each sandbox gets `BLOCK` ids: the
first is its tool uid (and gid), the next ones its servers' uids (sandbox_agent/server_identity.py).

Which blocks are taken is read from the engine itself, the one thing every control plane on a host
shares: each container carries its block in the `ocsb.tool_uid` label (so a restarted control plane
adopts it as it was, and a removed container frees it), and a claim file under a host-wide directory
covers the moment between choosing a block and the container's creation, under an exclusive lock, so
two control planes creating at once cannot choose the same one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from controlplane.errors import ConfigError, SandboxStartError
from controlplane.sandbox.layout import LABEL_TOOL_UID

BLOCK = 8
"""Ids per sandbox: the tool uid and four server uids (Bun, Python, language servers, MCP), and spare."""
CLAIM_TTL_S = 600.0
"""A claim older than this belongs to a creation that died with its process: the block is free again."""
CLAIMS_DIR = Path("/run/ocsb-tool-ids")


def host_ids(path: Path) -> set[int]:
    """The numeric ids (third field) of /etc/passwd or /etc/group."""
    ids: set[int] = set()
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text(errors="replace").splitlines():
            fields = line.split(":")
            if len(fields) > 2 and fields[2].strip().isdigit():
                ids.add(int(fields[2]))
    return ids


def check_range(first: int, count: int, passwd: Path = Path("/etc/passwd"),
                group: Path = Path("/etc/group")) -> None:
    """ConfigError when the range is too small for one block or a host account's uid or gid falls in it."""
    if first < 1 or count < BLOCK:
        raise ConfigError(f"provider.tool_uid_first/count: the range needs at least {BLOCK} ids from 1 up")
    if first + count > 2**31 - 1:
        raise ConfigError("provider.tool_uid_first + tool_uid_count goes past the largest uid")
    for path, what in ((passwd, "user"), (group, "group")):
        clash = sorted(i for i in host_ids(path) if first <= i < first + count)
        if clash:
            raise ConfigError(
                f"provider.tool_uid_first/count ({first}-{first + count - 1}) holds the host's {what} id {clash[0]} "
                f"({path}): sandboxes would share its per-user kernel limits; choose a range no account uses"
            )


class ToolIds:
    """Hands out blocks of `BLOCK` ids from `[first, first + count)`."""

    def __init__(self, first: int, count: int, claims_dir: Path = CLAIMS_DIR) -> None:
        check_range(first, count)
        self.first = first
        self.count = count
        self._claims = claims_dir

    def blocks(self) -> range:
        return range(self.first, self.first + self.count - BLOCK + 1, BLOCK)

    def owns(self, uid: int) -> bool:
        return uid in self.blocks()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self._claims.mkdir(mode=0o700, parents=True, exist_ok=True)
            lock = (self._claims / ".lock").open("a")
        except OSError as exc:
            raise SandboxStartError(
                f"tool uid claims: cannot use {self._claims} ({exc.strerror}); the Docker provider runs as root"
            ) from exc
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _claimed(self) -> set[int]:
        claimed: set[int] = set()
        now = time.time()
        for path in self._claims.glob("[0-9]*"):
            with contextlib.suppress(OSError, ValueError):
                if now - path.stat().st_mtime < CLAIM_TTL_S:
                    claimed.add(int(path.name))
                else:
                    path.unlink()
        return claimed

    def claim(self, in_use: Callable[[], Iterable[int]], owner: str) -> int:
        """A block no container (`in_use()`: every labelled container on the engine) and no pending creation
        holds; claimed until `release_claim` (after the container, with its label, exists) or its TTL."""
        with self._locked():
            taken = set(in_use()) | self._claimed()
            for uid in self.blocks():
                if uid not in taken:
                    (self._claims / str(uid)).write_text(owner)
                    return uid
        raise SandboxStartError(
            f"no free tool uid block left in {self.first}-{self.first + self.count - 1} "
            f"({len(self.blocks())} sandboxes); raise provider.tool_uid_count"
        )

    @contextlib.contextmanager
    def claimed(self, in_use: Callable[[], Iterable[int]], owner: str) -> Iterator[int]:
        """A block claimed while the caller creates its container; once that exists its label holds the block
        (and when the creation failed, nothing does)."""
        uid = self.claim(in_use, owner)
        try:
            yield uid
        finally:
            self.release_claim(uid)

    def release_claim(self, uid: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._claims / str(uid))


def labelled_uids(containers: Iterable[dict[str, object]]) -> set[int]:
    """The blocks named by the `ocsb.tool_uid` labels of an engine's container summaries."""
    uids: set[int] = set()
    for summary in containers:
        labels = summary.get("Labels")
        value = labels.get(LABEL_TOOL_UID, "") if isinstance(labels, dict) else ""
        if isinstance(value, str) and value.isdigit():
            uids.add(int(value))
    return uids


def engine_uids(client: Any) -> set[int]:
    """Every sandbox's block on a docker-py client's engine, whichever control plane made it, in any state
    (summaries only: no inspect per container)."""
    return labelled_uids(client.api.containers(all=True, filters={"label": LABEL_TOOL_UID}))
