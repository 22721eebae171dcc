"""One exception root per process, drawn completely: every exception class of the control plane derives from
ControlPlaneError, every one of the sandbox agent from AgentError, every one of the Python tool host from
ToolHostError, and each is drawn in its root module's docstring under the parent it really derives from."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import controlplane.errors
import sandbox_agent.errors
from controlplane.errors import ControlPlaneError
from sandbox_agent.errors import AgentError

PYHOST = Path(__file__).resolve().parents[2] / "sandbox-image" / "pyhost"
NODE = re.compile(r"^(?P<indent>(?:[│ ]   |[├└]── )*)(?P<name>\w+)")


def drawn_tree(docstring: str, root: str) -> dict[str, str | None]:
    """{class name: its parent's name} as the docstring draws the tree starting at `root`."""
    lines = docstring.splitlines()
    start = lines.index(root)
    parents: dict[str, str | None] = {root: None}
    path = [root]
    for line in lines[start + 1:]:
        if not line.strip():
            break
        found = NODE.match(line)
        assert found is not None, f"not a tree line: {line!r}"
        assert found["indent"], f"a second root: {line!r}"
        depth = len(found["indent"]) // 4
        assert 1 <= depth <= len(path), f"a line deeper than its parent: {line!r}"
        del path[depth:]
        name = found["name"]
        assert name not in parents, f"{name} is drawn twice"
        parents[name] = path[-1]
        path.append(name)
    return parents


def exception_classes(package: ModuleType) -> dict[str, type[BaseException]]:
    """Every exception class defined at module level in the package, by name (names are unique)."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if info.name.endswith(("__main__", "_pb2", "_pb2_grpc")):
            continue  # `__main__` runs the command line; the generated stubs define no exceptions
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == info.name:
                assert value.__name__ not in found, f"two exception classes named {value.__name__}"
                found[value.__name__] = value
    return found


def check_tree(classes: dict[str, type[BaseException]], root: type[BaseException], docstring: str) -> None:
    outside = sorted(name for name, cls in classes.items() if not issubclass(cls, root))
    assert outside == [], f"not derived from {root.__name__}: {outside}"
    drawn = drawn_tree(docstring, root.__name__)
    assert sorted(drawn) == sorted(classes), "the docstring's tree and the exception classes differ"
    for name, parent in drawn.items():
        if parent is not None:
            # The first base inside the tree is the parent drawn; a builtin base beside it is allowed.
            real = next(base for base in classes[name].__bases__ if issubclass(base, root))
            assert real.__name__ == parent, f"{name} is drawn under {parent} but derives from {real.__name__}"


def test_every_control_plane_exception_derives_from_the_root_and_is_drawn() -> None:
    assert controlplane.errors.__doc__ is not None
    check_tree(exception_classes(controlplane), ControlPlaneError, controlplane.errors.__doc__)


def test_every_agent_exception_derives_from_the_root_and_is_drawn() -> None:
    assert sandbox_agent.errors.__doc__ is not None
    check_tree(exception_classes(sandbox_agent), AgentError, sandbox_agent.errors.__doc__)


def test_every_python_tool_host_exception_derives_from_its_root_and_is_drawn() -> None:
    """Read from the source: the host's modules harden the process they are imported into."""
    bases: dict[str, list[str]] = {}
    docstring = ""
    for path in sorted(PYHOST.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        if path.name == "opencode_tool.py":
            docstring = ast.get_docstring(tree) or ""
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                assert node.name not in bases, f"two classes named {node.name}"
                bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]

    def is_exception(name: str) -> bool:
        builtin = getattr(builtins, name, None)
        if inspect.isclass(builtin):
            return issubclass(builtin, BaseException)
        return any(is_exception(base) for base in bases.get(name, []))

    exceptions = {name: parents for name, parents in bases.items() if is_exception(name)}
    assert exceptions["ToolHostError"] == ["Exception"]
    outside = sorted(name for name, parents in exceptions.items()
                     if name != "ToolHostError" and not any(p in exceptions for p in parents))
    assert outside == [], f"not derived from ToolHostError: {outside}"
    drawn = drawn_tree(docstring, "ToolHostError")
    assert sorted(drawn) == sorted(exceptions)
    for name, parent in drawn.items():
        if parent is not None:
            assert parent == next(p for p in exceptions[name] if p in exceptions), name

