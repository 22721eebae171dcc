"""The evasion corpus against Exec's operator patterns: each `rm` respelling the bash tool's rules deny is
refused when it is an Exec's command under `exec = { "*" = "allow", "rm *" = "deny" }` (an ask is a refusal
too), through the same reading the served control plane uses (controlplane.exec_commands) and the gate.
test_exec_policy.py (local plane) and test_exec_patterns_docker.py show it through the public API."""

from __future__ import annotations

import shlex

import pytest

from controlplane.core.permissions.audit import AuditEntry
from controlplane.core.permissions.exec_policy import CommandReading, ExecDeniedError, ExecGate, Verdict
from controlplane.core.permissions.policy import OperatorPolicy
from controlplane.exec_commands import read_command
from tests.security.bash_evasion_corpus import CORPUS, Case

RM_RULESETS = ("rm-deny", "rm-ask", "operator-rm-deny")
CASES = [case for case in CORPUS if case.ruleset in RM_RULESETS]
GATE = ExecGate(OperatorPolicy(permission={"exec": {"*": "allow", "rm *": "deny"}}))


def verdict(argv: list[str], command: str = "", env: dict[str, str] | None = None, *, stdin: bool = True) -> Verdict:
    return GATE.decide(GATE.rules("t"), read_command(argv, command, env or {}, stdin))


@pytest.mark.parametrize("case", CASES, ids=[f"{c.ruleset}:{c.command}" for c in CASES])
def test_each_command_gets_the_bash_tools_answer(case: Case) -> None:
    refused = verdict([], case.command).rule.action != "allow"
    assert refused == (case.expected != "allow"), case.command


@pytest.mark.parametrize("argv", [
    ["/bin/rm", "f"], ["sh", "-c", "rm f"], ["bash", "-c", "rm f"], ["env", "rm", "f"], ["busybox", "rm", "f"],
    ["xargs", "rm"], ["find", ".", "-exec", "rm", "{}", ";"], ["nice", "/usr/bin/rm", "f"],
    ["timeout", "5", "sh", "-c", "echo ok; rm f"],
])
def test_an_argv_is_read_as_the_shell_line_that_makes_it(argv: list[str]) -> None:
    assert verdict(argv).rule.action == "deny", shlex.join(argv)


@pytest.mark.parametrize("argv", [
    ["sh"], ["bash", "-s"], ["dash", "-i"], ["sh", "-"], ["python3"], ["python3", "-"], ["python3", "-u"],
    ["python3", "-W", "ignore"], ["python3.11", "/dev/stdin"], ["perl"], ["perl", "-w"], ["ruby", "-r", "json"],
    ["node"], ["node", "-i"], ["php"], ["lua"], ["tclsh"], ["awk", "-f", "-"], ["sed", "-f", "/dev/stdin", "x"],
    ["make", "-f", "-"], ["php", "-f", "/dev/stdin"], ["dc", "-f", "-"],
    ["ed", "notes.txt"], ["gdb"], ["env", "python3"], ["nice", "perl"], ["busybox", "sh"],
])
def test_a_program_reading_its_code_from_stdin_gets_the_strictest_rule(argv: list[str]) -> None:
    decided = verdict(argv)
    assert decided.rule.action == "deny", argv
    assert decided.reason.startswith("the strictest exec rule decides, since"), decided.reason


@pytest.mark.parametrize("argv", [["python3"], ["perl"], ["node"], ["awk", "-f", "-"], ["ed", "notes.txt"]])
def test_without_a_stdin_an_interpreter_reads_nothing_from_it(argv: list[str]) -> None:
    """An Exec started without `stdin` gets /dev/null: nothing the client sends later reaches the program."""
    assert verdict(argv, stdin=False).rule.action == "allow", argv


def test_a_bare_shell_is_not_known_stdin_or_not() -> None:
    """The bash tool's analysis counts a shell reading its stdin as not known, whatever feeds it."""
    assert verdict(["sh"], stdin=False).rule.action == "deny"


@pytest.mark.parametrize("argv", [
    ["cat"], ["wc", "-l"], ["python3", "-c", "print(1)"], ["python3", "-m", "json.tool"], ["python3", "x.py"],
    ["perl", "-ne", "print"], ["node", "-e", "1"], ["awk", "{print}"], ["sed", "s/a/b/"], ["sh", "-c", "wc -l"],
    ["python3", "--version"], ["make"], ["php", "-f", "x.php"], ["git", "status"], ["grep", "rm", "notes.txt"],
])
def test_stdin_is_data_for_everything_else(argv: list[str]) -> None:
    assert verdict(argv).rule.action == "allow", argv


def test_the_environment_is_read_as_the_commands() -> None:
    assert verdict(["git", "fetch"], env={"GIT_SSH_COMMAND": "rm f"}).reason == "matched by `rm f`"
    for name in ("PATH", "LD_PRELOAD", "BASH_ENV", "ENV", "PS4"):
        value = "$(rm f)" if name == "PS4" else "/workspace/x"
        assert verdict(["bash", "-xc", "ls"], env={name: value}).rule.action == "deny", name
    assert verdict(["ls"], env={"LANG": "C", "1x": "rm f"}).rule.action == "allow"
    # bash imports `BASH_FUNC_ls%%` as a function `ls`: what `ls` runs is then not on the command line.
    assert verdict([], "ls", env={"BASH_FUNC_ls%%": "() { rm f; }"}).rule.action == "deny"


async def test_whole_exec_rules_read_nothing_and_the_last_decides() -> None:
    def read(*_: object) -> CommandReading:
        raise AssertionError("a whole-Exec rule needs no reading")  # pragma: no cover - the test fails

    gate = ExecGate(OperatorPolicy(permission={"exec": "deny"}, tenants={"t": {"exec": "allow"}}), reader=read)
    assert await gate.admit("t", "s", ["sh"], "") == "sh"
    with pytest.raises(ExecDeniedError):
        await gate.admit("u", "s", ["true"], "")


async def test_a_long_command_is_read_off_the_loop() -> None:
    command = "echo " + "x" * 100_000 + "; rm f"
    with pytest.raises(ExecDeniedError, match="matched by `rm f`"):
        await ExecGate(GATE.policy, reader=read_command).admit("t", "s", [], command)


async def test_a_gate_without_the_analysis_fails_closed() -> None:
    gate = ExecGate(GATE.policy)
    with pytest.raises(ExecDeniedError, match="no command analysis is configured"):
        await gate.admit("t", "s", ["ls"], "")


async def test_a_command_too_long_to_read_is_not_known_and_its_record_is_bounded() -> None:
    recorded: list[AuditEntry] = []

    class Log:
        async def record(self, entry: AuditEntry) -> None:
            recorded.append(entry)

    gate = ExecGate(GATE.policy, Log(), read_command)
    command = "echo " + "x" * 300_000
    with pytest.raises(ExecDeniedError, match="the command is too long to read"):
        await gate.admit("t", "s", [], command)
    [entry] = recorded
    assert entry.patterns[0].endswith(f"... (cut: {len(command)} characters in all)")
    assert len(entry.patterns[0]) < 70_000
    assert await ExecGate(OperatorPolicy(), Log(), read_command).admit("t", "s", [], command) == command
