"""SandboxService.Exec under operator policy, and in the audit record.

Exec runs a raw command in a session's sandbox, outside any tool and any agent's rules, so only the
operator's policy governs it: rules under the `exec` key, global then per tenant (`exec = "deny"`, or
`exec = { "*" = "allow", "rm *" = "deny" }`). Only that key counts: a catch-all `"*" = "deny"` written
for tools does not cut the raw API as a side effect. No matching rule allows (Exec is allowed by
default); `ask` refuses, since an Exec has no one to ask.

Patterns are matched against every command the Exec runs, as the `bash` tool's rules are (a
`CommandReading`, made by controlplane/exec_commands.py with the agent's bash analysis): the command as
written and each sub-command reduced to what runs, so `/bin/rm`, `env rm` or `sh -c 'rm f'` meet
`rm *`. The most restrictive answer wins. What cannot be known before the command runs (`$(echo rm)`,
a shell or an interpreter reading its code from the Exec's stdin) gets the strictest `exec` rule.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from controlplane.core.permissions.audit import AuditEntry, AuditLog, NoAudit
from controlplane.core.permissions.permission import STRICTNESS, Rule, is_catch_all, strictest
from controlplane.core.permissions.policy import OperatorPolicy
from controlplane.core.seam.messages import Exited
from controlplane.errors import ControlPlaneError, ErrorCode
from opencode_semantics.wildcard import match

PERMISSION = "exec"
DEFAULT = Rule(PERMISSION, "*", "allow")
"""What decides a command no `exec` rule matches."""
READ_NOW_CHARS = 4096
"""A command up to this long is read on the loop's thread; longer ones in a worker thread, so one huge
command does not hold every tenant's RPCs."""
MAX_READ_CHARS = 256 * 1024
"""Longer commands (with their environment) are not read at all: parsing a message of up to 64 MiB would
hold a worker thread, and the GIL, for seconds. Such a command is not known (the strictest rule decides)."""
MAX_AUDITED_CHARS = 64 * 1024
"""The audit record keeps this much of a command's text (and says how long it was)."""


class ExecDeniedError(ControlPlaneError):
    code = ErrorCode.PERMISSION_DENIED


def command_text(argv: Sequence[str], command: str) -> str:
    """What the rules match: the shell command, or the argv as a shell would read it."""
    return command or shlex.join(argv)


def audited_text(text: str) -> str:
    """A command as the audit record keeps it: whole up to MAX_AUDITED_CHARS, else its start and its length."""
    if len(text) <= MAX_AUDITED_CHARS:
        return text
    return f"{text[:MAX_AUDITED_CHARS]}... (cut: {len(text)} characters in all)"


@dataclass(frozen=True)
class CommandReading:
    """What an Exec runs, as far as it is known before it runs."""

    text: str
    """The command as one shell line (the audit record shows it)."""
    texts: tuple[str, ...]
    """Every command it runs: as written, and reduced to what runs (`/bin/rm f` also as `rm f`)."""
    unknown: tuple[str, ...] = ()
    """Why some of what it runs is known only when it runs (then the strictest `exec` rule decides)."""


CommandReader = Callable[[Sequence[str], str, Mapping[str, str], bool], CommandReading]
"""(argv, command, env, takes stdin) -> the reading; controlplane.exec_commands.read_command in a served plane."""


def literal_reading(argv: Sequence[str], command: str, env: Mapping[str, str], stdin: bool) -> CommandReading:
    """The command's text alone, for a gate built without the bash analysis: what it runs is then not
    known, so rules other than whole-Exec ones answer with the strictest (fail closed)."""
    text = command_text(argv, command)
    return CommandReading(text, (text,), ("no command analysis is configured",))


@dataclass(frozen=True)
class Verdict:
    rule: Rule
    """The deciding rule (DEFAULT when none matched)."""
    reason: str = ""
    """Which command it decided, when not the whole line, or why the strictest rule decided."""

    @property
    def described(self) -> str:
        if self.rule is DEFAULT:
            return "default allow"
        return f"{self.rule.permission} {self.rule.pattern} {self.rule.action} (operator)"


@dataclass
class ExecGate:
    policy: OperatorPolicy | None = None
    audit: AuditLog = NoAudit()  # noqa: RUF009 - stateless, shared
    reader: CommandReader = field(default=literal_reading)

    def rules(self, tenant: str) -> list[Rule]:
        if self.policy is None:
            return []
        return [r for r in self.policy.rules(tenant, home="/workspace") if r.permission == PERMISSION]

    @staticmethod
    def decide(rules: Sequence[Rule], reading: CommandReading) -> Verdict:
        """The most restrictive answer over every command the Exec runs."""
        verdict: Verdict | None = None
        for text in reading.texts:
            found = DEFAULT
            for rule in rules:
                if match(text, rule.pattern):
                    found = rule
            if verdict is None or STRICTNESS[found.action] > STRICTNESS[verdict.rule.action]:
                verdict = Verdict(found, "" if text == reading.text else f"matched by `{text}`")
        if reading.unknown:
            # The default allow comes first, so the strictest rule is looked for back to the last catch-all.
            rule = strictest(PERMISSION, [DEFAULT, *rules])
            if verdict is None or STRICTNESS[rule.action] > STRICTNESS[verdict.rule.action]:
                verdict = Verdict(rule, f"the strictest exec rule decides, since {reading.unknown[0]}")
        return verdict or Verdict(DEFAULT)

    async def read(self, argv: Sequence[str], command: str, env: Mapping[str, str], stdin: bool) -> CommandReading:
        size = len(command) + sum(len(a) + 1 for a in argv) + sum(len(k) + len(v) for k, v in env.items())
        if size <= READ_NOW_CHARS:
            return self.reader(argv, command, env, stdin)
        if size > MAX_READ_CHARS:
            text = command_text(argv, command)
            return CommandReading(text, (text,), (f"the command is too long to read ({size} characters)",))
        return await asyncio.to_thread(self.reader, argv, command, env, stdin)

    async def admit(
        self, tenant: str, session_id: str, argv: Sequence[str], command: str, env: Mapping[str, str] | None = None,
        *, stdin: bool = True,
    ) -> str:
        """Records the decision and returns the command's text; raises ExecDeniedError when the policy
        refuses the command."""
        rules = self.rules(tenant)
        env = env or {}
        if all(is_catch_all(r.pattern) for r in rules):
            # Whole-Exec rules (or none): the last one decides whatever runs, nothing to read.
            text = command_text(argv, command)
            verdict = Verdict(rules[-1] if rules else DEFAULT)
        else:
            reading = await self.read(argv, command, env, stdin)
            text, verdict = reading.text, self.decide(rules, reading)
        allowed = verdict.rule.action == "allow"
        await self.audit.record(AuditEntry(
            tenant=tenant, session_id=session_id, kind="permission", tool=PERMISSION, call_id="",
            outcome="allow" if allowed else "deny", permission=PERMISSION, patterns=(audited_text(text),),
            rule=verdict.described, detail=verdict.reason,
        ))
        if not allowed:
            why = f", {verdict.reason}" if verdict.reason else ""
            raise ExecDeniedError(
                f"the operator's policy does not allow this command in a sandbox (rule: {verdict.described}{why})"
            )
        return text

    async def refused(self, tenant: str, text: str, *, session_id: str, error: ControlPlaneError) -> None:
        """An Exec refused before the policy's decision: its session is not the tenant's, or the request is bad."""
        await self.audit.record(AuditEntry(
            tenant=tenant, session_id=session_id, kind="exec", tool=PERMISSION, call_id="", outcome="denied",
            permission=PERMISSION, patterns=(audited_text(text),), rule=f"request {error.code.value}",
            detail=str(error),
        ))

    async def finished(
        self, tenant: str, text: str, *, session_id: str, outcome: str, detail: str, stdin: StdinRecord | None = None,
    ) -> None:
        """`outcome`: ok (exit 0), error (another exit, a signal, a failure) or cancelled. With `stdin` (the
        Exec took a standard input), what it received comes first, in a `stdin` row."""
        if stdin is not None:
            await self.audit.record(AuditEntry(
                tenant=tenant, session_id=session_id, kind="stdin", tool=PERMISSION, call_id="",
                outcome="cut" if stdin.cut else "whole", permission=PERMISSION, patterns=(stdin.text(),),
                detail=stdin.describe(),
            ))
        await self.audit.record(AuditEntry(
            tenant=tenant, session_id=session_id, kind="exec", tool=PERMISSION, call_id="", outcome=outcome,
            permission=PERMISSION, patterns=(audited_text(text),), detail=detail,
        ))


STDIN_RECORD_BYTES = 64 * 1024
"""How much of an Exec's standard input the audit record keeps (the total is always counted)."""


@dataclass
class StdinRecord:
    """The standard input an Exec received, bounded: its first `limit` bytes and its total length."""

    limit: int = STDIN_RECORD_BYTES
    head: bytearray = field(default_factory=bytearray)
    total: int = 0
    closed: bool = False

    def add(self, data: bytes) -> None:
        room = self.limit - len(self.head)
        if room > 0:
            self.head += data[:room]
        self.total += len(data)

    @property
    def cut(self) -> bool:
        return self.total > len(self.head)

    def text(self) -> str:
        # Readable in the record; bytes that are not UTF-8 show as \xNN.
        return bytes(self.head).decode("utf-8", "backslashreplace")

    def describe(self) -> str:
        kept = f"; only the first {len(self.head)} recorded" if self.cut else ""
        end = "closed by the client" if self.closed else "not closed by the client"
        return f"{self.total} bytes received{kept}; {end}"


def exec_outcome(exited: Exited) -> tuple[str, str]:
    """(outcome, detail) of a finished command for the audit record."""
    if exited.aborted:
        return "cancelled", "aborted"
    if exited.timed_out:
        return "error", "timed out"
    if exited.signal:
        return "error", f"signal {exited.signal}"
    return ("ok" if exited.exit_code == 0 else "error"), f"exit {exited.exit_code}"
