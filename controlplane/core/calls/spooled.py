"""What is left of an output the sandbox kept bounded: the result carries its head, this says the rest."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Spooled:
    """An output the sandbox agent saved as it was produced, too large to travel: the result carries its head."""

    path: str
    """Where it was saved in the sandbox; "" when it could not be (`error`)."""
    total_bytes: int
    total_lines: int
    tail: str
    error: str = ""
    capped: bool = False
    """Only its first part is saved (the session's saved-output budget ran out); the file ends with a note."""
