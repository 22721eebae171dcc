"""Entry point of the sandbox image: `python3 -m sandbox_agent`."""

import asyncio

from sandbox_agent.config import AgentConfig
from sandbox_agent.server import serve


def main() -> None:
    asyncio.run(serve(AgentConfig.from_env()))


if __name__ == "__main__":
    main()
