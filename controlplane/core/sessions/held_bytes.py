"""What the control plane holds for a tenant, in bytes: event backlogs and pending questions are bounded
by size, not count, since one event or question can carry megabytes (a 4 MiB todo list, a 3 MiB question).

Sizes are estimates from the JSON-like value itself (text lengths plus a little per item), cheap enough to
take on every publish: the point is to tell a few KiB from many MiB, not to match the allocator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from controlplane.errors import ResourceExhaustedError

ITEM_BYTES = 16
"""Counted for every value besides its text: an event of many tiny items is not free either."""


def approximate_size(value: Any) -> int:
    """The bytes `value` (str, bytes, numbers, dicts, lists, tuples, dataclass-free) stands for."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        total += ITEM_BYTES
        if isinstance(item, str | bytes | bytearray):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)
    return total


class TenantBytes:
    """A per-tenant tally of bytes held, refusing what would take a tenant past `limit` (0: no limit)."""

    def __init__(self, limit: int, what: str, setting: str) -> None:
        self.limit = limit
        self._what = what
        self._setting = setting
        self._held: dict[str, int] = {}

    def held(self, tenant: str) -> int:
        return self._held.get(tenant, 0)

    @contextlib.contextmanager
    def holding(self, tenant: str, size: int) -> Iterator[None]:
        """Counts `size` for `tenant` while the block runs; RESOURCE_EXHAUSTED (naming the use and the
        limit) when that would exceed the limit."""
        held = self.held(tenant)
        if self.limit and held + size > self.limit:
            raise ResourceExhaustedError(
                f"tenant {tenant}'s {self._what} would hold {held + size} bytes; the limit is {self.limit} "
                f"({self._setting})"
            )
        self._held[tenant] = held + size
        try:
            yield
        finally:
            left = self._held[tenant] - size
            if left:
                self._held[tenant] = left
            else:
                del self._held[tenant]
