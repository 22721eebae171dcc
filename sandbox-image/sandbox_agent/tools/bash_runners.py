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
from sandbox_agent.tools.bash_normalise import (
    Context,
    Handler,
    Normaliser,
    follow,
    parse_options,
    skip_options,
    wrapper,
)
from sandbox_agent.tools.bash_programs import PROGRAMS
from sandbox_agent.tools.bash_words import Word, literal

Next = tuple[list[Word], Context] | None

_HV = "--help --version"

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
    if args and args[0].value == "--":
        args = args[1:]  # bash's eval takes `--` as the end of its (no) options: `eval -- 'rm f'`
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


_XARGS_WITH_ARG = frozenset("-a --arg-file -d --delimiter -E -I -L --max-lines -n --max-args -P --max-procs -s "
                            "--max-chars --process-slot-var".split())
_XARGS_OPTIONAL = frozenset("-e --eof -i --replace -l".split())
_XARGS_FLAGS = frozenset("-0 --null -o --open-tty -p --interactive -r --no-run-if-empty -t --verbose -x --exit "
                         "--show-limits --help --version".split())


def _xargs(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    parsed = parse_options(args, _XARGS_WITH_ARG, _XARGS_FLAGS, _XARGS_OPTIONAL)
    if parsed is None:
        n.opaque("xargs with an option not known here, or known only when it runs")
        return None
    start, found = parsed
    if any(option in ("--help", "--version", "--show-limits") for option, _ in found):
        return None
    placeholders = list(ctx.placeholders)
    for option, value in found:
        if option == "-I":
            placeholders.append(value or "{}")
        elif option in ("-i", "--replace"):
            placeholders.append(value or "{}")
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
    parsed = parse_options(args, frozenset("-n --interval -q --equexit".split()),
                           frozenset(f"-b --beep -c --color -C --no-color -e --errexit -g --chgexit -p --precise -t "
                                     f"--no-title -w --no-wrap -x --exec -r --no-rerun -h -v {_HV}".split()),
                           frozenset("-d --differences".split()))
    if parsed is None:
        n.opaque("watch with an option not known here, or known only when it runs")
        return None
    start, found = parsed
    options = {option for option, _ in found}
    if options & {"-h", "-v", "--help", "--version"}:
        return None
    rest = args[start:]
    if options & {"-x", "--exec"}:
        return follow(n, name, rest, ctx)
    values = _values(rest)
    if values is None:
        n.opaque("watch runs a command known only when it runs")
    elif values:
        n.script(" ".join(values), ctx)  # watch hands its words, joined, to `sh -c`
    return None


_FLOCK_WITH_ARG = frozenset("-w --timeout -E --conflict-exit-code -c --command".split())
_FLOCK_FLAGS = frozenset(f"-s --shared -x -e --exclusive -u --unlock -n --nb --nonblock -o --close -F --no-fork "
                         f"--verbose -h -V {_HV}".split())


def _flock(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    parsed = parse_options(args, _FLOCK_WITH_ARG, _FLOCK_FLAGS)
    if parsed is None:
        n.opaque("flock with an option not known here, or known only when it runs")
        return None
    start, found = parsed
    if any(option in ("-h", "-V", "--help", "--version") for option, _ in found):
        return None
    # `flock FILE -c CMD`: getopt also reads options after the file (it permutes), so look past it.
    later = parse_options(args[start + 1:], _FLOCK_WITH_ARG, _FLOCK_FLAGS) if start < len(args) else (0, [])
    if later is None:
        n.opaque("flock with an option not known here, or known only when it runs")
        return None
    for option, value in [*found, *later[1]]:
        if option in ("-c", "--command"):
            if value is None:
                n.opaque("flock runs a script known only when it runs")
            else:
                n.script(value, ctx)
            return None
    return follow(n, name, args[start + 1:], ctx) if start + 1 < len(args) else None


_SUDO_WITH_ARG = frozenset("-u --user -g --group -C --close-from -D --chdir --host -p --prompt -r --role -t --type "
                           "-T --command-timeout -U --other-user -R --chroot".split())
_SUDO_FLAGS = frozenset(f"-A --askpass -b --background -E -e --edit -H --set-home -i --login -K --remove-timestamp "
                        f"-k --reset-timestamp -l --list -n --non-interactive -P --preserve-groups -S --stdin -s "
                        f"--shell -V -v --validate -N --no-update -B --bell {_HV}".split())


def _sudo(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    parsed = parse_options(args, _SUDO_WITH_ARG, _SUDO_FLAGS, frozenset({"-h", "--preserve-env"}))
    if parsed is None:
        n.opaque(f"{name} with an option not known here, or known only when it runs")
        return None
    start, found = parsed
    flags = {option for option, _ in found}
    rest = args[start:]
    if flags & {"-s", "--shell", "-i", "--login"}:
        values = _values(rest)
        if values:
            n.script(" ".join(values), ctx)
        else:
            n.opaque(f"{name} runs a shell on a command known only when it runs")
        return None
    if flags & {"-l", "--list", "-v", "--validate", "-K", "-V", "--version", "-e", "--edit", "-h", "--help"}:
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


_COMPOUND = frozenset("{ ( (( while until if for case select [[ function".split())


def _coproc(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    """`coproc [NAME] COMMAND`: a compound command after NAME (`coproc X { rm f; }`) is not followed here."""
    if any(w.value is None or w.value in _COMPOUND for w in args[:2]):
        n.opaque("coproc runs a compound command not followed here")
        return None
    return follow(n, name, args, ctx)


def _callback(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    """`compgen -C CMD`, `complete -C CMD`, `mapfile -C CMD`: CMD is shell text the builtin runs."""
    for j, w in enumerate(args):
        value = w.value
        if value is None:
            n.opaque(f"{name} with an option known only when it runs")
            return None
        if value == "--" or not value.startswith("-"):
            if name not in ("compgen", "complete"):
                continue
            break
        cut = value.find("C")
        if cut > 0:
            text = value[cut + 1:] or (args[j + 1].value if j + 1 < len(args) else "")
            if text is None:
                n.opaque(f"{name} -C runs a command known only when it runs")
            elif text:
                n.script(text, ctx)
    if name in ("mapfile", "readarray"):
        return PROGRAMS["mapfile"](n, name, args, ctx)
    return None


def _bind(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    """`bind -x 'KEYSEQ:CMD'` runs CMD when the key is read; not followed here."""
    if any(w.value is None or ((w.value or "").startswith("-") and "x" in (w.value or "")) for w in args):
        n.opaque("bind -x runs a command when a key is read")
    return None


_SETARCH_FLAGS = ("-B --32bit -F --fdpic-funcptrs -I --short-inode -L --addr-compat-layout -R --addr-no-randomize "
                  "-S --whole-seconds -T --sticky-timeouts -X --read-implies-exec -Z --mmap-page-zero -3 --3gb "
                  "--4gb --uname-2.6 -v --verbose --list -h -V " + _HV)
_setarch_options = wrapper(flags=_SETARCH_FLAGS, no_command="--list -h -V --help --version")


def _setarch(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    """`setarch ARCH [OPTIONS] CMD`: the architecture comes first, its options after it."""
    if name == "setarch" and args and not (args[0].value or "").startswith("-"):
        args = args[1:]  # the architecture (optional in newer versions: then an option comes first)
    return _setarch_options(n, name, args, ctx)


def _dash_words(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    """`valgrind --opt=value PROG`: every option is one word (values attached), the first other word runs."""
    for j, w in enumerate(args):
        if w.value is None:
            n.opaque(f"{name} with an option known only when it runs")
            return None
        if w.value in ("-h", "--help", "--help-debug", "--version"):
            return None
        if w.value == "--" or not w.value.startswith("-"):
            return follow(n, name, args[j + (w.value == "--"):], ctx)
    return None


def _busybox(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    return follow(n, name, args, ctx)


RUNNERS: dict[str, Handler] = {
    **PROGRAMS,
    **dict.fromkeys(SHELLS, _shell),
    "eval": _eval, "source": _source, ".": _source, "trap": _trap, "alias": _alias,
    "env": _env, "xargs": _xargs, "find": _find, "git": git, "watch": _watch, "flock": _flock,
    "sudo": _sudo, "doas": wrapper("-u -C", "-n -s -L", no_command="-s -L"), "parallel": _parallel, "busybox": _busybox,
    "command": wrapper(flags="-p -v -V", no_command="-v -V"),
    "coproc": _coproc, "bind": _bind,
    "strace": wrapper("-e -E -p -u -b -I -P -a -o -s -X -O -S -U --env --attach --user --detach-on --interruptible "
                      "--trace --signal --status --trace-path --columns --abbrev --verbose --raw --read --write --kvm "
                      "--output --string-limit --const-print-style --summary-syscall-overhead --summary-sort-by "
                      "--summary-columns --inject --fault",
                      "-D -f -z -Z -i -k -n -A -q -r -t -T -v -x -y -Y -c -C -w -d -h -V --follow-forks "
                      "--output-separately --successful-only --failed-only --instruction-pointer --stack-traces "
                      "--syscall-number --output-append-mode --no-abbrev --summary-only --summary "
                      "--summary-wall-clock --debug --seccomp-bpf --help --version",
                      optional="--daemonize --relative-timestamps --absolute-timestamps --syscall-times "
                               "--decode-fds --tips", no_command="-h -V --help --version"),
    "ltrace": wrapper("-o --output -e -p -s -u -a --align -n --indent -l --library -x -E -F --config -A -D -w --where",
                      "-b --no-signals -c -C --demangle -f -h --help -i -L -r -S -t -T -V --version",
                      no_command="-h -V --help --version"),
    **dict.fromkeys(("compgen", "complete", "mapfile", "readarray"), _callback),
    **dict.fromkeys(("setarch", "linux32", "linux64", "i386", "x86_64"), _setarch), "valgrind": _dash_words,
    "builtin": wrapper(),
    "nohup": wrapper(flags=_HV),
    "nice": wrapper("-n --adjustment", "-NUM " + _HV),
    "timeout": wrapper("-s --signal -k --kill-after", "-v --verbose -f --foreground -p --preserve-status " + _HV,
                       positional=1),
    "stdbuf": wrapper("-i -o -e --input --output --error", _HV),
    "time": wrapper("-f --format -o --output", "-p --portability -a --append -v --verbose -q --quiet -V " + _HV),
    "ionice": wrapper("-c --class -n --classdata -p --pid -P --pgid -u --uid", "-t --ignore -h -V " + _HV,
                      no_command="-p --pid -P --pgid -u --uid -h -V --help --version"),
    "setsid": wrapper(flags="-c --ctty -f --fork -w --wait -h -V " + _HV),
    "chrt": wrapper("-T --sched-runtime -P --sched-period -D --sched-deadline",
                    "-a --all-tasks -b --batch -d --deadline -e --ext -f --fifo -i --idle -o --other -r --rr "
                    "-R --reset-on-fork -m --max -p --pid -v --verbose -h -V " + _HV, positional=1,
                    no_command="-p --pid -m --max -h -V --help --version"),
    "taskset": wrapper(flags="-a --all-tasks -p --pid -c --cpu-list -h -V " + _HV, positional=1,
                       no_command="-p --pid -h -V --help --version"),
    "setpriv": wrapper("--reuid --regid --ruid --rgid --euid --egid --groups --inh-caps --ambient-caps "
                       "--bounding-set --securebits --pdeathsig --selinux-label --apparmor-profile "
                       "--landlock-access --landlock-rule --seccomp-filter",
                       "-d --dump --nnp --no-new-privs --clear-groups --keep-groups --init-groups --reset-env -h -V "
                       + _HV, no_command="-d --dump -h -V --help --version"),
    "unshare": wrapper("-S --setuid -G --setgid -R --root -w --wd --map-user --map-group --map-users --map-groups "
                       "--propagation --setgroups --monotonic --boottime",
                       "-f --fork -r --map-root-user -c --map-current-user --map-auto --keep-caps -h -V " + _HV,
                       optional="-m --mount -u --uts -i --ipc -n --net -p --pid -U --user -C --cgroup -T --time "
                                "--kill-child --mount-proc", empty_runs_shell=True),
    "nsenter": wrapper("-t --target -S --setuid -G --setgid -W --wdns",
                       "-a --all -F --no-fork -Z --follow-context --preserve-credentials -h -V " + _HV,
                       optional="-m --mount -u --uts -i --ipc -n --net -p --pid -C --cgroup -U --user -T --time "
                                "-r --root -w --wd", empty_runs_shell=True),
    "chroot": wrapper("--userspec --groups", "--skip-chdir " + _HV, positional=1, empty_runs_shell=True),
    "prlimit": wrapper("-p --pid -o --output", "--noheadings --raw --verbose -h -V " + _HV,
                       optional="-c --core -d --data -e --nice -f --fsize -i --sigpending -l --memlock -m --rss "
                                "-n --nofile -q --msgqueue -r --rtprio -s --stack -t --cpu -u --nproc -v --as "
                                "-x --locks -y --rttime", no_command="-p --pid -h -V --help --version"),
    "su": _script_option(("-c", "--command", "--session-command"), "-s --shell -g --group -G --supp-group -w "
                         "--whitelist-environment", otherwise_shell=True),
    "runuser": _script_option(("-c", "--command", "--session-command"), "-s --shell -g --group -G --supp-group "
                              "-w --whitelist-environment -u --user", otherwise_shell=True, command_after="-u --user"),
    "script": _script_option(("-c", "--command"), "-E --echo -I --log-in -O --log-out -B --log-io -T --log-timing "
                             "-m --logging-format -t --timing", otherwise_shell=True),
}
"""By the name a command is run as."""
