"""search cases."""

from tests.oracle.cases import Case

CASES: list[Case] = []
