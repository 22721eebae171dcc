"""A tenant's budget of call output (controlplane/core/calls/output_budget.py): its calls' windows together stay under
the budget (plus the floor of each call started past it), a call whose consumer reads always progresses however
many of the tenant's other calls sit unread, and one tenant's budget never touches another's. The agent here is a
model of sandbox_agent/output_credit.py's rule: send while what was sent and not granted back is under the window."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from controlplane.core.calls.output_budget import FLOOR, TENANT_BUDGET, CallShare, OutputBudget, OutputBudgets
from controlplane.sandbox.call_windows import GRANT_EVERY, WINDOW

CHUNK = 64 << 10


@dataclass
class ModelCall:
    """One call between a model agent (as output_credit.Credit does) and the plane's share of the budget."""

    share: CallShare
    outstanding: int = 0
    queued: list[int] = field(default_factory=list)
    delivered: int = 0

    def agent_sends(self) -> bool:
        if self.outstanding >= self.share.window:
            return False
        self.outstanding += CHUNK
        self.queued.append(CHUNK)
        return True

    def consumer_takes(self) -> bool:
        if not self.queued:
            return False
        size = self.queued.pop(0)
        self.delivered += size
        grant = self.share.taken(size)
        self.outstanding = max(0, self.outstanding - grant)
        return True


def test_calls_start_with_a_full_window_while_the_budget_has_room_then_with_the_floor() -> None:
    budget = OutputBudget()
    shares = [budget.open(WINDOW, GRANT_EVERY) for _ in range(100)]
    full = TENANT_BUDGET // WINDOW
    assert [s.window for s in shares[:full]] == [WINDOW] * full
    assert {s.window for s in shares[full:]} == {FLOOR}
    assert budget.used == TENANT_BUDGET + (100 - full) * FLOOR


def test_what_unread_calls_hold_is_bounded_by_the_budget_not_by_their_number() -> None:
    budget = OutputBudget()
    calls = [ModelCall(budget.open(WINDOW, GRANT_EVERY)) for _ in range(100)]
    for call in calls:
        while call.agent_sends():
            pass
    held = sum(sum(call.queued) for call in calls)
    # Per call, a window each (1 MiB): 100 MiB. Shared: the budget and the floor of each call past it.
    assert held <= TENANT_BUDGET + 100 * FLOOR
    assert held < 24 << 20


def test_a_read_call_progresses_while_the_tenants_other_calls_sit_unread_on_the_whole_budget() -> None:
    budget = OutputBudget()
    unread = [ModelCall(budget.open(WINDOW, GRANT_EVERY)) for _ in range(40)]
    for call in unread:
        while call.agent_sends():
            pass
    reader = ModelCall(budget.open(WINDOW, GRANT_EVERY))
    assert reader.share.window == FLOOR
    for _ in range(2000):
        if not reader.agent_sends():
            assert reader.consumer_takes(), "the read call stalled: its agent waits and nothing is queued"
    assert reader.delivered >= 1000 * CHUNK
    assert sum(sum(call.queued) for call in [*unread, reader]) <= TENANT_BUDGET + 41 * FLOOR


def test_grants_are_batched_as_before_while_the_budget_has_room() -> None:
    budget = OutputBudget()
    share = budget.open(WINDOW, GRANT_EVERY)
    grants = [share.taken(CHUNK) for _ in range(8)]
    assert grants == [0, 0, 0, GRANT_EVERY, 0, 0, 0, GRANT_EVERY]
    assert budget.used == WINDOW


def test_a_grant_past_the_budget_waits_until_the_tenants_consumers_read() -> None:
    budget = OutputBudget(total=2 * WINDOW)
    first, second = budget.open(WINDOW, GRANT_EVERY), budget.open(WINDOW, GRANT_EVERY)
    late = budget.open(WINDOW, GRANT_EVERY)  # past the budget: the floor
    assert late.window == FLOOR
    # `first`'s consumer takes a quarter window: its grant is what the budget has room for (the floor's overdraft
    # is repaid first), not the whole quarter.
    assert [first.taken(CHUNK) for _ in range(4)] == [0, CHUNK, CHUNK, CHUNK]
    assert budget.used == 2 * WINDOW
    # From then on the tenant's calls are granted what their consumers gave back, in smaller grants.
    assert [second.taken(CHUNK) for _ in range(4)] == [CHUNK] * 4
    assert budget.used == 2 * WINDOW
    first.close()
    second.close()
    late.close()
    assert budget.used == 0


def test_an_ended_call_gives_its_window_back() -> None:
    budget = OutputBudget()
    share = budget.open(WINDOW, GRANT_EVERY)
    share.taken(CHUNK)
    share.close()
    share.close()
    assert budget.used == 0
    assert share.taken(CHUNK) == 0
    assert budget.used == 0


def test_each_tenant_has_a_budget_of_its_own() -> None:
    budgets = OutputBudgets()
    hoarder = budgets.of("hoarder")
    for _ in range(200):
        hoarder.open(WINDOW, GRANT_EVERY)
    assert budgets.of("hoarder") is hoarder
    assert budgets.of("neighbour").open(WINDOW, GRANT_EVERY).window == WINDOW


def test_a_floor_too_small_for_a_grant_is_refused() -> None:
    with pytest.raises(ValueError, match="floor"):
        OutputBudget(floor=1024)
