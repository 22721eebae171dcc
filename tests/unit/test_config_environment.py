"""config.py is the control plane's reader of the environment: every other module that touches
`os.environ` or `os.getenv` is one its docstring names, and what config.py hands on is what it says."""

from __future__ import annotations

import ast
from pathlib import Path

import controlplane.config
from controlplane.config import client_environment, upstream_environment

PACKAGE = Path(controlplane.config.__file__).parent


def reads_environment(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb", "getenvb"):
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                return True
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(alias.name in ("environ", "getenv", "environb", "getenvb") for alias in node.names):
                return True
    return False


def test_every_other_reader_of_the_environment_is_named_in_config_docstring() -> None:
    doc = controlplane.config.__doc__ or ""
    readers = sorted(str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py")
                     if "v1" not in p.relative_to(PACKAGE).parts and reads_environment(p))
    assert "controlplane/config.py" in readers
    unnamed = [path for path in readers if path != "controlplane/config.py" and path not in doc]
    assert unnamed == [], f"modules reading the environment that config.py does not name: {unnamed}"


def test_client_environment_takes_target_and_token_and_treats_empty_as_unset() -> None:
    given = client_environment({"CONTROLPLANE_TARGET": "127.0.0.1:1", "CONTROLPLANE_TOKEN": "", "OTHER": "x"})
    assert (given.target, given.token) == ("127.0.0.1:1", None)


def test_upstream_environment_is_the_opencode_variables_only() -> None:
    env = {"OPENCODE_ENABLE_QUESTION_TOOL": "1", "OPENCODE_CLIENT": "", "PATH": "/bin", "opencode_x": "no"}
    assert upstream_environment(env) == {"OPENCODE_ENABLE_QUESTION_TOOL": "1", "OPENCODE_CLIENT": ""}
