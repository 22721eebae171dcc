"""A command with its line continuations joined, as bash reads it.

bash removes every backslash-newline before it splits words (outside single quotes, ANSI-C strings, comments and
quoted here-documents), so `r\\<newline>m f` runs `rm f`. tree-sitter-bash reads the pair as blank space between
words instead, and saw the command `r` with the arguments `m f`: a rule against `rm *` never met it. The
analysis therefore also follows the joined text. The patterns shown to the user stay the command as written
(upstream shows those), while the joined commands are matched against the rules too.
"""

from __future__ import annotations

from tree_sitter import Node

_KEPT_IN = frozenset({"raw_string", "ansi_c_string", "comment"})
"""Nodes inside which bash keeps a backslash-newline as it is."""


def joined(text: str, root: Node) -> str:
    """`text` (whose parse is `root`) with the backslash-newlines bash would remove removed; `text` itself when
    there are none."""
    source = text.encode("utf-8", "surrogatepass")
    if b"\\\n" not in source:
        return text
    out = bytearray()
    i = 0
    while i < len(source):
        byte = source[i]
        if byte != 0x5C:  # a backslash
            out.append(byte)
            i += 1
            continue
        run_end = i
        while run_end < len(source) and source[run_end] == 0x5C:
            run_end += 1
        # In a run of backslashes each pair is one escaped backslash: only an odd run escapes what follows.
        escapes_newline = (run_end - i) % 2 == 1 and source[run_end:run_end + 1] == b"\n"
        if escapes_newline and _removed_at(root, run_end - 1):
            out += source[i:run_end - 1]
            i = run_end + 1
        else:
            out += source[i:run_end]
            i = run_end
    return out.decode("utf-8", "surrogatepass")


def _removed_at(root: Node, offset: int) -> bool:
    node: Node | None = root.descendant_for_byte_range(offset, offset + 1)
    while node is not None:
        if node.type in _KEPT_IN:
            return False
        if node.type == "heredoc_body":
            return not _quoted_heredoc(node)
        node = node.parent
    return True


def _quoted_heredoc(body: Node) -> bool:
    """Whether the here-document's delimiter was quoted (`<<'EOF'`, `<<"EOF"`, `<<\\EOF`): its body is literal."""
    redirect = body.parent
    if redirect is None:
        return False
    for child in redirect.children:
        if child.type == "heredoc_start":
            start = (child.text or b"")
            return any(quote in start for quote in (b"'", b'"', b"\\"))
    return False
