"""The identity of the long-lived processes that serve later calls (the Bun and Python tool hosts).

Tool processes run as the tool user (the sandbox's own uid, 1000 when none is given). A server that ran
as that same uid could be ptraced,
read through /proc/PID/mem, stopped or killed by any of them, and a `bash` call could change what later
custom-tool calls and plugin hooks return. So each server runs with a real and saved uid of its own
(`server_uid(tool uid, *_SERVER)`, no account and no files of its own; one per kind of server, so that
what one kind runs cannot signal another; all in the sandbox's own block of ids after the tool uid, so that
no two sandboxes share a server uid either) and the tool user's effective (and so filesystem)
uid, so that what it creates still belongs to the tool user:

- ptrace and /proc/PID/mem need the caller's uid to equal the target's real, effective AND saved uid,
  and the target to be dumpable; an exec with real != effective uid leaves the server non-dumpable;
- a signal needs the sender's real or effective uid to equal the target's real or saved uid.

The agent (uid 0, CAP_SETUID/SETGID) starts a server through `setpriv` with these ids. execve copies
the effective uid into the saved one, so the server restores its saved uid itself as its very first
step (toolhost/harden.ts; pyhost/pyhost_harden.py, which the Python language server imports too);
`verify_server` waits for that, checks every
thread, and resumes a server that a tool process stopped in the moment before it.

gVisor's execve (Debian's runsc 2022) does not keep that split: it resets the effective uid to the real one
(`setpriv --ruid=S --euid=T` then exec gives S, S, S), and nothing unprivileged gets from there to the tool
user. Where a probe finds that (`exec_keeps_split_uid`), the server is started as root with CAP_SETUID alone
(every other capability out of its bounding set, its gids already the tool user's) and the uids in
`SERVER_UIDS_ENV`; its first step calls setresuid(S, T, S) itself, which drops the capability and, as the
effective uid changed, makes it non-dumpable: the same identity, checked by the same `verify_server`. While
it is root no tool process can signal or trace it (they hold no capability and their uid is not 0), and a
server that never takes the identity stays root, fails the check and is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import replace

from sandbox_agent.errors import AgentError, SpawnError
from sandbox_agent.process import Chunk, ExecSpec, Execution, Identity

BUN_SERVER = 1
PY_SERVER = 2
LSP_SERVER = 3
MCP_SERVER = 4
"""Each kind of server's uid is the tool uid plus its number: the control plane hands every sandbox a block of
ids (controlplane/sandbox/tool_ids.py), so a server's uid is as much the sandbox's own as the tool uid."""
SETPRIV = "/usr/bin/setpriv"
ENV = "/usr/bin/env"
ID = "/usr/bin/id"
SERVER_UIDS_ENV = "AGENT_SERVER_UIDS"
"""`S:T`, the server uid and the tool uid a root-started server takes itself (toolhost/harden.ts, pyhost_identity)."""
NICE = "/usr/bin/nice"
SERVER_NICENESS = 10
"""As the spawner's tool processes: the agent's health and abort answers stay ahead of a busy host."""
SERVER_OOM_SCORE_ADJ = 500
"""Between the agent and the tool processes (1000): a memory hog that is a tool process goes first."""
_AGENT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUARD = [sys.executable, "-I", "-S", "-B", "-c",
         f"import sys; sys.path.insert(0, {_AGENT_ROOT!r}); from sandbox_agent.proc_guard import exec_restricted;"
         " exec_restricted()"]
"""The first program of a server's chain: it enters proc_guard's domain (as root, before the uid switch) and execs
the rest. `-S`: it needs nothing beyond the standard library, and `site` (its .pth files) costs every host start."""
VERIFY_TIMEOUT_S = 10.0
_POLL_FIRST_S = 0.001
_POLL_MAX_S = 0.008
"""The checks back off from 1 to 8 ms: a server takes its identity as its first step and then goes on loading, so a
check every 2 ms (each reads every thread's status) mostly took CPU from the start it waited for."""

__all__ = ["BUN_SERVER", "LSP_SERVER", "MCP_SERVER", "PY_SERVER", "SERVER_UIDS_ENV", "ServerIdentityError",
           "exec_keeps_split_uid", "is_bun_server", "probe_split_uid_early", "server_argv", "server_uid",
           "start_bun_server", "verify_server"]
TOOLHOST_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "toolhost")


class ServerIdentityError(AgentError):
    """The server did not reach its protected identity (it was killed, or it is not ours)."""


def server_uid(tool_uid: int, kind: int) -> int:
    """The real uid of the `kind` server (BUN_SERVER, ...) in a sandbox whose tool uid is `tool_uid`."""
    return tool_uid + kind


def server_argv(argv: list[str], server_uid: int, uid: int, gid: int, *, split_exec: bool = True,
                guards_itself: bool = False) -> list[str]:
    """`argv` run with real uid `server_uid`, effective uid `uid`, all gids `gid` and no other groups, unable to
    write under /proc (proc_guard: the tool code it runs, and what that starts, cannot lower its OOM score).

    `split_exec=False` (a kernel whose execve does not keep real != effective uid): started as root with only
    CAP_SETUID, and the server takes its uids itself (module docstring). `guards_itself`: the server enters
    proc_guard's domain as its own first step, before any code not the image's runs (the Python tool host:
    pyhost_harden), so the chain skips GUARD's interpreter start."""
    guard = [] if guards_itself else GUARD
    if split_exec:
        return [*guard, NICE, "-n", str(SERVER_NICENESS), SETPRIV, f"--ruid={server_uid}", f"--euid={uid}",
                f"--rgid={gid}", f"--egid={gid}", "--clear-groups", "--", *argv]
    return [*guard, NICE, "-n", str(SERVER_NICENESS), SETPRIV, f"--rgid={gid}", f"--egid={gid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all,+setuid", "--", ENV, f"{SERVER_UIDS_ENV}={server_uid}:{uid}",
            *argv]


_split_exec: bool | None = None
_split_probe: asyncio.Task[bool] | None = None


async def exec_keeps_split_uid(server_uid: int, uid: int, buffer_limit: int) -> bool:
    """Whether an exec under real uid `server_uid` and effective uid `uid` keeps the effective uid (Linux
    does, gVisor's Debian build does not). Probed once: the kernel does not change under a running agent; callers
    that ask while the probe runs (`probe_split_uid_early`'s, then a host's start) share it."""
    global _split_exec, _split_probe
    if _split_exec is None:
        probe = _split_probe
        if probe is None or probe.get_loop() is not asyncio.get_running_loop() or (probe.done() and (
                probe.cancelled() or probe.exception() is not None)):
            probe = _split_probe = asyncio.ensure_future(_probe_split_uid(server_uid, uid, buffer_limit))
        _split_exec = await asyncio.shield(probe)
    return _split_exec


def probe_split_uid_early(tool_uid: int, buffer_limit: int) -> asyncio.Task[bool] | None:
    """Starts the probe in the background (the agent, once its socket serves): the first tool host's start, which
    CreateSession's code snapshot begins, then finds the answer instead of starting a process to get it. None when
    the agent has no tool user (no server is separated)."""
    if tool_uid < 0:
        return None
    task = asyncio.ensure_future(exec_keeps_split_uid(server_uid(tool_uid, PY_SERVER), tool_uid, buffer_limit))
    task.add_done_callback(_quiet)
    return task


def _quiet(task: asyncio.Task[bool]) -> None:
    if not task.cancelled():
        task.exception()  # a failed early probe is probed again by the host's start, which reports it


async def _probe_split_uid(server_uid: int, uid: int, buffer_limit: int) -> bool:
    spec = ExecSpec(argv=[SETPRIV, f"--ruid={server_uid}", f"--euid={uid}", "--", ID, "-u"], env={}, cwd="/",
                    timeout_s=VERIFY_TIMEOUT_S, stdin=False, kill_grace_s=0.2, merge_stderr=True)
    execution = await Execution.start(spec, Identity(uid=None, gid=None), buffer_limit)
    out = bytearray()
    async for item in execution.events():
        if isinstance(item, Chunk):
            out.extend(item.data)
        else:
            break
    # Anything but the tool uid (a failed probe included) takes the path that holds on both kernels.
    return out.decode(errors="replace").strip() == str(uid)


def _threads_protected(pid: int, server_uid: int) -> bool:
    """True once every thread has real = saved uid = server_uid and nothing traces it."""
    tasks = os.listdir(f"/proc/{pid}/task")
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except FileNotFoundError:
            continue  # a thread that just ended
        if int(fields["TracerPid"].split()[0]) != 0:
            raise ServerIdentityError("the server is being traced")
        ruid, _euid, suid, _fsuid = (int(x) for x in fields["Uid"].split())
        if ruid != server_uid or suid != server_uid:
            if fields["State"].split()[0] in ("T", "t"):
                # A tool process may signal the server only before it restored its saved uid.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            return False
    return bool(tasks)


def _write_oom_score_adj(pid: int) -> None:
    with open(f"/proc/{pid}/oom_score_adj", "w") as adj:  # procfs: never blocks
        adj.write(str(SERVER_OOM_SCORE_ADJ))


async def verify_server(pid: int, server_uid: int, label: str) -> None:
    """Waits until the server `pid` (`label`: "the bun tool host") protected itself; ServerIdentityError if not."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + VERIFY_TIMEOUT_S
    delay = _POLL_FIRST_S
    try:
        _write_oom_score_adj(pid)
        while not _threads_protected(pid, server_uid):
            if loop.time() > deadline:
                raise ServerIdentityError(f"{label} did not take its protected identity in time")
            await asyncio.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)
        # A non-dumpable process's /proc entries belong to root.
        if os.stat(f"/proc/{pid}/mem").st_uid != 0:
            raise ServerIdentityError(f"{label} is still dumpable")
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ServerIdentityError(f"{label} ended while starting") from exc
    except PermissionError as exc:
        # The agent (root without DAC_OVERRIDE) writes a server's /proc files only once they are root's, i.e. once
        # it is not dumpable: a server that never takes its identity never gets there. A refused server, not a
        # failed call: the tools it would have served are reported as not loaded.
        raise ServerIdentityError(f"{label} is still dumpable") from exc


def is_bun_server(argv: list[str]) -> bool:
    """Whether a local MCP server's command runs Bun (whose hardening the image ships: toolhost/harden.ts)."""
    return bool(argv) and os.path.basename(argv[0]) == "bun"


async def start_bun_server(spec: ExecSpec, identity: Identity, buffer_limit: int) -> Execution:
    """A Bun-run local MCP server under the MCP server uid, protected as the Bun tool host is.

    harden.ts is preloaded (it restores the saved uid, turns dumping off and starts children as the tool
    user), and the image's empty bunfig replaces the project's one, whose `preload` would run code the
    tool user wrote in the server. Other runtimes have no such first step: they run as the tool user.
    """
    if identity.uid is None:
        raise SpawnError("a protected server needs the tool user's identity")
    gid = identity.gid if identity.gid is not None else identity.uid
    bun, *rest = spec.argv
    argv = [bun, f"--preload={os.path.join(TOOLHOST_DIR, 'harden.ts')}",
            f"--config={os.path.join(TOOLHOST_DIR, 'bunfig.toml')}", *rest]
    mcp_uid = server_uid(identity.uid, MCP_SERVER)
    split = await exec_keeps_split_uid(mcp_uid, identity.uid, buffer_limit)
    wrapped = replace(spec, argv=server_argv(argv, mcp_uid, identity.uid, gid, split_exec=split))
    execution = await Execution.start(wrapped, Identity(uid=None, gid=None), buffer_limit)
    try:
        await verify_server(execution.pid, mcp_uid, f"the local MCP server {bun!r}")
    except ServerIdentityError:
        await execution.stop(reason="not protected")
        raise
    return execution
