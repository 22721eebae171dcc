"""This process's resident memory, read the way the memory-bound tests compare it (a plane served in-process)."""

from __future__ import annotations


def rss() -> int:
    """VmRSS in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def rss_mib() -> int:
    return rss() >> 20
