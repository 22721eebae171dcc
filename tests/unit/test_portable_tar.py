"""What a snapshot or a fork leaves out of a workspace tar: only what no new session would take."""

from __future__ import annotations

import io
import random
import tarfile

import pytest

from controlplane.core.sessions import portable_tar, workspace_archive
from controlplane.core.sessions.portable_tar import portable
from controlplane.core.sessions.workspace_archive import check
from controlplane.errors import InvalidArgumentError, ResourceExhaustedError


def _tar(*members: tuple[str, bytes, str]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, kind, target in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, target
            info.mode = 0o640 if kind == tarfile.REGTYPE else 0o755
            data = b"data of " + name.encode() if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _listing(data: bytes) -> list[tuple[str, str, int]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(m.name, m.linkname, m.mode) for m in tar]


def test_a_tree_with_nothing_to_leave_out_is_used_as_it_came() -> None:
    data = _tar(("d", tarfile.DIRTYPE, ""), ("d/f", tarfile.REGTYPE, ""), ("d/up", tarfile.SYMTYPE, "../d/f"),
                ("d/gone", tarfile.SYMTYPE, "missing"), ("hard", tarfile.LNKTYPE, "d/f"))
    made = portable(data)
    assert made.tar is data
    assert made.dropped == []


def test_links_out_of_the_workspace_and_fifos_are_left_out_by_name() -> None:
    data = _tar(("d", tarfile.DIRTYPE, ""), ("d/f", tarfile.REGTYPE, ""), ("abs", tarfile.SYMTYPE, "/etc/passwd"),
                ("d/out", tarfile.SYMTYPE, "../../x"), ("pipe", tarfile.FIFOTYPE, ""),
                ("d/in", tarfile.SYMTYPE, "../d/f"), ("dev", tarfile.CHRTYPE, ""))
    made = portable(data)
    assert _listing(made.tar) == [("d", "", 0o755), ("d/f", "", 0o640), ("d/in", "../d/f", 0o755)]
    with tarfile.open(fileobj=io.BytesIO(made.tar)) as tar:
        body = tar.extractfile("d/f")
        assert body is not None
        assert body.read() == b"data of d/f"
    assert [d.split(":")[0] for d in made.dropped] == ["abs", "d/out", "pipe", "dev"]
    assert "outside the workspace" in made.dropped[0]


def test_what_is_said_of_many_long_names_left_out_is_bounded() -> None:
    # Thousands of FIFOs with 4,000-byte names: before, every name went whole into one log line.
    names = [f"{i:05d}" + "p" * 3995 for i in range(1000)]
    made = portable(_tar(("keep", tarfile.REGTYPE, ""), *((name, tarfile.FIFOTYPE, "") for name in names)))
    assert _listing(made.tar) == [("keep", "", 0o640)]
    assert len(made.dropped) == portable_tar.MAX_LISTED + 1
    assert made.dropped[0].startswith("00000ppp")
    assert all(len(d) <= portable_tar.MAX_SHOWN + 3 for d in made.dropped)
    assert made.dropped[-1] == "and 900 more entries"
    assert len("; ".join(made.dropped)) < 40_000


def _restorable(data: bytes) -> None:
    check(data, max_entries=1 << 20, max_bytes=1 << 40)  # InvalidArgumentError if a new session would refuse it


def test_a_link_that_leads_out_only_through_another_link_is_left_out() -> None:
    # By its words alone `chain` climbs back to where it starts; through `self` (the workspace itself) each
    # `self` is no step down, so its three `..` climb out.
    data = _tar(("self", tarfile.SYMTYPE, "."), ("chain", tarfile.SYMTYPE, "self/self/self/../../.."),
                ("f", tarfile.REGTYPE, ""))
    with pytest.raises(InvalidArgumentError, match="chain"):
        _restorable(data)
    made = portable(data)
    assert [name for name, _, _ in _listing(made.tar)] == ["self", "f"]
    assert [d.split(":")[0] for d in made.dropped] == ["chain"]
    _restorable(made.tar)


def test_a_link_made_to_lead_out_by_a_later_entry_is_left_out() -> None:
    # `up` is `b/..` (the workspace) while `b` is a directory, and out of it once `b` is a link to `.`.
    data = _tar(("b", tarfile.DIRTYPE, ""), ("up", tarfile.SYMTYPE, "b/.."), ("b", tarfile.SYMTYPE, "."))
    made = portable(data)
    assert [d.split(":")[0] for d in made.dropped] == ["up"]
    _restorable(made.tar)


def test_what_named_a_left_out_link_is_left_out_too() -> None:
    # The hard link reaches `f` through the link `a`; once `a` is left out (it leads out after `b` becomes a link
    # to `.`), `a/f` names nothing, and a new session would refuse the hard link.
    data = _tar(("f", tarfile.REGTYPE, ""), ("b", tarfile.DIRTYPE, ""), ("a", tarfile.SYMTYPE, "b/.."),
                ("h", tarfile.LNKTYPE, "a/f"), ("b", tarfile.SYMTYPE, "."))
    made = portable(data)
    assert sorted(d.split(":")[0] for d in made.dropped) == ["a", "h"]
    _restorable(made.tar)


def test_what_a_new_session_takes_is_kept_as_it_came_and_the_rest_always_restores() -> None:
    # Random trees of directories, files and links (targets made of the same few names, `.` and `..`), with names
    # repeated so that later entries replace earlier ones: whatever the walk accepts is used as it came, and what
    # is left of any other always passes the check a restore makes.
    rng = random.Random(2611)
    names = ["a", "b", "c"]
    taken = left = 0
    for _ in range(1500):
        members: list[tuple[str, bytes, str]] = []
        for _ in range(rng.randint(1, 9)):
            name = "/".join(rng.choice(names) for _ in range(rng.randint(1, 3)))
            kind = rng.choice([tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE])
            target = ""
            if kind == tarfile.SYMTYPE:
                target = "/".join(rng.choice([*names, ".", "..", ".."]) for _ in range(rng.randint(1, 6)))
            elif kind == tarfile.LNKTYPE:
                target = "/".join(rng.choice(names) for _ in range(rng.randint(1, 3)))
            members.append((name, kind, target))
        data = _tar(*members)
        try:
            _restorable(data)
        except InvalidArgumentError:
            left += 1
            made = portable(data)
            assert made.dropped
            _restorable(made.tar)
        else:
            taken += 1
            assert portable(data).tar is data
    assert taken > 100  # both sides were really tried
    assert left > 100


def test_past_the_rounds_allowed_every_link_is_left_out_and_the_files_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    # Leaving `a` out (it leads out once `b` is a link to `.`) makes the hard link `h` name nothing: a second round.
    # With one round allowed, every link goes instead, and the files stay.
    monkeypatch.setattr(workspace_archive, "MAX_LEAVE_OUT_ROUNDS", 1)
    data = _tar(("f", tarfile.REGTYPE, ""), ("b", tarfile.DIRTYPE, ""), ("a", tarfile.SYMTYPE, "b/.."),
                ("h", tarfile.LNKTYPE, "a/f"), ("b", tarfile.SYMTYPE, "."), ("keep", tarfile.SYMTYPE, "f"))
    made = portable(data)
    assert [name for name, _, _ in _listing(made.tar)] == ["f", "b"]
    assert [d.split(":")[0] for d in made.dropped] == ["a", "h", "b", "keep"]
    assert "too tangled" in made.dropped[-1]
    _restorable(made.tar)


def test_a_copy_from_a_hostile_agent_is_read_in_bounded_memory() -> None:
    # The tar comes from the sandbox's agent: a compromised one could declare a PAX header of a GiB (read whole by
    # tarfile) or send millions of tiny entries (each held until the count was checked after the pass).
    big = io.BytesIO()
    with tarfile.open(fileobj=big, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("f")
        info.pax_headers = {"comment": "x" * (2 << 20)}
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ResourceExhaustedError, match="a PAX header declares"):
        portable(big.getvalue())
    many = _tar(*((f"f{i}", tarfile.REGTYPE, "") for i in range(50)))
    with pytest.raises(ResourceExhaustedError, match="more than 40 entries"):
        portable(many, max_entries=40)
    assert portable(many, max_entries=50).entries == 50
