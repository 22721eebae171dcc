"""Oracle cases for the edges of the bash tool: truncation boundaries and the saved-output hint, bytes and
characters, timeouts, workdir, the shell itself, its environment, and the other parameters (upstream v1.2.27)."""

from tests.oracle.cases import Case


def bx(name: str, command: str, description: str = "Runs a command", **extra: object) -> Case:
    """A bash case; `files`, `setup`, `agent`, `config`, `git` pass through, anything else is a parameter."""
    options = {k: extra.pop(k) for k in ("files", "setup", "agent", "config", "git") if k in extra}
    params = {"command": command, "description": description, **extra}
    return Case(f"bx_{name}", "bash", params, **options)  # type: ignore[arg-type]


X24 = "x" * 24
TO_2000 = f"yes {X24} | head -n 1999; head -c"
"""1999 lines of 24 bytes, then the 2000th line's bytes follow."""

CASES: list[Case] = [
    # truncation boundaries and the saved-output hint
    bx("lines_2001_no_newline", "seq 1 2001 | head -c -1"),
    bx("empty_lines_2000", "yes '' | head -n 2000"),
    bx("lines_limit_bytes_over", "yes 0123456789012345678 | head -n 3000"),
    bx("lines_and_bytes_both_over", f"yes {'y' * 40} | head -n 3000"),
    # 1999 lines of 24 bytes, one of 1225: the first 2000 lines take exactly 51200 bytes.
    bx("lines_2000_at_51200_then_more", f"{TO_2000} 1225 /dev/zero | tr '\\0' y; echo; echo extra"),
    bx("lines_2000_at_51201_then_more", f"{TO_2000} 1226 /dev/zero | tr '\\0' y; echo; echo extra"),
    bx("huge_first_line_then_short", "head -c 60000 /dev/zero | tr '\\0' a; echo; echo tail"),
    bx("short_line_then_huge", "echo first; head -c 60000 /dev/zero | tr '\\0' b; echo"),
    bx("huge_line_multibyte", "yes é | head -n 30000 | tr -d '\\n'; echo"),
    bx("stderr_truncated", "seq 1 2500 >&2"),
    bx("cr_only_no_line_split", "seq 1 3000 | tr '\\n' '\\r'"),
    bx("metadata_cap_emoji", "yes 😀 | head -n 15000 | tr -d '\\n'; echo"),
    # bytes and characters
    bx("invalid_continuation_bytes", "printf 'a\\x80\\x80b\\n'"),
    bx("invalid_surrogate_utf8", "printf '[\\xed\\xa0\\x80]\\n'"),
    bx("bom_kept", "printf '\\xef\\xbb\\xbfbom\\n'"),
    bx("control_chars", "printf 'a\\tb\\bc\\fd\\ve\\n'"),
    bx("ansi_cursor_and_osc", "printf '\\033[2K\\033[1Gline\\n\\033]0;title\\007text\\n'"),
    bx("trailing_whitespace", "printf 'a  \\n\\t\\n   '"),
    bx("stdout_no_newline_then_stderr", "printf out; sleep 0.2; echo err >&2"),
    bx("stderr_no_newline_then_stdout", "printf err >&2; sleep 0.2; echo out"),
    bx("char_length_in_locale", "s=héllo; echo ${#s}; printf %s ü | wc -c"),
    bx("sort_collation", "printf 'b\\nA\\na\\nB\\n_\\n' | sort"),
    # timeouts
    bx("timeout_one_ms", "sleep 5", timeout=1),
    bx("timeout_negative_zero", "sleep 5", timeout=-0.0),
    bx("timeout_term_trapped", "trap 'echo got-term; exit 7' TERM; sleep 5 & wait", timeout=300),
    Case("bx_timeout_object", "bash", {"command": "echo hi", "description": "d", "timeout": {}}),
    # workdir and cd
    bx("workdir_dangling_symlink", "pwd", workdir="dangling", setup="ln -s missing dangling"),
    bx("cd_then_pwd", "cd sub; pwd; cd ..; pwd; echo $PWD", setup="mkdir sub"),
    bx("cd_missing", "cd nope 2>&1; echo status=$?"),
    bx("pwd_env_with_workdir", "echo $PWD; echo $OLDPWD", workdir="sub", setup="mkdir sub"),
    # the shell itself
    bx("exit_in_function", "f() { echo in; exit 4; echo no; }; f; echo after"),
    bx("set_e_in_function", "set -e; f() { echo one; false; echo two; }; f; echo after"),
    bx("set_u_unbound", "set -u; echo $NOPE_UNDEFINED_VAR; echo after"),
    bx("trap_exit", "trap 'echo bye' EXIT; echo hi; exit 2"),
    bx("arrays", "a=(x y 'z w'); echo ${#a[@]} \"${a[2]}\"; for i in \"${a[@]}\"; do echo \"[$i]\"; done"),
    bx("brace_expansion", "echo {a,b}{1..3} {01..03} {c..a}"),
    bx("glob_workspace", "echo *.txt; ls; echo nomatch*",
       files={"b.txt": "", "A.txt": "", "c.md": "", "sub/d.txt": ""}),
    bx("background_wait", "(echo bg) & wait; echo fg"),
    # the environment both sides give the command
    bx("env_common", "echo \"$LANG|$TERM|$USER|$SHELL|$TMPDIR|$HOME|$SHLVL|${LOGNAME-unset}\""),
    bx("shell_flags", "echo $-; shopt -q login_shell; echo login=$?"),
    bx("stdin_is_dev_null", "readlink /proc/self/fd/0"),
    bx("session_and_group_leader",
       "read -r -a s < /proc/$$/stat; [ \"${s[4]}\" = \"$$\" ] && echo group-leader; "
       "[ \"${s[5]}\" = \"$$\" ] && echo session-leader"),
    # the command text and the other parameters
    bx("command_whitespace_only", "   "),
    bx("command_crlf", "echo a\r\necho b"),
    bx("command_nul_byte", "echo a\u0000b"),
    bx("command_nul_long", "echo " + "y" * 200 + "\u0000"),
    bx("command_nul_quotes_newline", "echo 'it' \"q\"\n\u0000\techo \\ done"),
    bx("workdir_nul_byte", "pwd", workdir="sub\u0000x", setup="mkdir sub"),
    bx("command_long", "echo " + "x" * 5000),
    bx("description_newline", "echo hi", "first line\nsecond line"),
    bx("env_opencode_markers", 'echo "$OPENCODE|$AGENT|${OPENCODE_PID:+set}"'),
]
