"""The `mcp` map of a session's opencode.json, parsed into typed server entries.

Shapes follow upstream's config schema: `local {command[], environment?, enabled?, timeout?}` and
`remote {url, headers?, enabled?, timeout?, oauth?: {clientId?, clientSecret?, scope?} | false}`.
A malformed entry is reported with its server name and does not hide the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, TypeAdapter, ValidationError

from controlplane.errors import ConfigError

DEFAULT_CONNECT_TIMEOUT_MS = 30_000
"""Connect and list-tools limit when a server sets no `timeout` (upstream's default)."""
DEFAULT_CALL_TIMEOUT_MS = 60_000
"""Tool-call limit when neither the server's `timeout` nor `experimental.mcp_timeout` is set (the SDK default)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class OAuthSettings(_Strict):
    client_id: StrictStr | None = Field(None, alias="clientId")
    client_secret: StrictStr | None = Field(None, alias="clientSecret")
    scope: StrictStr | None = None


class LocalServer(_Strict):
    type: Literal["local"]
    command: list[StrictStr] = Field(min_length=1)
    environment: dict[str, StrictStr] = Field(default_factory=dict)
    enabled: StrictBool = True
    timeout: Annotated[int, Field(gt=0)] | None = None
    """Milliseconds."""


class RemoteServer(_Strict):
    type: Literal["remote"]
    url: StrictStr
    headers: dict[str, StrictStr] = Field(default_factory=dict)
    enabled: StrictBool = True
    timeout: Annotated[int, Field(gt=0)] | None = None
    """Milliseconds."""
    oauth: OAuthSettings | Literal[False] | None = None


ServerEntry = Annotated[LocalServer | RemoteServer, Field(discriminator="type")]
_ENTRY: TypeAdapter[LocalServer | RemoteServer] = TypeAdapter(ServerEntry)


class McpConfigError(ConfigError):
    """An `mcp.{name}` entry that cannot be used; the message names the server."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"mcp.{name}: {problem}")
        self.name = name
        self.problem = problem


@dataclass(frozen=True)
class McpConfig:
    servers: dict[str, LocalServer | RemoteServer] = field(default_factory=dict)
    """Every well-formed entry, enabled or not, in document order."""
    problems: list[McpConfigError] = field(default_factory=list)
    call_timeout_ms: int | None = None
    """`experimental.mcp_timeout`: the tool-call limit of servers that set no `timeout`."""


def parse_entry(name: str, value: object) -> LocalServer | RemoteServer:
    """One entry, or McpConfigError saying what is wrong with it."""
    if not isinstance(value, Mapping):
        raise McpConfigError(name, "expected an object")
    if "type" not in value:
        raise McpConfigError(name, 'missing "type" (expected "local" or "remote")')
    try:
        return _ENTRY.validate_python(dict(value))
    except ValidationError as exc:
        raise McpConfigError(name, _describe(exc)) from None


def parse_mcp_config(document: Mapping[str, Any] | None) -> McpConfig:
    """The `mcp` map and `experimental.mcp_timeout` of an opencode.json document."""
    document = document or {}
    raw = document.get("mcp") or {}
    if not isinstance(raw, Mapping):
        return McpConfig(problems=[McpConfigError("*", "`mcp` must be an object of named servers")])
    servers: dict[str, LocalServer | RemoteServer] = {}
    problems: list[McpConfigError] = []
    for name, value in raw.items():
        try:
            servers[str(name)] = parse_entry(str(name), value)
        except McpConfigError as exc:
            problems.append(exc)
    return McpConfig(servers, problems, _call_timeout(document.get("experimental")))


def connect_timeout_ms(entry: LocalServer | RemoteServer) -> int:
    return entry.timeout or DEFAULT_CONNECT_TIMEOUT_MS


def call_timeout_ms(entry: LocalServer | RemoteServer, configured_default: int | None) -> int:
    return entry.timeout or configured_default or DEFAULT_CALL_TIMEOUT_MS


def _call_timeout(experimental: object) -> int | None:
    if not isinstance(experimental, Mapping):
        return None
    value = experimental.get("mcp_timeout")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        # The discriminator adds the union member's tag to the location; the user never wrote it.
        loc = [str(p) for p in error["loc"] if p not in ("local", "remote")]
        where = ".".join(loc)
        parts.append(f"{where}: {error['msg']}" if where else error["msg"])
    return "; ".join(parts)
