"""Which workspace volumes on the engine belong to this control plane instance, and to which sandbox.

Reconciliation removes the volumes of sandboxes it does not keep. The engine makes a volume without labels
when it creates one for a mount itself, so a volume is also recognised by its name, and only when that name
holds a sandbox id as the Docker provider makes them.
"""

from __future__ import annotations

import re
from typing import Any

from controlplane.sandbox.layout import LABEL_INSTANCE, LABEL_SANDBOX, engine_name

SANDBOX_ID = re.compile(r"[0-9a-f]{12}")
"""How the Docker provider names sandboxes (secrets.token_hex(6)); a volume name is only trusted as ours with one."""


def instance_volumes(client: Any, instance: str) -> list[Any]:
    """This instance's volumes: by label, and by name for one the engine made for a mount without labels."""
    labelled = client.volumes.list(filters={"label": f"{LABEL_INSTANCE}={instance}"})
    named = [v for v in client.volumes.list(filters={"name": engine_name(instance, "")})
             if volume_owner(v, instance) is not None]
    return list({v.name: v for v in [*labelled, *named]}.values())


def volume_owner(volume: Any, instance: str) -> str | None:
    """The sandbox a volume of this instance belongs to (its label, else its name); None: not ours."""
    labels = volume.attrs.get("Labels") or {}
    if labels.get(LABEL_INSTANCE) == instance:
        return str(labels.get(LABEL_SANDBOX, ""))
    name = volume.name or ""
    prefix, suffix = engine_name(instance, ""), "-ws"
    middle = name[len(prefix):-len(suffix)] if name.startswith(prefix) and name.endswith(suffix) else ""
    return middle if SANDBOX_ID.fullmatch(middle) else None
