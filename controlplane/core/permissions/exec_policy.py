"""SandboxService.Exec under operator policy, and in the audit record.

Exec runs a raw command in a session's sandbox, outside any tool and any agent's rules, so only the
operator's policy governs it: rules under the `exec` key, global then per tenant, matched against the
command's text (`exec = "deny"`, or `exec = { "*" = "allow", "rm *" = "deny" }`). Only that key counts:
a catch-all `"*" = "deny"` written for tools does not cut the raw API as a side effect. No matching
rule allows (Exec is allowed by default); `ask` refuses, since an Exec has no one to ask.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from controlplane.core.permissions.audit import AuditEntry, AuditLog, NoAudit
from controlplane.core.permissions.permission import Rule
from controlplane.core.permissions.policy import OperatorPolicy
from controlplane.core.seam.messages import Exited
from controlplane.errors import ControlPlaneError, ErrorCode
from opencode_semantics.wildcard import match

PERMISSION = "exec"


class ExecDeniedError(ControlPlaneError):
    code = ErrorCode.PERMISSION_DENIED


def command_text(argv: Sequence[str], command: str) -> str:
    """What the rules match: the shell command, or the argv as a shell would read it."""
    return command or shlex.join(argv)


@dataclass
class ExecGate:
    policy: OperatorPolicy | None = None
    audit: AuditLog = NoAudit()  # noqa: RUF009 - stateless, shared

    def decide(self, tenant: str, text: str) -> Rule | None:
        """The last `exec` rule matching `text`, or None (allowed by default)."""
        if self.policy is None:
            return None
        found: Rule | None = None
        for rule in self.policy.rules(tenant, home="/workspace"):
            if rule.permission == PERMISSION and match(text, rule.pattern):
                found = rule
        return found

    async def admit(self, tenant: str, session_id: str, text: str) -> None:
        """Records the decision; raises ExecDeniedError when the policy refuses the command."""
        rule = self.decide(tenant, text)
        action = rule.action if rule is not None else "allow"
        described = f"{rule.permission} {rule.pattern} {rule.action} (operator)" if rule else "default allow"
        await self.audit.record(AuditEntry(
            tenant=tenant, session_id=session_id, kind="permission", tool=PERMISSION, call_id="",
            outcome="allow" if action == "allow" else "deny", permission=PERMISSION, patterns=(text,),
            rule=described,
        ))
        if action != "allow":
            raise ExecDeniedError(
                f"the operator's policy does not allow this command in a sandbox (rule: {described})"
            )

    async def finished(self, tenant: str, text: str, *, session_id: str, outcome: str, detail: str) -> None:
        """`outcome`: ok (exit 0), error (another exit, a signal, a failure) or cancelled."""
        await self.audit.record(AuditEntry(
            tenant=tenant, session_id=session_id, kind="exec", tool=PERMISSION, call_id="", outcome=outcome,
            permission=PERMISSION, patterns=(text,), detail=detail,
        ))


def exec_outcome(exited: Exited) -> tuple[str, str]:
    """(outcome, detail) of a finished command for the audit record."""
    if exited.aborted:
        return "cancelled", "aborted"
    if exited.timed_out:
        return "error", "timed out"
    if exited.signal:
        return "error", f"signal {exited.signal}"
    return ("ok" if exited.exit_code == 0 else "error"), f"exit {exited.exit_code}"
