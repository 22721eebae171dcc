"""bash: output, merged stderr, exit codes, metadata, timeouts, workdir, truncation, validation errors."""

from tests.oracle.cases import Case


def bash(name: str, command: str, description: str = "Runs a command", **extra: object) -> Case:
    """A bash case; `files`, `setup`, `agent`, `config`, `git` pass through, anything else is a parameter."""
    options = {k: extra.pop(k) for k in ("files", "setup", "agent", "config", "git") if k in extra}
    params = {"command": command, "description": description, **extra}
    return Case(f"bash_{name}", "bash", params, **options)  # type: ignore[arg-type]


CASES = [
    # plain output, exit codes
    bash("echo", "echo hello", "Prints hello"),
    bash("empty_output", "true"),
    bash("empty_command", ""),
    bash("no_trailing_newline", "printf abc"),
    bash("exit_code_3", "echo before; exit 3"),
    bash("false", "false"),
    bash("exit_255", "exit 255"),
    bash("exit_256_wraps", "exit 256"),
    bash("killed_by_signal", "echo doomed; kill -9 $$"),
    bash("term_self", "kill -TERM $$"),
    bash("child_signal_status", "sh -c 'kill -TERM $$'; echo status=$?"),
    bash("command_not_found", "definitely_not_a_command_xyz"),
    bash("syntax_error", "if then fi"),
    # stdout and stderr merged in arrival order
    bash("stderr_only", "echo oops >&2"),
    bash("stderr_merged_ordered", "echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three; sleep 0.2; echo four >&2"),
    bash("stderr_exit", "echo fail >&2; exit 2"),
    # shell, stdin, environment that is the same on both sides
    bash("dollar_zero", "echo $0"),
    bash("stdin_is_empty", "read -r line; echo \"status=$? line=[$line]\""),
    bash("cat_stdin", "cat; echo after"),
    bash("pwd_default", "pwd"),
    bash("heredoc", "cat <<'EOF'\nfirst $HOME\nsecond\nEOF"),
    bash("comments_only", "# nothing to do here"),
    bash("multiline_command", "echo a\necho b\necho c"),
    bash("pipeline", "printf 'b\\na\\nc\\n' | sort | tr a-z A-Z"),
    bash("subshell_and_vars", "X=5; (X=7; echo inner=$X); echo outer=$X"),
    bash("background_ignored", "(sleep 2; echo late) & echo early"),
    bash("files_listing", "ls", files={"only.txt": "x\n"}),
    bash("cat_file_crlf", "cat w.txt", files={"w.txt": "a\r\nb\r\n"}),
    bash("printf_cr", "printf 'progress 1\\rprogress 2\\rdone\\n'"),
    # unicode and bytes
    bash("unicode", "printf 'h\\xc3\\xa9llo \\xe2\\x9c\\x93 \\xf0\\x9f\\x98\\x80\\n'", "Prints ✓ unicode é"),
    bash("unicode_file", "cat u.txt", files={"u.txt": "日本語\n\u0391\u03b8\u03ae\u03bd\u03b1\n🙂 emoji\n"}),
    bash("invalid_utf8", "printf 'a\\xffb\\xfe\\xc3(\\n'"),
    bash("truncated_utf8_tail", "printf 'ok\\xe2\\x9c'"),
    bash("nul_byte", "printf 'a\\0b\\n'"),
    bash("ansi_escape", "printf '\\033[31mred\\033[0m\\n'"),
    # description and title
    bash("description_unicode", "echo hi", "Показывает приветствие ✓"),
    bash("description_empty", "echo hi", ""),
    bash("extra_param_ignored", "echo hi", "Extra", extra_key=1),
    # workdir
    bash("workdir_relative", "pwd", workdir="sub", setup="mkdir sub"),
    bash("workdir_root", "pwd", workdir="/"),
    bash("workdir_trailing_slash", "pwd; ls", workdir="sub/", files={"sub/f.txt": "x\n"}),
    bash("workdir_tilde", "pwd", workdir="~"),
    bash("workdir_symlink", "pwd; pwd -P", workdir="link", setup="mkdir real && ln -s real link"),
    bash("cd_out_and_back", "cd .. && cd - >/dev/null && pwd"),
    bash("workdir_dotdot", "pwd", workdir="sub/../other", setup="mkdir sub other"),
    bash("workdir_empty_string", "pwd", workdir=""),
    bash("workdir_outside", "pwd", workdir="/etc"),
    bash("workdir_missing", "pwd", workdir="nope"),
    bash("workdir_is_file", "pwd", workdir="f.txt", files={"f.txt": "x\n"}),
    bash("workdir_unicode", "pwd", workdir="dossier é", setup="mkdir 'dossier é'"),
    # timeouts
    bash("timeout_silent", "sleep 5", timeout=300),
    bash("timeout_with_output", "echo started; sleep 5", timeout=400),
    bash("timeout_fraction", "sleep 5", timeout=250.5),
    bash("timeout_zero", "sleep 5", timeout=0),
    bash("timeout_integral_float", "sleep 5", timeout=300.0),
    bash("timeout_not_hit", "echo quick", timeout=5000),
    # Not `echo` with a huge timeout: upstream's timer then fires after 1 ms, racing the command.
    bash("timeout_past_int32", "sleep 1; echo done", timeout=2147483648),
    bash("timeout_huge_sleeping", "sleep 1; echo done", timeout=1e21),
    bash("timeout_negative", "echo never", timeout=-1),
    bash("timeout_negative_fraction", "echo never", timeout=-0.5),
    bash("timeout_kills_group", "sleep 5 & sleep 5; echo unreachable", timeout=300),
    # truncation (2000 lines / 50 KB) and the metadata cap (30000 characters)
    bash("lines_1999", "seq 1 1999"),
    bash("lines_2000_plus_newline", "seq 1 2000"),
    bash("lines_2000_no_newline", "seq 1 2000 | head -c -1"),
    bash("lines_3000", "seq 1 3000"),
    bash("lines_3000_explore", "seq 1 3000", agent="explore"),
    bash("bytes_single_line", "head -c 61440 /dev/zero | tr '\\0' a"),
    bash("bytes_many_lines", f"yes {'0123456789' * 7} | head -n 1000"),
    bash("bytes_48k_metadata_capped", f"yes {'0123456789' * 19} | head -n 256 | head -c 51200"),
    bash("bytes_exactly_51200", f"yes {'x' * 99} | head -n 512"),
    bash("bytes_51201", f"yes {'x' * 99} | head -n 512; printf y"),
    bash("bytes_multibyte", "for i in $(seq 1 800); do echo 'éééééééééééééééééééééééééééééééééééééééé'; done"),
    bash("metadata_cap", "yes 0123456789012345678 | head -n 1800"),
    bash("metadata_cap_exact", "yes 0123456789 | head -n 2727 | head -c 30000"),
    bash("metadata_cap_one_over", "yes 0123456789 | head -n 2728 | head -c 30001"),
    # permission rules from the config (asks are allowed; denies are observable)
    bash("config_deny_pattern", "rm -f nothing.txt", config={"permission": {"bash": {"*": "allow", "rm *": "deny"}}}),
    bash("config_deny_other_pattern", "echo fine", config={"permission": {"bash": {"*": "allow", "rm *": "deny"}}}),
    # more ordering, exits and truncation interplay
    bash("background_output_before_exit", "echo a; (sleep 0.3; echo b) & sleep 0.8; echo c"),
    bash("stdout_closed_early", "exec 1>&-; echo to-stderr >&2"),
    bash("sigpipe_is_fine", "yes | head -n 2"),
    bash("set_e", "set -e; false; echo unreachable"),
    bash("exit_minus_one", "exit -1"),
    bash("echo_unicode_literal", "echo 'naïve — ✓ 中文'"),
    bash("long_description", "echo hi", "word " * 60),
    bash("truncated_and_failed", "seq 1 3000; exit 4"),
    bash("truncated_crlf_lines", "seq 1 2500 | sed 's/$/\r/'"),
    bash("timeout_truncated", "seq 1 3000; sleep 5", timeout=600),
    bash("timeout_tiny_fraction", "sleep 5", timeout=1.5e-7),
    bash("workdir_dot", "pwd", workdir="."),
    bash("lines_3000_plan", "seq 1 3000", agent="plan"),
    bash("lines_3000_task_denied", "seq 1 3000", config={"permission": {"task": "deny"}}),
    bash("lines_3000_task_pattern_denied", "seq 1 3000", config={"permission": {"task": {"explore": "deny"}}}),
    bash("no_git_pwd", "pwd; git rev-parse --is-inside-work-tree 2>&1 | head -c 30", git=False),
    # argument validation (zod's texts)
    Case("bash_missing_command", "bash", {"description": "d"}),
    Case("bash_missing_description", "bash", {"command": "echo hi"}),
    Case("bash_missing_both", "bash", {}),
    Case("bash_command_number", "bash", {"command": 5, "description": "d"}),
    Case("bash_command_null", "bash", {"command": None, "description": "d"}),
    Case("bash_timeout_string", "bash", {"command": "echo hi", "description": "d", "timeout": "100"}),
    Case("bash_timeout_null", "bash", {"command": "echo hi", "description": "d", "timeout": None}),
    Case("bash_timeout_bool", "bash", {"command": "echo hi", "description": "d", "timeout": True}),
    Case("bash_workdir_number", "bash", {"command": "pwd", "description": "d", "workdir": 1}),
    Case("bash_description_array", "bash", {"command": "pwd", "description": ["a"]}),
]
