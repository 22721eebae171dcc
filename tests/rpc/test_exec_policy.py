"""SandboxService.Exec under the operator's `exec` policy, per tenant, and every Exec in the audit record.

The patterns meet every command an Exec runs, read with the bash tool's analysis: each respelling of `rm`
below is refused under `"rm *" = "deny"` and leaves `victim` in the workspace (on the local plane the
commands would run as host processes, in the session's workspace: they only name `victim` there)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from controlplane.client import AsyncClient
from controlplane.core.permissions.audit import AuditEntry
from tests.planes import Plane, served_plane

TENANTS = [{"name": "alpha", "token": "token-alpha"}, {"name": "beta", "token": "token-beta"},
           {"name": "gamma", "token": "token-gamma"}, {"name": "delta", "token": "token-delta"}]
POLICY = {
    "permission": {"exec": {"*": "allow", "rm *": "deny"}, "*": "deny"},
    # delta's whole-Exec allow comes after the global `rm *` deny: nothing is restricted, stdin is data.
    "tenants": {"beta": {"exec": "deny"}, "gamma": {"exec": {"cat *": "ask"}}, "delta": {"exec": "allow"}},
}
RM_RESPELLED: list[tuple[list[str], str]] = [
    (["/bin/rm", "victim"], ""), (["sh", "-c", "rm victim"], ""), (["bash", "-c", "rm victim"], ""),
    ([], "true; rm victim"), (["env", "rm", "victim"], ""), ([], '"r"m victim'), ([], "$(echo rm) victim"),
    ([], "`echo rm` victim"), ([], "echo ok | rm victim"), ([], "echo victim | xargs rm"),
    ([], "find . -name victim -exec rm {} \\;"), (["busybox", "rm", "victim"], ""), ([], "command rm victim"),
    ([], "exec rm victim"), (["xargs", "rm"], ""), (["find", ".", "-name", "victim", "-delete"], ""),
    ([], "r''m victim"), (["nice", "-n", "1", "/usr/bin/env", "rm", "victim"], ""), ([], "{ \\rm victim; }"),
    ([], "echo cm0gdmljdGlt | base64 -d | sh"), ([], "sh -c 'sh -c \"rm victim\"'"),
]
"""(argv, command): respellings of `rm victim` (the red team's list and more)."""
STDIN_READERS = [["sh"], ["bash", "-s"], ["sh", "-"], ["bash", "-i"], ["python3"], ["python3", "-"],
                 ["perl"], ["python3", "/dev/stdin"], ["env", "sh"], ["busybox", "sh"]]
"""Programs that would run what the client writes to the Exec's stdin after the check."""


plane = served_plane("local", scope="function", tenants=TENANTS, policy=POLICY, pool={"size": 0})


async def audited(plane: Plane, tenant: str, session_id: str) -> list[AuditEntry]:
    await plane.plane.audit.flush()
    return [e for e in await plane.plane.store.audit_entries(tenant, session_id) if e.tool == "exec"]


async def denied(call: object) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, info.value.details()
    return info.value.details() or ""


async def test_exec_is_allowed_by_default_and_denied_where_the_policy_says(plane: Plane) -> None:
    alpha = plane.client
    session = await alpha.create_session()
    done = await alpha.run(session.id, ["sh", "-c", "echo hi; exit 3"])  # the catch-all `*` deny is for tools
    assert (done.exit_code, done.stdout) == (3, b"hi\n")
    assert await denied(alpha.run(session.id, ["rm", "-rf", "/workspace/x"])) == (
        "the operator's policy does not allow this command in a sandbox (rule: exec rm * deny (operator))"
    )
    assert await denied(alpha.run(session.id, command="rm -f y")) != ""
    entries = await audited(plane, "alpha", session.id)
    assert [(e.kind, e.outcome, e.patterns, e.detail) for e in entries] == [
        ("permission", "allow", ("sh -c 'echo hi; exit 3'",), ""),
        ("exec", "error", ("sh -c 'echo hi; exit 3'",), "exit 3"),
        ("permission", "deny", ("rm -rf /workspace/x",), ""),
        ("permission", "deny", ("rm -f y",), ""),
    ]
    assert entries[0].rule == "exec * allow (operator)"
    assert entries[2].rule == "exec rm * deny (operator)"
    assert {e.tenant for e in entries} == {"alpha"}
    assert {e.session_id for e in entries} == {session.id}


async def test_a_tenant_denied_exec_cannot_run_anything_and_ask_is_a_refusal(plane: Plane) -> None:
    async with AsyncClient(plane.plane.address, "token-beta") as beta:
        session = await beta.create_session()
        await denied(beta.run(session.id, ["true"]))
        await beta.delete_session(session.id)
    [entry] = await audited(plane, "beta", session.id)
    assert (entry.outcome, entry.rule) == ("deny", "exec * deny (operator)")
    async with AsyncClient(plane.plane.address, "token-gamma") as gamma:
        session = await gamma.create_session()
        assert (await gamma.run(session.id, ["echo", "ok"])).stdout == b"ok\n"
        await denied(gamma.run(session.id, ["cat", "/etc/hostname"]))
        await gamma.delete_session(session.id)


async def test_a_successful_and_an_aborted_exec_are_audited(plane: Plane) -> None:
    alpha = plane.client
    session = await alpha.create_session()
    assert (await alpha.run(session.id, ["true"])).exit_code == 0
    call = alpha.exec_call(session.id, ["sleep", "30"])
    await anext(aiter(call))
    call.cancel()
    for _ in range(100):
        outcomes = [(e.kind, e.outcome) for e in await audited(plane, "alpha", session.id)]
        if len(outcomes) == 4:
            break
        await asyncio.sleep(0.05)
    assert outcomes == [("permission", "allow"), ("exec", "ok"), ("permission", "allow"), ("exec", "cancelled")]


async def test_every_respelling_of_a_denied_command_is_refused(plane: Plane) -> None:
    alpha = plane.client
    session = await alpha.create_session()
    assert (await alpha.run(session.id, ["touch", "victim"])).exit_code == 0
    for argv, command in RM_RESPELLED:
        details = await denied(alpha.run(session.id, argv, command=command))
        assert details.startswith("the operator's policy does not allow this command in a sandbox (rule: exec rm * "
                                  "deny (operator)"), (argv, command, details)
    listing = await alpha.run(session.id, ["ls"])
    assert b"victim" in listing.stdout.split()  # none ran
    assert (await alpha.run(session.id, command="echo rm victim | grep -c victim")).stdout == b"1\n"
    # What the reading adds is in the record: the sub-command or the reason the strictest rule decided.
    reasons = {e.patterns[0]: e.detail for e in await audited(plane, "alpha", session.id) if e.outcome == "deny"}
    assert reasons["sh -c 'rm victim'"] == "matched by `rm victim`"
    assert reasons["$(echo rm) victim"] == (
        "the strictest exec rule decides, since the command name '$(echo rm)' is known only when it runs"
    )


async def test_a_shell_or_interpreter_reading_stdin_is_refused_under_restrictive_patterns(plane: Plane) -> None:
    alpha = plane.client
    session = await alpha.create_session()
    await alpha.run(session.id, ["touch", "victim"])

    async def script() -> AsyncIterator[bytes]:
        yield b"rm victim\n"

    for argv in STDIN_READERS:
        details = await denied(alpha.run(session.id, argv, stdin=script()))
        assert "the strictest exec rule decides, since" in details, (argv, details)
        assert "standard input" in details, (argv, details)
    # Stdin is data for a program that does not run it, and a shell given its script on the command line.
    assert (await alpha.run(session.id, ["cat"], stdin=script())).stdout == b"rm victim\n"
    assert (await alpha.run(session.id, ["sh", "-c", "wc -l"], stdin=script())).stdout.strip() == b"1"
    assert (await alpha.run(session.id, ["python3", "-c", "print(1)"])).stdout == b"1\n"
    # Started without a stdin, an interpreter reads /dev/null: nothing the client sends can reach it.
    assert (await alpha.run(session.id, ["python3"])).exit_code == 0
    assert b"victim" in (await alpha.run(session.id, ["ls"])).stdout.split()


async def test_with_only_whole_exec_rules_stdin_to_a_shell_runs(plane: Plane) -> None:
    async with AsyncClient(plane.plane.address, "token-delta") as delta:
        session = await delta.create_session()

        async def script() -> AsyncIterator[bytes]:
            yield b"echo from-stdin; touch victim; rm victim; echo done\n"

        done = await delta.run(session.id, ["sh"], stdin=script())
        assert (done.exit_code, done.stdout) == (0, b"from-stdin\ndone\n")
        assert (await delta.run(session.id, ["rm", "-f", "nothing"])).exit_code == 0
        await delta.delete_session(session.id)


async def test_the_exec_environment_is_read_as_the_commands_environment(plane: Plane) -> None:
    alpha = plane.client
    session = await alpha.create_session()
    # A variable whose value another program runs is followed; one that changes what a name runs is not known.
    await denied(alpha.run(session.id, ["git", "--version"], env={"GIT_SSH_COMMAND": "rm victim"}))
    details = await denied(alpha.run(session.id, ["ls"], env={"PATH": "/workspace/bin:/usr/bin"}))
    assert "PATH makes the command run or load files" in details
    # bash would import this as a function `ls` that runs in place of the command.
    details = await denied(alpha.run(session.id, command="ls", env={"BASH_FUNC_ls%%": "() { rm victim; }"}))
    assert "BASH_FUNC_ls%% defines a function" in details
    assert (await alpha.run(session.id, ["sh", "-c", "echo $GREETING"], env={"GREETING": "hi"})).stdout == b"hi\n"


async def test_a_refusal_reaches_a_client_still_waiting_on_its_own_input_at_once(plane: Plane) -> None:
    alpha = plane.client
    session = await alpha.create_session()
    never = asyncio.Event()

    async def terminal() -> AsyncIterator[bytes]:
        await never.wait()  # a user who has not typed anything yet
        yield b""  # pragma: no cover - never reached

    started = asyncio.get_running_loop().time()
    await denied(alpha.run(session.id, ["sh"], stdin=terminal()))
    assert asyncio.get_running_loop().time() - started < 2.0


async def test_refused_execs_streaming_stdin_get_their_status_every_time(plane: Plane) -> None:
    """Forty refusals of an Exec that writes stdin at once, ten at a time: PERMISSION_DENIED each time, never
    the client's own failed write (INTERNAL)."""
    alpha = plane.client
    session = await alpha.create_session()

    async def flood() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b"rm victim\n" * 100

    async def one() -> grpc.StatusCode:
        try:
            await alpha.run(session.id, ["sh"], stdin=flood())
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK

    codes = []
    for _ in range(4):
        codes += await asyncio.gather(*(one() for _ in range(10)))
    assert set(codes) == {grpc.StatusCode.PERMISSION_DENIED}
