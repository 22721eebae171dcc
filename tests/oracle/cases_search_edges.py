"""Oracle cases for the edges of glob and grep: result limits, long names and lines, ordering, hidden and
ignored files, odd paths and patterns, and how ripgrep's output is split and trimmed (upstream v1.2.27).

As in cases_search, every case with several matching files gives each a distinct mtime (ripgrep's own
order depends on the filesystem and its threads). `list` is not here: upstream's debug agent cannot run it.
Upstream's workspace is also named `workspace`, so `../workspace` leads back into it on both sides.
"""

import string

from tests.oracle.cases import Case


def mtimes(*paths: str) -> str:
    """A setup giving each path its own mtime, the first one oldest."""
    return "\n".join(f"touch -h -d '2020-01-01 00:00:{i:02d}' '{p}'" for i, p in enumerate(paths, 1))


TREE = {
    "a.txt": "a\n", "b.md": "b\n", "src/c.txt": "c\n", "src/d.py": "d\n", "src/deep/e.txt": "e\n",
    "lib/f.py": "f\n", ".hidden/h.txt": "h\n", ".dot.txt": "d\n", "f1.txt": "1\n", "f2.txt": "2\n", "F3.txt": "3\n",
}
TREE_TIMES = mtimes(*TREE)
# One file whose name holds 101 lines: ripgrep prints it whole, upstream splits it into 101 paths (none exists,
# so all tie at mtime 0 and keep their order): a deterministic way to reach the 100-result limit.
CHARS = (string.digits + string.ascii_letters) * 2
HUNDRED_ONE_LINES = "\\n".join(CHARS[:101])

LONG_DIR = "d" * 250 + "/" + "e" * 250
LONG_NAMES = (f"mkdir -p {LONG_DIR} && for i in $(seq -w 1 100); do f={LONG_DIR}/${{i}}{'n' * 100}.txt; echo x > $f; "
              "touch -d @$((1577836800 + 10#$i)) $f; done")

GLOB = [
    Case("sx_glob_leading_dot_slash", "glob", {"pattern": "./src/*.txt"}, TREE, setup=TREE_TIMES),
    Case("sx_glob_double_star_middle", "glob", {"pattern": "src/**/*.txt"}, TREE, setup=TREE_TIMES),
    Case("sx_glob_negated_class_bang", "glob", {"pattern": "[!a]*.txt"}, TREE, setup=TREE_TIMES),
    Case("sx_glob_negated_class_caret", "glob", {"pattern": "[^a]*.txt"}, TREE, setup=TREE_TIMES),
    Case("sx_glob_range_class", "glob", {"pattern": "f[0-9].txt"}, TREE, setup=TREE_TIMES),
    Case("sx_glob_nested_braces", "glob", {"pattern": "*.{t{xt,s},md}"}, TREE, setup=TREE_TIMES),
    Case("sx_glob_brace_dirs", "glob", {"pattern": "{src,lib}/*.py"}, TREE, setup=TREE_TIMES),
    Case("sx_glob_hidden_dot_star", "glob", {"pattern": ".*"}, TREE, setup=TREE_TIMES),
    Case("sx_glob_hidden_dir_contents", "glob", {"pattern": ".hidden/**"}, TREE, setup=TREE_TIMES),
    Case("sx_glob_path_hidden_dir", "glob", {"pattern": "*", "path": ".hidden"}, TREE, setup=TREE_TIMES),
    Case("sx_glob_path_via_parent", "glob", {"pattern": "*.txt", "path": "../workspace/src"}, TREE,
         setup=TREE_TIMES),
    Case("sx_glob_backslash_separator", "glob", {"pattern": "src\\c.txt"}, TREE, setup=TREE_TIMES),
    Case("sx_glob_no_extension", "glob", {"pattern": "Makefile"}, {"Makefile": "all:\n", "sub/Makefile": "x:\n"},
         setup=mtimes("Makefile", "sub/Makefile")),
    Case("sx_glob_dot_ignore_file", "glob", {"pattern": "*.txt"},
         {".ignore": "skip/\n", "skip/s.txt": "s\n", "keep.txt": "k\n"}),
    Case("sx_glob_gitignore_negation", "glob", {"pattern": "*", "path": "sub"},
         {"sub/.gitignore": "*.log\n!keep.log\n", "sub/drop.log": "d\n", "sub/keep.log": "k\n"},
         setup=mtimes("sub/.gitignore", "sub/drop.log", "sub/keep.log")),
    Case("sx_glob_gitignore_without_git", "glob", {"pattern": "*"},
         {".gitignore": "secret.txt\n", "secret.txt": "s\n", "open.txt": "o\n"}, git=False,
         setup=mtimes(".gitignore", "secret.txt", "open.txt")),
    Case("sx_glob_rgignore", "glob", {"pattern": "*"}, {".rgignore": "x.tmp\n", "x.tmp": "x\n", "y.txt": "y\n"},
         git=False, setup=mtimes(".rgignore", "x.tmp", "y.txt")),
    Case("sx_glob_ignored_dir_double_star", "glob", {"pattern": "build/**"},
         {".gitignore": "build/\n", "build/out.bin": "o\n", "src/x.c": "x\n"}),
    Case("sx_glob_ignored_dir_by_name", "glob", {"pattern": "build"},
         {".gitignore": "build/\n", "build/out.bin": "o\n"}),
    Case("sx_glob_node_modules_listed", "glob", {"pattern": "*.js"},
         {"node_modules/m/index.js": "m\n", "app.js": "a\n"}, setup=mtimes("node_modules/m/index.js", "app.js")),
    Case("sx_glob_symlink_dir_not_followed", "glob", {"pattern": "*.txt"}, {"real/r.txt": "r\n"},
         setup="ln -s real lnk"),
    Case("sx_glob_broken_symlink", "glob", {"pattern": "*.txt"}, {"ok.txt": "o\n"}, setup="ln -s nowhere dangling.txt"),
    Case("sx_glob_deep_nesting", "glob", {"pattern": "**/f.txt"}, {"a/b/c/d/e/f.txt": "f\n", "f.txt": "top\n"},
         setup=mtimes("f.txt", "a/b/c/d/e/f.txt")),
    Case("sx_glob_subsecond_mtimes", "glob", {"pattern": "*.txt"}, {"p.txt": "p\n", "q.txt": "q\n", "r.txt": "r\n"},
         setup="touch -d '2020-01-01 00:00:01.300' p.txt; touch -d '2020-01-01 00:00:01.100' q.txt; "
               "touch -d '2020-01-01 00:00:01.200' r.txt"),
    Case("sx_glob_future_and_epoch", "glob", {"pattern": "*.txt"}, {"old.txt": "o\n", "new.txt": "n\n"},
         setup="touch -d '@0' old.txt; touch -d '2099-01-01' new.txt"),
    Case("sx_glob_unicode_pattern", "glob", {"pattern": "é*"}, {"été.txt": "e\n", "ete.txt": "e\n"}),
    Case("sx_glob_101_truncated", "glob", {"pattern": "*"}, git=False,
         setup=f"printf 'x\\n' > $'{HUNDRED_ONE_LINES}'"),
    Case("sx_glob_pattern_with_path_prefix", "glob", {"pattern": "src/*.txt", "path": "src"}, TREE, setup=TREE_TIMES),
    # Glob's metadata has `truncated`, so upstream does not cut its output at 50 KB either.
    Case("sx_glob_output_over_50kb", "glob", {"pattern": "*.txt"}, git=False, setup=LONG_NAMES),
    Case("sx_glob_empty_dir_only", "glob", {"pattern": "*"}, git=False, setup="mkdir -p empty/inner"),
]

MANY = {f"m{i}.txt": "".join(f"zebra42 {i}.{n}\n" for n in range(1, 41)) for i in range(1, 4)}
BIG_THEN_NUL = "zebra42 early\n" + ("filler line\n" * 20000) + "\0zebra42 late\n"

GREP = [
    Case("sx_grep_two_matches_one_line", "grep", {"pattern": "zebra42"}, {"t.txt": "zebra42 and zebra42\n"}),
    Case("sx_grep_word_boundary", "grep", {"pattern": r"\bzebra\b"}, {"t.txt": "zebra\nzebras\na zebra b\n"},
         git=False),
    Case("sx_grep_lookahead_unsupported", "grep", {"pattern": "zebra(?=42)"}, {"t.txt": "zebra42\n"}),
    Case("sx_grep_backreference_unsupported", "grep", {"pattern": r"(z)\1"}, {"t.txt": "zz\n"}),
    Case("sx_grep_unicode_class", "grep", {"pattern": r"\p{Greek}+"}, {"g.txt": "alpha\n\u03b1\u03b2\u03b3\n"},
         git=False),
    Case("sx_grep_unicode_case_insensitive", "grep", {"pattern": "(?i)ÉTÉ42"}, {"u.txt": "été42\nÉté42\nete42\n"}),
    Case("sx_grep_anchored_line", "grep", {"pattern": "^zebra42$"}, {"t.txt": "zebra42\n zebra42\nzebra42 \n"}),
    Case("sx_grep_empty_alternative", "grep", {"pattern": "zebra42|"}, {"t.txt": "one\n\nzebra42\n"}, git=False),
    Case("sx_grep_large_line_number", "grep", {"pattern": "zebra42"}, {"n.txt": "x\n" * 12345 + "zebra42 deep\n"}),
    Case("sx_grep_many_files_truncated", "grep", {"pattern": "zebra42"}, MANY,
         setup=mtimes("m1.txt", "m2.txt", "m3.txt")),
    Case("sx_grep_five_files_order", "grep", {"pattern": "zebra42"},
         {f"d{i}/f.txt": f"zebra42 {i}\nno\nzebra42 again {i}\n" for i in range(5)},
         setup=mtimes("d3/f.txt", "d0/f.txt", "d4/f.txt", "d1/f.txt", "d2/f.txt")),
    Case("sx_grep_include_hidden", "grep", {"pattern": "zebra42", "include": ".*"},
         {".env": "zebra42\n", "v.txt": "zebra42\n"}),
    Case("sx_grep_include_dir_glob", "grep", {"pattern": "zebra42", "include": "src/*.py"},
         {"src/a.py": "zebra42\n", "src/deep/b.py": "zebra42\n", "c.py": "zebra42\n"}),
    Case("sx_grep_include_case", "grep", {"pattern": "zebra42", "include": "*.TXT"}, {"t.txt": "zebra42\n"}),
    Case("sx_grep_include_with_path", "grep", {"pattern": "zebra42", "path": "src", "include": "deep/*.ts"},
         {"src/deep/c.ts": "zebra42\n", "src/b.ts": "zebra42\n"}),
    Case("sx_grep_path_gitignored_file", "grep", {"pattern": "zebra42", "path": "secret.txt"},
         {".gitignore": "secret.txt\n", "secret.txt": "zebra42\n"}),
    Case("sx_grep_path_gitignored_dir", "grep", {"pattern": "zebra42", "path": "ign"},
         {".gitignore": "ign/\n", "ign/x.txt": "zebra42\n"}),
    Case("sx_grep_path_hidden_dir", "grep", {"pattern": "zebra42", "path": ".cfg"},
         {".cfg/c.txt": "zebra42\n", "o.txt": "zebra42\n"}),
    Case("sx_grep_path_via_parent", "grep", {"pattern": "zebra42", "path": "../workspace/src"},
         {"src/s.txt": "zebra42\n"}),
    Case("sx_grep_node_modules_searched", "grep", {"pattern": "zebra42"},
         {"node_modules/m/i.js": "zebra42\n", "app.js": "zebra42\n"}, setup=mtimes("node_modules/m/i.js", "app.js")),
    Case("sx_grep_gitignore_negation", "grep", {"pattern": "zebra42"},
         {".gitignore": "*.log\n!keep.log\n", "drop.log": "zebra42\n", "keep.log": "zebra42\n"}),
    Case("sx_grep_rgignore", "grep", {"pattern": "zebra42"}, {".rgignore": "x.tmp\n", "x.tmp": "zebra42\n"},
         git=False),
    Case("sx_grep_symlink_dir_not_followed", "grep", {"pattern": "zebra42"}, {"real/r.txt": "zebra42\n"},
         setup="ln -s real lnk"),
    Case("sx_grep_nul_after_match", "grep", {"pattern": "zebra42"}, {"late.bin": BIG_THEN_NUL}),
    Case("sx_grep_utf16_bom_file", "grep", {"pattern": "zebra42"},
         {"w.txt": "base64:" + "//56AGUAYgByAGEANAAyACAAdQB0AGYAMQA2AAoA"}),
    # rg's `path|line|text` is split at the first `|`: with a file `a` present, `a|b.txt` is read as file `a`.
    Case("sx_grep_pipe_name_nan_line", "grep", {"pattern": "zebra42"}, {"a": "nothing\n", "a|b.txt": "zebra42\n"}),
    Case("sx_grep_pipe_name_numeric_line", "grep", {"pattern": "zebra42"},
         {"a": "nothing\n", "a|7|b.txt": "zebra42\n"}),
    Case("sx_grep_include_mismatch_file_path", "grep", {"pattern": "zebra42", "path": "t.txt", "include": "*.py"},
         {"t.txt": "zebra42\n"}),
    # The whole rg output is trimmed the JavaScript way: NBSP goes, U+001F stays.
    Case("sx_grep_trailing_js_space_last_line", "grep", {"pattern": "zebra42"},
         {"t.txt": "zebra42 a\u00a0\nzebra42 b\x1f\u00a0\u2028\n"}),
    Case("sx_grep_space_in_dir_name", "grep", {"pattern": "zebra42"}, {"my dir/a b.txt": "zebra42\n"}),
]

CASES: list[Case] = GLOB + GREP
