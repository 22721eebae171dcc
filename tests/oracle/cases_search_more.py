"""More oracle cases (search), added to find where we still differ from upstream v1.2.27."""

from tests.oracle.cases import Case

CASES: list[Case] = []
