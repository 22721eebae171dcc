"""Template images on a Swarm: built and checked on the manager (sandbox/templates.py), then copied to the other
nodes' engines, since there is no registry to pull from.

A Swarm task whose node lacks its image fails to start (nothing pulls it), and a node could hold another image
under the same tag (an older build, or one planted there): the copy is compared by image id, which is a digest
of the image's content, and a node that does not end up with exactly the manager's image is left out of the
template's placement (`lacking`). Nodes whose engine the control plane cannot reach (not in
`provider.node_engines`) are left out the same way: a template session runs only where its image is known.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import docker
import docker.errors

from controlplane.config import SwarmProviderConfig
from controlplane.config_lifecycle import TemplateConfig
from controlplane.core.sessions.templates import DEFAULT_TEMPLATE
from controlplane.sandbox.template_prune import prune_templates
from controlplane.sandbox.templates import TemplateImages

log = logging.getLogger("controlplane.sandbox.swarm")

COPY_TIMEOUT_S = 900
"""A `docker save | docker load` of a template (the sandbox image's layers and the template's) over a slow link."""


def node_client(url: str) -> Any:
    return docker.DockerClient(base_url=url, version="auto", timeout=COPY_TIMEOUT_S)


def image_id(client: Any, image: str) -> str:
    try:
        return str(client.api.inspect_image(image)["Id"])
    except docker.errors.ImageNotFound:
        return ""


def copy_image(source: Any, target: Any, image: str) -> None:
    """Streams `image` from the source engine into the target one (`docker save | docker load`)."""
    target.api.load_image(source.api.get_image(image), quiet=True)


class SwarmTemplateImages(TemplateImages):
    """The templates' images on the manager, and on which nodes each one is."""

    def __init__(self, config: SwarmProviderConfig, templates: Iterable[TemplateConfig], instance: str,
                 default_pool: int) -> None:
        super().__init__(config.base_url, config.image, templates, instance, default_pool)
        self._node_urls = list(config.node_engines)
        self._holders: dict[str, frozenset[str]] = {}
        """Image tag -> the Swarm node ids that hold exactly the manager's image of that tag."""

    def lacking(self, template: str, nodes: Iterable[str]) -> list[str]:
        """Those of `nodes` a sandbox of `template` must not be placed on: they do not hold its image."""
        if template == DEFAULT_TEMPLATE:
            return []  # the sandbox image is on every node by the operator's hand, as docs/swarm.md asks
        holders = self._holders.get(self.image(template), frozenset())
        return [node for node in nodes if node not in holders]

    def _check(self, name: str, image: str) -> None:
        # Copied before it is marked ready: a session waiting for the template is placed only once the nodes
        # that will hold it do.
        if self._present(image):
            self._holders[image] = self._distribute(image)
        super()._check(name, image)

    def _distribute(self, image: str) -> frozenset[str]:
        want = image_id(self._client, image)
        holders = {str((self._client.info().get("Swarm") or {}).get("NodeID", ""))}
        for url in self._node_urls:
            try:
                node = node_client(url)
            except docker.errors.DockerException as exc:
                log.warning("template image %s not copied to %s: %s", image, url, exc)
                continue
            try:
                node_id = str((node.info().get("Swarm") or {}).get("NodeID", ""))
                if image_id(node, image) != want:
                    log.info("copying template image %s to node %s (%s)", image, node_id, url)
                    copy_image(self._client, node, image)
                if node_id and image_id(node, image) == want:
                    holders.add(node_id)
                else:
                    log.warning("node %s (%s) does not hold template image %s as built; no session of it "
                                "runs there", node_id, url, image)
            except docker.errors.DockerException as exc:
                log.warning("template image %s not copied to %s: %s", image, url, exc)
            finally:
                node.close()
        holders.discard("")
        return frozenset(holders)

    def _prune(self, keep: dict[str, str]) -> list[str]:
        removed = super()._prune(keep)
        for url in self._node_urls:  # the copies on the other nodes go the same way
            try:
                node = node_client(url)
            except docker.errors.DockerException as exc:
                log.warning("template images on %s not pruned: %s", url, exc)
                continue
            try:
                removed += [f"{url} {tag}" for tag in prune_templates(node, self._instance, keep, self._base_image)]
            except docker.errors.DockerException as exc:
                log.warning("template images on %s not pruned: %s", url, exc)
            finally:
                node.close()
        return removed
