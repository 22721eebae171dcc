"""The session proxy against garbage: mutated and random request bytes (seeded, bounded) never raise out of
a connection handler, never reach a server the policy does not allow, and leave the proxy answering."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from tests.egress.support import EchoServer, HttpUpstream, split_response, start_proxy

SEEDS = range(150)


def mutated(valid: bytes, rng: random.Random) -> bytes:
    data = bytearray(valid)
    for _ in range(rng.randint(1, 6)):
        choice = rng.random()
        at = rng.randrange(len(data) + 1)
        if choice < 0.4 and data:
            data[min(at, len(data) - 1)] = rng.choice(b"\r\n :@[]/%\x00\xff0aZ")
        elif choice < 0.7:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        else:
            del data[at:at + rng.randint(1, 8)]
    return bytes(data)


async def test_garbage_never_escapes_a_handler_nor_the_policy(tmp_path: Path) -> None:
    upstream = await HttpUpstream().start()
    blocked = await EchoServer().start()
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: errors.append(context))
    p = await start_proxy(tmp_path, allow_hosts=[f"allowed.test:{upstream.port}"], operator_cidrs=["127.0.0.1/32"],
                          static_hosts={"allowed.test": "127.0.0.1", "blocked.test": "127.0.0.1"})
    valid = [
        f"GET http://allowed.test:{upstream.port}/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n".encode(),
        f"POST http://allowed.test:{upstream.port}/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        "3\r\nabc\r\n0\r\n\r\n".encode(),
        f"CONNECT allowed.test:{upstream.port} HTTP/1.1\r\n\r\n".encode(),
        f"GET http://blocked.test:{blocked.port}/ HTTP/1.1\r\n\r\n".encode(),
    ]
    try:
        for seed in SEEDS:
            rng = random.Random(seed)
            raw = mutated(rng.choice(valid), rng) if seed % 5 else bytes(rng.randrange(256) for _ in range(200))
            reader, writer = await p.open()
            writer.write(raw)
            writer.write_eof()
            try:
                await asyncio.wait_for(reader.read(-1), 5)
            except (ConnectionError, TimeoutError):
                pass
            writer.close()
        last = valid[0].replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
        status, _, body = split_response(await p.exchange(last))
    finally:
        await p.proxy.close()
        loop.set_exception_handler(previous)
        await upstream.close()
        await blocked.close()
    assert (status, body) == (200, b"hello from upstream")
    assert errors == []
    assert blocked.connections == 0
