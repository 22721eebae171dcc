"""The temporary files of the agent's writing helpers, and their removal when a helper could not remove its own.

An upload (tario extract) or a WriteFile (fileops write) writes each entry under a temporary name beside its
target and renames it over the target once complete, so the old entry stays whole until then. A helper that
fails or is stopped removes its unfinished temporary file itself (SIGTERM unwinds it), but not when it is
SIGKILLed at the end of its grace, starved of CPU on a busy machine: the file was then left beside the user's
own. So the helper announces each temporary path on stdout, on a line of its own (`@` and the JSON-quoted path)
before it makes it, and the agent removes the last one it heard of whenever the helper did not succeed. Entries
are written one at a time, so only the last announced name can be unfinished.

The removal runs as the tool user (the directories are that user's), removes only a name a helper makes (the
platform's temporary patterns) and walks from the workspace with O_NOFOLLOW at each step, so a link a tool
process swapped in cannot point it elsewhere. What it removes, a tool process could remove itself.

    python3 -m sandbox_agent.helper_temps remove WORKSPACE PATH   -> exit 0 when PATH was removed
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable

from sandbox_agent.errors import AgentError
from sandbox_agent.process import Chunk, Execution, Exit

MARK = "@"
REMOVER_TIMEOUT_S = 10.0
TEMP_NAMES = re.compile(r"\.ocsb-upload-[0-9]+-[0-9]+|\..+\.ocsb-[0-9]+", re.DOTALL)
"""tario's and fileops' temporary names: nothing else is ever removed."""
Helper = Callable[[list[str], bool], Awaitable[Execution]]
"""Starts `python -m sandbox_agent.<argv>` as the tool user (stdin kept open when asked)."""
_WALK = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def announce(path: str | None) -> None:
    """Helper side: says where the next temporary entry is made, before making it; None once a name could not be
    made because it was taken (a tool process can guess it): that entry is someone else's, never removed."""
    sys.stdout.write(MARK + json.dumps(path) + "\n")
    sys.stdout.flush()


class Announced:
    """Agent side: a helper's stdout split into the temporary paths it announced and its result."""

    def __init__(self, workspace: str) -> None:
        self._workspace = workspace
        self._pending = bytearray()
        self._result = bytearray()
        self.temp: str | None = None

    def feed(self, data: bytes) -> None:
        self._pending += data
        if b"\n" not in data:
            # The result is one line without an end (a summary, a listing): appending alone keeps a long one
            # linear; looking through all of it again for each piece would be quadratic.
            return
        start = 0
        while (end := self._pending.find(b"\n", start)) >= 0:
            line = bytes(self._pending[start:end])
            if line.startswith(MARK.encode()):
                try:
                    said = json.loads(line[1:])
                except ValueError:
                    said = None
                self.temp = said if isinstance(said, str) else None
            else:
                self._result += line + b"\n"
            start = end + 1
        del self._pending[:start]

    def result(self) -> bytes:
        return bytes(self._result + self._pending)

    async def remove_left(self, start: Helper) -> None:
        """Removes the last announced temporary entry if it is still there, through a helper of its own: the
        directories are the tool user's, and the agent, root without CAP_DAC_OVERRIDE, may not write in them.
        Bounded in time, and stopped with its caller: a tool process can SIGSTOP it (same uid)."""
        if self.temp is None:
            return
        temp, self.temp = self.temp, None
        try:
            remover = await start(["sandbox_agent.helper_temps", "remove", self._workspace, temp], False)
        except (AgentError, OSError):
            return  # out of processes: the caller's own answer (the refusal) matters more than the leftover
        ended = False
        try:
            async with asyncio.timeout(REMOVER_TIMEOUT_S):
                async for _ in remover.events():
                    pass
            ended = True
        except TimeoutError:
            pass
        finally:
            if not ended:
                remover.stop(reason="temporary entry removal overran or was cancelled")


def remove_temp(workspace: str, path: str) -> bool:
    root = os.path.realpath(workspace)
    if os.path.normpath(path) != path or not path.startswith(root.rstrip("/") + "/"):
        return False
    parts = path[len(root.rstrip("/")) + 1:].split("/")
    if not TEMP_NAMES.fullmatch(parts[-1]):
        return False
    try:
        fd = os.open(root, _WALK)
    except OSError:
        return False
    try:
        for name in parts[:-1]:
            following = os.open(name, _WALK, dir_fd=fd)
            os.close(fd)
            fd = following
        os.unlink(parts[-1], dir_fd=fd)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


async def collect(helper: Execution, stdout: Announced) -> tuple[bytes, bytes, Exit]:
    """The helper's result (stdout less its announcements), its stderr and its exit."""
    err = bytearray()
    async for item in helper.events():
        if isinstance(item, Exit):
            return stdout.result(), bytes(err), item
        if item.stream == "stdout":
            stdout.feed(item.data)
        else:
            err.extend(item.data)
    raise RuntimeError("helper ended without an exit event")


async def stop_and_clean(helper: Execution, stdout: Announced, reason: str, start: Helper) -> None:
    """Stops a helper whose caller went away, then removes what it left: the announcements it made after the
    caller stopped reading are still in its output."""
    await helper.stop(reason=reason)
    async for item in helper.events():
        if isinstance(item, Chunk) and item.stream == "stdout":
            stdout.feed(item.data)
    await stdout.remove_left(start)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "remove":
        sys.exit(0 if remove_temp(sys.argv[2], sys.argv[3]) else 1)
    print(__doc__, file=sys.stderr)
    sys.exit(64)
