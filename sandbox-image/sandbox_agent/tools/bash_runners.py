"""Programs that run another command, and how to find that command in their arguments (for bash_normalise).

Each entry knows the options that take a value, so the first word after them is read as the program it
runs; where a program runs a script (`sh -c`, `eval`, `su -c`, a git alias starting with `!`), the script's
commands are followed. A program that runs something only known when it runs (a file, standard input, a
dynamic word) makes the command unknown, which the permission check answers with the strictest bash rule.
"""

from __future__ import annotations

import shlex
from dataclasses import replace

from sandbox_agent.tools.bash_git import git
from sandbox_agent.tools.bash_normalise import Context, Handler, Normaliser, follow, skip_options, wrapper
from sandbox_agent.tools.bash_programs import PROGRAMS
from sandbox_agent.tools.bash_words import Word, literal

Next = tuple[list[Word], Context] | None

SHELLS = frozenset("sh bash dash zsh ksh mksh ash rbash yash posh fish".split())


def _shell(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    """`sh -c SCRIPT` runs SCRIPT; `sh FILE` a file and a bare `sh` its standard input, neither known here."""
    i, command_mode = 0, False
    while i < len(args):
        value = args[i].value
        if value is None:
            n.opaque(f"{name} with an option known only when it runs")
            return None
        if value in ("--", "-"):
            i += 1
            break
        if value in ("--rcfile", "--init-file", "-o", "+o", "-O", "+O"):
            i += 2
            continue
        if value.startswith("--"):
            i += 1
            continue
        if len(value) > 1 and value[0] in "-+":
            command_mode = command_mode or (value[0] == "-" and "c" in value[1:])
            i += 2 if value[-1] in "oO" else 1  # `-eo pipefail`: the set option is the next word
            continue
        break
    if command_mode:
        if i < len(args) and args[i].value is not None:
            n.script(args[i].value or "", ctx)
        else:
            n.opaque(f"{name} -c runs a script known only when it runs")
        return None
    if i < len(args):
        n.opaque(f"{name} runs the file {args[i].raw!r}, which permission rules cannot read")
    elif not any(w.value in ("--version", "--help") for w in args):
        n.opaque(f"{name} runs the commands it reads from its standard input")
    return None


def _eval(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    values = [w.value for w in args]
    if ctx.appended or any(v is None for v in values):
        n.opaque(f"{name} of text known only when it runs")
    elif values:
        n.script(" ".join(v for v in values if v is not None), ctx)
    return None


def _source(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    if args or ctx.appended:
        n.opaque(f"{name} runs a file, which permission rules cannot read")
    return None


def _trap(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    """`trap ACTION SIGNAL...`: ACTION is a script run later by this shell."""
    rest = args[1:] if args and args[0].value == "--" else args
    if ctx.appended:
        n.opaque("trap with an action known only when it runs")
    elif len(rest) >= 2 and rest[0].value not in ("-l", "-p", "-lp", "-pl", "-"):
        if rest[0].value is None:
            n.opaque("trap with an action known only when it runs")
        else:
            n.script(rest[0].value, ctx)
    return None


def _alias(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    """An alias's text runs where its name is used (with `shopt -s expand_aliases`): follow it as a script."""
    for w in args:
        if w.value is None:
            n.opaque("alias with text known only when it runs")
        elif "=" in w.value:
            n.script(w.value.split("=", 1)[1], ctx)
    return None


def _env(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    i = 0
    options = True
    while i < len(args):
        value = args[i].value
        if value is None:
            n.opaque("env with an option or assignment known only when it runs")
            return None
        split_at = _env_split(value) if options else None
        if split_at is not None:
            text = value[split_at:]
            if not text and i + 1 < len(args):
                i += 1
                text = args[i].value or ""
                if args[i].value is None:
                    n.opaque("env -S with text known only when it runs")
                    return None
            try:
                split = [literal(part) for part in shlex.split(text)]
            except ValueError:
                n.opaque("env -S with text that does not split")
                return None
            if "${" in text:
                n.opaque("env -S expands variables only known when it runs")
                return None
            return _env(n, name, split + args[i + 1:], ctx)
        if options and value == "--":
            options = False
        elif options and (value in ("-u", "-C") or (
                "=" not in value and len(value) > 2 and ("--unset".startswith(value) or "--chdir".startswith(value)))):
            i += 1
        elif options and value.startswith("-") and value != "-":
            pass  # a flag, or an option with its value attached (`-uNAME`, `--chdir=DIR`)
        elif "=" in value and not value.startswith("="):
            options = False  # NAME=VALUE: assignments only from here on
            name, _, assigned = value.partition("=")
            n.variable(name, literal(assigned), ctx)
        else:
            break
        i += 1
    return follow(n, name, args[i:], ctx)


def _env_split(value: str) -> int | None:
    """Where `-S`'s text starts in an option word (`-S`, `-vS'..'`, `-iS..`, `--split-string=`, or any
    abbreviation of it), or None; a cluster stops at `-u`/`-C`, whose value is the rest of the word."""
    if value.startswith("--"):
        name = value.split("=", 1)[0]
        if len(name) < 3 or not "--split-string".startswith(name):
            return None
        return len(name) + 1 if "=" in value else len(value)
    if not value.startswith("-"):
        return None
    for k, c in enumerate(value[1:], 1):
        if c == "S":
            return k + 1
        if c in "uC":
            return None
    return None


def _xargs(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    takes = frozenset("-a --arg-file -d --delimiter -E -I -L -n --max-args -P --max-procs -s --max-chars "
                      "--process-slot-var".split())
    placeholders = list(ctx.placeholders)
    start = skip_options(args, takes)
    if start is None:
        n.opaque("xargs with an option known only when it runs")
        return None
    for j, w in enumerate(args[:start]):
        value = w.value or ""
        if value == "-I" and j + 1 < start:
            placeholders.append(args[j + 1].value or "{}")
        elif value.startswith("--replace") or value.startswith("-i"):
            placeholders.append(value.split("=", 1)[1] if "=" in value else value[2:] or "{}")
        elif value.startswith("-I") and len(value) > 2:
            placeholders.append(value[2:])
    rest = args[start:]
    if not rest:
        return None  # runs echo
    return rest, Context(ctx.depth, tuple(p for p in placeholders if p), appended=True)


def _find(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    i = 0
    while i < len(args):
        value = args[i].value
        if value in ("-exec", "-execdir", "-ok", "-okdir"):
            end = i + 1
            while end < len(args) and args[end].value not in (";", "+"):
                end += 1
            inner = Context(ctx.depth, (*ctx.placeholders, "{}"), appended=False)
            if end == i + 1:
                n.opaque(f"find {value} without a command")
            else:
                n.run(args[i + 1:end], inner)
            i = end + 1
            continue
        if value == "-delete":
            n.add("rm", [], respelled=True)  # find deletes the files itself: what `rm` rules are about
        i += 1
    return None


def _values(words: list[Word]) -> list[str] | None:
    values = [w.value for w in words]
    return None if any(v is None for v in values) else [v for v in values if v is not None]


def _script_option(options: tuple[str, ...], with_arg: str, *, otherwise_shell: bool,
                   command_after: str = "") -> Handler:
    """A program whose `-c SCRIPT` (any of `options`) runs a script; `command_after` options (`runuser -u U`)
    make the words after the options a command; without either it may run a shell reading standard input."""
    takes = frozenset(with_arg.split()) | frozenset(options)

    def handle(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
        for j, w in enumerate(args):
            value = w.value
            if value is None:
                continue
            text: str | None
            if value in options or (value[:1] == "-" and value[1:2] != "-" and value.endswith("c") and "-c" in options):
                # `-c SCRIPT`, also at the end of a cluster of flags (`script -qc SCRIPT`)
                text = args[j + 1].value if j + 1 < len(args) else None
                if j + 1 >= len(args) and not ctx.appended:
                    return None
            elif value.startswith(tuple(o + "=" for o in options if o.startswith("--"))):
                text = value.split("=", 1)[1]
            else:
                continue
            if text is None:
                n.opaque(f"{name} runs a script known only when it runs")
            else:
                n.script(text, ctx)
            return None
        start = skip_options(args, takes)
        if start is None:
            n.opaque(f"{name} with an option known only when it runs")
            return None
        if command_after and any(w.value in command_after.split() for w in args[:start]):
            return follow(n, name, args[start:], ctx)
        if otherwise_shell:
            n.opaque(f"{name} without a command runs a shell reading standard input")
        return None

    return handle


def _watch(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    start = skip_options(args, frozenset("-n --interval -d --differences -q --equexit".split()))
    if start is None:
        n.opaque("watch with an option known only when it runs")
        return None
    rest = args[start:]
    if any(w.value in ("-x", "--exec") for w in args[:start]):
        return follow(n, name, rest, ctx)
    values = _values(rest)
    if values is None:
        n.opaque("watch runs a command known only when it runs")
    elif values:
        n.script(" ".join(values), ctx)  # watch hands its words, joined, to `sh -c`
    return None


def _flock(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    handled = _script_option(("-c", "--command"), "-w --timeout -E --conflict-exit-code", otherwise_shell=False)
    if any(w.value in ("-c", "--command") or (w.value or "").startswith("--command=") for w in args):
        return handled(n, name, args, ctx)
    start = skip_options(args, frozenset("-w --timeout -E --conflict-exit-code".split()))
    if start is None:
        n.opaque("flock with an option known only when it runs")
        return None
    return follow(n, name, args[start + 1:], ctx) if start + 1 < len(args) else None


def _sudo(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    start = skip_options(args, frozenset(
        "-u --user -g --group -C --close-from -D --chdir -h --host -p --prompt -r --role -t --type -T "
        "--command-timeout -U --other-user".split()))
    if start is None:
        n.opaque(f"{name} with an option known only when it runs")
        return None
    flags = {w.value for w in args[:start]}
    rest = args[start:]
    if flags & {"-s", "--shell", "-i", "--login"}:
        values = _values(rest)
        if values:
            n.script(" ".join(values), ctx)
        else:
            n.opaque(f"{name} runs a shell on a command known only when it runs")
        return None
    if flags & {"-l", "--list", "-v", "--validate", "-K", "-V", "--version", "-e", "--edit"}:
        return None
    return follow(n, name, rest, ctx)


def _parallel(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    values = [w.value for w in args]
    end = next((j for j, v in enumerate(values) if v in (":::", "::::", ":::+", "::::+")), len(args))
    start = skip_options(args[:end], frozenset("-j --jobs -S --sshlogin --joblog -I --replace".split()))
    command = args[start:end] if start is not None else []
    joined = _values(command)
    if start is None or joined is None or not joined:
        n.opaque("parallel runs commands known only when it runs")
    else:
        n.script(" ".join(joined), replace(ctx, placeholders=(*ctx.placeholders, "{")))
    return None


def _busybox(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    return follow(n, name, args, ctx)


RUNNERS: dict[str, Handler] = {
    **PROGRAMS,
    **dict.fromkeys(SHELLS, _shell),
    "eval": _eval, "source": _source, ".": _source, "trap": _trap, "alias": _alias,
    "env": _env, "xargs": _xargs, "find": _find, "git": git, "watch": _watch, "flock": _flock,
    "sudo": _sudo, "doas": wrapper("-u -C", no_command="-s"), "parallel": _parallel, "busybox": _busybox,
    "command": wrapper(no_command="-v -V"),
    "coproc": wrapper(),
    "setarch": wrapper(positional=1),
    "linux32": wrapper(), "linux64": wrapper(),
    "builtin": wrapper(),
    "nohup": wrapper(),
    "nice": wrapper("-n --adjustment"),
    "timeout": wrapper("-s --signal -k --kill-after", positional=1),
    "stdbuf": wrapper("-i -o -e --input --output --error"),
    "time": wrapper("-f --format -o --output"),
    "ionice": wrapper("-c --class -n --classdata -p --pid -P --pgid -u --uid",
                      no_command="-p --pid -P --pgid -u --uid"),
    "setsid": wrapper(),
    "chrt": wrapper("-T --sched-runtime -P --sched-period -D --sched-deadline", positional=1,
                    no_command="-p --pid -m --max"),
    "taskset": wrapper(positional=1, no_command="-p --pid"),
    "setpriv": wrapper("--reuid --regid --ruid --rgid --euid --egid --groups --inh-caps --ambient-caps "
                       "--bounding-set --securebits --pdeathsig --selinux-label --apparmor-profile "
                       "--landlock-access --landlock-rule", no_command="-d --dump"),
    "unshare": wrapper("-S --setuid -G --setgid -R --root -w --wd --map-user --map-group --map-users --map-groups "
                       "--propagation", empty_runs_shell=True),
    "nsenter": wrapper("-t --target -S --setuid -G --setgid", empty_runs_shell=True),
    "chroot": wrapper("--userspec --groups", positional=1, empty_runs_shell=True),
    "prlimit": wrapper(no_command="-p --pid"),
    "su": _script_option(("-c", "--command", "--session-command"), "-s --shell -g --group -G --supp-group -w "
                         "--whitelist-environment", otherwise_shell=True),
    "runuser": _script_option(("-c", "--command", "--session-command"), "-s --shell -g --group -G --supp-group "
                              "-w --whitelist-environment -u --user", otherwise_shell=True, command_after="-u --user"),
    "script": _script_option(("-c", "--command"), "-E --echo -I --log-in -O --log-out -B --log-io -T --log-timing "
                             "-m --logging-format -t --timing", otherwise_shell=True),
}
"""By the name a command is run as."""
