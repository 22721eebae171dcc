"""Hostile workspace archives and opencode.json documents in CreateSession (local plane)."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from hypothesis import strategies as st

from controlplane.v1 import session_pb2
from tests.fuzz.harness import ARCHIVE_ENTRIES_CAP, SECRET, FuzzPlane, run_given, snapshot, tree
from tests.fuzz.strategies import hostile_text, json_values, malformed_json

Member = tuple[tarfile.TarInfo, bytes | None]


def tar(members: list[Member]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"pwned\n", link: str = "") -> Member:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    if kind == tarfile.CHRTYPE:
        info.devmajor, info.devminor = 1, 3
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        return info, data
    return info, None


def hostile(outside: Path) -> dict[str, bytes]:
    climb = "../" * 12 + str(outside)[1:]
    return {
        "dotdot": tar([member("ok.txt"), member(f"{climb}/dotdot.txt")]),
        "absolute": tar([member(f"{outside}/absolute.txt")]),
        "device": tar([member("null", tarfile.CHRTYPE), member("fifo", tarfile.FIFOTYPE)]),
        "hardlink_out": tar([member("hl", tarfile.LNKTYPE, link=f"{climb}/secret.txt"),
                             member("hl2", tarfile.LNKTYPE, link=f"{str(outside)[1:]}/secret.txt")]),
        "symlink_dir_then_write": tar([member("out", tarfile.SYMTYPE, link=str(outside)),
                                       member("out/through-link.txt")]),
        "many_files": tar([member(f"d/{i}", data=b"") for i in range(3000)]),
    }


CASES = ["dotdot", "absolute", "device", "hardlink_out", "symlink_dir_then_write", "many_files"]


def _workspace(fp: FuzzPlane, sandbox_id: str) -> Path:
    return fp.plane.settings.data_dir / "sandboxes" / sandbox_id / "workspace"


async def _create(fp: FuzzPlane, archive: bytes, check: Callable[[Path], None] | None = None,
                  config_json: str = "") -> tuple[grpc.StatusCode, str]:
    try:
        session = await fp.client.create_session(workspace_archive=archive, config_json=config_json, deadline_s=60)
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    try:
        if check is not None:
            check(_workspace(fp, session.sandbox_id))
    finally:
        await fp.client.delete_session(session.id)
    return grpc.StatusCode.OK, ""


def _no_secret_inside(workspace: Path) -> None:
    for path in workspace.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert SECRET.encode() not in path.read_bytes(), f"{path} holds the outside secret"


@pytest.mark.parametrize("case", CASES)
async def test_hostile_archive_writes_nothing_outside(fplane: FuzzPlane, case: str) -> None:
    before = tree(fplane.outside)
    code, details = await _create(fplane, hostile(fplane.outside)[case], _no_secret_inside)
    assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED), details
    assert tree(fplane.outside) == before
    assert (fplane.outside / "secret.txt").stat().st_nlink == 1


def refusals(outside: Path) -> dict[str, tuple[grpc.StatusCode, str]]:
    climb = "../" * 12 + str(outside)[1:]
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    return {
        "dotdot": (invalid, f'entry "{climb}/dotdot.txt" escapes the workspace'),
        "absolute": (invalid, f'entry "{outside}/absolute.txt" has an absolute path'),
        "device": (invalid, 'entry "null" is a character device; only files, directories and links are allowed'),
        "hardlink_out": (invalid, f'entry "hl" is a hard link to "{climb}/secret.txt", outside the workspace'),
        "symlink_dir_then_write": (
            invalid, f'entry "out" is a symlink to "{outside}", an absolute path outside the workspace'
        ),
        "many_files": (grpc.StatusCode.RESOURCE_EXHAUSTED,
                       f"the archive has more than {ARCHIVE_ENTRIES_CAP} entries (limits.max_archive_entries)"),
    }


@pytest.mark.parametrize("case", CASES)
async def test_hostile_archive_is_refused_naming_the_entry_and_leaves_nothing(fplane: FuzzPlane, case: str) -> None:
    before = await snapshot(fplane)
    code, details = await _create(fplane, hostile(fplane.outside)[case])
    expected_code, reason = refusals(fplane.outside)[case]
    assert (code, details) == (expected_code, "workspace upload refused: " + reason)
    assert await snapshot(fplane) == before  # no session, no sandbox dir, nothing written anywhere


async def test_an_archive_at_the_entry_cap_is_accepted(fplane: FuzzPlane) -> None:
    files = [member(f"d/{i}", data=b"") for i in range(ARCHIVE_ENTRIES_CAP - 1)]
    before = await snapshot(fplane)
    code, details = await _create(fplane, tar([member("d", tarfile.DIRTYPE), *files]))
    assert code == grpc.StatusCode.OK, details
    after = await snapshot(fplane)
    assert (after.sandboxes, after.outside) == (before.sandboxes, before.outside)


def declared_big() -> tarfile.TarInfo:
    big = tarfile.TarInfo("big")
    big.size = 1 << 34  # 16 GiB declared, 4 KiB sent
    return big


async def test_size_bomb_is_resource_exhausted(fplane: FuzzPlane) -> None:
    before = await snapshot(fplane)
    code, details = await _create(fplane, declared_big().tobuf(tarfile.GNU_FORMAT) + b"\0" * 4096)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details == "workspace upload refused: archive expands past the 1073741824-byte limit"
    assert await snapshot(fplane) == before


async def test_not_a_tar_is_invalid_argument(fplane: FuzzPlane) -> None:
    code, details = await _create(fplane, b"hello world")
    assert (code, details) == (
        grpc.StatusCode.INVALID_ARGUMENT, "workspace upload refused: not a valid tar archive: truncated header"
    )


async def test_refused_create_leaves_no_session_behind(fplane: FuzzPlane) -> None:
    before = await snapshot(fplane)
    refusals = [
        (b"hello world", ""),
        (tar([member("ok.txt")]), "[1, 2]"),
        (tar([member("ok.txt")]), "{not json"),
        (tar([member("ok.txt"), member("../escape.txt")]), ""),
        (declared_big().tobuf(tarfile.GNU_FORMAT) + b"\0" * 4096, ""),
    ]
    for archive, config_json in refusals:
        code, details = await _create(fplane, archive, config_json=config_json)
        assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED), details
        assert await snapshot(fplane) == before


@st.composite
def archives(draw: st.DrawFn) -> bytes:
    kinds = st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE,
                             tarfile.FIFOTYPE])
    names = st.one_of(hostile_text, st.sampled_from(["a", "a/b", "../x", "/x", "./.", "a/../../x", "..", "."]))
    members = draw(st.lists(st.tuples(names, kinds, names, st.binary(max_size=64)), max_size=6))
    built = []
    for name, kind, link, data in members:
        if "\x00" in name or "\x00" in link:
            continue
        try:
            info, payload = member(name, kind, data, link)
            info.tobuf(tarfile.GNU_FORMAT)
        except (ValueError, UnicodeError):
            continue
        built.append((info, payload))
    raw = tar(built)
    cut = draw(st.integers(min_value=0, max_value=len(raw)))
    return raw if draw(st.booleans()) else raw[:cut]


async def test_fuzzed_archives_give_a_clear_answer_and_write_nothing_outside(fplane: FuzzPlane) -> None:
    async def check(archive: bytes) -> None:
        before = await snapshot(fplane)
        code, details = await _create(fplane, archive, _no_secret_inside)
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED), (
            f"{code.name}: {details}"
        )
        assert code == grpc.StatusCode.OK or details
        after = await snapshot(fplane)
        assert (after.outside, after.workspace, after.sandboxes) == (before.outside, before.workspace,
                                                                     before.sandboxes)

    await run_given(archives(), check)


async def test_malformed_opencode_json_is_invalid_argument_or_harmless(fplane: FuzzPlane) -> None:
    documents = st.one_of(
        malformed_json,
        st.dictionaries(st.sampled_from(["permission", "agent", "mcp", "tools", "plugin", "experimental", "$schema"]),
                        json_values, max_size=4).map(json.dumps),
    )

    async def check(doc: str) -> None:
        before = await snapshot(fplane)
        refused: grpc.aio.AioRpcError | None = None
        try:
            session = await fplane.client.create_session(config_json=doc, deadline_s=30)
        except grpc.aio.AioRpcError as exc:
            refused = exc
        if refused is not None:
            assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.details()
            assert (refused.details() or "").startswith(("config_json ", "config_json: ")), refused.details()
        else:
            # Accepted: the document is a JSON object; its tools must list or refuse clearly, never crash.
            assert session.state == session_pb2.Session.READY
            listing_refused: grpc.aio.AioRpcError | None = None
            try:
                await fplane.client.list_tools(session.id)
            except grpc.aio.AioRpcError as exc:
                listing_refused = exc
            if listing_refused is not None:
                code = listing_refused.code()
                assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION), (
                    f"{code.name}: {listing_refused.details()}"
                )
            await fplane.client.delete_session(session.id)
        after = await snapshot(fplane)
        assert (after.outside, after.workspace, after.sandboxes) == (before.outside, before.workspace,
                                                                     before.sandboxes)

    await run_given(documents, check)
