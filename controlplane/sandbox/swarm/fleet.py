"""The Swarm provider's relays: one global relay service per control-plane instance (relay.py, shipped as
a Swarm config with its TLS material as secrets) and, per node, a client that pings it and reaches the
agents on that node through it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.types import ConfigReference, Mount, SecretReference

from controlplane.config import SwarmProviderConfig
from controlplane.errors import SandboxError, SandboxStartError
from controlplane.sandbox.layout import (
    CAP_DROP,
    LABEL_INSTANCE,
    LABEL_MANAGED,
    LABEL_RELAY_HASH,
    LABEL_ROLE,
    RELAY_DIR,
    engine_name,
)
from controlplane.sandbox.swarm.channel import RelayClient, RelayPki

# The provider's logger: relay failures are part of its story (and tests read that logger's records).
log = logging.getLogger("controlplane.sandbox.swarm")

RELAY_SCRIPT = Path(__file__).with_name("relay.py")
"""Shipped to the nodes as a file, not imported here: it is stdlib only and runs on the sandbox image's Python."""
RELAY_SPEC = 2
"""Part of the relay service's hash: bump it when the service spec changes, so running relays are replaced."""


@dataclass
class NodeRelay:
    client: RelayClient
    failures: int = 0
    ready: bool = False


class RelayFleet:
    """The relay service of one instance and its per-node clients (`relays`, by Swarm node id)."""

    def __init__(self, api: Any, config: SwarmProviderConfig, instance: str) -> None:
        self._api = api
        self._config = config
        self._instance = instance
        self.pki: RelayPki | None = None
        self.relays: dict[str, NodeRelay] = {}

    async def start(self, state_dir: Path) -> None:
        """The instance's TLS material, its relay service (replaced when its inputs changed), and the relays'
        first answers."""
        self.pki = await asyncio.to_thread(RelayPki.ensure, state_dir / "pki")
        await asyncio.to_thread(self.ensure_service)
        await self.wait_ready()

    def _inputs(self) -> tuple[bytes, dict[str, bytes], str]:
        assert self.pki is not None
        script = RELAY_SCRIPT.read_bytes()
        secret_files = {
            "cert": self.pki.server_cert.read_bytes(),
            "key": self.pki.server_key.read_bytes(),
            "ca": self.pki.ca.read_bytes(),
        }
        digest = hashlib.sha256(script)
        for name, data in sorted(secret_files.items()):
            digest.update(name.encode() + data)
        digest.update(f"{RELAY_SPEC}|{self._config.relay_port}|{self._config.image}|{self._config.node_root}".encode())
        return script, secret_files, digest.hexdigest()[:12]

    def ensure_service(self) -> None:
        script, secret_files, relay_hash = self._inputs()
        name = engine_name(self._instance, "relay")
        labels = {LABEL_MANAGED: "true", LABEL_INSTANCE: self._instance, LABEL_ROLE: "relay",
                  LABEL_RELAY_HASH: relay_hash}
        existing = self._api.services(filters={"name": name})
        if any(s["Spec"]["Labels"].get(LABEL_RELAY_HASH) == relay_hash for s in existing if s["Spec"]["Name"] == name):
            return
        self.remove_objects(self._api)
        config = self._api.create_config(f"{name}-{relay_hash}", script, labels=labels)
        secrets_refs = []
        for key, data in secret_files.items():
            created = self._api.create_secret(f"{name}-{relay_hash}-{key}", data, labels=labels)
            secrets_refs.append(SecretReference(created["ID"], f"{name}-{relay_hash}-{key}", filename=f"relay-{key}",
                                                uid="0", gid="0", mode=0o400))
        spec = docker.types.ContainerSpec(
            self._config.image, command=["python3", "/ocsb/relay.py"], user="0:0", labels=labels,
            env={
                "OCSB_NODE": "{{.Node.ID}}", "OCSB_PORT": str(self._config.relay_port), "OCSB_ROOT": RELAY_DIR,
                "OCSB_CERT": "/run/secrets/relay-cert", "OCSB_KEY": "/run/secrets/relay-key",
                "OCSB_CA": "/run/secrets/relay-ca",
            },
            mounts=[Mount(RELAY_DIR, self._config.node_root, type="bind")],
            configs=[ConfigReference(config["ID"], f"{name}-{relay_hash}", filename="/ocsb/relay.py",
                                     uid="0", gid="0", mode=0o444)],
            secrets=secrets_refs, read_only=True, cap_drop=list(CAP_DROP),
            # Not PID 1, so SIGTERM ends it at once: a node's daemon shutting down loses its relay (and
            # its sessions are reported lost) in a second or two instead of at the 10 s kill.
            init=True,
        )
        template = docker.types.TaskTemplate(
            spec, resources=docker.types.Resources(mem_limit=128 * 1024 * 1024),
            restart_policy=docker.types.RestartPolicy(condition="any", delay=1_000_000_000),
            networks=["host"],
        )
        self._api.create_service(template, name=name, labels=labels, mode=docker.types.ServiceMode("global"))

    def remove_objects(self, api: Any) -> None:
        filters = {"label": [f"{LABEL_INSTANCE}={self._instance}", f"{LABEL_ROLE}=relay"]}
        for service in api.services(filters=filters):
            with contextlib.suppress(docker.errors.NotFound):
                api.remove_service(service["ID"])
        deadline = time.monotonic() + 20.0
        for kind in ("config", "secret"):
            listing = getattr(api, f"{kind}s")(filters=filters)
            for item in listing:
                while True:  # still referenced until the relay's tasks are gone
                    try:
                        getattr(api, f"remove_{kind}")(item["ID"])
                        break
                    except docker.errors.NotFound:
                        break
                    except docker.errors.APIError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)

    async def refresh_nodes(self) -> None:
        assert self.pki is not None
        nodes = await asyncio.to_thread(self._api.nodes)
        context = None
        seen = set()
        for node in nodes:
            node_id = node["ID"]
            status, spec = node.get("Status") or {}, node.get("Spec") or {}
            if status.get("State") != "ready" or spec.get("Availability") != "active":
                continue
            seen.add(node_id)
            address = status.get("Addr", "")
            if address in ("", "0.0.0.0"):
                address = ((node.get("ManagerStatus") or {}).get("Addr") or "").rsplit(":", 1)[0]
            relay = self.relays.get(node_id)
            if relay is None or relay.client.host != address:
                context = context or self.pki.client_context()
                self.relays[node_id] = NodeRelay(RelayClient(address, self._config.relay_port, context))
        for node_id, relay in self.relays.items():
            if node_id not in seen:
                relay.ready = False
                relay.failures = max(relay.failures, self._config.relay_failures)

    async def ping(self, node_id: str, relay: NodeRelay) -> None:
        try:
            reply = await relay.client.request({"op": "ping"}, timeout_s=2.0)
            if reply.get("node") != node_id:
                raise SandboxError(f"relay at {relay.client.host} is node {reply.get('node')}, not {node_id}")
        except SandboxError as exc:
            relay.failures += 1
            relay.ready = False
            log.debug("relay of node %s: %s", node_id, exc)
        else:
            relay.failures = 0
            relay.ready = True

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + self._config.start_timeout_s
        while True:
            await self.refresh_nodes()
            await asyncio.gather(*(self.ping(n, r) for n, r in self.relays.items()))
            if self.relays and all(r.ready for r in self.relays.values()):
                return
            if time.monotonic() > deadline:
                if any(r.ready for r in self.relays.values()):
                    return  # some nodes serve; the others are excluded from placement until they do
                raise SandboxStartError(
                    f"no relay answered on port {self._config.relay_port} within {self._config.start_timeout_s} s "
                    f"(is {self._config.node_root} present on every node?)"
                )
            await asyncio.sleep(0.3)
