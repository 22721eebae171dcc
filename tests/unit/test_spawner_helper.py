"""The spawner helper's imports: one helper lives as long as its sandbox, so what it imports is memory every idle
sandbox holds (docs/performance.md: asyncio alone costs a Python process about 6 MiB of private memory)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sandbox_agent import spawner
from sandbox_agent.spawner_helper import (
    _Assembler,
    _frames,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
)

AGENT_ROOT = Path(spawner.__file__).resolve().parent.parent
HEAVY = {"asyncio", "concurrent.futures", "logging", "ssl", "subprocess", "typing", "inspect", "dataclasses"}
LIGHT_BUT_COSTLY = {"json", "re", "enum", "socket", "selectors", "signal", "threading", "contextlib", "collections",
                    "site"}
"""What the helper once imported for conveniences (1.9 of its 5.0 MiB in the image): its own framing and the
low-level modules (_socket, select, _signal) do the same work."""


def helper_modules() -> set[str]:
    """The modules a fresh interpreter holds once it imported what the agent's helper command line runs."""
    # No json here: the probe must not load what it looks for.
    code = (f"import sys; sys.path.insert(0, {str(AGENT_ROOT)!r}); import {spawner.HELPER_MODULE}; "
            "print(' '.join(sys.modules))")
    done = subprocess.run([sys.executable, *spawner.HELPER_FLAGS, "-c", code], capture_output=True, check=True,
                          text=True)
    return set(done.stdout.split())


def test_the_helper_imports_none_of_the_agents_heavy_modules() -> None:
    loaded = helper_modules()
    assert spawner.HELPER_MODULE in loaded
    assert loaded & HEAVY == set()


def test_the_helper_module_has_the_helpers_entry_point() -> None:
    module = __import__(spawner.HELPER_MODULE, fromlist=["main"])
    assert callable(module.main)
    assert module.TOOL_NICENESS == spawner.TOOL_NICENESS


def test_the_helper_leaves_out_the_convenience_modules_too() -> None:
    loaded = helper_modules()
    assert loaded & LIGHT_BUT_COSTLY == set()


def test_a_request_crosses_the_framing_as_it_was_sent() -> None:
    """Every str the agent may pass arrives unchanged: a NUL (which posix_spawn then refuses, as it did), a lone
    surrogate, empty strings, newlines and spaces (the header's separators), no argv or env at all, and a request
    larger than a frame."""
    for argv, env in ((["a\0b", "\udcff", "", "1\n2 3"], {"K": "v\0", "": "", "é": "\ud800", "L": "x\ny"}), ([], {}),
                      (["y" * (spawner.FRAME * 2)], {"BIG": "z" * spawner.FRAME})):
        message = {"id": 7, "argv": argv, "env": env, "cwd": "/w\0", "umask": 0o22, "stdin": True, "stderr": "pipe"}
        frames = _frames(encode_request(message))
        assembler = _Assembler()
        data = [assembler.feed(f) for f in frames]
        assert data[:-1] == [None] * (len(frames) - 1)
        last = data[-1]
        assert last is not None
        assert decode_request(last) == message


def test_replies_cross_the_framing_as_they_were_sent() -> None:
    for reply in ({"ready": True}, {"id": 3, "pid": 42}, {"pid": 42, "status": -9},
                  {"id": 4, "error": {"errno": 2, "strerror": "No such file or directory: 'x\0'"}}):
        assert decode_reply(encode_reply(reply)) == reply
