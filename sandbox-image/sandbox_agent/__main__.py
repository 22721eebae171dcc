"""Entry point of the sandbox image: `python3 -m sandbox_agent`."""

import os

from sandbox_agent import environ_scrub, event_loop, syscall_filter
from sandbox_agent.config import AgentConfig
from sandbox_agent.serving import serve


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
