"""Which processes a command left, and the container's counters: read from /proc and the pids cgroup.

The agent has no cgroup of its own per command, so a command's processes are found by group, session and
parent pid in /proc; `cgroup_counter` reads a cgroup's event counters (forks refused, OOM kills).
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from typing import Literal, NamedTuple

_SIGTERM_BIT = 1 << (signal.SIGTERM - 1)
PIDS_EVENTS = ("/sys/fs/cgroup/pids/pids.events", "/sys/fs/cgroup/pids.events")
"""The container's pids cgroup (v1, v2): its `max` line counts the forks refused at the pids limit."""
SigtermReaction = Literal["dies", "handles", "deaf"]
"""What a process does with a SIGTERM: die of it, run a handler, or nothing for now (blocked or ignored)."""


@dataclass(frozen=True)
class Member:
    group: int
    sigterm: SigtermReaction


def outside(members: dict[int, Member], group: int) -> set[int]:
    return {pid for pid, member in members.items() if member.group != group}


class ProcessTree:
    """The processes a command left: its group and session, and whatever descends from them by parent pid.

    Found by scanning /proc (the agent has no cgroup of its own per command). A process whose parent
    died before the scan (a double fork, `setsid -f`) is re-parented to init and cannot be found.
    """

    def __init__(self, leader: int) -> None:
        self._leader = leader
        self._leader_start = _start_time(leader)
        """Tells the leader from a later process that reused its pid (and so its group and session ids)."""

    def members(self) -> dict[int, Member]:
        """The live (non-zombie) processes of the command, by pid."""
        table = _process_table()
        leader = table.get(self._leader)
        if leader is not None and self._leader_start is not None and leader.start != self._leader_start:
            return {}
        found = {pid for pid, stat in table.items() if self._leader in (stat.group, stat.session)}
        children: dict[int, list[int]] = {}
        for pid, stat in table.items():
            children.setdefault(stat.parent, []).append(pid)
        todo = list(found)
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in found:
                    found.add(child)
                    todo.append(child)
        found.discard(os.getpid())
        found.discard(1)
        return {pid: Member(table[pid].group, table[pid].sigterm) for pid in found}


class _Stat(NamedTuple):
    parent: int
    group: int
    session: int
    start: int
    sigterm: SigtermReaction


def _process_table() -> dict[int, _Stat]:
    """Every live process visible in /proc, by pid."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _read_stat(int(entry))) is not None:
            table[int(entry)] = stat
    return table


def _read_stat(pid: int) -> _Stat | None:
    """None for a process that is gone or a zombie."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)  # os.open: a buffered open() costs far more in /proc
        try:
            text = os.read(fd, 1024)
        finally:
            os.close(fd)
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces and parentheses. After it, from the
    # state on, fields 3 to 52 of proc(5): the signal masks (blocked, ignored, caught) are fields 32 to 34.
    rest = text[text.rfind(b")") + 2:].split()
    try:
        if rest[0] == b"Z":
            return None
        blocked, ignored, caught = int(rest[29]), int(rest[30]), int(rest[31])
        reaction: SigtermReaction = (
            "deaf" if (blocked | ignored) & _SIGTERM_BIT else "handles" if caught & _SIGTERM_BIT else "dies"
        )
        return _Stat(int(rest[1]), int(rest[2]), int(rest[3]), int(rest[19]), reaction)
    except (IndexError, ValueError):
        return None


def forks_refused() -> int | None:
    """Forks the container's pids limit refused so far; None where no pids cgroup is visible (tests on a host)."""
    return cgroup_counter(PIDS_EVENTS, b"max")


_answering: dict[tuple[str, ...], str] = {}
"""For each list of candidate files, the one that answered last (the others do not exist on this host)."""


def cgroup_counter(paths: tuple[str, ...], name: bytes) -> int | None:
    """The `name VALUE` line of the first of `paths` that has one (cgroup v1 and v2 name their files apart).

    Read with os.open: this runs on the loop's thread for every command, and a buffered open costs
    several times more in /sys.
    """
    known = _answering.get(paths)
    for path in (known, *paths) if known else paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            text = os.read(fd, 4096)
        except OSError:
            continue
        finally:
            os.close(fd)
        for line in text.splitlines():
            key, _, value = line.partition(b" ")
            if key == name:
                try:
                    count = int(value)
                except ValueError:
                    return None
                _answering[paths] = path
                return count
    return None


def _start_time(pid: int) -> int | None:
    stat = _read_stat(pid)
    return None if stat is None else stat.start


def signal_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
