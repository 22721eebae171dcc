"""What apply_patch's test files share: a patch text in its Begin/End envelope."""

from __future__ import annotations


def patch(*body: str) -> str:
    return "\n".join(["*** Begin Patch", *body, "*** End Patch"])
