"""The agent's sockets (`/run/agent/agent.sock`, gRPC, and `frames.sock`, its two shared streams as frames) seen
from inside a session: a tool process can neither reach them nor relay through them. Moved out of test_escape.py
when the second socket came."""

from __future__ import annotations

import pytest

from tests.planes import Plane
from tests.security.conftest import Pair, Vector, python_probe
from tests.security.escape_probes import on_gvisor, reasons

pytestmark = pytest.mark.docker

SOCKETS = ("/run/agent/agent.sock", "/run/agent/frames.sock")


async def test_agent_socket_cannot_be_used_as_a_relay(
    runtime_plane: Plane, pair: Pair, vector: Vector, runtime: str,
) -> None:
    out = await vector.run(runtime_plane.client, pair.a, (
        "stat -c '%a %U:%G' /run/agent; " + "".join(f"stat -c '%a %U' {path}; " for path in SOCKETS)
        + "cat /proc/net/tcp /proc/net/tcp6 | awk 'NR > 1 && $4 == \"0A\"' | wc -l;\n"
        + python_probe("""
import socket, sys
for path in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        print(path, "CONNECTED")
    except OSError as e:
        print(path, type(e).__name__, e.errno)
""", *SOCKETS)
    ))
    # No TCP listener exists inside either: nothing can be relayed over loopback.
    expected = (
        "700 root:root\n"
        "stat: cannot statx '/run/agent/agent.sock': Permission denied\n"
        "stat: cannot statx '/run/agent/frames.sock': Permission denied\n"
        "0\n"
        "/run/agent/agent.sock PermissionError 13\n"
        "/run/agent/frames.sock PermissionError 13\n"
    )
    if runtime == "runsc":  # gVisor's statx fails on the dir too: its mode is read with os.stat instead
        expected = on_gvisor(expected).replace("700 root:root\n", "stat: cannot statx '/run/agent': Invalid argument\n")
        mode = await vector.run(runtime_plane.client, pair.a, python_probe(
            "import os; s = os.stat('/run/agent'); print(oct(s.st_mode & 0o777), s.st_uid, s.st_gid)"))
        assert mode == "0o700 0 0\n"
        assert await reasons(runtime_plane, pair.a, vector, *SOCKETS) == dict.fromkeys(SOCKETS, "EACCES")
    assert out == expected
