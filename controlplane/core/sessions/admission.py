"""What a create request may ask for: resources within the policy's bounds and a workspace archive within
its limits, checked before anything exists, so that a refused create leaves nothing behind."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.core.config import project_files
from controlplane.core.sessions import archive_stream, workspace_archive
from controlplane.core.sessions.models import NetworkPolicy, Resources
from controlplane.core.sessions.snapshots import SnapshotState
from controlplane.errors import InvalidArgumentError, ResourceExhaustedError

log = logging.getLogger(__name__)

INLINE_ARCHIVE_CHECK_BYTES = 32 * 1024
"""Uncompressed archives up to this size are checked on the event loop (about a millisecond); larger ones,
and every compressed one (a few KiB can expand to the whole expanded-size limit), in a thread."""


@dataclass(frozen=True)
class SessionPolicy:
    defaults: Resources
    maximum: Resources
    idle_timeout_s: float
    max_lifetime_s: float
    reap_interval_s: float
    max_archive_bytes: int
    max_archive_entries: int = 50_000
    max_archive_expanded_bytes: int = 1 << 30
    """What a workspace archive may expand to; the sandbox agent's own extraction limit is the same."""


@dataclass(frozen=True)
class CreateSpec:
    agent: str = ""
    workspace_archive: bytes = b""
    config_json: str = ""
    labels: dict[str, str] | None = None
    resources: Resources | None = None
    template: str = ""
    """A template's name; empty: the default (the sandbox image itself)."""
    network: NetworkPolicy | None = None
    """The network asked for (None: none); checked against the tenant's cap before anything exists."""
    archive_limit_bytes: int = 0
    """0: the policy's `max_archive_bytes` (a request's size). A restored snapshot or a fork sets its own (the
    workspace is the platform's copy, not a request); the expanded-size limit holds for every archive."""
    kept_config: tuple[str, str | None] | None = None
    """A restore's or fork's: the config the copied session ran with, and the caller's own (None: the same). The
    new session runs with it when the workspace's project files are refused: those are the model's to rewrite,
    and a copy the platform kept must stay restorable, as the live session kept running with this config."""


def resources(policy: SessionPolicy, asked: Resources | None) -> Resources:
    """The resources a session gets: what it asked for, the policy's defaults for what it left out."""
    d, m = policy.defaults, policy.maximum
    r = Resources(
        cpu=asked.cpu if asked and asked.cpu else d.cpu,
        memory_mb=asked.memory_mb if asked and asked.memory_mb else d.memory_mb,
        pids=asked.pids if asked and asked.pids else d.pids,
    )
    if r.cpu < 0.01 or r.cpu > m.cpu:
        raise InvalidArgumentError(f"resources.cpu must be between 0.01 and {m.cpu}, got {r.cpu}")
    if r.memory_mb < 32 or r.memory_mb > m.memory_mb:
        raise InvalidArgumentError(f"resources.memory_mb must be between 32 and {m.memory_mb}, got {r.memory_mb}")
    if r.pids < 16 or r.pids > m.pids:
        raise InvalidArgumentError(f"resources.pids must be between 16 and {m.pids}, got {r.pids}")
    return r


async def check_archive(policy: SessionPolicy, archive: bytes, limit_bytes: int = 0) -> dict[str, bytes]:
    """The archive's project config files (project_files), once it is known to be acceptable."""
    if not archive:
        return {}
    limit = limit_bytes or policy.max_archive_bytes
    if len(archive) > limit:
        raise ResourceExhaustedError(f"workspace archive is {len(archive)} bytes; the limit is {limit}")
    check = functools.partial(
        workspace_archive.check, archive, policy.max_archive_entries, policy.max_archive_expanded_bytes,
        keep=project_files.wanted, keep_bytes=project_files.MAX_FILE_BYTES,
        keep_total=project_files.MAX_PROJECT_BYTES,
    )
    kept = await _archive_pass(archive, check)
    references = project_files.file_references(kept) - kept.keys()
    if references:  # `{file:...}` in a config file: one more pass for the files it names
        kept |= await _archive_pass(archive, functools.partial(check, keep=references.__contains__))
    return kept


async def _archive_pass(archive: bytes, check: Callable[[], workspace_archive.ArchiveStats]) -> dict[str, bytes]:
    if len(archive) > INLINE_ARCHIVE_CHECK_BYTES or archive_stream.compression(archive):
        stats = await asyncio.to_thread(check)  # mostly headers, but a big (or compressed) archive takes a while
    else:
        stats = check()
    return stats.kept


async def session_config(policy: SessionPolicy, spec: CreateSpec) -> tuple[str, str | None, str]:
    """The session's merged config, the caller's own (when the project added to it) and its agent, from the
    checked archive's project files: refused (INVALID_ARGUMENT) before anything exists."""
    project = await check_archive(policy, spec.workspace_archive, spec.archive_limit_bytes)
    read = functools.partial(project_files.session_and_caller_config, project, spec.config_json)
    # Small files can still expand (aliases, {file:}): any project file is read off the loop.
    inline = not project and len(spec.config_json) <= INLINE_ARCHIVE_CHECK_BYTES
    try:
        config_json, caller_config = read() if inline else await asyncio.to_thread(read)
    except InvalidArgumentError as exc:
        if spec.kept_config is None or not project:
            raise
        # The same config, not the caller's alone: what the project's files narrowed stays narrowed.
        log.warning("a copy of a session runs with the config that session ran with: the workspace's project "
                    "config is not taken (%s)", exc)
        return spec.kept_config[0], spec.kept_config[1], spec.agent or project_files.default_agent(spec.kept_config[0])
    agent = spec.agent or project_files.default_agent(config_json)
    if not spec.agent:
        project_files.workspace_chosen_agent(agent, caller_config)
    return config_json, caller_config, agent


def kept_config(state: SnapshotState) -> tuple[str, str | None] | None:
    """What a restore or fork of a session copy falls back to (CreateSpec.kept_config)."""
    if state.session_config_json is None:
        return None
    caller = state.config_json
    return state.session_config_json, None if caller == state.session_config_json else caller
