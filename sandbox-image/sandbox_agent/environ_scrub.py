"""The agent's initial environment, blanked in its memory once read.

`/proc/PID/environ` shows the strings the process was started with, where the kernel put them (the top of its
first stack), not what it has made of them since. runc shows that file only to the process's own uid, but
gVisor as Debian ships it (runsc 2022) lets every uid in the sandbox read it (docs/security.md, gap 7): a tool
process could read whatever the control plane gave the agent. Nothing secret is there today (the tool uid,
the syscall filter's list, paths), and this keeps it so if something is ever added: the agent copies every
variable to the heap (`setenv` makes its own copy, and children started without an explicit environment
inherit those copies), then zeroes the original strings. Python's `os.environ` is a copy made at start-up.
"""

from __future__ import annotations

import ctypes
import os


def scrub() -> int:
    """Blanks the original environment strings (keeping every variable's value); returns how many bytes."""
    libc = ctypes.CDLL(None, use_errno=True)
    table = ctypes.POINTER(ctypes.c_void_p).in_dll(libc, "environ")
    originals: list[tuple[int, int]] = []
    index = 0
    while table and table[index]:
        address = int(table[index])
        originals.append((address, len(ctypes.string_at(address))))
        index += 1
    for name, value in os.environ.items():
        os.putenv(name, value)  # setenv: a heap copy replaces the pointer into the original strings
    blanked = 0
    for address, length in originals:
        ctypes.memset(address, 0, length)
        blanked += length
    return blanked
