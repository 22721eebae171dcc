"""Templates on the two-node swarm: built once on the manager, copied to the worker's engine (replacing an image
planted there under the same tag), sessions of it on both nodes with the sandbox's hardening, a warm pool of its
own; a node whose engine the plane cannot reach runs none of them; a changed template's old image is pruned on
both engines, while the sandbox image and what a session uses stay."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import grpc
import pytest

from controlplane.client import AsyncClient
from controlplane.sandbox.layout import LABEL_TEMPLATE
from controlplane.sandbox.swarm.provider import SwarmSandboxProvider
from controlplane.sandbox.templates import template_tag
from controlplane.v1 import session_pb2
from tests.cluster.support import Cluster, swarm_plane
from tests.planes import new_instance

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

NONCE = secrets.token_hex(3)
NAME = f"hello-{NONCE}"
DOCKERFILE = """ARG SANDBOX_IMAGE
FROM ${SANDBOX_IMAGE}
COPY hello.txt /opt/template/hello.txt
# A setuid-root shell, what an attacker in the sandbox would look for: no_new_privs keeps it harmless.
RUN cp /bin/bash /usr/local/bin/rootbash && chmod 4755 /usr/local/bin/rootbash
"""
PROBE = "cat /opt/template/hello.txt; rootbash -p -c 'id -u; grep -E \"^(CapEff|NoNewPrivs)\" /proc/self/status'"
WAIT_S = 300.0


def _sandbox_image() -> str:
    import os

    return os.environ.get("OCSB_TEST_IMAGE", "ocsb-sandbox:latest")


def _image_id(client: Any, reference: str) -> str:
    try:
        return str(client.api.inspect_image(reference)["Id"])
    except docker.errors.ImageNotFound:
        return ""


def _remove_template_images(clients: list[Any]) -> None:
    """This test's images on both engines; a container of a session just deleted may hold one for a few seconds."""
    deadline = time.monotonic() + 60
    for client in clients:
        for label in (f"{LABEL_TEMPLATE}={NAME}", "ocsb.planted"):
            for image in client.images.list(filters={"label": label}):
                while True:
                    try:
                        client.images.remove(str(image.id), force=True)
                        break
                    except docker.errors.NotFound:
                        break
                    except docker.errors.APIError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.5)


@pytest.fixture
def context(tmp_path: Path, cluster: Cluster) -> Iterator[Path]:
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(DOCKERFILE)
    (tmp_path / "ctx" / "hello.txt").write_text(f"{NONCE}\n")
    manager, worker = docker.from_env(timeout=600), cluster.worker_client()
    yield tmp_path / "ctx" / "Dockerfile"
    _remove_template_images([manager, worker])
    manager.close()
    worker.close()


async def _ready(client: AsyncClient) -> session_pb2.Template:
    deadline = time.monotonic() + WAIT_S
    while True:
        found = {t.name: t for t in await client.list_templates()}
        if found[NAME].state != session_pb2.Template.BUILDING:
            assert found[NAME].state == session_pb2.Template.READY, found[NAME].error
            return found[NAME]
        assert time.monotonic() < deadline, "the template is still building"
        await asyncio.sleep(0.5)


async def _probe(client: AsyncClient, session_id: str) -> list[str]:
    ran = await client.run(session_id, ["bash", "-c", PROBE])
    assert ran.exit_code == 0, ran.stderr
    return ran.stdout.decode().split()


async def _pruned(p: Any) -> list[str]:
    """What the plane's pruning after its start removed, once it is done."""
    pruning = p.plane.sessions._provider._templates._pruning
    assert pruning is not None
    return list(await pruning)


def _service(instance: str, sandbox_id: str) -> dict[str, Any]:
    api: Any = docker.from_env().api
    return dict(api.inspect_service(f"ocsb-{instance}-{sandbox_id}"))


async def test_a_template_is_copied_to_the_worker_and_runs_hardened_on_both_nodes(
    cluster: Cluster, context: Path
) -> None:
    manager, worker = docker.from_env(), cluster.worker_client()
    # An image planted on the worker under the tag the plane will compute: replaced, since ids are compared.
    tag = template_tag(NAME, context, _image_id(manager, _sandbox_image()))
    planted = context.parent.parent / "planted"  # outside the build context, whose bytes make the tag
    planted.mkdir()
    (planted / "Dockerfile").write_text(f"FROM {_sandbox_image()}\nLABEL ocsb.planted=1\n")
    worker.images.build(path=str(planted), tag=tag, rm=True)
    template = {"name": NAME, "dockerfile": str(context), "pool": 1}
    async with swarm_plane(settings={"templates": [template]},
                           node_engines=[cluster.state["WORKER_SOCK"]]) as p:
        alpha, beta = p.clients["alpha"], p.clients["beta"]
        info = await _ready(alpha)
        assert info.image == tag
        assert _image_id(worker, tag) == _image_id(manager, tag) != ""
        for client, node in ((alpha, cluster.manager), (beta, cluster.worker)):
            session = await client.create_session(template=NAME)
            assert session.template == NAME
            provider = p.plane.sessions._provider
            assert isinstance(provider, SwarmSandboxProvider)
            assert provider.node_of(session.sandbox_id) == node
            spec = _service(p.instance, session.sandbox_id)["Spec"]
            assert spec["TaskTemplate"]["ContainerSpec"]["Image"].split("@")[0] == tag
            assert spec["Labels"][LABEL_TEMPLATE] == NAME
            lines = await _probe(client, session.id)
            assert lines[0] == NONCE
            assert lines[1] != "0"  # the setuid-root shell runs as the tool user
            assert lines[2:] == ["CapEff:", "0000000000000000", "NoNewPrivs:", "1"]
            plain = await client.run((await client.create_session()).id, ["bash", "-c", "ls /opt/template || true"])
            assert "hello.txt" not in plain.stdout.decode()  # the default image has none of it
        # The template keeps a warm pool of its own on the swarm.
        api: Any = manager.api
        deadline = time.monotonic() + 120
        while True:
            pooled = [s for s in api.services(filters={"label": [f"ocsb.instance={p.instance}",
                                                                  f"{LABEL_TEMPLATE}={NAME}"]})
                      if "ocsb.session" not in s["Spec"]["Labels"]]
            if pooled:
                break
            assert time.monotonic() < deadline, "the template's pool was never filled"
            await asyncio.sleep(0.5)
        gamma = p.clients["gamma"]  # no tenant constraint: served from the pool
        taken = await gamma.create_session(template=NAME)
        assert taken.sandbox_id in {s["Spec"]["Labels"]["ocsb.sandbox"] for s in pooled}
        assert (await _probe(gamma, taken.id))[0] == NONCE
    manager.close()
    worker.close()


async def test_a_node_whose_engine_is_not_listed_runs_no_template_session(cluster: Cluster, context: Path) -> None:
    async with swarm_plane(settings={"templates": [{"name": NAME, "dockerfile": str(context)}]},
                           start_timeout_s=8.0) as p:
        await _ready(p.clients["alpha"])
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await p.clients["beta"].create_session(template=NAME)  # beta is held to the worker, which lacks it
        assert "no suitable node" in (refused.value.details() or "")
        assert [s.state for s in await p.clients["beta"].list_sessions()] == [session_pb2.Session.FAILED]
        api: Any = docker.from_env().api
        assert api.services(filters={"label": [f"ocsb.instance={p.instance}", "ocsb.tenant=beta"]}) == []
        provider = p.plane.sessions._provider
        assert isinstance(provider, SwarmSandboxProvider)
        for _ in range(3):  # gamma may go anywhere, but only the manager holds the image
            session = await p.clients["gamma"].create_session(template=NAME)
            assert provider.node_of(session.sandbox_id) == cluster.manager
        beta_plain = await p.clients["beta"].create_session()  # the default template is unaffected
        assert provider.node_of(beta_plain.sandbox_id) == cluster.worker


async def test_a_changed_templates_old_image_is_pruned_on_both_engines(cluster: Cluster, context: Path) -> None:
    manager, worker = docker.from_env(), cluster.worker_client()
    engines: dict[str, Any] = {"node_engines": [cluster.state["WORKER_SOCK"]]}
    template = {"name": NAME, "dockerfile": str(context)}
    # One instance restarted on one store: its sessions outlive each plane, as across an operator's restart.
    settings = {"instance": new_instance("c"), "templates": [template],
                "store": {"url": f"sqlite:///{context.parent.parent}/shared.db"}}
    async with swarm_plane(settings=settings, delete_sessions=False, **engines) as p:
        old = (await _ready(p.clients["alpha"])).image
        held = await p.clients["beta"].create_session(template=NAME)  # on the worker, kept through the change
    assert _image_id(worker, old) != ""
    (context.parent / "hello.txt").write_text("changed\n")
    async with swarm_plane(settings=settings, delete_sessions=False, **engines) as p:
        new = (await _ready(p.clients["alpha"])).image
        assert new != old
        # A session of the old image still runs (its service names it): the image stays on both engines.
        assert old not in " ".join(await _pruned(p))
        assert _image_id(manager, old) != ""
        assert _image_id(worker, old) != ""
        assert _image_id(manager, _sandbox_image()) != ""
        assert (await p.clients["beta"].get_session(held.id)).state == session_pb2.Session.READY
        await p.clients["beta"].delete_session(held.id)
    old_id = _image_id(worker, old)
    deadline = time.monotonic() + 60
    while any(c.get("ImageID") == old_id for c in worker.api.containers(all=True)):
        assert time.monotonic() < deadline, "the deleted session's container stayed on the worker"
        await asyncio.sleep(0.2)  # the worker removes a removed service's container on its own time
    async with swarm_plane(settings=settings, **engines) as p:
        assert (await _ready(p.clients["alpha"])).image == new
        assert sorted(await _pruned(p)) == sorted([old, f"{cluster.state['WORKER_SOCK']} {old}"])
        assert _image_id(worker, old) == _image_id(manager, old) == ""  # nothing used it any more
        assert _image_id(worker, new) == _image_id(manager, new) != ""
        assert _image_id(worker, _sandbox_image()) != ""
    manager.close()
    worker.close()
