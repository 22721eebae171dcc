"""Config dirs, custom tool files and plugin files, found on a real temporary filesystem."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_agent.custom.discovery import config_directories, fingerprint, plugin_files, tool_files
from sandbox_agent.custom.files import HostFile, LoadError


def touch(path: Path, text: str = "export default {}\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """outside/.opencode above a worktree `repo` holding repo/.opencode and repo/app/web/.opencode."""
    paths = {
        "global": tmp_path / "global",
        "home": tmp_path / "home",
        "outside": tmp_path / "outside",
    }
    paths["repo"] = paths["outside"] / "repo"
    paths["directory"] = paths["repo"] / "app" / "web"
    for key in ("global", "home", "directory"):
        paths[key].mkdir(parents=True)
    for parent in (paths["outside"], paths["repo"], paths["directory"]):
        (parent / ".opencode").mkdir()
    return paths


def dirs(layout: dict[str, Path], env: dict[str, str] | None = None, worktree: Path | None = None) -> list[str]:
    return config_directories(
        str(layout["directory"]), str(worktree or layout["repo"]), global_dir=str(layout["global"]),
        home=str(layout["home"]), env=env or {},
    )


def test_config_dirs_global_then_project_nearest_first_then_home_then_env(layout: dict[str, Path]) -> None:
    (layout["home"] / ".opencode").mkdir()
    extra = layout["home"] / "extra-config"
    extra.mkdir()
    assert dirs(layout, {"OPENCODE_CONFIG_DIR": str(extra)}) == [
        str(layout["global"]),
        str(layout["directory"] / ".opencode"),
        str(layout["repo"] / ".opencode"),
        str(layout["home"] / ".opencode"),
        str(extra),
    ]


def test_config_dirs_skip_missing_dirs_and_a_dot_opencode_file(layout: dict[str, Path]) -> None:
    layout["global"].rmdir()
    (layout["directory"] / ".opencode").rmdir()
    (layout["directory"] / ".opencode").write_text("not a directory")
    assert dirs(layout, {"OPENCODE_CONFIG_DIR": str(layout["home"] / "missing")}) == [
        str(layout["repo"] / ".opencode"),
    ]


def test_config_dirs_walk_to_the_root_when_the_worktree_is_not_an_ancestor(layout: dict[str, Path]) -> None:
    found = dirs(layout, worktree=layout["home"])
    assert found[:4] == [
        str(layout["global"]),
        str(layout["directory"] / ".opencode"),
        str(layout["repo"] / ".opencode"),
        str(layout["outside"] / ".opencode"),
    ]


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "True"])
def test_disable_project_config_drops_only_project_dirs(layout: dict[str, Path], value: str) -> None:
    (layout["home"] / ".opencode").mkdir()
    assert dirs(layout, {"OPENCODE_DISABLE_PROJECT_CONFIG": value}) == [
        str(layout["global"]), str(layout["home"] / ".opencode"),
    ]


@pytest.mark.parametrize("value", ["0", "yes", "false", ""])
def test_other_flag_values_do_not_disable(layout: dict[str, Path], value: str) -> None:
    assert len(dirs(layout, {"OPENCODE_DISABLE_PROJECT_CONFIG": value})) == 3


def test_config_dir_env_relative_to_directory_and_listed_once(layout: dict[str, Path]) -> None:
    found = dirs(layout, {"OPENCODE_CONFIG_DIR": "../../.opencode"})
    assert found == [str(layout["global"]), str(layout["directory"] / ".opencode"), str(layout["repo"] / ".opencode")]


def test_tool_files_top_level_sorted_with_dotfiles_and_python(tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    for name in ["tools/zeta.ts", "tools/.hidden.ts", "tools/b.py", "tool/a.js", "tool/Upper.ts", "tools/skip.json",
                 "tools/skip.mjs", "tools/nested/deep.ts", "tool/README.md"]:
        touch(first / name)
    (first / "tools" / "folder.ts").mkdir()
    touch(second / "tools" / "aa.ts")
    files, errors = tool_files([str(second), str(first)], allowed_roots=[str(tmp_path)])
    assert files == [
        HostFile(str(second / "tools/aa.ts"), "tool"),
        HostFile(str(first / "tool/Upper.ts"), "tool"),
        HostFile(str(first / "tool/a.js"), "tool"),
        HostFile(str(first / "tools/.hidden.ts"), "tool"),
        HostFile(str(first / "tools/b.py"), "tool"),
        HostFile(str(first / "tools/zeta.ts"), "tool"),
    ]
    assert errors == []


def test_tool_symlinks_followed_inside_roots_and_reported_outside(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "workspace", tmp_path / "elsewhere"
    real = touch(root / "lib" / "real.ts")
    secret = touch(elsewhere / "secret.ts")
    tools = root / ".opencode" / "tools"
    tools.mkdir(parents=True)
    (tools / "inside.ts").symlink_to(real)
    (tools / "escape.ts").symlink_to(secret)
    (tools / "dangling.ts").symlink_to(root / "gone.ts")
    (tools / "linkdir.ts").symlink_to(root / "lib")
    files, errors = tool_files([str(root / ".opencode")], allowed_roots=[str(root)])
    assert files == [HostFile(str(tools / "inside.ts"), "tool")]
    assert errors == [
        LoadError(str(tools / "dangling.ts"),
                  f"{tools / 'dangling.ts'} is a symbolic link to {root / 'gone.ts'}, which does not exist"),
        LoadError(str(tools / "escape.ts"), f"{tools / 'escape.ts'} resolves to {secret}, "
                                            "outside the directories custom code may be loaded from"),
    ]
    # A second allowed root makes the same link acceptable.
    files, _ = tool_files([str(root / ".opencode")], allowed_roots=[str(root), str(elsewhere)])
    assert [f.path for f in files] == [str(tools / "escape.ts"), str(tools / "inside.ts")]


def test_a_symlinked_config_dir_leaving_the_roots_is_reported(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "workspace", tmp_path / "elsewhere"
    touch(elsewhere / "tools" / "t.ts")
    root.mkdir()
    (root / ".opencode").symlink_to(elsewhere)
    files, errors = tool_files([str(root / ".opencode")], allowed_roots=[str(root)])
    assert files == []
    assert [e.origin for e in errors] == [str(root / ".opencode" / "tools" / "t.ts")]


def plugins(tmp_path: Path, dirs: list[Path], config: list[str]) -> tuple[list[HostFile], list[LoadError]]:
    return plugin_files([str(d) for d in dirs], config, str(tmp_path / "ws"), allowed_roots=[str(tmp_path)])


def test_plugin_files_config_entries_then_dir_files(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    spaced = touch(tmp_path / "my plugins" / "by-url.ts")
    absolute = touch(tmp_path / "abs.js")
    relative = touch(ws / "local" / "rel.ts")
    parent = touch(tmp_path / "up.ts")
    cfg = ws / ".opencode"
    for name in ["plugins/b.ts", "plugin/a.js", "plugins/.dot.ts", "plugins/not.py", "plugin/sub/deep.ts"]:
        touch(cfg / name)
    files, errors = plugins(tmp_path, [cfg], [
        "file://" + str(spaced).replace(" ", "%20"), str(absolute), "./local/rel.ts", "../up.ts",
        "some-plugin@1.2.3", "@scope/pkg",
    ])
    assert files == [HostFile(str(p), "plugin") for p in [
        spaced, absolute, relative, parent, cfg / "plugin/a.js", cfg / "plugins/.dot.ts", cfg / "plugins/b.ts",
    ]]
    assert errors == [
        LoadError("some-plugin@1.2.3", "Failed to load plugin some-plugin@1.2.3: npm packages cannot be installed "
                                       "in the sandbox (it has no network access)"),
        LoadError("@scope/pkg", "Failed to load plugin @scope/pkg: npm packages cannot be installed "
                                "in the sandbox (it has no network access)"),
    ]


def test_plugin_dedupe_by_canonical_name_later_wins_in_its_own_place(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    early = touch(first / "plugins" / "shared.ts")
    touch(first / "plugins" / "keep.ts")
    late = touch(second / "plugin" / "shared.js")
    from_config = touch(tmp_path / "ws" / "p" / "keep.js")
    files, errors = plugins(tmp_path, [first, second], ["./p/keep.js", "keep@2.0.0", "other@1", "other@2"])
    # keep: config file < npm "keep@2.0.0" < first/plugins/keep.ts; shared: first < second; other: @1 < @2.
    assert files == [HostFile(str(first / "plugins" / "keep.ts"), "plugin"), HostFile(str(late), "plugin")]
    assert [e.origin for e in errors] == ["other@2"]
    assert str(early) not in [f.path for f in files]
    assert str(from_config) not in [f.path for f in files]


def test_npm_spec_after_a_file_of_the_same_name_wins_and_is_reported(tmp_path: Path) -> None:
    touch(tmp_path / "ws" / "x" / "thing.ts")
    files, errors = plugins(tmp_path, [], ["./x/thing.ts", "thing@3"])
    assert files == []
    assert [e.origin for e in errors] == ["thing@3"]
    # A plugin dir's file comes after every config entry, so it beats the npm spec again.
    cfg = tmp_path / "cfg"
    touch(cfg / "plugins" / "thing.ts")
    files, errors = plugins(tmp_path, [cfg], ["./x/thing.ts", "thing@3"])
    assert files == [HostFile(str(cfg / "plugins" / "thing.ts"), "plugin")]
    assert errors == []


def test_plugin_problems_and_skipped_specs(tmp_path: Path) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-outside.ts"
    outside.write_text("")
    try:
        files, errors = plugins(tmp_path, [], [
            "./missing.ts", str(outside), "opencode-openai-codex-auth@1.0.0", "opencode-copilot-auth", str(tmp_path),
        ])
    finally:
        outside.unlink()
    assert files == []
    ws = tmp_path / "ws"
    assert errors == [
        LoadError(str(ws / "missing.ts"), f"Failed to load plugin ./missing.ts: {ws / 'missing.ts'} does not exist"),
        LoadError(str(outside), f"Failed to load plugin {outside}: {outside} resolves to {outside}, "
                                "outside the directories custom code may be loaded from"),
        LoadError(str(tmp_path), f"Failed to load plugin {tmp_path}: {tmp_path} is not a regular file"),
    ]


def test_fingerprint_tracks_mtime_size_and_membership(tmp_path: Path) -> None:
    a = touch(tmp_path / "tools" / "a.ts", "one")
    b = touch(tmp_path / "tools" / "b.ts", "two")
    files = [HostFile(str(a), "tool"), HostFile(str(b), "tool")]
    first = fingerprint(files)
    assert fingerprint([HostFile(str(a), "tool"), HostFile(str(b), "tool")]) == first
    assert len(first) == 64

    info = os.stat(a)
    os.utime(a, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000))
    touched = fingerprint(files)
    assert touched != first

    info = os.stat(b)
    b.write_text("three")  # same mtime, other size
    os.utime(b, ns=(info.st_atime_ns, info.st_mtime_ns))
    resized = fingerprint(files)
    assert resized != touched

    assert fingerprint(files[:1]) != resized
    assert fingerprint([HostFile(str(a), "plugin"), files[1]]) != resized
    b.unlink()
    assert fingerprint(files) != resized
    assert fingerprint([]) == fingerprint([])
