"""`[policy.tenants.NAME.permission]` (a table nested once too deep) is an error that says where the rules go,
instead of rules for a permission named "permission" that never match."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.config import load_settings
from controlplane.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_a_tenant_permission_table_is_refused_with_the_right_nesting(tmp_path: Path) -> None:
    path = write(tmp_path, '[policy.tenants.bob.permission]\nbash = "deny"\n')
    with pytest.raises(ConfigError, match=r"directly under \[policy\.tenants\.bob\]"):
        load_settings(path)


def test_a_global_permission_table_nested_twice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"directly under \[policy\.permission\]"):
        load_settings(write(tmp_path, '[policy.permission.permission]\nbash = "deny"\n'))


def test_the_documented_nesting_loads(tmp_path: Path) -> None:
    text = '[policy.permission]\nbash = "ask"\n[policy.tenants.bob]\nbash = "deny"\n'
    settings = load_settings(write(tmp_path, text))
    assert settings.policy.tenants == {"bob": {"bash": "deny"}}
    assert settings.policy.permission == {"bash": "ask"}
