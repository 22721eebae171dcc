"""Entry point of the sandbox image: `python3 -m sandbox_agent`."""

import sys

# First: the agent runs as root with the workspace as its working directory, and without a safe path `-m` puts that
# directory first on sys.path, so every module imported after start (the bash grammar, the rare RPCs') would be
# looked up where the model and the tenant's archive write. The image sets PYTHONSAFEPATH=1; without it, no start.
if __name__ == "__main__" and not sys.flags.safe_path:
    raise SystemExit("sandbox agent: refusing to start: its working directory would come first on sys.path "
                     "(run it with PYTHONSAFEPATH=1 or python3 -P)")

import gc

# No collection while the agent's modules load (all of them live as long as the agent): a few ms of every sandbox's
# start. serve() collects, freezes and enables the collector once the socket serves (gc_tuning).
gc.disable()

# Before asyncio and uvloop load: they import `ssl`, which would load OpenSSL for TLS the agent never speaks.
from sandbox_agent import no_tls  # noqa: E402

no_tls.install()

import os  # noqa: E402

from sandbox_agent import environ_scrub, event_loop, syscall_filter  # noqa: E402
from sandbox_agent.config import AgentConfig  # noqa: E402
from sandbox_agent.serving import serve  # noqa: E402


def main() -> None:
    # Docker gives root its supplementary group 0. The agent's own access comes from its uid; the
    # filesystem identity it takes for the tool user (fsuid/fsgid) keeps the process's groups, so they
    # are dropped before any thread exists: a root-group-readable file stays closed to the tool user.
    os.setgroups([])
    config = AgentConfig.from_env()
    # Read: from here what a process can see of the agent's start-up environment is blank (gVisor shows it to all).
    environ_scrub.scrub()
    # Before any thread and any tool: the filter holds for every process the agent starts.
    syscall_filter.install(syscall_filter.from_env(config.syscall_deny))
    event_loop.run(serve(config))


if __name__ == "__main__":
    main()
