"""What a `git` command line makes git run (for bash_normalise): aliases starting with `!`, configuration
whose value is a program, subcommand options that take a program, and `ext::` URLs.

Git is lenient in ways that respell these: configuration keys are case-insensitive (`core.gitProxy`), a
long option may be any unambiguous prefix (`--exe` is `--exec`), a short option's value may be attached
(`-x'cmd'`, `-O'cmd'`), and an `ext::` URL (anywhere: an argument, a `-c` value or key, a remote) runs
its command. Each of these counts as the full spelling here; where the program is only known when git
runs, the command is one not known (the strictest bash rule decides).
"""

from __future__ import annotations

import shlex
from dataclasses import replace

from sandbox_agent.tools.bash_normalise import MAX_DEPTH, Context, Normaliser
from sandbox_agent.tools.bash_programs import long_option
from sandbox_agent.tools.bash_words import Word, literal

Next = tuple[list[Word], Context] | None

_PROGRAM_KEYS = frozenset({
    "core.pager", "core.editor", "core.sshcommand", "core.fsmonitor", "core.askpass", "core.gitproxy",
    "core.alternaterefscommand", "sequence.editor", "diff.external", "diff.guitool", "merge.guitool",
    "gpg.program", "credential.helper", "interactive.difffilter", "uploadpack.packobjectshook",
    "sendemail.sendmailcmd", "sendemail.tocmd", "sendemail.cccmd", "web.browser", "instaweb.httpd",
    "mergetool.path", "difftool.path", "sendemail.smtpserver", "remote.origin.uploadpack",
    "remote.origin.receivepack", "receive.procreceiverefs",
})
"""Git configuration whose value is a command or program that git runs (keys lower-cased)."""
_PROGRAM_SUFFIXES = (".textconv", ".command", ".driver", ".clean", ".smudge", ".process", ".program", ".cmd",
                     ".helper", ".path", ".uploadpack", ".receivepack", ".proxy", "pager", ".update",
                     ".gitproxy")
_FILE_KEYS = ("include.", "includeif.", "core.hookspath", "init.templatedir", "core.worktree")
"""Configuration naming files or directories whose programs git runs (hooks, more configuration)."""
_GLOBAL_WITH_ARG = frozenset("-C --git-dir --work-tree --namespace --super-prefix --list-cmds "
                             "--attr-source".split())
_EXEC: dict[str, tuple[tuple[str, ...], str, str]] = {
    "rebase": (("--exec",), "x", "sXC"), "difftool": (("--extcmd",), "x", "tyX"),
    "clone": (("--upload-pack",), "u", "objc"), "fetch": (("--upload-pack",), "", "jo"),
    "pull": (("--upload-pack",), "", "sXo"), "ls-remote": (("--upload-pack",), "u", ""),
    "push": (("--receive-pack", "--exec"), "", "o"), "archive": (("--exec",), "", "o"),
    "send-pack": (("--receive-pack", "--exec"), "", ""), "fetch-pack": (("--upload-pack", "--exec"), "", ""),
    "grep": (("--open-files-in-pager",), "O", "efABCm"),
    "send-email": (("--sendmail-cmd", "--to-cmd", "--cc-cmd", "--smtp-server"), "", ""),
    "filter-branch": (("--env-filter", "--tree-filter", "--index-filter", "--parent-filter", "--msg-filter",
                       "--commit-filter", "--tag-name-filter"), "", ""),
    "instaweb": (("--httpd", "--browser"), "db", ""), "daemon": (("--access-hook",), "", ""), "mergetool": ((), "", ""),
    "submodule": ((), "", ""), "bisect": ((), "", ""), "config": ((), "", ""), "init": ((), "", ""),
    "remote": ((), "", ""),
}
"""Per subcommand: long options whose value is a command git runs, the same as short options, and other
short options that take a value (so a cluster is read as git reads it)."""
_OPTIONAL_VALUE = frozenset({"--open-files-in-pager", "-O"})
"""Options whose value is only ever attached (`-Ocmd`, `--open-files-in-pager=cmd`)."""
_TEMPLATE = ("--template",)


_PROGRAM_ENDINGS = ("command", "cmd", "program", "helper", "hook", "editor", "pager", "proxy", "path")
"""A key whose last part ends so (`gpg.ssh.defaultKeyCommand`) names a program git may run."""


def program_key(key: str) -> bool:
    key = key.lower()
    return key.rsplit(".", 1)[-1].endswith(_PROGRAM_ENDINGS) or key in _PROGRAM_KEYS \
        or key.endswith(_PROGRAM_SUFFIXES) or key.startswith(("pager.", "alias."))


def _setting(n: Normaliser, setting: str, ctx: Context, *, from_env: bool) -> str | None:
    """A `-c KEY=VALUE` (or `--config-env KEY=ENV`): follows or reports what it makes git run; an alias's
    name when it defines a non-`!` alias, else None."""
    key, _, text = setting.partition("=")
    lower = key.lower()
    if "ext::" in setting.lower():
        n.opaque("git runs the command of an ext:: URL")
    elif lower.startswith(_FILE_KEYS):
        n.opaque("git runs programs from files or configuration known only when it runs")
    elif from_env and program_key(key):
        n.opaque("git runs a program from configuration known only when it runs")
    elif lower.startswith("alias.") and not from_env:
        if text.startswith("!"):
            n.script(text[1:], ctx)
        else:
            return lower[len("alias."):]
    elif program_key(key) and text and text.lower() not in ("true", "false", "0", "1"):
        n.script(text[1:] if text.startswith("!") else text, ctx)
    return None


def git(n: Normaliser, name: str, args: list[Word], ctx: Context) -> Next:
    aliases: dict[str, str] = {}
    if any("ext::" in (w.value or "").lower() for w in args):
        n.opaque("git runs the command of an ext:: URL")
    i = 0
    while i < len(args):
        value = args[i].value
        if value is None:
            n.opaque("git with an option known only when it runs")
            return None
        if value in ("-c", "--config-env") or value.startswith("--config-env="):
            setting = value.split("=", 1)[1] if "=" in value else (args[i + 1].value if i + 1 < len(args) else "")
            if setting is None:
                n.opaque("git runs a program from configuration known only when it runs")
            else:
                alias = _setting(n, setting, ctx, from_env=value.startswith("--config-env"))
                if alias is not None:
                    aliases[alias] = setting.partition("=")[2]
            i += 1 if "=" in value and value.startswith("--config-env") else 2
            continue
        if value.startswith("--exec-path="):
            n.opaque("git runs its subcommands from a directory permission rules cannot read")
        if value in _GLOBAL_WITH_ARG:
            i += 2
            continue
        if value.startswith("-"):
            i += 1
            continue
        break
    rest = args[i:]
    if not rest:
        return None
    sub = (rest[0].value or "").lower()
    if sub in aliases:
        try:
            expansion = [literal(part) for part in shlex.split(aliases[sub])]
        except ValueError:
            n.opaque("a git alias that does not split")
            return None
        n.add("git", [*expansion, *rest[1:]], respelled=True)
        if expansion and (expansion[0].value or "").startswith("-"):
            # git reads global options at the start of an alias too (`alias.x='-c core.pager=CMD log'`).
            if ctx.depth >= MAX_DEPTH:
                n.opaque("git aliases nested too deep to follow")
                return None
            return git(n, name, [*expansion, *rest[1:]], replace(ctx, depth=ctx.depth + 1))
        sub = expansion[0].value or "" if expansion else ""
        rest = [rest[0], *expansion[1:], *rest[1:]]
    _subcommand(n, sub, rest[1:], ctx)
    return None


def _subcommand(n: Normaliser, sub: str, args: list[Word], ctx: Context) -> None:
    spec = _EXEC.get(sub)
    if spec is None:
        return
    longs, shorts, with_arg = spec
    values = [w.value for w in args]
    if sub == "bisect" and values[:1] == ["run"]:
        n.run(args[1:], ctx)
    if sub == "submodule" and "foreach" in values:
        after = args[values.index("foreach") + 1:]
        while after and (after[0].value or "").startswith("-"):
            after = after[1:]  # `--recursive`, `-q`: foreach's own options, before the command
        if any(w.value is None for w in after):
            n.opaque("git submodule foreach with a command known only when it runs")
        elif after:
            n.script(" ".join(w.value or "" for w in after), ctx)
    if sub == "config":
        # `git config alias.x '!cmd'` stores a command for later calls: follow it as if it ran now.
        for j, w in enumerate(args[:-1]):
            if w.value is not None and not w.value.startswith("-"):
                _setting(n, f"{w.value}={args[j + 1].value or ''}", ctx, from_env=False)
    for j, w in enumerate(args):
        value = w.value or ""
        given = args[j + 1].value if j + 1 < len(args) else ""
        if value == "--":
            return
        if sub in ("clone", "init") and long_option(value, _TEMPLATE) and value != "--":
            n.opaque("git copies hooks from a template directory permission rules cannot read")
        if sub == "clone" and (value in ("-c", "--config") or value.startswith("--config=")):
            setting = value.split("=", 1)[1] if "=" in value else given
            if setting is None:
                n.opaque("git runs a program from configuration known only when it runs")
            else:
                _setting(n, setting, ctx, from_env=False)
            continue
        option = long_option(value, longs)
        text: str | None
        if option is not None:
            if "=" in value:
                text = value.split("=", 1)[1]
            elif option in _OPTIONAL_VALUE:
                continue
            else:
                text = given
            _program(n, f"git {sub} {option}", text, ctx)
        elif value.startswith("-") and not value.startswith("--"):
            for k, c in enumerate(value[1:], 2):
                if c in shorts:
                    if k < len(value):
                        _program(n, f"git {sub} -{c}", value[k:], ctx)
                    elif f"-{c}" not in _OPTIONAL_VALUE:
                        _program(n, f"git {sub} -{c}", given, ctx)
                    break
                if c in with_arg:
                    break  # the rest of the cluster is this option's value


def _program(n: Normaliser, what: str, text: str | None, ctx: Context) -> None:
    if text is None:
        n.opaque(f"{what} with a command known only when it runs")
    elif text:
        n.script(text, ctx)
