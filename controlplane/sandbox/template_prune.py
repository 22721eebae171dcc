"""Removing template images nobody declares any more: each rebuild leaves its old tag behind (a few hundred MB
each, most of it shared with the sandbox image, but the template's own layers are not), and a template taken
out of the configuration leaves all of its.

Only what this control plane built is a candidate: images labelled `ocsb.template` and `ocsb.instance` = this
instance (sandbox/templates.py puts both on every build). Of those, kept: the current image of every declared
template (every image of a template whose current tag is not known, say its Dockerfile could not be read this
time, or one given as a prebuilt `image =`), the sandbox image itself, and any image a container (running or
stopped, of any instance) or a Swarm service still uses. The engine is asked without force, so an image that
came into use meanwhile is refused by the engine itself and stays.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import docker.errors

from controlplane.sandbox.layout import LABEL_INSTANCE, LABEL_TEMPLATE

log = logging.getLogger(__name__)

UNTAGGED = "<none>:<none>"


@dataclass(frozen=True)
class BuiltImage:
    id: str
    tags: tuple[str, ...]
    template: str
    """Its `ocsb.template` label."""
    instance: str
    """Its `ocsb.instance` label: the control plane that built it."""


def prunable(images: Iterable[BuiltImage], instance: str, keep: Mapping[str, str],
             in_use: set[str]) -> list[BuiltImage]:
    """The images to remove. `keep`: each declared template's current image tag ("": keep all of that template's);
    `in_use`: ids of the images that must stay whatever their labels say (the sandbox image, those of containers
    and services)."""
    doomed = []
    for image in images:
        if not image.template or image.instance != instance or image.id in in_use:
            continue
        if image.template in keep and (not keep[image.template] or keep[image.template] in image.tags):
            continue
        doomed.append(image)
    return doomed


def _built(api: Any, instance: str) -> list[BuiltImage]:
    found = []
    for raw in api.images(filters={"label": [LABEL_TEMPLATE, f"{LABEL_INSTANCE}={instance}"]}):
        labels = raw.get("Labels") or {}
        tags = tuple(t for t in raw.get("RepoTags") or () if t != UNTAGGED)
        found.append(BuiltImage(str(raw["Id"]), tags, labels.get(LABEL_TEMPLATE, ""), labels.get(LABEL_INSTANCE, "")))
    return found


def _id_of(api: Any, reference: str) -> str:
    try:
        return str(api.inspect_image(reference)["Id"])
    except docker.errors.ImageNotFound:
        return ""


def images_in_use(api: Any, base_image: str) -> set[str]:
    """Ids of the sandbox image and of every image a container or (on a manager) a service uses."""
    used = {_id_of(api, base_image)}
    used.update(str(c.get("ImageID", "")) for c in api.containers(all=True))
    info = api.info()
    if (info.get("Swarm") or {}).get("ControlAvailable"):
        for service in api.services():
            image = str(service["Spec"]["TaskTemplate"]["ContainerSpec"].get("Image", ""))
            used.add(_id_of(api, image.split("@", 1)[0]))
    used.discard("")
    return used


def prune_templates(client: Any, instance: str, keep: Mapping[str, str], base_image: str) -> list[str]:
    """Removes this instance's template images that `prunable` names; the tags (or ids) it removed."""
    api = client.api
    removed = []
    for image in prunable(_built(api, instance), instance, keep, images_in_use(api, base_image)):
        for reference in image.tags or (image.id,):
            try:  # never forced: an image in use (a container made since we looked) is refused by the engine
                api.remove_image(reference, noprune=False)
            except docker.errors.NotFound:
                continue
            except docker.errors.APIError as exc:
                log.info("template image %s kept: %s", reference, exc.explanation or exc)
                break
            removed.append(reference)
    if removed:
        log.info("removed template images no template declares any more: %s", removed)
    return removed
