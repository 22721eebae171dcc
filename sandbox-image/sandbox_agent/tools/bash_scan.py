"""What a bash command asks before it runs: tree-sitter finds every simple command, its pattern and arity prefix.

`scan` is synchronous and touches the filesystem (realpath, isdir): call it through `ctx.io`.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tree_sitter import Language, Node, Parser

from sandbox_agent.tools.base import ToolError
from sandbox_agent.tools.bash_arity import prefix
from sandbox_agent.tools.bash_continuations import joined
from sandbox_agent.tools.bash_normalise import Context, Normaliser
from sandbox_agent.tools.bash_programs import statement
from sandbox_agent.tools.bash_runners import RUNNERS

TOKEN_TYPES = frozenset({"command_name", "word", "string", "raw_string", "concatenation"})
PATH_COMMANDS = frozenset({"cd", "rm", "cp", "mv", "mkdir", "touch", "chmod", "chown", "cat"})
"""Commands whose arguments are checked for paths outside the project (upstream's list, not exhaustive)."""


@dataclass(frozen=True)
class Scan:
    patterns: list[str]
    """One entry per distinct command text (redirects and heredoc bodies included), first seen first."""
    always: list[str]
    """One `<arity prefix> *` per distinct prefix, first seen first."""
    external_dirs: list[str]
    """Directories outside the project the command names (the workdir first when it is outside)."""
    checks: list[str] = field(default_factory=list)
    """What runs, normalised (bash_normalise), where it differs from `patterns`: matched against the rules
    too, never shown (the request shows upstream's patterns)."""
    unknown: list[str] = field(default_factory=list)
    """Why some command's name is known only when it runs; when any, the strictest bash rule decides."""


@functools.cache
def _language() -> Language:
    return Language(_bash_grammar().language())


def _bash_grammar() -> Any:
    """tree_sitter_bash's compiled grammar, loaded without running its package's `__init__`: that imports
    importlib.resources (pathlib, tempfile, shutil, ipaddress...) for a query file the agent never reads, 0.6 MiB
    of private memory in every agent that ran a `bash` call (docs/performance.md, 2026-11-28)."""
    package = importlib.util.find_spec("tree_sitter_bash")  # a top-level package's spec: found, not imported
    where = package.submodule_search_locations if package is not None else None
    spec = importlib.machinery.PathFinder.find_spec("tree_sitter_bash._binding", list(where or []))
    if spec is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
        import tree_sitter_bash  # laid out differently: the package's own way

        return tree_sitter_bash
    binding = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(binding)
    return binding


def scan(command: str, cwd: str, directory: str, worktree: str) -> Scan:
    """Parses `command` and collects what to ask; `cwd` is the resolved workdir the command runs in."""
    # A Parser is cheap and not safe to share between the io threads, so each call makes its own.
    parser = Parser(_language())
    try:
        tree = parser.parse(command.encode("utf-8", "surrogatepass"))
    except Exception as exc:
        raise ToolError("Failed to parse command") from exc
    normaliser = Normaliser(lambda text: parser.parse(text.encode("utf-8", "surrogatepass")).root_node, RUNNERS,
                            statement)
    patterns: dict[str, None] = {}
    always: dict[str, None] = {}
    dirs: dict[str, None] = {}
    if not _inside(cwd, directory, worktree):
        dirs[cwd] = None
    if tree.root_node.has_error:
        # Text the grammar could not read may still run (`{rm,f}` is `rm f`): what it runs is not known.
        normaliser.opaque("part of the command does not parse, so what it runs is not known")
    for node in _commands(tree.root_node, lambda found: statement(normaliser, found)):
        parent = node.parent
        text_node = parent if parent is not None and parent.type == "redirected_statement" else node
        tokens = [_text(child) for child in node.children if child.type in TOKEN_TYPES]
        if not tokens:
            continue
        if tokens[0] in PATH_COMMANDS:
            for arg in tokens[1:]:
                if arg.startswith("-") or (tokens[0] == "chmod" and arg.startswith("+")):
                    continue
                outside = _outside_dir(os.path.join(cwd, arg), directory, worktree)
                if outside is not None:
                    dirs[outside] = None
        if tokens[0] != "cd":
            patterns[_text(text_node)] = None
            always[" ".join(prefix(tokens)) + " *"] = None
        normaliser.command(node)
    follow = joined(command, tree.root_node)
    if follow != command:
        normaliser.script(follow, Context())  # what bash runs once it joined the continuations: checked too
    checks: dict[str, None] = {}
    for form in normaliser.forms.values():
        if form.text in patterns:
            continue
        checks[form.text] = None
        if not form.name:
            continue  # a nested command as written: its normalised form brings the prefix
        # So that an "always" reply covers what really runs, not only the wrapper (`env *`); never a prefix
        # with wildcards of its own (`\\* x` would offer `* *`, an approval of almost everything).
        named = prefix(form.tokens)
        if not any("*" in token or "?" in token for token in named):
            always[" ".join(named) + " *"] = None
        if form.respelled and form.name in PATH_COMMANDS:
            for word in form.args:
                value = word.value
                if value is None or value.startswith("-") or (form.name == "chmod" and value.startswith("+")):
                    continue
                outside = _outside_dir(os.path.join(cwd, value), directory, worktree)
                if outside is not None:
                    dirs[outside] = None
    return Scan(list(patterns), list(always), list(dirs), list(checks), normaliser.unknown)


def _commands(root: Node, visit: Callable[[Node], None] | None = None) -> Iterator[Node]:
    """Every `command` node in document order, however deeply nested (pipelines, loops, substitutions...);
    `visit` sees every node on the way."""
    stack = [root]
    while stack:
        node = stack.pop()
        if visit is not None:
            visit(node)
        if node.type == "command":
            yield node
        stack.extend(reversed(node.children))


def _text(node: Node) -> str:
    return (node.text or b"").decode("utf-8", "replace")


def _outside_dir(path: str, directory: str, worktree: str) -> str | None:
    """The directory to ask for when `path` resolves outside the project: itself, or a file's parent."""
    real = realpath_command(path)
    if real is None or _inside(real, directory, worktree):
        return None
    return real if os.path.isdir(real) else os.path.dirname(real)


def realpath_command(path: str) -> str | None:
    """What `realpath PATH` (GNU coreutils, as upstream runs it) prints; None where it fails.

    Every component but the last must exist, so a file or directory the command is about to
    create (`touch /tmp/new`, `mkdir /tmp/d`) still resolves, and its parent is asked for.
    """
    trimmed = path.rstrip("/") or "/"
    parent, last = os.path.split(trimmed)
    try:
        if os.path.exists(trimmed):
            real = os.path.realpath(trimmed, strict=True)
            return None if path.endswith("/") and not os.path.isdir(real) else real
        if last in ("", ".", "..") or not os.path.isdir(os.path.realpath(parent or ".", strict=True)):
            return None
        # A dangling symlink resolves to where it points, if that place's parent exists.
        real = os.path.realpath(trimmed)
        return real if os.path.isdir(os.path.dirname(real)) else None
    except (OSError, ValueError):
        return None


def _inside(target: str, directory: str, worktree: str) -> bool:
    """Same rule as `paths.contains_path`: the project directory, or the git worktree unless it is "/"."""
    return _within(directory, target) or (worktree != "/" and _within(worktree, target))


def _within(parent: str, child: str) -> bool:
    return not os.path.relpath(child, parent).startswith("..")
