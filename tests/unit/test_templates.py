"""Templates without an engine: their configuration, the Dockerfile's base check, the content tag, and which
tenant may use which (controlplane.config, controlplane.sandbox.templates, controlplane.core.sessions.templates)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controlplane.app import build_provider
from controlplane.config import load_settings
from controlplane.core.sessions.templates import TemplateAccess, TemplateDeniedError, TemplateInfo
from controlplane.errors import ConfigError, FailedPreconditionError, InvalidArgumentError
from controlplane.sandbox.templates import context_digest, from_problem, template_tag

BASE = "ocsb-sandbox:latest"


def settings(tmp_path: Path, **overrides: object) -> object:
    return load_settings(None, data_dir=tmp_path, **overrides)


def test_a_template_takes_exactly_one_source_and_a_safe_unique_name(tmp_path: Path) -> None:
    ok = load_settings(None, data_dir=tmp_path, templates=[{"name": "node", "dockerfile": "/x/Dockerfile", "pool": 1},
                                                           {"name": "pre", "image": "mine:1"}])
    assert [(t.name, t.pool) for t in ok.templates] == [("node", 1), ("pre", None)]
    for bad, message in [
        ({"name": "a", "dockerfile": "/x/Dockerfile", "image": "y"}, "exactly one of dockerfile and image"),
        ({"name": "a"}, "exactly one of dockerfile and image"),
        ({"name": "default", "image": "y"}, "reserved"),
        ({"name": "Node", "image": "y"}, "pattern"),
        ({"name": "-x", "image": "y"}, "pattern"),
        ({"name": "../x", "image": "y"}, "pattern"),
        ({"name": "a", "image": "y", "pool": -1}, "greater than or equal"),
        ({"name": "a", "image": "y", "size": 2}, "Extra inputs"),
    ]:
        with pytest.raises(ConfigError, match=message):
            settings(tmp_path, templates=[bad])
    with pytest.raises(ConfigError, match=r"template names must be unique: \['a'\]"):
        settings(tmp_path, templates=[{"name": "a", "image": "y"}, {"name": "a", "image": "z"}])


def test_a_tenant_may_name_only_declared_templates(tmp_path: Path) -> None:
    templates = [{"name": "node", "image": "y"}]
    fine = load_settings(None, data_dir=tmp_path, templates=templates,
                         tenants=[{"name": "a", "token": "t" * 32, "templates": ["node", "default"]}])
    assert fine.tenants[0].templates == ["node", "default"]
    with pytest.raises(ConfigError, match=r"tenant 'a' names templates that are not declared: \['rust'\]"):
        settings(tmp_path, templates=templates, tenants=[{"name": "a", "token": "t" * 32, "templates": ["rust"]}])


def test_the_local_provider_takes_no_templates(tmp_path: Path) -> None:
    local = load_settings(None, data_dir=tmp_path, provider={"type": "local"}, templates=[{"name": "a", "image": "y"}])
    with pytest.raises(ConfigError, match=r"\[\[templates\]\] \['a'\] need provider.type = \"docker\""):
        build_provider(local, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("dockerfile", [
    f"FROM {BASE}\nRUN true\n",
    f"# a comment\n\nFROM --platform=linux/amd64 {BASE} AS base\nRUN true\n",
    "ARG SANDBOX_IMAGE\nFROM ${SANDBOX_IMAGE}\n",
    "ARG SANDBOX_IMAGE=ocsb-sandbox:latest\nFROM $SANDBOX_IMAGE AS base\nFROM base\nRUN true\n",
    f"FROM {BASE} AS build\nRUN make\nFROM {BASE}\nCOPY --from=build /out /out\n",
    f"FROM \\\n  {BASE}\n",
])
def test_a_dockerfile_built_on_the_sandbox_image_is_accepted(dockerfile: str) -> None:
    assert from_problem(dockerfile, BASE) is None


@pytest.mark.parametrize(("dockerfile", "problem"), [
    ("FROM debian:bookworm\n", "its first FROM is 'debian:bookworm'"),
    ("FROM ocsb-sandbox:other\n", "its first FROM is 'ocsb-sandbox:other'"),
    ("ARG BASE=ocsb-sandbox:latest\nFROM $BASE\n", "its first FROM is '$BASE'"),
    ("FROM ${SANDBOX_IMAGE}\n", "its first FROM is '${SANDBOX_IMAGE}'"),  # no ARG: nothing fills it
    (f"FROM {BASE} AS agent\nFROM debian:bookworm\nCOPY --from=agent /opt /opt\n", "last stage is not built on"),
    ("RUN true\n", "it has no FROM"),
    (f"# FROM {BASE}\nFROM scratch\n", "its first FROM is 'scratch'"),
])
def test_a_dockerfile_on_another_base_is_refused(dockerfile: str, problem: str) -> None:
    found = from_problem(dockerfile, BASE)
    assert found is not None
    assert problem in found


def test_the_tag_follows_the_context_the_dockerfile_and_the_base(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text(f"FROM {BASE}\nCOPY hello /hello\n")
    (tmp_path / "hello").write_text("hi\n")
    first = template_tag("node", tmp_path / "Dockerfile", "sha256:aaa")
    assert first.startswith("ocsb-template-node:")
    assert len(first.rsplit(":", 1)[1]) == 16
    assert template_tag("node", tmp_path / "Dockerfile", "sha256:aaa") == first  # unchanged: the same tag
    assert template_tag("node", tmp_path / "Dockerfile", "sha256:bbb") != first  # a new sandbox image
    before = context_digest(tmp_path)
    os.chmod(tmp_path / "hello", 0o755)
    assert context_digest(tmp_path) != before  # modes are built into the image too
    mode_changed = context_digest(tmp_path)
    (tmp_path / "hello").write_text("hi!\n")
    assert context_digest(tmp_path) != mode_changed
    (tmp_path / "link").symlink_to("hello")
    linked = context_digest(tmp_path)
    (tmp_path / "link").unlink()
    (tmp_path / "link").symlink_to("Dockerfile")
    assert context_digest(tmp_path) != linked


def test_a_tenant_is_told_what_it_may_use() -> None:
    known = [TemplateInfo("default", "ocsb-sandbox:latest", "ready"), TemplateInfo("node", "t:1", "ready"),
             TemplateInfo("rust", "t:2", "building"), TemplateInfo("broken", "t:3", "failed", "the build failed: x")]
    access = TemplateAccess({"acme": ["node", "rust", "broken"], "open": None})
    assert access.check("open", "", known) == "default"
    assert access.check("anyone", "node", known) == "node"
    assert access.check("acme", "rust", known) == "rust"  # still building: the create waits for it
    with pytest.raises(InvalidArgumentError, match=r"unknown template 'go'; this tenant may use \['broken', 'node'"):
        access.check("acme", "go", known)
    with pytest.raises(TemplateDeniedError, match=r"tenant 'acme' may not use template 'default'"):
        access.check("acme", "", known)
    with pytest.raises(InvalidArgumentError) as huge:  # a hostile name is not echoed whole
        access.check("acme", "x" * 1_000_000, known)
    assert str(huge.value) == f"unknown template {'x' * 80!r}... (1000000 chars); this tenant may use ['broken', " \
        "'node', 'rust']"
    with pytest.raises(FailedPreconditionError, match="template 'broken' is not usable: the build failed: x"):
        access.check("acme", "broken", known)
    assert [t.name for t in access.visible("acme", known)] == ["node", "rust", "broken"]
    assert [t.name for t in access.visible("open", known)] == ["default", "node", "rust", "broken"]
