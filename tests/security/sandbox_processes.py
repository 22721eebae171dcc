"""The processes of a sandbox as the host can count them, on runc and on gVisor.

On runc a sandbox's processes are host processes in the container's pids cgroup. On gVisor they live in
gVisor's own kernel (the Sentry): the host's cgroup holds only the Sentry and its helpers, and a fork bomb
inside shows there as a few threads. What gVisor itself counts is asked through `runsc` (as root, the
state Docker keeps for the container): `runsc events --stats` (its pids cgroup) and `runsc ps` (its
process table). Neither starts a process inside the sandbox, so both still answer at its pids limit.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
from pathlib import Path

RUNSC = "/usr/bin/runsc"
RUNSC_TIMEOUT_S = 30.0


def _cgroup_file(cid: str, name: str) -> Path:
    # Under the engine's own parent, or under its tenant's or the pool's (controlplane/sandbox/tenant_cgroups.py).
    tenants = glob.glob(f"/sys/fs/cgroup/pids/ocsb-*/*/{cid}/{name}")
    for path in (f"/sys/fs/cgroup/pids/docker/{cid}/{name}", f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/{name}",
                 *tenants):
        if os.path.exists(path):
            return Path(path)
    raise AssertionError(f"no pids cgroup found for container {cid}")


def runsc_root(cid: str) -> str:
    """The state directory Docker gave runsc for this container (it names it after the runtime it registered)."""
    for root in sorted(glob.glob("/run/docker/runtime-*/moby")):
        if glob.glob(os.path.join(root, f"{cid}*")):
            return root
    raise AssertionError(f"no runsc state found for container {cid}")


def _runsc(cid: str, *args: str) -> str:
    done = subprocess.run([RUNSC, "--root", runsc_root(cid), *args, cid], capture_output=True, text=True,
                          timeout=RUNSC_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise AssertionError(f"runsc {args[0]} {cid}: {done.stderr.strip()[-300:]}")
    return done.stdout


def pids_current(cid: str, runtime: str) -> int:
    """Tasks (threads included) the sandbox's pids limit counts."""
    if runtime == "runsc":
        stats = json.loads(_runsc(cid, "events", "--stats"))
        return int(stats["data"]["pids"]["current"])
    return int(_cgroup_file(cid, "pids.current").read_text())


def container_processes(cid: str, runtime: str) -> list[str]:
    """The command names of the sandbox's processes (not threads)."""
    if runtime == "runsc":
        rows = _runsc(cid, "ps").splitlines()[1:]  # UID PID PPID C TTY STIME TIME CMD
        return [row.split()[-1] for row in rows if row.split()]
    names = []
    for pid in _cgroup_file(cid, "cgroup.procs").read_text().split():
        try:
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        except OSError:
            continue  # ended while we looked
    return names
