"""A throwaway PostgreSQL server for tests: Debian's binaries, a temp data dir, a Unix socket in /tmp, no TCP.

The server refuses to run as root, so as root it runs as the `postgres` user (made by Debian's package).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parents[2]
SERVER_USER = "postgres"
ROLE = "ocsb"
INSTALL_HINT = "run `make test-postgres` or scripts/ensure-postgres.sh (installs Debian's postgresql)"


class PgUnavailableError(Exception):
    """Why no server can run here (the tests skip with this text)."""


def find_bindir() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name)
                   if p.parent.parent.name.isdigit() else 0)
    if not found:
        raise PgUnavailableError(
            f"PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin: {INSTALL_HINT}"
        )
    return found[-1].parent


@dataclass
class PgServer:
    bindir: Path
    root: Path
    as_user: str | None
    """The unprivileged user the server runs as when we are root; None: the current user."""

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{ROLE}@/{database}?host={self.socket_dir}"

    def _run(self, *argv: str) -> None:
        command = [*(["runuser", "-u", self.as_user, "--"] if self.as_user else []), *argv]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} failed ({done.returncode}): {done.stderr or done.stdout}")

    @classmethod
    def start(cls) -> PgServer:
        bindir = find_bindir()
        as_user: str | None = None
        if os.geteuid() == 0:
            try:
                import pwd

                account = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise PgUnavailableError(
                    f"running as root and there is no {SERVER_USER!r} user: {INSTALL_HINT}"
                ) from None
            if shutil.which("runuser") is None:
                raise PgUnavailableError("running as root and `runuser` (util-linux) is missing")
            as_user = SERVER_USER
        root = Path(tempfile.mkdtemp(prefix="ocsbpg", dir="/tmp"))  # short: socket paths are limited
        server = cls(bindir, root, as_user)
        server.socket_dir.mkdir()
        if as_user:
            for path in (root, server.socket_dir):
                os.chown(path, account.pw_uid, account.pw_gid)
        try:
            server._run(str(bindir / "initdb"), "-D", str(server.data), "-U", ROLE, "-A", "trust", "-E", "UTF8",
                        "--locale=C", "--no-sync")
            options = f"-k {server.socket_dir} -c listen_addresses='' -c fsync=off -c synchronous_commit=off"
            server._run(str(bindir / "pg_ctl"), "start", "-w", "-t", "30", "-D", str(server.data),
                        "-l", str(root / "server.log"), "-o", options)
        except BaseException:
            server.stop()
            raise
        return server

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # a test's own identifier
        return self.url(name)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self._run(str(self.bindir / "pg_ctl"), "stop", "-w", "-m", "immediate", "-D", str(self.data))
        shutil.rmtree(self.root, ignore_errors=True)
