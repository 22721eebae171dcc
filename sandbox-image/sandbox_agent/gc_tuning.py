"""The garbage collector's settings for a long-running server process (the control plane, the agent).

A tool call allocates a few thousand container objects (asyncio futures and handles, protobuf wrappers,
dicts) that almost all die young by reference counting. With CPython's default generation-0 threshold
(700) the collector still scans the young generation several times per call; at 10,000 it does so
every few calls, and `gc.freeze()` after start-up keeps the imported modules, the configuration and
the gRPC machinery out of every later full collection. In alternating runs against the defaults
(docs/performance.md) that took 7-10 % off the CPU and the latency of a call. Only a process's owner
calls this (not a library import, not a test run hosting many planes).
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 10_000


def tune_after_startup() -> None:
    gc.enable()  # the agent's entry point keeps it off while its modules load
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
