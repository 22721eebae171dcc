"""A workspace archive opened for reading in bounded memory, whatever it declares.

tarfile left to itself decompresses a whole input chunk at once (a few KiB of bzip2 can expand to
hundreds of MiB) and reads a PAX or GNU long-name header's whole declared size into one string (a
510 KB gzip once declared 512 MiB and cost a GB). Here decompression is done by the stdlib's file
objects, which hand out at most what is asked for, and every header kind whose body tarfile keeps in
memory is refused past MAX_HEADER_BYTES before a byte of it is read.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import tarfile
import zlib
from typing import IO, Any

from controlplane.errors import InvalidArgumentError, ResourceExhaustedError

PREFIX = "workspace upload refused: "
MAX_HEADER_BYTES = 1 << 20
"""PAX and GNU long-name/long-link headers: a name is at most 4096 bytes and real PAX records a few KiB."""

_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
)
"""The compressions tarfile's `r|*` accepted before (and the sandbox agent's extractor reads)."""
_HEADER_KINDS = {
    tarfile.XHDTYPE: "PAX",
    tarfile.XGLTYPE: "PAX global",
    tarfile.SOLARIS_XHDTYPE: "Solaris extended",
    tarfile.GNUTYPE_LONGNAME: "GNU long-name",
    tarfile.GNUTYPE_LONGLINK: "GNU long-link",
}
STREAM_ERRORS = (EOFError, OSError, lzma.LZMAError, zlib.error, ValueError)
"""What a corrupt compressed stream raises from read (zlib.error and bz2's are OSError or ValueError)."""


def compression(data: bytes) -> str:
    """The compression `data` starts with, "" for none."""
    return next((name for magic, name in _MAGIC if data.startswith(magic)), "")


def decompressed(archive: bytes) -> IO[bytes]:
    """`archive`'s tar stream: decompressed on demand, in small pieces. A compressed stream inside the
    compressed one is refused: nothing legitimate double-compresses, and each layer multiplies the ratio."""
    kind = compression(archive)
    raw = io.BytesIO(archive)
    if not kind:
        return raw
    stream: Any = (gzip.GzipFile(fileobj=raw) if kind == "gzip" else bz2.BZ2File(raw) if kind == "bzip2"
                   else lzma.LZMAFile(raw))
    try:
        head = stream.peek(8)[:8]
    except STREAM_ERRORS as exc:
        raise InvalidArgumentError(f"{PREFIX}not a valid {kind} stream: {exc}") from exc
    inner = compression(head)
    if inner:
        raise InvalidArgumentError(f"{PREFIX}nested compression ({inner} inside {kind}) is not accepted")
    return stream  # type: ignore[no-any-return]


class CappedTarInfo(tarfile.TarInfo):
    """A TarInfo that refuses, before reading them, the header bodies tarfile would hold in memory."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        kind = _HEADER_KINDS.get(self.type)
        if kind is not None and self.size > MAX_HEADER_BYTES:
            raise ResourceExhaustedError(
                f"{PREFIX}a {kind} header declares {self.size} bytes; the limit is {MAX_HEADER_BYTES}"
            )
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise _sparse()
        return super()._proc_member(tarfile_)  # type: ignore[misc,no-any-return]

    # PAX sparse maps are read block by block up to a count the header declares: refused outright.
    def _proc_gnusparse_00(self, *_: object) -> None:
        raise _sparse()

    def _proc_gnusparse_01(self, *_: object) -> None:
        raise _sparse()

    def _proc_gnusparse_10(self, *_: object) -> None:
        raise _sparse()


def _sparse() -> InvalidArgumentError:
    return InvalidArgumentError(f"{PREFIX}sparse files are not accepted")
