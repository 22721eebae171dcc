"""What a CreateSession workspace archive brings in before any sandbox exists: once its headers pass the
checks (workspace_archive), the project config files it carries and the files those name."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from controlplane.core.config import project_files
from controlplane.core.sessions import workspace_archive
from controlplane.errors import ResourceExhaustedError

INLINE_CHECK_BYTES = 32 * 1024
"""Archives up to this size are checked on the event loop (about a millisecond); larger ones in a thread."""


async def project_of(archive: bytes, max_bytes: int, max_entries: int, max_expanded_bytes: int) -> dict[str, bytes]:
    """The archive's project config files (project_files), once it is known to be acceptable."""
    if not archive:
        return {}
    if len(archive) > max_bytes:
        raise ResourceExhaustedError(f"workspace archive is {len(archive)} bytes; the limit is {max_bytes}")
    check = functools.partial(
        workspace_archive.check, archive, max_entries, max_expanded_bytes,
        keep=project_files.wanted, keep_bytes=project_files.MAX_FILE_BYTES,
        keep_total=project_files.MAX_PROJECT_BYTES,
    )
    kept = await _archive_pass(archive, check)
    references = project_files.file_references(kept) - kept.keys()
    if references:  # `{file:...}` in a config file: one more pass for the files it names
        kept |= await _archive_pass(archive, functools.partial(check, keep=references.__contains__))
    return kept


async def _archive_pass(archive: bytes, check: Callable[[], workspace_archive.ArchiveStats]) -> dict[str, bytes]:
    if len(archive) > INLINE_CHECK_BYTES:
        stats = await asyncio.to_thread(check)  # mostly headers, but a big (or compressed) archive takes a while
    else:
        stats = check()
    return stats.kept
