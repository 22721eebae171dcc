"""What a SandboxService.Exec runs, read the way the `bash` tool reads its commands.

The `bash` tool's rules hold against respellings (`/bin/rm`, `env rm`, `sh -c 'rm f'`, `$(echo rm)`...)
because the agent parses each command with tree-sitter-bash and reduces every simple command to what
runs (sandbox_agent/tools/bash_normalise.py). Exec's `exec` patterns go through that same reader here, on
the control plane's side, so an Exec is matched command by command before anything reaches the sandbox.

Only the parsing part of the agent's scan is used: the scan also resolves paths (for its
external-directory asks), which on this side would be the host's filesystem.

What the reader cannot know before the command runs (`unknown`) is answered by the strictest `exec`
rule, as the bash tool answers it with the strictest `bash` rule. Exec adds one case the bash tool has
no need for: a program that reads its code from the Exec's standard input (`python3`, `perl`, `sh -s`...),
which the client can feed after any check.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

import tree_sitter_bash
from tree_sitter import Language, Parser

from controlplane.core.permissions.exec_policy import CommandReading
from sandbox_agent.tools.bash_continuations import joined
from sandbox_agent.tools.bash_normalise import Context, Form, Normaliser
from sandbox_agent.tools.bash_programs import statement
from sandbox_agent.tools.bash_runners import RUNNERS
from sandbox_agent.tools.bash_words import literal

_LANGUAGE = Language(tree_sitter_bash.language())
STDIN_PATHS = re.compile(r"-|/dev/stdin|/dev/fd/0|/proc/(self|thread-self|\d+)/fd/0")
"""Names of the standard input as a file a program may be told to run."""
INTERPRETERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    # family: (options whose value is the code to run, options whose next word is their value)
    "python": (frozenset({"-c", "-m"}), frozenset({"-W", "-X", "--check-hash-based-pycs"})),
    "pypy": (frozenset({"-c", "-m"}), frozenset({"-W", "-X"})),
    "perl": (frozenset({"-e", "-E"}), frozenset({"-I"})),
    "ruby": (frozenset({"-e"}), frozenset({"-I", "-r", "-C", "-E", "--encoding"})),
    "node": (frozenset({"-e", "--eval", "-p", "--print"}),
             frozenset({"-r", "--require", "--import", "--loader", "-C", "--conditions", "--input-type"})),
    "nodejs": (frozenset({"-e", "--eval", "-p", "--print"}), frozenset({"-r", "--require", "--import", "--loader"})),
    "bun": (frozenset({"-e", "--eval", "-p", "--print", "run", "x", "test", "build", "install", "add"}),
            frozenset({"-r", "--preload", "--cwd", "--config", "-c"})),
    "deno": (frozenset({"eval", "run", "test", "task", "compile", "fmt", "lint"}), frozenset({"--config", "-c"})),
    "php": (frozenset({"-r", "-f", "-S"}), frozenset({"-c", "-d", "-z", "-t"})),
    "lua": (frozenset({"-e"}), frozenset({"-l"})),
    "luajit": (frozenset({"-e", "-b"}), frozenset({"-l", "-j", "-O"})),
    "tclsh": (frozenset(), frozenset({"-encoding"})),
    "wish": (frozenset(), frozenset({"-encoding", "-display", "-name"})),
    "expect": (frozenset({"-c", "-f"}), frozenset()),
    "Rscript": (frozenset({"-e"}), frozenset()),
    "R": (frozenset({"-e", "-f", "--file"}), frozenset()),
    "guile": (frozenset({"-c", "-s"}), frozenset({"-L", "-l", "-e", "-x", "-C"})),
    "julia": (frozenset({"-e", "-E", "--eval", "--print"}), frozenset({"-L", "--load", "-p", "-t", "--project"})),
    "m4": (frozenset(), frozenset({"-D", "-U", "-I", "-s", "-F", "-R", "-o", "-l", "-L", "-d", "-t"})),
    "dc": (frozenset({"-e", "--expression", "-f", "--file"}), frozenset()),
    "sbcl": (frozenset({"--eval", "--script", "--load"}), frozenset({"--core", "--dynamic-space-size"})),
    "clisp": (frozenset({"-x"}), frozenset({"-M", "-m", "-L", "-E", "-i"})),
    "make": (frozenset(), frozenset()),  # only `-f -` (a makefile read from stdin) is code from stdin
    "awk": (frozenset(), frozenset()),  # awk's program is its first argument; only `-f -` reads it from stdin
    "sed": (frozenset(), frozenset()),
}
"""Programs that run code from a file, an option, or (with neither) their standard input, by family
(`python3.11` is `python`, `gawk` is `awk`)."""
FAMILY = re.compile(r"(?P<family>python|pypy|perl|ruby|node|nodejs|bun|deno|php|lua|luajit|tclsh|wish|expect|Rscript|R|"
                    r"guile|julia|m4|dc|sbcl|clisp|make|gmake|awk|gawk|mawk|nawk|busybox-awk|sed|gsed)[\d.]*")
FILE_ONLY = frozenset({"make", "gmake", "awk", "gawk", "mawk", "nawk", "busybox-awk", "sed", "gsed"})
"""Families whose first argument is not a script: only an `-f` naming the standard input reads code from it."""
CONSOLES = frozenset({"ed", "red", "ex", "vi", "vim", "nvim", "view", "rvim", "gdb", "sqlite3", "psql", "mysql",
                      "ftp", "sftp", "irb", "jshell", "ghci", "bc", "parallel", "at", "batch"})
"""Programs that take commands (some run shell commands: `!cmd`, `.shell`) on their standard input whatever
their arguments."""
INTERACTIVE = frozenset({"-i", "--interactive", "-a", "--repl"})
"""Options that make an interpreter read commands from its standard input even with a script."""
INFORMATIONAL = frozenset({"--version", "--help", "-V", "-h", "--usage"})
"""An interpreter asked only for its version or help runs nothing."""


def read_command(argv: Sequence[str], command: str, env: Mapping[str, str], stdin: bool = True) -> CommandReading:
    """Every command the Exec may run, as written and normalised, and why some are not known; with `stdin`
    (the Exec takes one: without, the command's stdin is /dev/null), programs that would read code from it.

    `command` runs as `bash -c COMMAND` (the agent's shell), `argv` directly: it is read as the shell
    line `shlex.join(argv)`, which a shell splits back into exactly `argv`.
    """
    text = command or shlex.join(argv)
    # A Parser is cheap and not safe to share between threads (long commands are read off the loop).
    parser = Parser(_LANGUAGE)
    normaliser = Normaliser(lambda script: parser.parse(script.encode("utf-8", "surrogatepass")).root_node,
                            RUNNERS, statement)
    for name, value in env.items():
        # The Exec's environment is the command's, as `env NAME=value command` would set it (PATH, LD_PRELOAD,
        # BASH_ENV, GIT_SSH_COMMAND, BASH_FUNC_ls%%... are followed or make the command unknown).
        normaliser.variable(name, literal(value), Context())
    tree = parser.parse(text.encode("utf-8", "surrogatepass"))
    if tree.root_node.has_error:
        normaliser.opaque("part of the command does not parse, so what it runs is not known")
    written: dict[str, None] = {}
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        statement(normaliser, node)
        if node.type == "command":
            parent = node.parent
            shown = parent if parent is not None and parent.type == "redirected_statement" else node
            written[(shown.text or b"").decode("utf-8", "replace")] = None
            normaliser.command(node)
        stack.extend(reversed(node.children))
    follow = joined(text, tree.root_node)
    if follow != text:
        normaliser.script(follow, Context())  # what bash runs once it joined the continuations: checked too
    for form in list(normaliser.forms.values()) if stdin else ():
        why = reads_code_from_stdin(form) if form.name else ""
        if why:
            normaliser.opaque(why)
    texts = [*written, *(t for t in normaliser.forms if t not in written)]
    return CommandReading(text=text, texts=tuple(texts), unknown=tuple(normaliser.unknown))


def reads_code_from_stdin(form: Form) -> str:
    """Why the program of `form` may run code the client sends on the Exec's stdin after the check ("" if not)."""
    name = form.name
    values = [w.value for w in form.args]
    if name in CONSOLES:
        return f"{name} takes commands on its standard input"
    found = FAMILY.fullmatch(name)
    if found is None or any(v in INFORMATIONAL for v in values):
        return ""
    family = found.group("family")
    if family in FILE_ONLY:
        return _file_option_is_stdin(name, values)
    code, valued = INTERPRETERS[family]
    i = 0
    while i < len(values):
        value = values[i]
        if value is None:
            return f"{name} has an argument known only when it runs"
        if value in INTERACTIVE or (family == "perl" and value.startswith("-d")):
            return f"{name} {value} reads commands from its standard input"
        if value == "--":
            i += 1
            break
        option = value.split("=", 1)[0]
        if option in ("-f", "--file") and option in code:
            return _file_option_is_stdin(name, values)  # `php -f -`: a script file, which may be stdin
        if option in code or (family == "perl" and value.startswith("-") and not value.startswith("--")
                              and ("e" in value or "E" in value)):
            return ""
        if any(value.startswith(c) and len(c) == 2 for c in code if not value.startswith("--")):
            return ""  # the code attached to its option (`-cprint(1)`)
        if value.startswith("-") and value != "-":
            i += 2 if option in valued and "=" not in value else 1
            continue
        break
    if i >= len(values):
        return f"{name} without a script reads its code from its standard input"
    script = values[i]
    if script is None:
        return f"{name} runs a script named only when it runs"
    if STDIN_PATHS.fullmatch(script):
        return f"{name} runs {script!r}, which is its standard input"
    return ""


def _file_option_is_stdin(name: str, values: Sequence[str | None]) -> str:
    """`-f FILE` / `--file=FILE` naming the standard input (awk, sed, make)."""
    for i, value in enumerate(values):
        if value is None:
            return f"{name} has an argument known only when it runs"
        target: str | None = None
        if value in ("-f", "--file", "--makefile"):
            target = values[i + 1] if i + 1 < len(values) else ""
        elif value.startswith(("--file=", "--makefile=")):
            target = value.split("=", 1)[1]
        elif value.startswith("-f") and not value.startswith("--"):
            target = value[2:]
        if target is None:
            continue
        if not target or STDIN_PATHS.fullmatch(target):
            return f"{name} -f {target!r} reads its program from its standard input"
    return ""
