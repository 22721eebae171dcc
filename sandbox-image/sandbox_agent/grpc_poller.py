"""Which I/O engine grpcio uses in our processes; applied before the first `import grpc`.

grpcio 1.85 moved Python onto its EventEngine: socket I/O runs on EventEngine threads and every
completed read or write crosses one more thread before the asyncio loop sees it. On the short
messages of a tool call that hop costs CPU, and the poller it replaced (the thread that waits on the
completion queue polls the sockets itself) spends less per call: 10-50 % in `make bench`'s section
"grpc engine" and 4-23 % of the control plane's CPU per exec in the whole chain, the more the busier the
machine; wall-clock latency moved between -15 % and +9 % with the machine's load. The EventEngine
experiments are still switchable in the pinned grpcio; an operator who sets GRPC_EXPERIMENTS keeps
their own value, and setting it to "" restores grpcio's default.
"""

from __future__ import annotations

import os
import sys

EXPERIMENTS_VAR = "GRPC_EXPERIMENTS"
POLLER_EXPERIMENTS = "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"


def prefer_poller() -> bool:
    """Chooses the poller unless the operator chose otherwise; False when grpc was already loaded."""
    if "grpc" in sys.modules:
        return False
    os.environ.setdefault(EXPERIMENTS_VAR, POLLER_EXPERIMENTS)
    return True
