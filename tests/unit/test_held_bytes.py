"""Per-tenant byte tallies and size estimates behind the bounded event backlogs and pending questions."""

from __future__ import annotations

import pytest

from controlplane.core.sessions.held_bytes import ITEM_BYTES, TenantBytes, approximate_size
from controlplane.errors import ResourceExhaustedError


def test_sizes_count_text_and_items() -> None:
    assert approximate_size("abc") == 3 + ITEM_BYTES
    assert approximate_size({"k": ["x" * 1000, 1]}) == 1 + 1000 + 5 * ITEM_BYTES
    assert approximate_size([{"content": "t" * (1 << 20)}] * 4) > 4 << 20


def test_a_tenant_past_its_limit_is_refused_and_others_are_counted_apart() -> None:
    held = TenantBytes(100, "pending questions", "limits.x")
    with held.holding("a", 60):
        with pytest.raises(ResourceExhaustedError) as caught, held.holding("a", 50):
            pass
        assert str(caught.value) == "tenant a's pending questions would hold 110 bytes; the limit is 100 (limits.x)"
        with held.holding("b", 90):
            assert (held.held("a"), held.held("b")) == (60, 90)
    assert (held.held("a"), held.held("b")) == (0, 0)
    with held.holding("a", 100):  # given back
        pass
    unlimited = TenantBytes(0, "pending questions", "limits.x")
    with unlimited.holding("a", 1 << 40):
        assert unlimited.held("a") == 1 << 40
