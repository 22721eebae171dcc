"""Where a session's custom code comes from: upstream's `Config.directories()` and its tool and plugin globs.

Everything here is blocking filesystem work: run it through the tool user's `io()` so that what the
tool user cannot see is not discovered either.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Iterable, Iterator, Mapping, Sequence

from sandbox_agent.custom.files import HostFile, LoadError
from sandbox_agent.tools.collation import code_unit_key

GLOBAL_DIR = "/opt/opencode/global"
"""The operator's read-only config dir: upstream's `~/.config/opencode`."""
HOME = "/tmp/home"

TOOL_SUBDIRS = ("tool", "tools")
TOOL_EXTENSIONS = (".js", ".ts", ".py")
PLUGIN_SUBDIRS = ("plugin", "plugins")
PLUGIN_EXTENSIONS = (".ts", ".js")
# Upstream drops these plugin specs: their features are built in.
SKIPPED_PLUGIN_SPECS = ("opencode-openai-codex-auth", "opencode-copilot-auth")


def flag(env: Mapping[str, str], name: str) -> bool:
    """Upstream's boolean env flags: "true" or "1", any case."""
    return env.get(name, "").lower() in ("true", "1")


def walk_up(targets: Sequence[str], start: str, stop: str) -> Iterator[str]:
    """Each existing `target` from `start` upward, nearest first, ending at `stop` (or at "/")."""
    current = posixpath.normpath(start)
    stop = posixpath.normpath(stop)
    while True:
        for target in targets:
            candidate = posixpath.join(current, target)
            if os.path.isdir(candidate):
                yield candidate
        parent = posixpath.dirname(current)
        if current == stop or parent == current:
            return
        current = parent


def config_directories(directory: str, worktree: str, *, global_dir: str, home: str,
                       env: Mapping[str, str]) -> list[str]:
    """The existing config dirs in upstream's order, which is the order in which later ones win.

    Project `.opencode` dirs come nearest first, as upstream's walk yields them (so a `.opencode`
    higher up is later and wins a tool-id collision). A dir listed twice keeps its first place.
    """
    candidates = [global_dir]
    if not flag(env, "OPENCODE_DISABLE_PROJECT_CONFIG"):
        candidates += walk_up([".opencode"], directory, worktree)
    candidates.append(posixpath.join(home, ".opencode"))
    if env.get("OPENCODE_CONFIG_DIR"):
        candidates.append(posixpath.join(directory, env["OPENCODE_CONFIG_DIR"]))
    found: list[str] = []
    for candidate in (posixpath.normpath(c) for c in candidates):
        if candidate not in found and os.path.isdir(candidate):
            found.append(candidate)
    return found


def tool_files(dirs: Iterable[str], *, allowed_roots: Sequence[str]) -> tuple[list[HostFile], list[LoadError]]:
    """`{tool,tools}/*.{js,ts,py}` of each dir (dirs in order, files sorted), plus the files skipped."""
    files: list[HostFile] = []
    errors: list[LoadError] = []
    for directory in dirs:
        for path in _top_level_files(directory, TOOL_SUBDIRS, TOOL_EXTENSIONS):
            problem = _unusable(path, allowed_roots)
            if problem:
                errors.append(LoadError(path, problem))
            else:
                files.append(HostFile(path, "tool"))
    return files, errors


def plugin_files(dirs: Iterable[str], config_plugins: Sequence[str], directory: str, *,
                 allowed_roots: Sequence[str]) -> tuple[list[HostFile], list[LoadError]]:
    """Plugin modules to load, in load order, and the specs that cannot be loaded here.

    The session config's `plugin` entries come first, then `{plugin,plugins}/*.{ts,js}` of each dir.
    Entries sharing a canonical name (file stem, or package name without version) are deduplicated:
    the later one wins and keeps its own place. npm specs are reported: a sandbox cannot install them.
    """
    entries = [(spec, plugin_file(spec, directory)) for spec in config_plugins]
    for config_dir in dirs:
        entries += [(path, path) for path in _top_level_files(config_dir, PLUGIN_SUBDIRS, PLUGIN_EXTENSIONS)]

    files: list[HostFile] = []
    errors: list[LoadError] = []
    for spec, path in _latest_by_name(entries):
        if any(skipped in spec for skipped in SKIPPED_PLUGIN_SPECS):
            continue
        if path is None:
            errors.append(LoadError(spec, f"Failed to load plugin {spec}: npm packages cannot be installed "
                                          "in the sandbox (it has no network access)"))
            continue
        problem = _unusable(path, allowed_roots)
        if problem:
            errors.append(LoadError(path, f"Failed to load plugin {spec}: {problem}"))
        else:
            files.append(HostFile(path, "plugin"))
    return files, errors


def fingerprint(files: Iterable[HostFile]) -> str:
    """Changes whenever a file is added, removed, replaced, touched or resized: cheap, no content read."""
    digest = hashlib.sha256()
    for file in files:
        try:
            info = os.stat(file.path)
            state = f"{info.st_mtime_ns}:{info.st_size}:{info.st_ino}"
        except OSError:
            state = "missing"
        digest.update(f"{file.kind}\0{file.path}\0{state}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def plugin_name(spec: str, path: str | None) -> str:
    """Upstream's dedupe key: a file's stem, or an npm spec without its `@version` (`@scope/pkg@1` -> `@scope/pkg`)."""
    if path is not None:
        return _stem(path)
    at = spec.rfind("@")
    return spec[:at] if at > 0 else spec


def plugin_file(spec: str, directory: str) -> str | None:
    """The file a config `plugin` entry names, or None for an npm spec."""
    if spec.startswith("file://"):
        return posixpath.normpath(_url_path(spec))
    if spec.startswith("/"):
        return posixpath.normpath(spec)
    if spec.startswith(("./", "../")):
        return posixpath.normpath(posixpath.join(directory, spec))
    return None


def _latest_by_name(entries: list[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
    seen: set[str] = set()
    kept: list[tuple[str, str | None]] = []
    for spec, path in reversed(entries):
        name = plugin_name(spec, path)
        if name not in seen:
            seen.add(name)
            kept.append((spec, path))
    kept.reverse()
    return kept


def _top_level_files(directory: str, subdirs: Sequence[str], extensions: Sequence[str]) -> list[str]:
    """Direct children of `directory/{subdirs}` with one of `extensions`: dotfiles too, directories not."""
    found: list[str] = []
    for subdir in subdirs:
        parent = posixpath.join(directory, subdir)
        try:
            entries = list(os.scandir(parent))
        except OSError:
            continue
        for entry in entries:
            if not entry.name.endswith(tuple(extensions)):
                continue
            try:
                if entry.is_dir():  # follows symlinks: a link to a directory is not a file
                    continue
            except OSError:
                pass
            found.append(posixpath.join(parent, entry.name))
    return sorted(found, key=code_unit_key)


def _unusable(path: str, allowed_roots: Sequence[str]) -> str:
    """Why `path` must not be loaded ("" when it may): a dangling link, or one leading out of every root."""
    if not os.path.lexists(path):
        return f"{path} does not exist"
    real = os.path.realpath(path)
    if not os.path.isfile(real):
        if os.path.islink(path) and not os.path.exists(real):
            return f"{path} is a symbolic link to {real}, which does not exist"
        return f"{path} is not a regular file"
    if not any(_within(real, os.path.realpath(root)) for root in allowed_roots):
        return f"{path} resolves to {real}, outside the directories custom code may be loaded from"
    return ""


def _within(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def _url_path(url: str) -> str:
    # Imported here: only a plugin named by a file URL needs it, and urllib.parse (with ipaddress) costs every idle
    # agent about 0.5 MiB.
    from urllib.parse import unquote, urlparse

    return unquote(urlparse(url).path)


def _stem(path: str) -> str:
    name = posixpath.basename(path)
    dot = name.rfind(".")
    return name[:dot] if dot > 0 else name
