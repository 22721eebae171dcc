"""What a bash command really runs, in the form permission rules are written for.

Upstream matches rules against each simple command as written, so `/bin/rm f`, `\\rm f`, `env rm f` or
`sh -c 'rm f'` all escape an `rm *` rule. Here each simple command is also reduced to what runs: the
program's name without its path, quotes or backslashes, the words after any transparent wrapper (`env`,
`nice`, `timeout`, `xargs`, ...), and the commands of any script it hands to another program where that
script is literal text (`sh -c`, `eval`, `find -exec`, `git -c alias.x=!...`, `trap`, ...). Each of these
forms is matched against the rules too (`Normaliser.forms`).

A command whose name only the running shell knows (an expansion or a substitution in command position,
`eval "$x"`, `source f`, `sh script.sh`, a shell reading its commands from standard input) cannot be
matched against anything: it is reported in `Normaliser.unknown`, and the permission check then applies
the strictest rule the ruleset has for bash.

What the rules cannot see (a program that runs a file or code of its own, `./x.sh`, `python -c`,
configuration the model wrote into the workspace) is the sandbox's to contain: docs/security.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from tree_sitter import Node

from sandbox_agent.tools.bash_words import Word, assignments, command_words

MAX_DEPTH = 8
"""Scripts inside scripts (`sh -c "sh -c '...'"`) are followed this deep; deeper is a name not known."""
MAX_NESTED_CHARS = 100_000
"""Nested script text parsed in all, per command; more is treated as a name not known."""
PROGRAM_VARIABLES = frozenset({
    "GIT_SSH_COMMAND", "GIT_SSH", "GIT_PAGER", "GIT_EDITOR", "GIT_SEQUENCE_EDITOR", "GIT_EXTERNAL_DIFF",
    "GIT_ASKPASS", "SSH_ASKPASS", "PAGER", "MANPAGER", "EDITOR", "VISUAL", "BROWSER", "LESSOPEN", "LESSCLOSE",
    "PROMPT_COMMAND", "GIT_PROXY_COMMAND",
})
"""Environment variables whose value is a command another program runs (`GIT_EDITOR='x' git commit`)."""
PROMPT_VARIABLES = frozenset({"PS0", "PS1", "PS2", "PS3", "PS4"})
"""Prompts: bash expands them (PS4 for each `set -x` line), running the substitutions they hold."""
FILE_VARIABLES = frozenset({"BASH_ENV", "ENV", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PYTHONSTARTUP",
                            "NODE_OPTIONS", "PERL5OPT", "GIT_EXEC_PATH", "GIT_DIR", "GIT_TEMPLATE_DIR", "PATH",
                            "GIT_ALLOW_PROTOCOL", "BASH_ALIASES", "BASH_CMDS"})
"""Environment variables that make a program load or run a file, or look programs up elsewhere."""
LOADER = re.compile(r"ld[-\w.]*\.so[\w.]*")
"""The dynamic loader's names (`ld-linux-x86-64.so.2`, `ld.so`, `ld-musl-x86_64.so.1`): it runs the program
named by its first argument, so it is one more wrapper (its handler is the one `RUNNERS` has for `ld.so`)."""
MAX_FORMS = 2_000
"""Forms collected per command; a command that yields more is treated as not known."""


@dataclass(frozen=True)
class Form:
    """One program run, normalised: its name and arguments."""

    name: str
    """Empty for a nested command's text as written (matched, but no arity prefix of its own)."""
    args: tuple[Word, ...]
    text: str
    """`name` and the arguments' values, space-separated: what the rules are matched against."""
    respelled: bool
    """Not the command as the user wrote it (path, quotes, a wrapper or a nested script were removed)."""

    @property
    def tokens(self) -> list[str]:
        """The name and the arguments with known values (as upstream's tokens, for the arity prefix)."""
        return [self.name, *(w.value for w in self.args if w.value is not None)]


@dataclass(frozen=True)
class Context:
    depth: int = 0
    placeholders: tuple[str, ...] = ()
    """Strings the runner replaces with run-time text (`{}` of find and xargs -I): a name holding one is unknown."""
    appended: bool = False
    """The runner appends words only known at run time (xargs, find -exec +): a wrapper's command may come from them."""


Handler = Callable[["Normaliser", str, list[Word], Context], "tuple[list[Word], Context] | None"]
"""Given a program's name and arguments: the words of the command it runs next, or None (nothing more, or
what it runs was followed already through `Normaliser.script`, or reported unknown)."""


@dataclass
class Normaliser:
    parse: Callable[[str], Node]
    """Parses a script's text into a tree-sitter-bash tree (its root node)."""
    handlers: Mapping[str, Handler]
    """By program name: how to find the command a program runs (bash_runners.RUNNERS)."""
    statement: Callable[[Normaliser, Node], None] | None = None
    """Called with every node of the script and of nested scripts: checks of shell syntax that is not a
    simple command (`declare`, `[[ ]]`, assignments; bash_programs.statement)."""
    forms: dict[str, Form] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)
    """Why a command's name cannot be known before it runs, one reason per case."""
    _nested_chars: int = 0

    def command(self, node: Node) -> None:
        """Normalises one `command` node of the script being asked about."""
        for name, value in assignments(node):
            self.variable(name, value, Context())
        self.run(command_words(node), Context(), respelled=False)

    def variable(self, name: str, value: Word, ctx: Context) -> None:
        """An assignment in a command's environment: a command it names is followed, a file it names is not known."""
        if name in PROMPT_VARIABLES:
            # bash expands a prompt (`set -x` prints PS4), running any substitution it holds.
            if value.value is None:
                self.opaque(f"{name} holds a prompt known only when it runs")
            elif any(s in value.value for s in ("$(", "`", "<(", ">(")):
                self.script(value.value, ctx)
        elif name in PROGRAM_VARIABLES or name.startswith("GIT_CONFIG"):
            if value.value is None or name.startswith("GIT_CONFIG"):
                self.opaque(f"{name} names a program known only when it runs")
            elif value.value:
                self.script(value.value, ctx)
        elif name.startswith("BASH_FUNC_"):
            # bash imports `BASH_FUNC_ls%%=() { ...; }` from its environment as a function `ls` that shadows
            # the command of that name (only `env` can set such a name): what `ls` then runs is not on the line.
            self.opaque(f"{name} defines a function that a bash started with it runs in place of a command")
        elif name in FILE_VARIABLES and value.value != "":
            # A command-prefix PATH or preload changes what a name runs: no rule can see the file.
            self.opaque(f"{name} makes the command run or load files that permission rules cannot read")

    def run(self, words: list[Word], ctx: Context, *, respelled: bool = True) -> None:
        """Follows one command through its wrappers, adding a form per program on the way."""
        while words:
            head, args = words[0], words[1:]
            name = program_name(head, ctx)
            if name is None:
                self.opaque(f"the command name {head.raw!r} is known only when it runs")
                return
            self.add(name, args, respelled=respelled or head.value != head.raw or name != head.value)
            handler = self.handlers.get(name) or (self.handlers.get("ld.so") if LOADER.fullmatch(name) else None)
            if handler is None:
                return
            following = handler(self, name, args, ctx)
            if following is None:
                return
            words, ctx = following
            respelled = True

    def script(self, text: str, ctx: Context) -> None:
        """Follows every command of a script another program runs (`sh -c TEXT`, `eval TEXT`, ...)."""
        self._nested_chars += len(text)
        if ctx.depth >= MAX_DEPTH or self._nested_chars > MAX_NESTED_CHARS:
            self.opaque("scripts nested too deep or too long to follow")
            return
        root = self.parse(text)
        if root.has_error:
            # bash may still run the commands before the error: follow them, and count the rest unknown.
            self.opaque("a nested script that does not parse")
        inner = replace(ctx, depth=ctx.depth + 1, appended=False)
        stack = [root]
        while stack:
            node = stack.pop()
            if self.statement is not None:
                self.statement(self, node)
            if node.type == "command":
                parent = node.parent
                shown = parent if parent is not None and parent.type == "redirected_statement" else node
                words = command_words(node)
                for name, value in assignments(node):
                    self.variable(name, value, inner)
                self.run(words, inner)
                if words and words[0].value != "cd":
                    # As written too, so a rule spelled with quotes still meets the nested command.
                    raw = (shown.text or b"").decode("utf-8", "replace")
                    self.forms.setdefault(raw, Form("", (), raw, True))
            stack.extend(reversed(node.children))

    def add(self, name: str, args: list[Word], *, respelled: bool) -> None:
        if name == "cd":
            return  # upstream asks nothing for cd (its path is the external-directory check's)
        if len(self.forms) >= MAX_FORMS:
            self.opaque("too many commands to follow")
            return
        text = " ".join([name, *(w.shown for w in args)])
        self.forms.setdefault(text, Form(name, tuple(args), text, respelled))

    def opaque(self, why: str) -> None:
        if why not in self.unknown:
            self.unknown.append(why)


def program_name(word: Word, ctx: Context) -> str | None:
    """The command name the shell looks up for `word` (a path reduced to its last part); None if not known."""
    value = word.value
    if value is None or word.pattern or not value or any(p in value for p in ctx.placeholders):
        return None
    return value.rstrip("/").rsplit("/", 1)[-1] or value


# -- option parsing -------------------------------------------------------------------------------------


def long_name(value: str, table: frozenset[str]) -> str | None:
    """The option of `table` that `--name` or `--name=v` spells: itself, or the one option it is a prefix of
    (getopt_long accepts any unambiguous abbreviation); None when it is none of them or ambiguous."""
    name = value.split("=", 1)[0]
    if name in table:
        return name
    matches = [o for o in table if o.startswith("--") and o.startswith(name)]
    return matches[0] if len(matches) == 1 else None


def parse_options(args: list[Word], with_arg: frozenset[str], flags: frozenset[str] | None = None,
                  optional: frozenset[str] = frozenset()) -> tuple[int, list[tuple[str, str | None]]] | None:
    """Reads a program's options as getopt_long does: the index of the first word after them (`--` ends them)
    and each option by its full name with its value; None if an option is not known.

    `with_arg`: options whose value is the next word unless attached (`-n 5`, `-n5`, `--adjust=5`, `--adj 5`);
    `optional`: options whose value is only ever attached (`-i{}`, `--replace=X`); `flags`: the other options,
    `-NUM` meaning a number is one (`nice -5`). A long option is matched by unique prefix against the whole
    table; one that is unknown or ambiguous, or a short option not in the table, makes the result None (the
    caller reports the command not known), since skipping it would read its value as the command. Without
    `flags` a short option not in `with_arg` counts as a flag, long options must still be in the table.
    """
    table = with_arg | optional | (flags or frozenset())
    found: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        value = args[i].value
        if value is None:
            return None
        if value == "--":
            return i + 1, found
        if not value.startswith("-") or value == "-":
            return i, found
        if value.startswith("--"):
            option = long_name(value, table)
            if option is None:
                return None
            if "=" in value:
                if option not in with_arg and option not in optional:
                    return None  # getopt refuses a value for a flag: do not guess what runs
                found.append((option, value.split("=", 1)[1]))
                i += 1
            elif option in with_arg:
                found.append((option, args[i + 1].value if i + 1 < len(args) else None))
                i += 2
            else:
                found.append((option, None))
                i += 1
            continue
        if flags is not None and "-NUM" in flags and value[1:].isdigit():
            found.append(("-NUM", value[1:]))
            i += 1
            continue
        step = 1
        for k, c in enumerate(value[1:], 2):
            option = f"-{c}"
            if option in with_arg:
                attached = value[k:]
                found.append((option, attached or (args[i + 1].value if i + 1 < len(args) else None)))
                step = 1 if attached else 2
                break
            if option in optional:
                found.append((option, value[k:]))
                break
            if flags is not None and option not in flags:
                return None
            found.append((option, None))
        i += step
    return min(i, len(args)), found


def skip_options(args: list[Word], with_arg: frozenset[str], flags: frozenset[str] | None = None,
                 optional: frozenset[str] = frozenset()) -> int | None:
    """Index of the first word after a program's options; None if an option is not known (parse_options)."""
    parsed = parse_options(args, with_arg, flags, optional)
    return None if parsed is None else parsed[0]


def follow(n: Normaliser, name: str, rest: list[Word], ctx: Context, *, empty_runs_shell: bool = False,
           ) -> tuple[list[Word], Context] | None:
    """The command a wrapper runs: `rest`, or, when it gave none, what runs instead."""
    if rest:
        return rest, ctx
    if ctx.appended:
        n.opaque(f"{name} runs a command given only at run time")
    elif empty_runs_shell:
        n.opaque(f"{name} without a command runs a shell reading standard input")
    return None


def wrapper(with_arg: str = "", flags: str = "", *, positional: int = 0, no_command: str = "",
            optional: str = "", empty_runs_shell: bool = False) -> Handler:
    """A program that runs the command after its options (and `positional` words of its own). `with_arg`,
    `optional` and `flags` are its whole option table (parse_options): any other option is not known."""
    takes = frozenset(with_arg.split())
    others = frozenset(flags.split())
    attached = frozenset(optional.split())
    stops = frozenset(no_command.split())

    def handle(n: Normaliser, name: str, args: list[Word], ctx: Context) -> tuple[list[Word], Context] | None:
        parsed = parse_options(args, takes, others, attached)
        if parsed is None:
            n.opaque(f"{name} with an option not known here, or known only when it runs")
            return None
        start, found = parsed
        if any(option in stops for option, _ in found):
            return None  # an option that makes it run nothing (`command -v`, `taskset -p`)
        return follow(n, name, args[start + positional:], ctx, empty_runs_shell=empty_runs_shell)

    return handle
