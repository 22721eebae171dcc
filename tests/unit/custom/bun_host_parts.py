"""What the Bun tool host's test files share: zod's schema and retry texts, and loading tool and plugin files."""

from __future__ import annotations

from sandbox_agent.custom.host import HostFile, HostTool, ToolHost
from tests.unit.custom.conftest import Sandbox

SCHEMA = "https://json-schema.org/draft/2020-12/schema"
RETRY = "\nPlease rewrite the input so it satisfies the expected schema."


async def load(host: ToolHost, sandbox: Sandbox, *files: str, plugins: tuple[str, ...] = ()) -> list[HostTool]:
    loaded = await host.load([HostFile(f, "tool") for f in files] + [HostFile(p, "plugin") for p in plugins],
                             str(sandbox.project), str(sandbox.project))
    return loaded.tools
