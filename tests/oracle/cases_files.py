"""read, write, edit, multiedit, apply_patch."""

from tests.oracle.cases import Case

CASES = [
    Case("read_small", "read", {"filePath": "a.txt"}, {"a.txt": "line one\nline two\n"}),
    # One suggestion only: several come in directory order, which differs between filesystems.
    Case("read_missing_suggests", "read", {"filePath": "notes"}, {"notes.md": "x\n", "other.txt": "y\n"}),
]
