"""Workspace archives whose headers or compression would make the control plane hold unbounded memory:
refused from what they declare, in bounded memory, for every compression accepted (real archive bytes)."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import tarfile
import time
import tracemalloc
import zlib
from collections.abc import Callable

import pytest

from controlplane.core.sessions.archive_stream import MAX_HEADER_BYTES
from controlplane.core.sessions.workspace_archive import ArchiveStats, check
from controlplane.errors import ControlPlaneError, InvalidArgumentError, ResourceExhaustedError

GIB = 1 << 30
HUGE = 512 << 20
COMPRESSIONS: dict[str, Callable[[bytes], bytes]] = {
    "none": lambda data: data, "gzip": gzip.compress, "bzip2": bz2.compress, "xz": lzma.compress,
}


def header(kind: bytes, size: int, name: str = "././@PaxHeader") -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info.tobuf(tarfile.USTAR_FORMAT)


def gzip_of_zeros(head: bytes, zeros: int) -> bytes:
    """`head` then `zeros` zero bytes, gzip'd a MiB at a time (the test itself stays small)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [packer.compress(head)]
    chunk = bytes(1 << 20)
    for _ in range(zeros >> 20):
        out.append(packer.compress(chunk))
    out.append(packer.flush())
    return b"".join(out)


def regular(*files: tuple[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def refusal(archive: bytes) -> ControlPlaneError:
    with pytest.raises(ControlPlaneError) as caught:
        check(archive, 1000, GIB, keep=lambda _: True)
    return caught.value


def test_a_512_mib_pax_header_in_a_small_gzip_is_refused_quickly_in_bounded_memory() -> None:
    archive = gzip_of_zeros(header(tarfile.XHDTYPE, HUGE), HUGE)
    assert len(archive) < 1 << 20
    tracemalloc.start()
    started = time.monotonic()
    try:
        error = refusal(archive)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(error, ResourceExhaustedError)
    assert str(error) == (
        f"workspace upload refused: a PAX header declares {HUGE} bytes; the limit is {MAX_HEADER_BYTES}"
    )
    assert peak < 64 << 20, f"peak {peak >> 20} MiB"
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("compression", list(COMPRESSIONS))
@pytest.mark.parametrize(("kind", "shown"), [
    (tarfile.XHDTYPE, "PAX"), (tarfile.XGLTYPE, "PAX global"), (tarfile.GNUTYPE_LONGNAME, "GNU long-name"),
    (tarfile.GNUTYPE_LONGLINK, "GNU long-link"),
])
def test_every_header_kind_is_capped_in_every_compression(kind: bytes, shown: str, compression: str) -> None:
    size = MAX_HEADER_BYTES + 1
    archive = COMPRESSIONS[compression](header(kind, size, "././@LongLink") + bytes(size + 511 & ~511) + bytes(1024))
    error = refusal(archive)
    assert isinstance(error, ResourceExhaustedError)
    assert str(error) == f"workspace upload refused: a {shown} header declares {size} bytes; the limit is {1 << 20}"


@pytest.mark.parametrize("compression", list(COMPRESSIONS))
def test_ordinary_archives_still_pass_in_every_compression(compression: str) -> None:
    archive = COMPRESSIONS[compression](regular(("opencode.json", b"{}"), ("d/" + "n" * 200, b"x")))
    stats = check(archive, 10, GIB, keep=lambda path: path == "opencode.json")
    assert stats == ArchiveStats(2, 3, {"opencode.json": b"{}"})


@pytest.mark.parametrize(("outer", "inner"), [("gzip", "gzip"), ("gzip", "xz"), ("bzip2", "gzip"), ("xz", "bzip2")])
def test_nested_compression_is_refused(outer: str, inner: str) -> None:
    archive = COMPRESSIONS[outer](COMPRESSIONS[inner](regular(("a.txt", b"a"))))
    error = refusal(archive)
    assert isinstance(error, InvalidArgumentError)
    assert str(error) == f"workspace upload refused: nested compression ({inner} inside {outer}) is not accepted"


def test_a_corrupt_compressed_stream_is_invalid() -> None:
    archive = gzip.compress(regular(("a.txt", b"a" * 5000)))
    broken = archive[:10] + bytes(len(archive) - 10)
    error = refusal(broken)
    assert isinstance(error, InvalidArgumentError)
    assert str(error).startswith("workspace upload refused: not a valid ")


def test_sparse_files_are_refused_before_their_map_is_read() -> None:
    gnu_sparse = tarfile.TarInfo("s")
    gnu_sparse.type = tarfile.GNUTYPE_SPARSE
    archive = gnu_sparse.tobuf(tarfile.GNU_FORMAT) + bytes(1024)
    assert str(refusal(archive)) == "workspace upload refused: sparse files are not accepted"
    pax = tarfile.TarInfo("p")
    pax.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "p",
                       "GNU.sparse.realsize": "10"}
    pax_archive = pax.tobuf(tarfile.PAX_FORMAT) + bytes(1024)
    assert str(refusal(pax_archive)) == "workspace upload refused: sparse files are not accepted"
