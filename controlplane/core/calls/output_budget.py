"""A tenant's budget of call output held for its consumers, shared by all its calls on the agents' shared streams.

Each call on a shared stream has a window of bytes the agent may send ahead of the call's consumer (controlplane.
sandbox.call_windows, which gives its full window and grant batch to `open`), so what a tenant makes the plane
hold is its windows times its calls: 100 Execs nobody reads held 112 MiB. So the windows of one tenant's calls
come out of one budget: a call starts with a full window while the budget has room, and with the floor once it
has not; taken bytes are granted back (the agent may send that much more) only as far as the budget has room
again. Past it, a call still always has the floor: an honest call is never failed nor stopped, only slowed (its
grants wait until that tenant's consumers read), and each tenant has a budget of its own, so one tenant's unread
calls never slow another's.

What a tenant's calls make the plane hold is then at most `total`, plus `floor` for each call started past it (a
`calls` quota bounds how many), plus one event a call past its window (an event is never split).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

TENANT_BUDGET = 16 << 20
"""A tenant's calls' windows together: sixteen calls at a full window each (a fast reader's pace); more calls
share it."""
FLOOR = 64 << 10
"""The window every call keeps, budget or not (one chunk of an Exec's output): no call ever stalls for good."""
SMALLEST_GRANT = FLOOR // 4
"""A grant smaller than this waits for more taken bytes (unless it is all a stalled call can get)."""


class OutputBudget:
    """One tenant's bytes of output its calls' agents may send ahead of their consumers."""

    def __init__(self, total: int = TENANT_BUDGET, floor: int = FLOOR) -> None:
        if floor < SMALLEST_GRANT or total < 0:
            raise ValueError(f"an output budget needs a floor of at least {SMALLEST_GRANT} bytes, got {floor}")
        self.total = total
        self.floor = floor
        self.used = 0
        """The windows the tenant's calls have open now, less what their consumers took and was not granted back."""

    def open(self, full: int, batch: int) -> CallShare:
        """A new call's share: a `full` window if the budget has room, else what is left, at least the floor;
        its grants batched by `batch` (or by a quarter of a smaller window)."""
        window = max(self.floor, min(full, self.total - self.used))
        self.used += window
        return CallShare(self, window, min(batch, window // 4))


class CallShare:
    """One call's part of its tenant's budget: its window, and the bytes its consumer took not yet granted back."""

    def __init__(self, budget: OutputBudget, window: int, batch: int) -> None:
        self._budget = budget
        self.window = window
        self._batch = batch
        self.withheld = 0
        self._open = True

    @property
    def exposure(self) -> int:
        """What the agent may still have sent, or send, for this call before its next grant."""
        return self.window - self.withheld

    def taken(self, size: int) -> int:
        """The call's consumer took `size` bytes: what to grant back now (0: none yet)."""
        if not self._open:
            return 0
        self.withheld += size
        self._budget.used -= size
        room = max(self._budget.total - self._budget.used, self._budget.floor - self.exposure)
        grant = min(self.withheld, room)
        # Batched as before (a grant per quarter window taken); where the budget has less room than that, what it
        # has (a call whose agent waits has all its window withheld, and the floor is always room for it).
        if grant < self._batch and (room >= self._batch or grant < SMALLEST_GRANT):
            return 0
        self.withheld -= grant
        self._budget.used += grant
        return grant

    def close(self) -> None:
        """The call is over: its window goes back to the budget."""
        if self._open:
            self._open = False
            self._budget.used -= self.exposure


class OutputBudgets:
    """Each tenant's budget, made when first needed (one plane's)."""

    def __init__(self, total: int = TENANT_BUDGET, floor: int = FLOOR) -> None:
        self._total = total
        self._floor = floor
        self._tenants: dict[str, OutputBudget] = {}

    def of(self, tenant: str) -> OutputBudget:
        budget = self._tenants.get(tenant)
        if budget is None:
            budget = self._tenants[tenant] = OutputBudget(self._total, self._floor)
        return budget


CURRENT: ContextVar[OutputBudget | None] = ContextVar("ocsb_output_budget", default=None)
"""The budget the calls started in this context draw from: set by the handler that knows the tenant, read where a
call is started on a shared stream (deep under the provider's agent, which knows no tenant)."""


@contextmanager
def drawing_from(budget: OutputBudget) -> Iterator[None]:
    """Calls started inside draw their windows from `budget`."""
    token = CURRENT.set(budget)
    try:
        yield
    finally:
        CURRENT.reset(token)
