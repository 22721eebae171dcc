"""The operator's template images on the Docker engine: built from their Dockerfiles with no registry, tagged
by content, and refused unless they carry the platform's own agent.

A template is built `FROM` the sandbox image, so the agent and everything the hardening relies on come with
it; the container itself is created exactly as for the default image (sandbox/docker.py), which verifies the
hardening after creation and fails closed. What this module adds is the image side:

- The tag is `ocsb-template-NAME:HASH`, HASH over the build context (every file's path, type, mode and bytes,
  the Dockerfile included), the Dockerfile's name and the base image's id. An unchanged template is found on
  the engine at the next start and not built again; a new sandbox image changes every template's hash.
- Builds run in the background, one at a time (they compete with sessions for the host's CPUs), while the
  plane serves: the default image and the other templates never wait for a slow or failing build, and a
  CreateSession naming a template still building waits for it (core/sessions/templates.py).
- Before a template is `ready`, its image must start the agent the way the sandbox image does (same
  entrypoint, same `AGENT_ENV_PREFIXES` variables) and hold byte-identical agent code (`AGENT_ROOT`): an
  image that dropped, moved or patched the agent, or one built on an older sandbox image, speaks another
  protocol or runs other code as the sandbox's root, and is refused. The check reads the files from a
  created, never started container.
- After the provider's start, this instance's template images that no declared template uses any more are
  removed in the background (template_prune: never the sandbox image, another instance's, or one in use).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import os
import re
import stat
import tarfile
import threading
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors

from controlplane.config_lifecycle import TemplateConfig
from controlplane.core.sessions.templates import DEFAULT_TEMPLATE, TemplateInfo, TemplateState
from controlplane.errors import FailedPreconditionError
from controlplane.sandbox.layout import LABEL_INSTANCE, LABEL_TEMPLATE
from controlplane.sandbox.template_prune import prune_templates

log = logging.getLogger(__name__)

PLATFORM_ARG = "SANDBOX_IMAGE"
"""The build argument the platform fills with the sandbox image: `ARG SANDBOX_IMAGE` then `FROM ${SANDBOX_IMAGE}`."""
TAG_PREFIX = "ocsb-template-"
LABEL_TEMPLATE_HASH = "ocsb.template-hash"
AGENT_ROOT = "/opt/agent"
LOG_TAIL = 15
"""Build log lines kept for a failure's message."""

_CONTINUATION = re.compile(r"\\\s*\n")


def from_problem(dockerfile: str, platform_image: str) -> str | None:
    """Why a Dockerfile is not built on the sandbox image (None: it is). Its first FROM must name the platform's
    image or `$SANDBOX_IMAGE` (declared by an ARG before it), and its last stage must descend from that one:
    a multi-stage file whose final stage starts from another image would ship without the agent."""
    text = _CONTINUATION.sub(" ", dockerfile)
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    global_args: set[str] = set()
    stages: dict[str, bool] = {}
    final: bool | None = None
    for line in lines:
        word, _, rest = line.partition(" ")
        if word.upper() == "ARG" and final is None:
            global_args.add(rest.strip().split("=", 1)[0])
        if word.upper() != "FROM":
            continue
        parts = [p for p in rest.split() if not p.startswith("--")]
        if not parts:
            return "a FROM names no image"
        image = parts[0]
        platform = image == platform_image or (
            image in (f"${PLATFORM_ARG}", f"${{{PLATFORM_ARG}}}") and PLATFORM_ARG in global_args)
        if final is None and not platform:
            return (f"its first FROM is {image!r}; it must be the sandbox image {platform_image!r} (or "
                    f"`ARG {PLATFORM_ARG}` then `FROM ${{{PLATFORM_ARG}}}`)")
        final = platform or stages.get(image.lower(), False)
        if len(parts) >= 3 and parts[1].lower() == "as":
            stages[parts[2].lower()] = final
    if final is None:
        return "it has no FROM"
    if not final:
        return "its last stage is not built on the sandbox image"
    return None


def context_digest(context: Path) -> str:
    """Every entry below `context` (path, type, permission bits, bytes or link target), links not followed."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(context):
        dirs.sort()
        for name in sorted(files) + dirs:
            path = Path(root) / name
            info = path.lstat()
            relative = path.relative_to(context).as_posix()
            digest.update(f"{relative}\0{stat.S_IFMT(info.st_mode)}\0{stat.S_IMODE(info.st_mode)}\0".encode())
            if stat.S_ISLNK(info.st_mode):
                digest.update(os.readlink(path).encode())
            elif stat.S_ISREG(info.st_mode):
                with path.open("rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
            digest.update(b"\0")
    return digest.hexdigest()


def template_tag(name: str, dockerfile: Path, base_id: str) -> str:
    digest = hashlib.sha256(f"{context_digest(dockerfile.parent)}\0{dockerfile.name}\0{base_id}".encode())
    return f"{TAG_PREFIX}{name}:{digest.hexdigest()[:16]}"


def agent_digest(client: Any, image: str) -> str:
    """The agent's code in `image` (regular files below AGENT_ROOT, compiled caches left out), read from a
    created container that never runs."""
    created = client.api.create_container(image, command=["true"], entrypoint=[], network_disabled=True)
    try:
        stream, _ = client.api.get_archive(created["Id"], AGENT_ROOT)
        digest = hashlib.sha256()
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
            for member in sorted(archive.getmembers(), key=lambda m: m.name):
                if not member.isfile() or "__pycache__" in member.name or member.name.endswith(".pyc"):
                    continue
                content = archive.extractfile(member)
                digest.update(f"{member.name}\0{member.mode & 0o7777}\0".encode())
                digest.update(content.read() if content is not None else b"")
        return digest.hexdigest()
    except docker.errors.NotFound:
        return ""  # no AGENT_ROOT at all
    finally:
        client.api.remove_container(created["Id"], force=True)


AGENT_ENV_PREFIXES = ("PYTHON", "LD_", "GRPC_")
"""Variables that change how the agent's own interpreter, loader or gRPC start: a template keeps the sandbox
image's values of these and adds none (PYTHONSTARTUP, LD_PRELOAD would run code in the agent itself)."""


def _start_facts(client: Any, image: str) -> tuple[Any, dict[str, str]]:
    config = client.api.inspect_image(image).get("Config") or {}
    env = dict(e.split("=", 1) if "=" in e else (e, "") for e in config.get("Env") or [])
    return config.get("Entrypoint"), {k: v for k, v in env.items() if k.startswith(AGENT_ENV_PREFIXES)}


def agent_problem(client: Any, image: str, base_image: str, base_digest: str) -> str | None:
    """Why `image` does not run the sandbox image's agent (None: it does)."""
    entry, env = _start_facts(client, image)
    base_entry, base_env = _start_facts(client, base_image)
    if entry != base_entry:
        return f"its entrypoint is {entry}, not the agent's {base_entry}"
    if env != base_env:
        changed = sorted(k for k in {*env, *base_env} if env.get(k) != base_env.get(k))
        return f"its environment changes {changed}, which the agent's start depends on"
    if agent_digest(client, image) != base_digest:
        # A prebuilt `image = ...` built on an older sandbox image ends here, before any sandbox of it starts: its
        # agent would speak an older protocol (agent_protocol.py), which the plane refuses anyway at the start.
        return (f"its {AGENT_ROOT} is not the agent of the sandbox image {base_image} (missing, changed or older): "
                f"rebuild the template FROM the current sandbox image {base_image} (`ARG SANDBOX_IMAGE` then "
                "`FROM ${SANDBOX_IMAGE}`)")
    return None


class TemplateImages:
    """The templates' images and states for one Docker provider. Its own engine client: a build streams for
    minutes and must not hold a connection the sandboxes' calls need."""

    def __init__(self, base_url: str | None, base_image: str, templates: Iterable[TemplateConfig],
                 instance: str, default_pool: int = 0) -> None:
        self._base_url = base_url
        self._base_image = base_image
        self._specs = {t.name: t for t in templates}
        self._instance = instance
        self._default_pool = default_pool
        self._infos: dict[str, TemplateInfo] = {}
        self._settled: dict[str, asyncio.Event] = {}
        self._client: Any = None
        self._builds: asyncio.Task[None] | None = None
        self._pruning: asyncio.Task[list[str]] | None = None
        self._base_id = ""
        self._base_digest = ""

    def _info(self, name: str, image: str, state: TemplateState, error: str = "") -> None:
        self._infos[name] = TemplateInfo(name, image, state, error, self._specs[name].pool or 0)
        if state != "building":
            self._settled[name].set()

    def infos(self) -> list[TemplateInfo]:
        """The default template (the sandbox image itself, always ready) first, then the operator's."""
        default = TemplateInfo(DEFAULT_TEMPLATE, self._base_image, "ready", "", self._default_pool)
        return [default, *(self._infos[name] for name in self._specs)]

    def pool_sizes(self) -> dict[str, int]:
        return {DEFAULT_TEMPLATE: self._default_pool, **{name: spec.pool or 0 for name, spec in self._specs.items()}}

    def image(self, name: str) -> str:
        return self._base_image if name == DEFAULT_TEMPLATE else self._infos[name].image

    def ready(self) -> list[str]:
        return [name for name, info in self._infos.items() if info.state == "ready"]

    def ready_image(self, name: str) -> str | None:
        """The image a pooled sandbox of `name` must run to be adopted; None: the template is not ready (or gone)."""
        if name == DEFAULT_TEMPLATE:
            return self._base_image
        info = self._infos.get(name)
        return info.image if info is not None and info.state == "ready" else None

    async def wait(self, name: str) -> str:
        """The template's image once it is ready; FailedPreconditionError when its build or check failed."""
        if name == DEFAULT_TEMPLATE:
            return self._base_image
        await self._settled[name].wait()
        info = self._infos[name]
        if info.state != "ready":
            raise FailedPreconditionError(f"template {name!r} is not usable: {info.error}")
        return info.image

    async def start(self, on_ready: Callable[[str], None]) -> None:
        """Finds each template's tag, and which are already built and ready (`ready()`); builds the others in
        the background, calling `on_ready(name)` for each that becomes ready."""
        if not self._specs:
            return
        self._settled = {name: asyncio.Event() for name in self._specs}
        self._client = await asyncio.to_thread(
            lambda: docker.DockerClient(base_url=self._base_url) if self._base_url else docker.from_env())
        pending = await asyncio.to_thread(self._prepare)
        if pending:
            self._builds = asyncio.get_running_loop().create_task(self._build_all(pending, on_ready))

    def _prepare(self) -> list[str]:
        self._base_id = self._client.api.inspect_image(self._base_image)["Id"]
        self._base_digest = agent_digest(self._client, self._base_image)
        pending = []
        for name, spec in self._specs.items():
            try:  # whatever goes wrong with one template fails that one only
                image = spec.image or self._tag(name, spec)
                present = self._present(image)
            except (OSError, ValueError, docker.errors.DockerException) as exc:
                self._info(name, str(spec.image or spec.dockerfile), "failed", str(exc))
                continue
            if present:
                self._check(name, image)
            elif spec.image:
                self._info(name, image, "failed", f"image {image} is not on the engine")
            else:
                self._info(name, image, "building")
                pending.append(name)
        return pending

    def _tag(self, name: str, spec: TemplateConfig) -> str:
        assert spec.dockerfile is not None
        dockerfile = spec.dockerfile.resolve()
        problem = from_problem(dockerfile.read_text(), self._base_image)
        if problem:
            raise ValueError(f"{dockerfile}: {problem}")
        return template_tag(name, dockerfile, self._base_id)

    def _present(self, image: str) -> bool:
        try:
            self._client.api.inspect_image(image)
        except docker.errors.ImageNotFound:
            return False
        return True

    def _check(self, name: str, image: str) -> None:
        try:
            problem = agent_problem(self._client, image, self._base_image, self._base_digest)
        except docker.errors.DockerException as exc:  # this template fails; the others and the plane go on
            problem = f"the engine could not show its files: {exc}"
        if problem:
            log.error("template %s refused: %s", name, problem)
            self._info(name, image, "failed", f"image {image} does not carry the sandbox agent: {problem}")
        else:
            self._info(name, image, "ready")

    async def _build_all(self, names: list[str], on_ready: Callable[[str], None]) -> None:
        for name in names:
            try:
                error = await _in_daemon_thread(self._build, name)
            except Exception as exc:  # reported as the template's error
                error = f"the build failed: {exc}"
            if error:
                log.error("template %s failed to build: %s", name, error)
                self._info(name, self.image(name), "failed", error)
                continue
            await asyncio.to_thread(self._check, name, self.image(name))
            if self._infos[name].state == "ready":
                log.info("template %s built: %s", name, self.image(name))
                on_ready(name)

    def _build(self, name: str) -> str:
        """Builds the template; "" on success, else what went wrong with the log's last lines."""
        spec, image = self._specs[name], self.image(name)
        assert spec.dockerfile is not None
        dockerfile = spec.dockerfile.resolve()
        tail: deque[str] = deque(maxlen=LOG_TAIL)
        try:
            for chunk in self._client.api.build(
                path=str(dockerfile.parent), dockerfile=dockerfile.name, tag=image, rm=True, forcerm=True,
                pull=False, decode=True, buildargs={PLATFORM_ARG: self._base_image},
                labels={LABEL_TEMPLATE: name, LABEL_TEMPLATE_HASH: image.rsplit(":", 1)[1],
                        LABEL_INSTANCE: self._instance},
            ):
                tail.extend(line for line in str(chunk.get("stream", "")).splitlines() if line.strip())
                if "error" in chunk:
                    tail.append(str(chunk["error"]).strip())
                    return f"the build of {dockerfile} failed: " + " | ".join(tail)
        except docker.errors.DockerException as exc:
            return f"the build of {dockerfile} failed: {exc} | " + " | ".join(tail)
        return ""

    def start_pruning(self) -> None:
        """`prune` in the background: called by the provider once it has adopted or removed its sandboxes (a
        pooled sandbox of an old image, removed at start, no longer holds it)."""
        self._pruning = asyncio.get_running_loop().create_task(self.prune())

    async def prune(self) -> list[str]:
        """Removes this instance's template images that no declared template uses any more (template_prune), once
        `start` has named every template's current tag; what it removed. Never fails the plane: an engine error
        is logged, and the next start tries again."""
        keep = {name: "" for name in self._specs}  # a template whose tag is unknown keeps all of its images
        keep.update((name, info.image) for name, info in self._infos.items()
                    if info.image.startswith(TAG_PREFIX) and not self._specs[name].image)
        try:
            return await _in_daemon_thread(self._prune, keep)
        except docker.errors.DockerException as exc:
            log.warning("template images not pruned: %s", exc)
            return []

    def _prune(self, keep: dict[str, str]) -> list[str]:
        client = self._client or (docker.DockerClient(base_url=self._base_url) if self._base_url else docker.from_env())
        try:
            return prune_templates(client, self._instance, keep, self._base_image)
        finally:
            if client is not self._client:
                client.close()

    async def close(self) -> None:
        if self._pruning is not None:
            self._pruning.cancel()  # a removal under way finishes in its thread; the next start prunes the rest
        if self._builds is not None:
            self._builds.cancel()  # a build under way finishes in its thread and is cached for the next start
        if self._client is not None:
            await asyncio.to_thread(self._client.close)


_A = TypeVar("_A")
_R = TypeVar("_R")


async def _in_daemon_thread(fn: Callable[[_A], _R], arg: _A) -> _R:
    """`fn(arg)` in a daemon thread: a build (or an image removal on a busy engine) can take minutes, and a plane
    that stops meanwhile must neither wait for it nor keep its process alive (the default executor's threads are
    joined at exit). What `fn` raises is raised here."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[_R] = loop.create_future()

    def settle(result: _R | None, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]  # set only when fn returned

    def run() -> None:
        result: _R | None = None
        error: BaseException | None = None
        try:
            result = fn(arg)
        except Exception as exc:  # handed to the awaiting task, never lost with the thread
            error = exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            pass  # the loop is gone: the plane stopped meanwhile

    threading.Thread(target=run, name=f"template-{fn.__name__.strip('_')}", daemon=True).start()
    return await done
