"""Where a session's process limit is enforced on gVisor, and what host pids limit its Sentry gets.

Debian's runsc 2022 runs on gVisor's ptrace platform: every guest address space is a host stub process, and
every Sentry thread that has run a guest task in it adds a host thread to that stub. Those stubs and the
Sentry's own threads all sit in the container's host pids cgroup. When the cgroup refuses one, the Sentry does
not fail the guest's fork: it panics ("error initializing first thread: resource temporarily unavailable",
platform/ptrace/subprocess.go) and the whole sandbox is gone. Measured here: a sandbox that had run the escape
suite's probes (about 50 short-lived processes in all) held 340 host tasks; a fork bomb held to 512 guest
processes held 8,000 after 25 s and 27,000 after 60 s (of the host's 32,768 pids), still growing. So the
session's `pids` as the host limit ended sandboxes that never had more than a dozen live processes.

On gVisor the session's `pids` is therefore enforced inside the guest, by gVisor's own kernel: RLIMIT_NPROC
(docker's `nproc` ulimit, which runsc sets on the sandbox's first process and every process inherits) gives a
tool process EAGAIN at fork, as the pids cgroup does on runc. The count is per uid of the sandbox's own kernel,
so no other sandbox shares it. The host pids limit stays, sized for what the Sentry needs at that guest limit
(HOST_TASKS_PER_PROCESS per process above a base): it is what keeps one sandbox from taking the host's pid
space. runc is left as it was.
"""

from __future__ import annotations

from typing import Any

import docker.types

GVISOR = "runsc"

HOST_TASKS_PER_PROCESS = 16
"""Host pids per guest process allowed to a gVisor sandbox. Measured: 64 sleeping processes (the guest limit of
a `pids = 64` session) held 914 host tasks, 14 each; with 8 each the Sentry hit the host limit and the sandbox
was lost. A bomb that keeps forking at the guest limit still grows past any such bound (27,000 host tasks in
60 s) and then ends its own sandbox only (docs/security.md)."""

HOST_TASKS_BASE = 256
"""Host pids for the Sentry's own threads, the gofer and the stubs of the agent and the tool hosts."""


def host_pids(pids: int, runtime: str | None) -> int:
    """The pids limit the engine puts on the container's host cgroup for a session allowed `pids` processes."""
    return HOST_TASKS_BASE + pids * HOST_TASKS_PER_PROCESS if runtime == GVISOR else pids


def ulimits(pids: int, runtime: str | None) -> list[docker.types.Ulimit]:
    """The rlimits the container's processes start with: on gVisor, the session's process limit."""
    if runtime != GVISOR:
        return []
    return [docker.types.Ulimit(name="nproc", soft=pids, hard=pids)]


def container_limits(pids: int, runtime: str | None) -> dict[str, Any]:
    """The container's process limits as docker-py's create arguments."""
    return {"pids_limit": host_pids(pids, runtime), "ulimits": ulimits(pids, runtime)}


def problems(host_config: dict[str, Any], pids: int, runtime: str | None) -> list[str]:
    """What the engine did not store of the above (`host_config`: the container's inspected HostConfig)."""
    found = []
    if host_config.get("PidsLimit") != host_pids(pids, runtime):
        found.append(f"pids limit is {host_config.get('PidsLimit')}, wanted {host_pids(pids, runtime)}")
    if runtime == GVISOR:
        nproc = [u for u in host_config.get("Ulimits") or [] if u.get("Name") == "nproc"]
        if [(u.get("Soft"), u.get("Hard")) for u in nproc] != [(pids, pids)]:
            found.append(f"the nproc limit is {nproc or 'unset'}, wanted {pids} (the session's processes on gVisor)")
    return found
