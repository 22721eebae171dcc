"""Files written with holes where their data is zeros (the workspace extractor, tario.py).

A snapshot of a sparse file (`truncate -s 300M` costs the tool process no disk) stores its zeros, which compress to
nothing; written out in full on restore they could need more than the session's disk, and that session could then
never be restored or resumed.
"""

from __future__ import annotations

import os
from typing import IO

_PAGE = 4096
_COPY_BLOCK = 256 * _PAGE
_ZEROS = bytes(_COPY_BLOCK)


def write_sparse(fd: int, source: IO[bytes] | None) -> None:
    """Copies `source` into the new, empty file `fd`, leaving every whole zero page as a hole; the file's size
    comes from the final ftruncate."""
    size = 0
    while source is not None and (block := source.read(_COPY_BLOCK)):
        if block == _ZEROS[:len(block)]:
            os.lseek(fd, len(block), os.SEEK_CUR)
        else:
            # A mixed block: its data pages are written, its zero pages skipped. Pages stay aligned on the file's
            # (each block but the last is a whole number of pages), so a skipped page is a real hole.
            # (Comparisons are on bytes slices: a memoryview compares element by element, 40 times slower.)
            data = 0
            for start in range(0, len(block), _PAGE):
                page = block[start:start + _PAGE]
                if page == _ZEROS[:len(page)]:
                    _write_all(fd, memoryview(block)[data:start])
                    os.lseek(fd, len(page), os.SEEK_CUR)
                    data = start + len(page)
            _write_all(fd, memoryview(block)[data:])
        size += len(block)
    # A trailing hole is only a seek so far: the file's length is set here (growing it allocates nothing).
    os.ftruncate(fd, size)


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data):]
