"""A frame's header is checked the same way by the agent's reader and by the control plane's reader with its
deadline (one check, sandbox_agent.frames.parse_header): the same errors for the same broken headers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from controlplane.sandbox.frame_deadline import read_frame_in_time
from sandbox_agent.frames import (
    END,
    HEADER,
    MAX_PAYLOAD,
    MESSAGE,
    FrameError,
    FrameTooLargeError,
    StreamCutError,
    frame,
    read_frame,
)

Reader = Callable[[asyncio.StreamReader], Awaitable[tuple[int, bytes] | None]]
READERS = [pytest.param(read_frame, id="agent"), pytest.param(read_frame_in_time, id="plane")]


def stream(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


@pytest.mark.parametrize("read", READERS)
async def test_a_whole_frame_is_read_and_a_clean_end_is_none(read: Reader) -> None:
    reader = stream(frame(MESSAGE, b"payload"))
    assert await read(reader) == (MESSAGE, b"payload")
    assert await read(reader) is None


@pytest.mark.parametrize("read", READERS)
async def test_a_frame_over_the_limit_is_refused_before_its_payload(read: Reader) -> None:
    with pytest.raises(FrameTooLargeError, match=f"a frame of {MAX_PAYLOAD + 1} bytes is over the {MAX_PAYLOAD}-byte"):
        await read(stream(HEADER.pack(MAX_PAYLOAD + 1, MESSAGE)))


@pytest.mark.parametrize("read", READERS)
async def test_an_unknown_kind_is_refused(read: Reader) -> None:
    with pytest.raises(FrameError, match="unknown frame kind 9"):
        await read(stream(HEADER.pack(0, 9)))


@pytest.mark.parametrize("read", READERS)
async def test_a_stream_cut_inside_a_frame_is_said_so(read: Reader) -> None:
    with pytest.raises(StreamCutError):
        await read(stream(frame(MESSAGE, b"payload")[:-1]))


async def test_end_comes_only_from_the_plane_to_the_agent() -> None:
    assert await read_frame(stream(frame(END, b""))) == (END, b"")
    with pytest.raises(FrameError, match=f"unknown frame kind {END}"):
        await read_frame_in_time(stream(frame(END, b"")))
