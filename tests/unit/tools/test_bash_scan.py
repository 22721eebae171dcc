"""bash permission analysis: arity prefixes, patterns/always per command, external directories."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_agent.tools import bash_scan
from sandbox_agent.tools.base import ToolError
from sandbox_agent.tools.bash_arity import ARITY, prefix
from sandbox_agent.tools.bash_scan import Scan, scan


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        ([], []),
        (["ls"], ["ls"]),
        (["ls", "-la", "/tmp"], ["ls"]),
        (["unknowncmd", "a", "b"], ["unknowncmd"]),
        (["python3", "x.py"], ["python3"]),
        (["python", "-m", "pytest"], ["python", "-m"]),
        (["git", "checkout", "main"], ["git", "checkout"]),
        (["git", "config", "user.name", "x"], ["git", "config", "user.name"]),
        (["git", "stash", "pop"], ["git", "stash", "pop"]),
        (["npm", "install", "left-pad"], ["npm", "install"]),
        (["npm", "run", "dev", "--", "--port", "3"], ["npm", "run", "dev"]),
        (["npm", "run"], ["npm", "run"]),
        (["docker", "compose", "up", "-d"], ["docker", "compose", "up"]),
        (["docker", "ps", "-a"], ["docker", "ps"]),
        (["aws", "s3", "ls", "bucket"], ["aws", "s3", "ls"]),
        (["gh", "pr", "list", "--all"], ["gh", "pr", "list"]),
        (["bun", "x", "vite", "build"], ["bun", "x", "vite"]),
        (["redis-cli", "ping", "x"], ["redis-cli", "ping"]),
        (["kubectl", "rollout", "restart", "deploy/api"], ["kubectl", "rollout", "restart"]),
        (["cargo"], ["cargo"]),
        (["sudo", "rm", "x"], ["sudo"]),
    ],
)
def test_arity_prefix(tokens: list[str], expected: list[str]) -> None:
    assert prefix(tokens) == expected


def test_arity_table_matches_the_reference_sizes() -> None:
    assert sum(1 for v in ARITY.values() if v == 1) == 25
    assert sum(1 for v in ARITY.values() if v == 2) == 64
    assert sum(1 for v in ARITY.values() if v == 3) == 47
    assert "python3" not in ARITY
    assert ARITY["git stash"] == 3


def run_scan(command: str, project: Path, *, cwd: Path | None = None, worktree: str = "/") -> Scan:
    return scan(command, str(cwd or project), str(project), worktree)


@pytest.mark.parametrize(
    ("command", "patterns", "always"),
    [
        ("echo hello", ["echo hello"], ["echo *"]),
        ("ls -la | grep foo | wc -l", ["ls -la", "grep foo", "wc -l"], ["ls *", "grep *", "wc *"]),
        ("git status && git diff HEAD || true", ["git status", "git diff HEAD", "true"],
         ["git status *", "git diff *", "true *"]),
        ("echo hi > out.txt", ["echo hi > out.txt"], ["echo *"]),
        ("npm run build 2>&1 | tail -5", ["npm run build 2>&1", "tail -5"], ["npm run build *", "tail *"]),
        ("cat <<EOF > notes.txt\nline one\nline two\nEOF", ["cat <<EOF > notes.txt\nline one\nline two\nEOF"],
         ["cat *"]),
        ("FOO=bar BAZ=1 npm test", ["FOO=bar BAZ=1 npm test"], ["npm test *"]),
        ("for i in 1 2 3; do echo $i; done", ["echo $i"], ["echo *"]),
        ("while true; do sleep 1; done", ["true", "sleep 1"], ["true *", "sleep *"]),
        ("echo $(whoami)", ["echo $(whoami)", "whoami"], ["echo *", "whoami *"]),
        ('echo "user: $(id -un)"', ['echo "user: $(id -un)"', "id -un"], ["echo *", "id *"]),
        ("echo `date`", ["echo `date`", "date"], ["echo *", "date *"]),
        ("x=$(pwd)", ["pwd"], ["pwd *"]),
        ("(cd sub; make test)", ["make test"], ["make test *"]),
        ("if [ -f x ]; then rm x; fi", ["rm x"], ["rm *"]),
        ("f() { ls; }; f", ["ls", "f"], ["ls *", "f *"]),
        ("ls; ls; ls -la", ["ls", "ls -la"], ["ls *"]),
        ("git log -5 && git log --oneline", ["git log -5", "git log --oneline"], ["git log *"]),
        ("python -m pytest -q", ["python -m pytest -q"], ["python -m *"]),
        ("python3 -m pytest -q", ["python3 -m pytest -q"], ["python3 *"]),
        ("echo 'single quoted' \"double\" a\"b\"c", ["echo 'single quoted' \"double\" a\"b\"c"], ["echo *"]),
        ("cd sub && ls", ["ls"], ["ls *"]),
        ("ls # trailing comment", ["ls"], ["ls *"]),
        ('echo "unterminated', ["echo"], ["echo *"]),
    ],
)
def test_patterns_and_always(command: str, patterns: list[str], always: list[str], project: Path) -> None:
    found = run_scan(command, project)
    assert found.patterns == patterns
    assert found.always == always
    assert found.external_dirs == []


@pytest.mark.parametrize(
    "command", ["cd sub", "cd", "cd sub && cd -", "# only a comment", "# one\n# two\n", "", "  \n"]
)
def test_commands_that_ask_nothing(command: str, project: Path) -> None:
    assert run_scan(command, project) == Scan([], [], [])


def test_heredoc_body_with_substitution_adds_the_inner_command(project: Path) -> None:
    found = run_scan("cat <<EOF\n$(whoami)\nEOF", project)
    assert found.patterns == ["cat <<EOF\n$(whoami)\nEOF", "whoami"]
    assert found.always == ["cat *", "whoami *"]


def test_a_continuation_is_shown_as_written_and_checked_as_bash_joins_it(project: Path) -> None:
    found = run_scan("r\\\nm -f x", project)
    assert found.patterns == ["r\\\nm -f x"]  # as written: the text upstream shows the user
    assert "rm -f x" in found.checks  # what bash runs, matched against the rules too
    multi_line = run_scan("docker run \\\n  --rm img", project)
    assert multi_line.patterns == ["docker run \\\n  --rm img"]
    assert "docker run --rm img" in multi_line.checks


def test_non_ascii_command_text(project: Path) -> None:
    found = run_scan("echo 'héllo ✓' | grep é", project)
    assert found.patterns == ["echo 'héllo ✓'", "grep é"]


def test_external_file_asks_for_its_parent(project: Path, outside: Path) -> None:
    found = run_scan(f"rm {outside}/file.txt", project)
    assert found.external_dirs == [str(outside)]
    assert found.patterns == [f"rm {outside}/file.txt"]
    assert found.always == ["rm *"]


def test_external_directory_asks_for_itself(project: Path, outside: Path) -> None:
    found = run_scan(f"cp -r {outside}/dir {outside}/file.txt .", project)
    assert found.external_dirs == [str(outside / "dir"), str(outside)]


def test_relative_path_leaving_the_project(project: Path, outside: Path) -> None:
    assert run_scan("cat ../outside/file.txt", project).external_dirs == [str(outside)]


def test_relative_paths_resolve_against_the_workdir(project: Path, outside: Path) -> None:
    (project / "sub").mkdir()
    (project / "sub" / "a.txt").write_text("a")
    found = run_scan("cat a.txt", project, cwd=project / "sub")
    assert found.external_dirs == []
    found = run_scan("cat file.txt", project, cwd=outside)
    assert found.external_dirs == [str(outside)]  # the workdir itself, then the same dir again (deduped)


def test_symlink_inside_project_pointing_outside(project: Path, outside: Path) -> None:
    os.symlink(outside / "dir", project / "link")
    assert run_scan("touch link", project).external_dirs == [str(outside / "dir")]


def test_missing_paths_and_inside_paths_ask_nothing(project: Path, outside: Path) -> None:
    (project / "in.txt").write_text("x")
    found = run_scan(f"rm in.txt {outside}/missing/x.txt /definitely/not/here", project)
    assert found.external_dirs == []
    # Like `realpath`, a missing last component still resolves: its parent is asked for.
    assert run_scan(f"rm {outside}/missing.txt", project).external_dirs == [str(outside)]


def test_flags_and_chmod_plus_modes_are_not_paths(project: Path, outside: Path) -> None:
    os.symlink(outside, project / "+x")
    os.symlink(outside, project / "-f")
    assert run_scan("chmod +x file", project).external_dirs == []
    assert run_scan("rm -f file", project).external_dirs == []
    # `+x` is only skipped for chmod.
    assert run_scan("touch +x", project).external_dirs == [str(outside)]


def test_only_listed_commands_are_checked(project: Path, outside: Path) -> None:
    assert run_scan(f"ls {outside} && head {outside}/file.txt", project).external_dirs == []
    assert run_scan(f"mkdir -p {outside}/dir", project).external_dirs == [str(outside / "dir")]
    assert run_scan(f"chown me {outside}/file.txt", project).external_dirs == [str(outside)]


def test_cd_into_an_outside_directory_asks_for_it_but_not_for_bash(project: Path, outside: Path) -> None:
    found = run_scan(f"cd {outside}/dir", project)
    assert found == Scan([], [], [str(outside / "dir")])


def test_nested_commands_are_checked_too(project: Path, outside: Path) -> None:
    found = run_scan(f"for f in a b; do rm {outside}/file.txt; done; echo $(cat {outside}/dir)", project)
    assert found.external_dirs == [str(outside), str(outside / "dir")]


def test_quoted_arguments_are_not_unquoted(project: Path, outside: Path) -> None:
    # Tokens keep their quotes, so the path resolved is `<cwd>/"<path>"`, which does not exist.
    assert run_scan(f'rm "{outside}/file.txt"', project).external_dirs == []


def test_root_is_outside(project: Path) -> None:
    assert run_scan("rm -rf /", project).external_dirs == ["/"]


def test_external_dirs_are_deduplicated_in_first_seen_order(project: Path, outside: Path) -> None:
    found = run_scan(f"rm {outside}/file.txt; rm {outside}/dir {outside}/file.txt; touch {outside}", project)
    assert found.external_dirs == [str(outside), str(outside / "dir")]


def test_worktree_counts_as_inside_unless_it_is_root(project: Path, outside: Path, tmp_path: Path) -> None:
    command = f"rm {outside}/file.txt"
    assert run_scan(command, project, worktree=str(tmp_path)).external_dirs == []
    assert run_scan(command, project, worktree="/").external_dirs == [str(outside)]


def test_workdir_outside_the_project_comes_first(project: Path, outside: Path) -> None:
    found = run_scan("rm ../file.txt; ls", project, cwd=outside / "dir")
    assert found.external_dirs == [str(outside / "dir"), str(outside)]
    assert found.patterns == ["rm ../file.txt", "ls"]


def test_workdir_is_not_realpathed(project: Path, outside: Path) -> None:
    # The workdir is added as given, even when it does not exist.
    assert run_scan("ls", project, cwd=outside / "nope").external_dirs == [str(outside / "nope")]


def test_workdir_inside_the_project_asks_nothing(project: Path) -> None:
    (project / "sub").mkdir()
    assert run_scan("ls", project, cwd=project / "sub").external_dirs == []


def test_parse_failure(monkeypatch: pytest.MonkeyPatch, project: Path) -> None:
    class Broken:
        def __init__(self, *_: object) -> None:
            pass

        def parse(self, _: bytes) -> None:
            raise ValueError("boom")

    monkeypatch.setattr(bash_scan, "Parser", Broken)
    with pytest.raises(ToolError) as caught:
        run_scan("ls", project)
    assert str(caught.value) == "Failed to parse command"


def test_cd_to_the_parent_asks_external_directory_only(project: Path) -> None:
    assert run_scan("cd ..", project) == Scan([], [], [str(project.parent)])


# -- what runs, normalised (bash_normalise) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "checks", "always"),
    [
        ("ls -la", [], ["ls *"]),
        ("/bin/rm -f x", ["rm -f x"], ["/bin/rm *", "rm *"]),
        ("env -i X=1 nice -n 5 rm x", ["rm x", "nice -n 5 rm x"], ["env *", "nice *", "rm *"]),
        ("sh -c 'git push origin'", ["sh -c git push origin", "git push origin"], ["sh *", "git push *"]),
        ("echo x | xargs -0 rm", ["rm"], ["echo *", "xargs *", "rm *"]),
        ("find . -name '*.o' -delete", ["find . -name *.o -delete", "rm"], ["find *", "rm *"]),
        ("git -c alias.p=push p origin", ["git push origin"], ["git -c *", "git push *"]),
        ("\\* x", ["* x"], ["\\* *"]),
    ],
)
def test_normalised_forms_are_checks_and_bring_their_arity_prefix(
    command: str, checks: list[str], always: list[str], project: Path,
) -> None:
    found = run_scan(command, project)
    assert sorted(found.checks) == sorted(checks)
    assert found.always == always
    assert found.unknown == []


@pytest.mark.parametrize("command", [
    "$(echo rm) x", "eval \"$x\"", "source env.sh", ". ./env.sh", "sh build.sh", "echo ls | sh", "bash <<< ls",
    "sh -c \"$1\"", "{rm,x}", "r? x", "echo x | xargs -I{} {}", "env $OPTS rm x", "git -c \"$K\" st",
])
def test_a_command_whose_name_is_known_only_when_it_runs_is_reported(command: str, project: Path) -> None:
    assert run_scan(command, project).unknown


@pytest.mark.parametrize("command", ["xargs -I", "timeout", "env -S", "find . -exec", "git -c", "trap", "su -c",
                                     "sh -o", "flock", "chrt -p", "watch -n", "env -u"])
def test_an_option_missing_its_value_is_no_crash(command: str, project: Path) -> None:
    run_scan(command, project)


def test_a_respelled_path_command_still_asks_for_outside_directories(project: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "f").write_text("x")
    assert run_scan(f"env rm {outside}/f", project).external_dirs == [str(outside)]
    assert run_scan(f"sh -c 'cat {outside}/f'", project).external_dirs == [str(outside)]


def test_the_grammar_loads_without_the_tree_sitter_bash_package_and_its_imports() -> None:
    # A fresh interpreter (this one may hold the package already): the grammar parses, and neither the package's
    # __init__ nor what it imports (importlib.resources, pathlib, tempfile: 0.6 MiB of the agent) ever loaded.
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    code = ("import sys\n"
            "from sandbox_agent.tools.bash_scan import scan\n"
            "print(scan('echo hi && git status', '/tmp', '/tmp', '/tmp').patterns)\n"
            "print([m for m in ('tree_sitter_bash', 'importlib.resources', 'tempfile') if m in sys.modules])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'sandbox-image'}"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['echo hi', 'git status']", "[]"]
