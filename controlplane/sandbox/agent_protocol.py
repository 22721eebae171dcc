"""The one agent protocol this control plane speaks: every agent it uses names the flow control it honours, both
in Health (checked wherever the plane hears a sandbox's agent first: its start, its adoption) and on the first
message of each shared stream. An agent that names less is refused, never served without windows.

An older image's agent named nothing, and was once served without windows for compatibility: a compromised agent
could then say nothing too, credit no stdin and read none of its requests, and the plane queued the tenant's stdin
for it without bound (issue 22). An agent that names the features and does not honour them is held to them all the
same: its calls' output past their windows fails them, its stdin stalls at a window per call.
"""

from __future__ import annotations

from collections.abc import Iterable

from controlplane.errors import AgentProtocolError

REQUIRED = frozenset({"output-credit", "stdin-credit"})
"""Output windows (sandbox_agent/output_credit.py) and stdin credit (sandbox_agent/stdin_credit.py)."""


def protocol_error(named: Iterable[str], sandbox_id: str, where: str) -> AgentProtocolError | None:
    """Why an agent that named `named` (in `where`) is not used; None: it names all the plane requires."""
    said = frozenset(named)
    missing = sorted(REQUIRED - said)
    if not missing:
        return None
    return AgentProtocolError(
        f"sandbox {sandbox_id}: its agent's {where} names {', '.join(sorted(said)) or 'no flow control'}, not "
        f"{' and '.join(missing)}: the image's agent is older than this control plane, which uses no such sandbox. "
        "Rebuild the sandbox image with this control plane's tree (sandbox-image/build-image.sh) and every template "
        "FROM the current ocsb-sandbox image (`ARG SANDBOX_IMAGE` then `FROM ${SANDBOX_IMAGE}`; a prebuilt "
        "`image = ...` must be rebuilt the same way), then start the sandbox again")


class OlderAgent:
    """Put in each call's inbox of a stream whose first message named less than REQUIRED: the stream is closed."""

    def __init__(self, named: Iterable[str]) -> None:
        self.named = frozenset(named)

    def error(self, sandbox_id: str) -> AgentProtocolError:
        error = protocol_error(self.named, sandbox_id, "first message on a shared stream")
        assert error is not None
        return error
