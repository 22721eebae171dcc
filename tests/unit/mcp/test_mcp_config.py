from __future__ import annotations

import pytest

from controlplane.errors import ConfigError
from controlplane.mcp.config import (
    LocalServer,
    McpConfigError,
    OAuthSettings,
    RemoteServer,
    call_timeout_ms,
    connect_timeout_ms,
    parse_entry,
    parse_mcp_config,
)


def test_local_and_remote_entries_in_document_order() -> None:
    config = parse_mcp_config({
        "mcp": {
            "zeta": {"type": "remote", "url": "https://example.test/mcp", "headers": {"X-Key": "k"}, "oauth": False},
            "alpha": {"type": "local", "command": ["node", "server.js"], "environment": {"A": "1"}, "timeout": 500},
            "off": {"type": "local", "command": ["x"], "enabled": False},
        },
        "experimental": {"mcp_timeout": 9000},
    })
    assert list(config.servers) == ["zeta", "alpha", "off"]
    assert config.problems == []
    zeta, alpha, off = config.servers.values()
    assert zeta == RemoteServer(type="remote", url="https://example.test/mcp", headers={"X-Key": "k"}, oauth=False)
    assert alpha == LocalServer(type="local", command=["node", "server.js"], environment={"A": "1"}, timeout=500)
    assert isinstance(off, LocalServer)
    assert off.enabled is False
    assert config.call_timeout_ms == 9000


def test_defaults() -> None:
    entry = parse_entry("s", {"type": "local", "command": ["srv"]})
    assert isinstance(entry, LocalServer)
    assert (entry.environment, entry.enabled, entry.timeout) == ({}, True, None)
    assert connect_timeout_ms(entry) == 30_000
    assert call_timeout_ms(entry, None) == 60_000
    assert call_timeout_ms(entry, 7000) == 7000
    timed = parse_entry("s", {"type": "local", "command": ["srv"], "timeout": 1234})
    assert connect_timeout_ms(timed) == 1234
    assert call_timeout_ms(timed, 7000) == 1234  # the server's own timeout wins over experimental.mcp_timeout


def test_oauth_object_is_parsed_with_upstream_key_names() -> None:
    entry = parse_entry("r", {"type": "remote", "url": "https://x.test", "oauth": {"clientId": "id", "scope": "s"}})
    assert isinstance(entry, RemoteServer)
    assert entry.oauth == OAuthSettings.model_validate({"clientId": "id", "scope": "s"})
    assert entry.oauth.client_id == "id"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("npx server", "mcp.bad: expected an object"),
        ({"command": ["x"]}, 'mcp.bad: missing "type" (expected "local" or "remote")'),
        ({"type": "stdio", "command": ["x"]},
         "mcp.bad: Input tag 'stdio' found using 'type' does not match any of the expected tags: 'local', 'remote'"),
        ({"type": "local"}, "mcp.bad: command: Field required"),
        ({"type": "local", "command": []},
         "mcp.bad: command: List should have at least 1 item after validation, not 0"),
        ({"type": "local", "command": "npx server"}, "mcp.bad: command: Input should be a valid list"),
        ({"type": "local", "command": ["x"], "timeout": 0}, "mcp.bad: timeout: Input should be greater than 0"),
        ({"type": "local", "command": ["x"], "timeout": 1.5}, "mcp.bad: timeout: Input should be a valid integer"),
        ({"type": "local", "command": ["x"], "enabled": "yes"}, "mcp.bad: enabled: Input should be a valid boolean"),
        ({"type": "local", "command": ["x"], "environment": {"A": 1}},
         "mcp.bad: environment.A: Input should be a valid string"),
        ({"type": "local", "command": ["x"], "url": "http://x"}, "mcp.bad: url: Extra inputs are not permitted"),
        ({"type": "remote"}, "mcp.bad: url: Field required"),
        ({"type": "remote", "url": "http://x", "oauth": True},
         "mcp.bad: oauth.OAuthSettings: Input should be a valid dictionary or instance of OAuthSettings; "
         "oauth.literal[False]: Input should be False"),
        ({"type": "remote", "url": "http://x", "oauth": {"client": "x"}},
         "mcp.bad: oauth.OAuthSettings.client: Extra inputs are not permitted"),
    ],
)
def test_bad_entries_name_the_server(value: object, message: str) -> None:
    with pytest.raises(McpConfigError) as caught:
        parse_entry("bad", value)
    assert str(caught.value).startswith(message)
    assert caught.value.name == "bad"
    assert isinstance(caught.value, ConfigError)


def test_a_bad_entry_does_not_hide_the_others() -> None:
    config = parse_mcp_config({"mcp": {"one": {"type": "local"}, "two": {"type": "local", "command": ["ok"]}}})
    assert list(config.servers) == ["two"]
    assert [str(p) for p in config.problems] == ["mcp.one: command: Field required"]


@pytest.mark.parametrize("document", [None, {}, {"mcp": {}}, {"mcp": None}])
def test_no_servers(document: dict[str, object] | None) -> None:
    config = parse_mcp_config(document)
    assert (config.servers, config.problems, config.call_timeout_ms) == ({}, [], None)


def test_mcp_not_an_object() -> None:
    config = parse_mcp_config({"mcp": ["a"]})
    assert config.servers == {}
    assert [str(p) for p in config.problems] == ["mcp.*: `mcp` must be an object of named servers"]


@pytest.mark.parametrize("value", [0, -5, "100", True, 1.5])
def test_bad_mcp_timeout_is_ignored(value: object) -> None:
    assert parse_mcp_config({"experimental": {"mcp_timeout": value}}).call_timeout_ms is None
