"""Oracle cases for the edges of the file tools (read, write, edit, apply_patch): byte and line caps, text
encodings and line endings, image and binary kinds by name, directories, instruction files beside the read
file, and edits and patches at whitespace, CRLF and end-of-file boundaries (upstream v1.2.27).

Cases that would only show a documented platform decision (atomic multiedit, apply_patch's pure additions at
their context and `*** End of File`, BlockAnchor's threshold for a lone candidate, a move onto itself) are left
out: there the platform differs on purpose.
"""

import base64

from tests.oracle.cases import Case

GPT = {"model": "openai/gpt-5"}
PNG = "base64:iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
SEQ10 = "seq 1 10 > n.txt"


def raw(data: bytes) -> str:
    return "base64:" + base64.b64encode(data).decode()


def patch(*lines: str) -> dict[str, str]:
    return {"patchText": "\n".join(["*** Begin Patch", *lines, "*** End Patch"])}


READ = [
    Case("fx_read_limit_runs_past_end", "read", {"filePath": "n.txt", "offset": 8, "limit": 10}, setup=SEQ10),
    Case("fx_read_line_2001", "read", {"filePath": "l.txt"},
         setup="{ head -c 2001 /dev/zero | tr '\\0' z; printf '\\n'; } > l.txt"),
    Case("fx_read_long_lines_byte_cap", "read", {"filePath": "l.txt"},
         setup="for i in $(seq 1 30); do head -c 3000 /dev/zero | tr '\\0' q; echo; done > l.txt"),
    Case("fx_read_multibyte_byte_cap", "read", {"filePath": "m.txt"}, {"m.txt": ("é" * 600 + "\n") * 50}),
    Case("fx_read_long_multibyte_line", "read", {"filePath": "m.txt"}, {"m.txt": "ß" * 2500 + "\nend\n"}),
    Case("fx_read_nul_after_sample", "read", {"filePath": "t.txt"}, {"t.txt": raw(b"a" * 5000 + b"\x00b\n")}),
    Case("fx_read_tiny_control_file", "read", {"filePath": "t.txt"}, {"t.txt": raw(b"\x01ab")}),
    Case("fx_read_ansi_escapes", "read", {"filePath": "log.txt"}, {"log.txt": "\x1b[31mred\x1b[0m\nplain\n"}),
    Case("fx_read_utf16_bom_is_binary", "read", {"filePath": "u.txt"}, {"u.txt": raw("hi\n".encode("utf-16"))}),
    Case("fx_read_cut_utf8_at_end", "read", {"filePath": "t.txt"}, {"t.txt": raw(b"abc\n\xe2\x82")}),
    Case("fx_read_dot_bin_name_is_text", "read", {"filePath": ".bin"}, {".bin": "dotfile\n"}),
    Case("fx_read_tar_gz_is_binary", "read", {"filePath": "a.tar.gz"}, {"a.tar.gz": "text\n"}),
    Case("fx_read_ico", "read", {"filePath": "f.ico"}, {"f.ico": PNG}),
    Case("fx_read_bmp", "read", {"filePath": "f.bmp"}, {"f.bmp": PNG}),
    Case("fx_read_dib", "read", {"filePath": "f.dib"}, {"f.dib": PNG}),
    Case("fx_read_jxl", "read", {"filePath": "f.jxl"}, {"f.jxl": PNG}),
    Case("fx_read_jfif", "read", {"filePath": "f.jfif"}, {"f.jfif": PNG}),
    Case("fx_read_dir_top_level_only", "read", {"filePath": "d"}, {"d/x/y/z.txt": "", "d/f.txt": ""}),
    Case("fx_read_dir_accents_and_case", "read", {"filePath": "d"},
         {"d/b": "", "d/B": "", "d/a": "", "d/Ä": "", "d/ä": "", "d/z": "", "d/-dash": "", "d/~tilde": ""}),
    Case("fx_read_dir_through_dotdot", "read", {"filePath": "d/sub/.."}, {"d/sub/x": "", "d/y": ""}),
    Case("fx_read_missing_suggests_shorter_name", "read", {"filePath": "sub/config.json.bak"},
         {"sub/config.json": "{}\n"}),
    Case("fx_read_agents_md_itself", "read", {"filePath": "sub/AGENTS.md"}, {"sub/AGENTS.md": "rules\n"}),
    Case("fx_read_empty_agents_md", "read", {"filePath": "sub/f.txt"}, {"sub/AGENTS.md": "", "sub/f.txt": "f\n"}),
    Case("fx_read_lowercase_agents_md", "read", {"filePath": "sub/f.txt"},
         {"sub/agents.md": "lower\n", "sub/f.txt": "f\n"}),
    Case("fx_read_image_with_agents_md", "read", {"filePath": "img/p.png"},
         {"img/AGENTS.md": "img\n", "img/p.png": PNG}),
]

WRITE = [
    Case("fx_write_after_read_crlf_to_lf", "write", {"filePath": "a.txt", "content": "one\ntwo\n"},
         {"a.txt": "one\r\ntwo\r\n"}),
    Case("fx_write_after_read_through_symlink", "write", {"filePath": "link.txt", "content": "new\n"},
         {"real.txt": "old\n"}, setup="ln -s real.txt link.txt"),
    Case("fx_write_nul_content", "write", {"filePath": "z.txt", "content": "a\u0000b\n"}),
]

EDIT = [
    Case("fx_edit_after_read_replace_all_trimmed", "edit",
         {"filePath": "a.txt", "oldString": "  foo()", "newString": "bar()", "replaceAll": True},
         {"a.txt": "\tfoo()\n\tfoo()\n"}),
    Case("fx_edit_after_read_replace_all_overlap", "edit",
         {"filePath": "a.txt", "oldString": "aa", "newString": "b", "replaceAll": True}, {"a.txt": "aaaaa\n"}),
    Case("fx_edit_after_read_ambiguous_then_trimmed", "edit",
         {"filePath": "a.txt", "oldString": "foo", "newString": "X"}, {"a.txt": "  foo\nfoo\n"}),
    Case("fx_edit_after_read_whitespace_regex_chars", "edit",
         {"filePath": "a.txt", "oldString": "a.b  (c)", "newString": "Z"}, {"a.txt": "x = a.b (c) + 1\n"}),
    Case("fx_edit_after_read_whitespace_window", "edit",
         {"filePath": "a.txt", "oldString": "foo  bar\nbaz   qux", "newString": "joined"},
         {"a.txt": "start\nfoo bar\n  baz qux\nend\n"}),
    Case("fx_edit_after_read_nbsp", "edit", {"filePath": "a.txt", "oldString": "a b c", "newString": "abc"},
         {"a.txt": "x a\u00a0b\u00a0c y\n"}),
    Case("fx_edit_after_read_replace_all_two_hunks", "edit",
         {"filePath": "n.txt", "oldString": "x", "newString": "y", "replaceAll": True},
         setup="seq 1 60 | sed -e '5s/$/x/' -e '50s/$/x/' > n.txt"),
    Case("fx_edit_after_read_close_changes_merge", "edit",
         {"filePath": "n.txt", "oldString": "x", "newString": "y", "replaceAll": True},
         setup="seq 1 40 | sed -e '10s/$/x/' -e '18s/$/x/' > n.txt"),
    Case("fx_edit_after_read_drop_final_newline", "edit", {"filePath": "a.txt", "oldString": "b\n", "newString": "b"},
         {"a.txt": "a\nb\n"}),
    Case("fx_edit_after_read_crlf_new_has_crlf", "edit",
         {"filePath": "a.txt", "oldString": "b", "newString": "x\r\ny"}, {"a.txt": "a\r\nb\r\nc\r\n"}),
    Case("fx_edit_after_read_lone_cr_file", "edit", {"filePath": "a.txt", "oldString": "b", "newString": "B"},
         {"a.txt": "a\rb\rc"}),
    Case("fx_edit_create_crlf", "edit", {"filePath": "c.txt", "oldString": "", "newString": "a\r\nb\r\n"}),
    Case("fx_edit_create_over_directory", "edit", {"filePath": "sub", "oldString": "", "newString": "x"},
         {"sub/f": "y"}),
    Case("fx_edit_after_read_indented_diff", "edit",
         {"filePath": "a.py", "oldString": "value = 2", "newString": "value = 3"},
         {"a.py": "        first = 1\n        value = 2\n        last = 3\n"}),
    Case("fx_edit_after_read_delete_everything", "edit",
         {"filePath": "a.txt", "oldString": "only\nlines\n", "newString": ""}, {"a.txt": "only\nlines\n"}),
]

APPLY_PATCH = [
    Case("fx_ap_crlf_patch_text", "apply_patch",
         {"patchText": "*** Begin Patch\r\n*** Add File: c.txt\r\n+one\r\n+two\r\n*** End Patch\r\n"}, config=GPT),
    Case("fx_ap_crlf_patch_update", "apply_patch",
         {"patchText": "*** Begin Patch\r\n*** Update File: a.txt\r\n@@\r\n-a\r\n+A\r\n*** End Patch"},
         {"a.txt": "a\nb\n"}, config=GPT),
    Case("fx_ap_heredoc_without_cat", "apply_patch",
         {"patchText": "<<EOF\n*** Begin Patch\n*** Add File: h.txt\n+h\n*** End Patch\nEOF"}, config=GPT),
    Case("fx_ap_update_rstrip_match", "apply_patch", patch("*** Update File: a.txt", "@@", "-value = 1   ", "+v"),
         {"a.txt": "value = 1\n"}, config=GPT),
    Case("fx_ap_delete_then_update_same", "apply_patch",
         patch("*** Delete File: a.txt", "*** Update File: a.txt", "@@", "-a", "+A"), {"a.txt": "a\n"}, config=GPT),
    Case("fx_ap_add_then_update_same", "apply_patch",
         patch("*** Add File: n.txt", "+a", "*** Update File: n.txt", "@@", "-a", "+A"), config=GPT),
    Case("fx_ap_update_delete_all_lines", "apply_patch", patch("*** Update File: a.txt", "@@", "-a", "-b"),
         {"a.txt": "a\nb\n"}, config=GPT),
    Case("fx_ap_two_contexts", "apply_patch",
         patch("*** Update File: a.py", "@@ def f(x):", "-    b = 2", "+    b = 22", "@@ def g(x):", "-    d = 4",
               "+    d = 44"),
         {"a.py": "def f(x):\n    a = 1\n    b = 2\n    return a + b\n\n\ndef g(x):\n    c = 3\n    d = 4\n"},
         config=GPT),
    Case("fx_ap_eof_marker_unambiguous", "apply_patch",
         patch("*** Update File: a.txt", "@@", "-last", "+LAST", "*** End of File"), {"a.txt": "first\nlast\n"},
         config=GPT),
    Case("fx_ap_add_empty_path", "apply_patch", patch("*** Add File: ", "+x"), config=GPT),
    Case("fx_ap_trailing_blank_context", "apply_patch", patch("*** Update File: a.txt", "@@", "-x", "+y", " "),
         {"a.txt": "x\n"}, config=GPT),
    Case("fx_ap_delete_empty_file", "apply_patch", patch("*** Delete File: e.txt"), {"e.txt": ""}, config=GPT),
    Case("fx_ap_update_bom_line", "apply_patch", patch("*** Update File: a.txt", "@@", "-a", "+A"),
         {"a.txt": "\ufeffa\nb\n"}, config=GPT),
    Case("fx_ap_update_in_long_file", "apply_patch", patch("*** Update File: n.txt", "@@", "-50", "+fifty"),
         setup="seq 1 100 > n.txt", config=GPT),
    Case("fx_ap_add_blank_lines", "apply_patch", patch("*** Add File: b.txt", "+", "+mid", "+"), config=GPT),
    Case("fx_ap_text_after_end_marker", "apply_patch",
         {"patchText": "*** Begin Patch\n*** Add File: a.txt\n+a\n*** End Patch\n+ignored?\ntrailing words"},
         config=GPT),
    Case("fx_ap_move_to_existing_dir_path", "apply_patch",
         patch("*** Update File: a.txt", "*** Move to: sub", "@@", "-a", "+b"), {"a.txt": "a\n", "sub/k": "k\n"},
         config=GPT),
]

CASES: list[Case] = READ + WRITE + EDIT + APPLY_PATCH
