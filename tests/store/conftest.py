from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from tests.store.pg_server import PgServer, PgUnavailableError


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One PostgreSQL server for the whole run (about a second to start), removed at the end."""
    try:
        server = PgServer.start()
    except PgUnavailableError as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    """A fresh, empty database for one test."""
    return pg_server.create_database(f"t_{secrets.token_hex(6)}")
