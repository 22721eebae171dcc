"""More programs and shell features that run commands their name does not show (for bash_normalise).

- Launchers: the dynamic loader (`ld-linux-x86-64.so.2 /bin/rm f`), `start-stop-daemon`, `run-parts`,
  tracers and privilege or environment wrappers (`strace`, `fakeroot`, `tini`, `sg`, ...).
- Programs whose own script language can run a command: GNU sed's `e` command and `s///e` flag, GNU tar's
  `--checkpoint-action=exec=`, `--to-command`, `--use-compress-program`/`-I`, `--info-script`/`-F`.
  Both accept any unambiguous prefix of a long option (`--to-com=`), so a prefix counts as the option.
- Builtins that take variable names or arithmetic: bash evaluates an array subscript in them, and a
  subscript may hold a command substitution even inside single quotes (`declare 'a[$(rm f)]=1'`,
  `[[ -v 'a[$(rm f)]' ]]`, `printf -v`, `read`, `let`, `unset`, ...). A literal there that holds `$(`, a
  backquote or a process substitution is a command not known.
- Tables that change what a later name runs (`hash -p`, `enable -f`, `BASH_ALIASES`, `BASH_CMDS`): the
  names after them are not known.
"""

from __future__ import annotations

from tree_sitter import Node

from sandbox_agent.tools.bash_normalise import (
    FILE_VARIABLES,
    PROGRAM_VARIABLES,
    PROMPT_VARIABLES,
    Context,
    Handler,
    Normaliser,
    follow,
    skip_options,
    wrapper,
)
from sandbox_agent.tools.bash_words import Word, literal, word

Next = tuple[list[Word], Context] | None

EVALUATED = ("$(", "`", "<(", ">(")
"""What bash runs when it evaluates a subscript or an arithmetic expression held in a literal."""
NAME_TABLES = ("BASH_ALIASES", "BASH_CMDS")


def long_option(value: str, options: tuple[str, ...], exact: frozenset[str] = frozenset()) -> str | None:
    """The option of `options` that `value` (`--name` or `--name=v`) spells, counting an abbreviation as it
    (getopt and git accept any unambiguous prefix); None when it is none of them or another known option."""
    name = value.split("=", 1)[0]
    if not name.startswith("--") or len(name) < 3 or name in exact:
        return None
    return next((o for o in options if o.startswith(name)), None)


def _evaluated(value: str | None) -> bool:
    return value is not None and any(s in value for s in EVALUATED)


_LOADER_WITH_ARG = ("--library-path", "--inhibit-rpath", "--audit", "--preload", "--argv0",
                    "--glibc-hwcaps-prefix", "--glibc-hwcaps-mask")


def _loader(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    """`ld.so [OPTIONS] PROGRAM ARGS`: runs PROGRAM; libraries it is told to load are not known."""
    i = 0
    while i < len(args):
        value = args[i].value
        if value is None:
            n.opaque(f"{name} with an option known only when it runs")
            return None
        if value in ("--list", "--verify", "--help", "--version", "--list-tunables", "--list-diagnostics"):
            return None
        option = long_option(value, (*_LOADER_WITH_ARG, "--inhibit-cache"))
        if option in ("--preload", "--audit", "--library-path"):
            n.opaque(f"{name} loads libraries that permission rules cannot read")
            return None
        if value == "--":
            i += 1
            break
        if option is None and value.startswith("-"):
            n.opaque(f"{name} with an option it may read in a way not followed here")
            return None
        if option is None:
            break
        if option == "--argv0":
            argv0 = value.split("=", 1)[1] if "=" in value else (args[i + 1].value if i + 1 < len(args) else "")
            if argv0:
                n.run([literal(argv0), *args[i + (1 if "=" in value else 2) + 1:]], ctx)
        i += 1 if "=" in value or option == "--inhibit-cache" else 2
    return follow(n, name, args[i:], ctx)


def _exec(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    """`exec [-cl] [-a NAME] CMD`: runs CMD with NAME as its argv[0], which a multicall binary (`busybox`,
    `toybox`) acts on: the command is followed both as CMD and as NAME."""
    start = skip_options(args, frozenset({"-a"}), frozenset({"-c", "-l"}))
    if start is None:
        n.opaque("exec with an option known only when it runs")
        return None
    argv0 = next((args[j + 1] for j in range(start - 1)
                  if (args[j].value or "")[:1] == "-" and (args[j].value or "").endswith("a")), None)
    if argv0 is not None and start < len(args):
        n.run([argv0, *args[start + 1:]], ctx)
    return follow(n, name, args[start:], ctx)


def _start_stop_daemon(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    """`start-stop-daemon --start --exec PROG [--startas PROG] -- ARGS`: runs PROG with ARGS."""
    program: Word | None = None
    starts = False
    i = 0
    while i < len(args):
        value = args[i].value
        if value is None:
            n.opaque(f"{name} with an option known only when it runs")
            return None
        if value == "--":
            i += 1
            break
        opt = value.split("=", 1)[0]
        if value in ("-S", "--start"):
            starts = True
        elif opt.startswith("--"):
            # getopt: an abbreviation is the option (`--ex`, `--starta`); `--start` itself is exact.
            opt = long_option(value, ("--exec", "--startas"), frozenset({"--start"})) or opt
        if opt in ("-x", "--exec", "-a", "--startas"):
            given = literal(value.split("=", 1)[1]) if "=" in value else (args[i + 1] if i + 1 < len(args) else None)
            if program is None or opt in ("-a", "--startas"):
                program = given
            i += 1 if "=" in value else 2
            continue
        if value.startswith("-") and len(value) == 2 and value[1] in "pnucrdNPIkRsg":
            i += 2
            continue
        i += 1
    if not starts:
        return None
    if program is None:
        n.opaque(f"{name} runs a program known only when it runs")
        return None
    return [program, *args[i:]], ctx


def _run_parts(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    if not any(w.value in ("--test", "--list", "--help", "--version") for w in args):
        n.opaque("run-parts runs the files of a directory, which permission rules cannot read")
    return None


def _sg(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    """`sg GROUP [-c] COMMAND`: COMMAND is a script for /bin/sh."""
    rest = [w for w in args if w.value != "-"][1:]
    if rest and rest[0].value == "-c":
        rest = rest[1:]
    if not rest:
        n.opaque(f"{name} without a command runs a shell reading standard input")
    elif any(w.value is None for w in rest):
        n.opaque(f"{name} runs a script known only when it runs")
    else:
        n.script(" ".join(w.value or "" for w in rest), ctx)
    return None


def _entr(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    start = skip_options(args, frozenset(), frozenset("-a -c -d -n -p -r -s -z".split()))
    if start is None:
        n.opaque("entr with an option known only when it runs")
        return None
    if any(w.value == "-s" or ((w.value or "").startswith("-") and "s" in (w.value or "")[1:])
           for w in args[:start]):
        if start < len(args) and args[start].value is not None:
            n.script(args[start].value or "", ctx)
        else:
            n.opaque("entr -s runs a script known only when it runs")
        return None
    return follow(n, name, args[start:], ctx)


def _not_known(why: str, harmless: str = "") -> Handler:
    """A program that runs shell text it reads or schedules (`at`, `tmux new 'cmd'`): not known, unless
    every word is one of its `harmless` listing options."""
    quiet = frozenset(harmless.split())

    def handle(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
        if not args or any(w.value not in quiet for w in args):
            n.opaque(f"{name} {why}")
        return None

    return handle


def _multicall(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    """`toybox rm f`, `coreutils --coreutils-prog=rm f`: one binary that runs the tool it is told to."""
    first = args[0].value if args else None
    if first is not None and first.startswith("--coreutils-prog"):
        if "=" not in first:
            n.opaque(f"{name} runs a tool known only when it runs")
            return None
        return [literal(first.split("=", 1)[1]), *args[1:]], ctx
    return follow(n, name, args, ctx)


# -- sed -------------------------------------------------------------------------------------------------

_SED_SINGLE = frozenset("=dDgGhHnNpPxzFl{}")


def _sed_commands(script: str) -> tuple[list[str], bool]:
    """The commands a GNU sed script runs with `e CMD`, and whether it runs text only known when it runs
    (`e` alone, `s///e`) or could not be read (then also True: the strictest rule decides)."""
    found: list[str] = []
    i, size = 0, len(script)

    def to_eol(j: int) -> int:
        end = script.find("\n", j)
        return size if end < 0 else end

    def skip_delimited(j: int, delim: str) -> int:
        """Index after the next unescaped `delim` from j."""
        while j < size and script[j] != delim:
            j += 2 if script[j] == "\\" else 1
        return j + 1

    while i < size:
        ch = script[i]
        if ch in " \t\n;!}":
            i += 1
            continue
        if ch == "#":
            i = to_eol(i)
            continue
        while i < size and (script[i] in "0123456789$,~+ \t" or script[i] in "/\\"):
            if script[i] == "/":
                i = skip_delimited(i + 1, "/")
                while i < size and script[i] in "IM":
                    i += 1
            elif script[i] == "\\" and i + 1 < size:
                i = skip_delimited(i + 2, script[i + 1])
            else:
                i += 1
        while i < size and script[i] in "! \t":
            i += 1
        if i >= size:
            break
        ch = script[i]
        if ch == "e":
            text = script[i + 1:to_eol(i)].strip().rstrip(";")
            if text:
                found.append(text)
            else:
                return found, True
            i = to_eol(i)
        elif ch in "sy" and i + 1 < size:
            delim = script[i + 1]
            i = skip_delimited(skip_delimited(i + 2, delim), delim)
            while ch == "s" and i < size and script[i] in "gpiImMe0123456789w":
                if script[i] == "e":
                    return found, True
                if script[i] == "w":
                    i = to_eol(i)
                    break
                i += 1
        elif ch in "aicrRwWbtTv:":
            i = to_eol(i)
        elif ch in "qQLl":
            i += 1
            while i < size and script[i].isdigit():
                i += 1
        elif ch in _SED_SINGLE:
            i += 1
        else:
            return found, True  # not a command we know: do not guess what it does
    return found, False


def _sed(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    if any(w.value == "--sandbox" for w in args):
        return None  # GNU sed refuses e, r and w in sandbox mode
    scripts: list[str | None] = []
    operands: list[Word] = []
    i = 0
    while i < len(args):
        value = args[i].value
        if value is None:
            n.opaque("sed with an option known only when it runs")
            return None
        given = args[i + 1].value if i + 1 < len(args) else ""
        option = long_option(value, ("--expression", "--file", "--line-length"))
        if value == "--":
            operands.extend(args[i + 1:])
            break
        if option in ("--expression", "--file"):
            text = value.split("=", 1)[1] if "=" in value else given
            i += 1 if "=" in value else 2
            scripts.append(text if option == "--expression" else None)
            continue
        if option == "--line-length" or value.startswith("--") or value == "-":
            i += 1 if option is None or "=" in value else 2
            continue
        if value.startswith("-"):
            cluster = value[1:]
            cut = next((k for k, c in enumerate(cluster) if c in "efl"), None)
            if cut is None or cluster[0] == "i":
                i += 1  # flags, or `-i.bak`/`-isuffix` whose suffix is attached
                continue
            attached = cluster[cut + 1:]
            text = attached or given
            i += 1 if attached else 2
            if cluster[cut] != "l":
                scripts.append(text if cluster[cut] == "e" else None)
            continue
        operands.append(args[i])
        i += 1
    if not scripts and operands:
        scripts.append(operands[0].value)
    for text in scripts:
        if text is None:
            n.opaque("sed runs a script known only when it runs, which may hold an `e` command")
            continue
        commands, unknown = _sed_commands(text)
        for command in commands:
            n.script(command, ctx)
        if unknown:
            n.opaque("a sed script runs a command known only when it runs (`e`, `s///e`)")
    return None


# -- tar -------------------------------------------------------------------------------------------------

_TAR_PROGRAMS = ("--checkpoint-action", "--to-command", "--use-compress-program", "--info-script",
                 "--new-volume-script", "--rsh-command", "--rmt-command")
_TAR_EXACT = frozenset({"--checkpoint", "--to-stdout", "--info"})
_TAR_SHORT_WITH_ARG = "fCIFTXbHKLNVg"


def _tar_program(n: Normaliser, option: str, text: str | None, ctx: Context) -> None:
    if text is None:
        n.opaque(f"tar {option} with a command known only when it runs")
    elif option == "--checkpoint-action":
        if text.startswith("exec="):
            n.script(text[len("exec="):], ctx)
    elif text:
        n.script(text, ctx)


def _tar(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    words = list(args)
    first = words[0].value if words else None
    if first and not first.startswith("-"):
        # Old style (`tar cIf PROG x.tar`): each letter is an option, the ones that take a value take the
        # following words in order.
        expanded: list[Word] = []
        rest = words[1:]
        for c in first:
            expanded.append(literal(f"-{c}"))
            if c in _TAR_SHORT_WITH_ARG and rest:
                expanded.append(rest.pop(0))
        words = expanded + rest
    i = 0
    while i < len(words):
        value = words[i].value
        given = words[i + 1].value if i + 1 < len(words) else None
        if value is None or value == "--":
            i += 1 if value is None else len(words)
            continue
        option = long_option(value, _TAR_PROGRAMS, _TAR_EXACT)
        if option is not None:
            attached = "=" in value
            _tar_program(n, option, value.split("=", 1)[1] if attached else given, ctx)
            i += 1 if attached else 2
            continue
        if value.startswith("-") and not value.startswith("--"):
            step = 1
            for k, c in enumerate(value[1:], 2):
                if c in _TAR_SHORT_WITH_ARG:
                    text = value[k:] if k < len(value) else given
                    step = 1 if k < len(value) else 2
                    if c in "IF":
                        _tar_program(n, f"-{c}", text, ctx)
                    break
            i += step
            continue
        i += 1
    return None


def _program_option(options: tuple[str, ...]) -> Handler:
    """A program with long options whose value is a command it runs (`sort --compress-program=P`,
    `split --filter=CMD`, `sdiff --diff-program=P`); abbreviations count."""

    def handle(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
        for j, w in enumerate(args):
            value = w.value or ""
            if value == "--":
                break
            option = long_option(value, options)
            if option is None:
                continue
            text = value.split("=", 1)[1] if "=" in value else (args[j + 1].value if j + 1 < len(args) else "")
            if text is None:
                n.opaque(f"{name} {option} with a command known only when it runs")
            elif text:
                n.script(text, ctx)
        return None

    return handle


# -- builtins that take names or arithmetic, and name tables ----------------------------------------------

def _names(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    """test/[/let/read/unset/mapfile/wait: a literal holding a substitution runs it when bash evaluates it."""
    for w in args:
        _check_name(n, name, w.value)
    return None


def _printf(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    for j, w in enumerate(args):
        value = w.value or ""
        if value == "-v" and j + 1 < len(args):
            _check_name(n, name, args[j + 1].value)
        elif value.startswith("-v"):
            _check_name(n, name, value[2:])
        elif value == "--" or not value.startswith("-"):
            break
    return None


def _hash(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    if any(w.value is None or ((w.value or "").startswith("-") and "p" in (w.value or "")) for w in args):
        n.opaque("hash -p binds a name to another program: the names after it are not known")
    return None


def _enable(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    if any(w.value is None or ((w.value or "").startswith("-") and "f" in (w.value or "")) for w in args):
        n.opaque("enable -f loads a builtin from a file, which permission rules cannot read")
    return None


def _check_name(n: Normaliser, name: str, value: str | None) -> None:
    if _evaluated(value):
        n.opaque(f"{name} evaluates a subscript that runs a command")
    elif value is not None and value.startswith(NAME_TABLES):
        n.opaque(f"{name} changes what later command names run")


def statement(n: Normaliser, node: Node) -> None:
    """Checks of syntax that is not a simple command (`Normaliser.statement`)."""
    kind = node.type
    if kind in ("declaration_command", "unset_command", "test_command", "arithmetic_expansion", "subscript",
                "compound_statement", "c_style_for_statement"):
        # Also `$(( 'a[$(cmd)]' ))` and `${a['$(cmd)']}`: bash evaluates the quoted text as arithmetic.
        for child in _literals(node):
            if kind in ("compound_statement", "subscript") and child.parent is not None \
                    and child.parent.type not in ("subscript", "compound_statement"):
                continue  # a `{ ...; }` group's commands are checked as commands
            _check_name(n, kind.split("_")[0], word(child).value)
    elif kind == "expansion":
        raw = (node.text or b"").decode("utf-8", "replace")
        if "@P" in raw:
            n.opaque("a prompt expansion (`${x@P}`) runs the substitutions its value holds")
        elif _evaluated(raw) and not _has_substitution(node):
            # tree-sitter reads ``${x:-`cmd`}`` as a plain word: bash runs the backquoted command.
            n.opaque("an expansion holds a command substitution not followed here")
    elif kind == "variable_assignment":
        target = node.child_by_field_name("name")
        value = node.child_by_field_name("value")
        variable = (target.text or b"").decode("utf-8", "replace") if target is not None else ""
        parent = node.parent
        if variable.startswith(NAME_TABLES):
            n.opaque("an assignment changes what later command names run")
        elif value is not None and (parent is None or parent.type != "command") and variable != "PATH" and (
                variable in PROGRAM_VARIABLES | FILE_VARIABLES | PROMPT_VARIABLES or variable.startswith("GIT_CONFIG")):
            # `export GIT_EDITOR='rm f'; git commit`: the later commands of the script inherit it.
            n.variable(variable, word(value), Context())
        elif value is not None and value.type != "array":
            text = word(value).value
            if text is not None and "[" in text and _evaluated(text):
                n.opaque("a variable holds a subscript that runs a command when arithmetic reads it")


def _has_substitution(node: Node) -> bool:
    stack = list(node.children)
    while stack:
        child = stack.pop()
        if child.type in ("command_substitution", "process_substitution"):
            return True
        stack.extend(child.children)
    return False


def _literals(node: Node) -> list[Node]:
    """The quoted or plain words anywhere under `node`, substitutions left to the normal walk."""
    found: list[Node] = []
    stack = list(node.children)
    while stack:
        child = stack.pop()
        if child.type in ("raw_string", "string", "ansi_c_string", "word", "concatenation"):
            found.append(child)
        elif child.type not in ("command_substitution", "process_substitution"):
            stack.extend(child.children)
    return found


PROGRAMS: dict[str, Handler] = {
    "ld.so": _loader, "exec": _exec, "start-stop-daemon": _start_stop_daemon, "run-parts": _run_parts, "sg": _sg,
    "entr": _entr, "sed": _sed, "gsed": _sed, "tar": _tar, "gtar": _tar,
    **dict.fromkeys(("test", "[", "let", "read", "unset", "mapfile", "readarray", "wait", "declare", "typeset",
                     "local", "export", "readonly"), _names),
    "sort": _program_option(("--compress-program",)), "split": _program_option(("--filter",)),
    "sdiff": _program_option(("--diff-program",)), "diff3": _program_option(("--diff-program",)),
    "printf": _printf, "hash": _hash, "enable": _enable,
    "catchsegv": wrapper(), "unbuffer": wrapper(),
    "dumb-init": wrapper("-r --rewrite", "-c --single-child -v --verbose -V --version -h --help"),
    "fakeroot": wrapper("-l --lib --faked -s -i -b", "-u --unknown-is-real -h --help -v --version"),
    "faketime": wrapper(positional=1), "tini": wrapper("-p -e", "-h -s -v -w -g -l -V", no_command="-h -l -V"),
    "pkexec": wrapper("--user"), "torsocks": wrapper("-u -p -a -P"),
    "numactl": wrapper("-C --physcpubind -N --cpunodebind -m --membind -p --preferred -i --interleave"),
    "cgexec": wrapper("-g"), "firejail": wrapper(), "proot": wrapper("-r -b -w -q -k"),
    "systemd-run": wrapper("-p --property -u --unit --uid --gid -E --setenv --description --slice -M --machine "
                           "--working-directory"),
    "chpst": wrapper("-u -U -b -e -n -l -L -m -d -o -p -f -c -r -t"),
    "newgrp": wrapper(empty_runs_shell=True, positional=1),
    "at": _not_known("runs commands it reads", "-l -V --help"), "batch": _not_known("runs commands it reads"),
    "tmux": _not_known("runs shell commands it is given", "ls list-sessions -V"),
    "screen": _not_known("runs commands it is given", "-ls -list -v --version"),
    "fc": _not_known("runs commands from the shell's history", "-l -ln -lr -lnr -nl -rl"),
    "toybox": _multicall, "coreutils": _multicall, "proxychains": wrapper("-f"), "proxychains4": wrapper("-f"),
    "dbus-run-session": wrapper("--config-file --dbus-daemon"), "ssh-agent": wrapper("-a -E -P -t"),
    "setuidgid": wrapper(positional=1), "envdir": wrapper(positional=1), "eatmydata": wrapper(),
    "nocache": wrapper(), "chronic": wrapper(), "ifne": wrapper(), "lckdo": wrapper("-w", positional=1),
    "daemonize": wrapper("-a -c -e -o -p -l -u -E"), "trickle": wrapper("-u -d -w -t -l -s -n"),
}
"""By the name a command is run as (merged into bash_runners.RUNNERS)."""
