"""A session's custom code, fixed when the session is created: a copy the tool user cannot change.

Why: discovering tools, plugins and skills in the live workspace on every listing turned any file the
model writes (`write .opencode/tool/x.ts`) into code on the next call, beyond every permission rule.
Upstream reads its tools once per instance; here they are read once per session (and again only when
the API caller asks for it with ReloadTools), and loaded from a copy rather than from the workspace.

What is copied: every project config dir (each `.opencode` from the workspace up to the worktree,
HOME's `.opencode`, OPENCODE_CONFIG_DIR) with everything in it, so that relative imports inside the
dir and its own `node_modules` keep resolving, plus the plugin files the session config names outside
those dirs. The operator's global dir is mounted read-only and is used in place.

Where: in a container, under the providers' dedicated tmpfs (AGENT_CODE_DIR, /run/code, root-owned 0755,
`private`): Bun looks upward from every loaded file for node_modules, package.json, tsconfig.json and
jsconfig.json, so no ancestor of the copy may be writable by a tool process (under the sticky /tmp, a
model-written /tmp/node_modules or /tmp/tsconfig.json became code in the host). The agent checks every
ancestor before each snapshot and refuses otherwise. On the local plane (a host process, no isolation)
`base` is the sandbox's tmp dir.

How: files are opened by the tool user's io threads (what the tool user cannot read is not copied) and
written by the agent's own identity (root in a container) into a fresh directory under `base`: dirs
0755, files 0644 (0755 when executable), all owned by the agent, so the tool user can read but neither
write, rename, chmod nor delete them. Paths mirror the originals (`root + original`), so a relative
import resolves to the copy of its target when the target was copied, and to nothing when it was not: an
import reaching outside the copied dirs fails to resolve instead of running a workspace file. A symbolic
link is copied as what it points to (a link could lead back into the writable workspace); a loop or a
special file is skipped.
Skills (SKILL.md) are read at the same moment; the listing and the `skill` tool serve that scan.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import posixpath
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandbox_agent.custom import discovery
from sandbox_agent.custom.skills import SkillScan
from sandbox_agent.errors import AgentError
from sandbox_agent.tools.runner import ToolRunner
from sandbox_agent.tools.skill import scan_skills

MAX_FILES = 20_000
MAX_BYTES = 128 << 20
"""What one snapshot may hold: a config dir's own node_modules fits, a copied project does not."""
BATCH = 128
"""Files opened per hand-over from the tool user's thread to the agent's (bounded open descriptors)."""
PREFIX = ".opencode-code-"


class SnapshotError(AgentError):
    """The snapshot could not be taken; `str()` says why and what to do."""


@dataclass(frozen=True)
class CodeSnapshot:
    root: str
    """The root-owned directory holding the copies ("" for the empty snapshot)."""
    config_dirs: list[str]
    """The session's config dirs as discovered, original paths, in upstream's order."""
    plugin_specs: list[str]
    """The session config's `plugin` entries, file entries pointing into the copy."""
    files: dict[str, str] = field(default_factory=dict)
    """Every copied file and every skill: original path -> sha256 of its content."""
    skills: SkillScan = field(default_factory=SkillScan)

    def inside(self, original: str) -> str:
        """Where the copy of `original` lives (the operator's global dir stays where it is)."""
        if not self.root or _within(original, discovery.GLOBAL_DIR):
            return original
        return self.root + posixpath.normpath(original)

    def outside(self, text: str) -> str:
        """`text` with the copy's paths shown as the originals (origins and messages the caller reads)."""
        return text.replace(self.root + "/", "/") if self.root else text


@dataclass(frozen=True)
class Changes:
    added: list[str]
    changed: list[str]
    removed: list[str]


def changes(before: CodeSnapshot | None, after: CodeSnapshot) -> Changes:
    old = before.files if before is not None else {}
    return Changes(
        added=sorted(p for p in after.files if p not in old),
        changed=sorted(p for p in after.files if p in old and old[p] != after.files[p]),
        removed=sorted(p for p in old if p not in after.files),
    )


async def take(runner: ToolRunner, *, base: str, workspace: str, worktree: str, home: str,
               config: Mapping[str, Any], env: Mapping[str, str], private: bool = False) -> CodeSnapshot:
    """Copies the session's custom code now. Raises SnapshotError (nothing is left behind then).

    `private`: `base` must already exist with no ancestor (itself included) that anyone but the agent and
    root could write or replace."""
    plan = await runner.io(_plan, workspace, worktree, home, dict(config), dict(env))
    if private:
        await asyncio.to_thread(check_private, base)
    root = await asyncio.to_thread(_make_root, base, plan.dirs)
    try:
        digests: dict[str, str] = {}
        for start in range(0, len(plan.files), BATCH):
            opened = await runner.io(_open_all, plan.files[start:start + BATCH])
            digests |= await asyncio.to_thread(_copy_all, root, opened)
        skills = plan.skills
        for skill in skills.skills:
            text = f"{skill.name}\0{skill.description}\0{skill.content}".encode("utf-8", "surrogateescape")
            digests.setdefault(skill.location, hashlib.sha256(text).hexdigest())
        specs = [_copied_spec(spec, workspace, root) for spec in plan.plugin_specs]
        return CodeSnapshot(root, plan.config_dirs, specs, digests, skills)
    except BaseException:
        await asyncio.shield(asyncio.to_thread(remove, root))
        raise


def remove(root: str) -> None:
    """Deletes a snapshot directory (the agent's own files: its identity may)."""
    if root:
        import shutil  # only here: shutil (with bz2 and lzma) is 0.3 MiB of every idle agent

        shutil.rmtree(root, ignore_errors=True)


# -- the tool user's side: what to copy ----------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    config_dirs: list[str]
    plugin_specs: list[str]
    dirs: list[str]
    """Directories to create, parents first (original paths)."""
    files: list[str]
    """Files to copy (original paths; links are followed when opened)."""
    skills: SkillScan


def _plan(workspace: str, worktree: str, home: str, config: dict[str, Any], env: dict[str, str]) -> _Plan:
    config_dirs = discovery.config_directories(workspace, worktree, global_dir=discovery.GLOBAL_DIR, home=home,
                                              env=env)
    plugins = config.get("plugin")
    specs = [str(p) for p in plugins] if isinstance(plugins, list) else []
    dirs: list[str] = []
    files: list[str] = []
    seen_dirs: set[str] = set()
    total = [0, 0]  # bytes, files
    for directory in config_dirs:
        if _within(directory, discovery.GLOBAL_DIR):
            continue
        for kind, path in _walk(directory, seen_dirs, total):
            (dirs if kind == "dir" else files).append(path)
    for spec in specs:
        found = discovery.plugin_file(spec, workspace)
        if found is None or any(_within(found, d) for d in config_dirs) or not os.path.isfile(found):
            continue  # an npm spec, already copied with its dir, or missing (the load reports it)
        dirs.append(posixpath.dirname(found))
        files.append(found)
        total[0] += _size(found)
        total[1] += 1
    if total[1] > MAX_FILES or total[0] > MAX_BYTES:
        raise SnapshotError(
            f"the session's custom code ({', '.join(config_dirs) or 'no config dir'}) holds more than {MAX_FILES} "
            f"files or {MAX_BYTES} bytes, the most a session's code snapshot takes: keep build outputs, large "
            "dependencies and links to big directories out of the .opencode dirs")
    skills = scan_skills(workspace, worktree, home=home, env=env, config=config)
    return _Plan(config_dirs, specs, dirs, files, skills)


def _walk(top: str, seen: set[str], total: list[int]) -> Iterator[tuple[str, str]]:
    """("dir", path) and ("file", path) under `top`, `top` first; links followed, each real dir once."""
    real = os.path.realpath(top)
    if real in seen:
        return
    seen.add(real)
    yield "dir", top
    try:
        entries = sorted(os.scandir(top), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        path = posixpath.join(top, entry.name)
        try:
            info = os.stat(path)  # follows links: a link is taken as what it points to
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode):
            yield from _walk(path, seen, total)
        elif stat.S_ISREG(info.st_mode):
            total[0] += info.st_size
            total[1] += 1
            if total[0] > MAX_BYTES or total[1] > MAX_FILES:
                return  # past a limit (a link to / or /proc counts too): the plan is refused, stop walking
            yield "file", path


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _open_all(paths: Sequence[str]) -> list[tuple[str, int]]:
    """(path, fd) of each path that is still a regular file the tool user can read."""
    opened: list[tuple[str, int]] = []
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO swapped in must not block
        except OSError:
            continue
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            continue
        opened.append((path, fd))
    return opened


def check_private(base: str) -> None:
    """SnapshotError unless `base` and each of its ancestors is a real directory of root's or the agent's
    that neither group nor others may write: then nothing Bun or Python finds looking upward from the copy
    was put there by a tool process."""
    path = posixpath.normpath(base)
    while True:
        try:
            info = os.lstat(path)
        except OSError as exc:
            raise SnapshotError(f"the code snapshot dir {base} is not usable ({path}: {exc.strerror}); the "
                                "sandbox was not created as this agent expects: recreate the session") from None
        if (not stat.S_ISDIR(info.st_mode) or info.st_uid not in (0, os.geteuid())
                or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
            raise SnapshotError(
                f"refusing to keep the session's custom code under {base}: {path} could be written by a tool "
                f"process (owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}), and the tool hosts "
                "look for modules and config in every ancestor of a tool's file")
        if path == "/":
            return
        path = posixpath.dirname(path)


# -- the agent's side: the copy --------------------------------------------------------------------


def _make_root(base: str, dirs: Sequence[str]) -> str:
    """A fresh directory of the agent's own under `base`, with the mirror of `dirs` (original paths) in it."""
    try:
        os.makedirs(base, exist_ok=True)
    except OSError as exc:
        raise SnapshotError(_storage_problem(base, exc)) from None
    for _ in range(8):
        root = posixpath.join(base, PREFIX + os.urandom(8).hex())
        try:
            os.mkdir(root, 0o700)
        except FileExistsError:
            continue  # a name the tool user took first: it is not ours, take another
        except OSError as exc:
            raise SnapshotError(_storage_problem(base, exc)) from None
        try:
            os.chmod(root, 0o755)
            made: set[str] = {root}
            for original in dirs:
                _make_dirs(root, root + posixpath.normpath(original), made)
        except OSError as exc:
            remove(root)
            raise SnapshotError(_storage_problem(base, exc)) from None
        return root
    raise SnapshotError(f"could not create a directory for the session's custom code in {base}")


def _make_dirs(root: str, target: str, made: set[str]) -> None:
    """`target` and its missing parents below `root`, each 0755 whatever the umask (the tool host reads them)."""
    if target in made or not target.startswith(root + "/"):
        return
    _make_dirs(root, posixpath.dirname(target), made)
    try:
        os.mkdir(target, 0o755)
    except FileExistsError:
        pass
    os.chmod(target, 0o755)
    made.add(target)


def _copy_all(root: str, opened: list[tuple[str, int]]) -> dict[str, str]:
    digests: dict[str, str] = {}
    try:
        for index, (path, fd) in enumerate(opened):
            try:
                digests[path] = _copy(root, path, fd)
            except OSError as exc:
                for _, rest in opened[index + 1:]:
                    os.close(rest)
                opened = []
                raise SnapshotError(_storage_problem(root, exc)) from None
    finally:
        for _, fd in opened:
            os.close(fd)
    return digests


def _copy(root: str, original: str, source: int) -> str:
    target = root + posixpath.normpath(original)
    os.makedirs(posixpath.dirname(target), mode=0o755, exist_ok=True)
    mode = 0o755 if os.fstat(source).st_mode & 0o111 else 0o644
    digest = hashlib.sha256()
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(out, mode)
        while chunk := os.read(source, 1 << 20):
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view):]
    finally:
        os.close(out)
    return digest.hexdigest()


def _storage_problem(where: str, exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"no space left to copy the session's custom code into {where} ({exc.strerror}): keep large "
                "files out of the .opencode dirs (build outputs, big dependencies) and call ReloadTools again")
    return f"could not copy the session's custom code into {where}: {exc.strerror or exc}"


def _copied_spec(spec: str, workspace: str, root: str) -> str:
    """A config `plugin` entry naming a file, as the absolute path of its copy; other entries as they are."""
    path = discovery.plugin_file(spec, workspace)
    if path is None or _within(path, discovery.GLOBAL_DIR):
        return spec
    return root + path


def _within(path: str, root: str) -> bool:
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")
