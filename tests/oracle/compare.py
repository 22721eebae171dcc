"""The two sides of an oracle comparison in one shape: (result, None) or (None, error text)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from controlplane.client import ToolOutcome
from tests.oracle.cases import Recorded, mask_ids

Answer = tuple[dict[str, Any] | None, str | None]
KEYS = ("title", "output", "metadata", "attachments")
ATTACHMENT_KEYS = ("type", "mime", "url")


def ours(outcome: ToolOutcome, rewrite: Callable[[str], str] | None = None) -> Answer:
    """Our answer; `rewrite` adjusts the result's text first (a local sandbox's home path, say)."""
    if outcome.result is None:
        return None, mask_ids(outcome.error)
    r = outcome.result
    result: dict[str, Any] = {"title": r.title, "output": r.output, "metadata": json.loads(r.metadata_json or "{}")}
    if rewrite is not None:
        result = json.loads(rewrite(json.dumps(result)))
    if r.attachments:
        result["attachments"] = [{k: getattr(a, k) for k in ATTACHMENT_KEYS} for a in r.attachments]
    return mask_ids(result), None


def expected(recorded: Recorded) -> Answer:
    result = recorded.result
    if result is not None:
        result = {k: v for k, v in result.items() if k in KEYS}
        if "attachments" in result:
            result["attachments"] = [{k: a.get(k) for k in ATTACHMENT_KEYS} for a in result["attachments"]]
    return result, recorded.error
