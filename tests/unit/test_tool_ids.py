"""Per-sandbox tool uid blocks (controlplane.sandbox.tool_ids): a range no host account uses, one block each."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from controlplane.errors import ConfigError, SandboxStartError
from controlplane.sandbox.tool_ids import BLOCK, CLAIM_TTL_S, ToolIds, check_range, labelled_uids


def accounts(tmp_path: Path, uids: list[int], gids: list[int]) -> tuple[Path, Path]:
    passwd = tmp_path / "passwd"
    passwd.write_text("".join(f"u{u}:x:{u}:{u}::/h:/bin/sh\n" for u in uids) + "broken line\n")
    group = tmp_path / "group"
    group.write_text("".join(f"g{g}:x:{g}:\n" for g in gids))
    return passwd, group


def test_a_range_holding_a_host_account_is_a_config_error(tmp_path: Path) -> None:
    passwd, group = accounts(tmp_path, [0, 1000, 200_005], [0, 1000])
    with pytest.raises(ConfigError, match=r"holds the host's user id 200005 \(.*passwd\)"):
        check_range(200_000, 64, passwd, group)
    passwd, group = accounts(tmp_path, [0, 1000], [300_001])
    with pytest.raises(ConfigError, match="holds the host's group id 300001"):
        check_range(300_000, 64, passwd, group)
    check_range(200_008, 64, *accounts(tmp_path, [200_005], [200_007]))
    with pytest.raises(ConfigError, match="at least 8 ids"):
        check_range(200_000, BLOCK - 1, passwd, group)


def test_this_machines_accounts_are_outside_the_default_range() -> None:
    check_range(200_000, 65_536)


def test_blocks_are_unique_across_two_planes_sharing_a_host(tmp_path: Path) -> None:
    """Two allocators over one claims dir (two control planes on one host), the engine holding some blocks."""
    engine = {200_000}
    one = ToolIds(200_000, 64, tmp_path)
    two = ToolIds(200_000, 64, tmp_path)
    a = one.claim(lambda: engine, "a")
    b = two.claim(lambda: engine, "b")
    c = one.claim(lambda: engine, "c")
    assert [a, b, c] == [200_008, 200_016, 200_024]
    # The container exists now (its label holds the block): the claim goes, the block stays taken.
    engine.add(a)
    one.release_claim(a)
    assert two.claim(lambda: engine, "d") == 200_032
    # A removed container frees its block.
    engine.discard(a)
    assert one.claim(lambda: engine, "e") == a
    assert all(one.owns(u) for u in (a, b, c))
    assert not one.owns(200_001)
    assert not one.owns(200_064)


def test_a_stale_claim_expires_and_a_full_range_is_refused(tmp_path: Path) -> None:
    ids = ToolIds(200_000, 2 * BLOCK, tmp_path)
    first = ids.claim(set, "a")
    second = ids.claim(set, "b")
    with pytest.raises(SandboxStartError, match="no free tool uid block left in 200000-200015"):
        ids.claim(set, "c")
    old = time.time() - CLAIM_TTL_S - 1
    os.utime(tmp_path / str(first), (old, old))
    assert ids.claim(set, "d") == first
    assert second == first + BLOCK


def test_labels_name_the_blocks_in_use() -> None:
    summaries: list[dict[str, object]] = [
        {"Labels": {"ocsb.tool_uid": "200008"}}, {"Labels": {"ocsb.tool_uid": "x"}}, {"Labels": None}, {},
    ]
    assert labelled_uids(summaries) == {200_008}


def test_a_provider_on_a_range_with_host_accounts_does_not_start(tmp_path: Path) -> None:
    from controlplane.config import load_settings
    from controlplane.sandbox.docker import DockerSandboxProvider

    settings = load_settings(None, data_dir=tmp_path, provider={"type": "docker", "tool_uid_first": 1,
                                                                 "tool_uid_count": 64})
    with pytest.raises(ConfigError, match="holds the host's user id 1 "):  # daemon, on every Debian
        DockerSandboxProvider(settings.provider, settings.pool, settings.resources, tmp_path, "x",  # type: ignore[arg-type]
                              None)  # type: ignore[arg-type]


def test_an_unusable_claims_dir_is_a_clear_start_error(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(SandboxStartError, match=r"tool uid claims: cannot use .*file/claims"):
        ToolIds(200_000, 64, blocked / "claims").claim(set, "a")
