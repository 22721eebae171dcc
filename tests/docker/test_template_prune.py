"""Template images pruned by the Docker provider after its start, on the real engine: this instance's build of a
template it no longer declares goes; another instance's, an unlabelled one, one a stopped container still uses, and
the sandbox image stay."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from controlplane.sandbox.layout import LABEL_INSTANCE, LABEL_TEMPLATE
from tests.planes import new_instance, running_plane

pytestmark = pytest.mark.docker

IMAGE = os.environ.get("OCSB_TEST_IMAGE", "ocsb-sandbox:latest")


def _image_id(api: Any, reference: str) -> str:
    try:
        return str(api.inspect_image(reference)["Id"])
    except docker.errors.ImageNotFound:
        return ""


@pytest.fixture
def engine() -> Iterator[Any]:
    client = docker.from_env(timeout=300)
    yield client
    client.close()


def _build(engine: Any, folder: Path, tag: str, labels: dict[str, str]) -> str:
    folder.mkdir()
    (folder / "Dockerfile").write_text(f"FROM {IMAGE}\nLABEL ocsb.prune-test={tag}\n")
    image, _ = engine.images.build(path=str(folder), tag=tag, labels=labels, rm=True)
    return str(image.id)


async def test_only_this_instances_undeclared_and_unused_template_images_are_removed(
    engine: Any, tmp_path: Path
) -> None:
    instance, other = new_instance(), new_instance()
    suffix = instance.replace("_", "-").lower()
    tags = {kind: f"ocsb-template-{kind}-{suffix}:1" for kind in ("gone", "theirs", "plain", "held")}
    mine = {LABEL_INSTANCE: instance}
    _build(engine, tmp_path / "gone", tags["gone"], {LABEL_TEMPLATE: f"gone-{suffix}", **mine})
    _build(engine, tmp_path / "theirs", tags["theirs"], {LABEL_TEMPLATE: f"gone-{suffix}", LABEL_INSTANCE: other})
    _build(engine, tmp_path / "plain", tags["plain"], mine)  # no template label: not a template build
    _build(engine, tmp_path / "held", tags["held"], {LABEL_TEMPLATE: f"held-{suffix}", **mine})
    # A stopped container of another instance (its own label, not the image's: this plane would remove its own).
    holder = engine.containers.create(tags["held"], command=["true"], entrypoint=[], network_disabled=True,
                                      labels={LABEL_INSTANCE: other})
    try:
        async with running_plane("docker", instance=instance, pool={"size": 0}) as served:
            pruning = served.plane.sessions._provider._templates._pruning  # type: ignore[attr-defined]
            assert pruning is not None
            assert await pruning == [tags["gone"]]
        api = engine.api
        assert _image_id(api, tags["gone"]) == ""
        assert all(_image_id(api, tags[kind]) for kind in ("theirs", "plain", "held"))
        assert _image_id(api, IMAGE) != ""
    finally:
        try:
            holder.remove(force=True)
        except docker.errors.NotFound:
            pass
        for tag in tags.values():
            try:
                engine.images.remove(tag, force=True)
            except docker.errors.ImageNotFound:
                pass
