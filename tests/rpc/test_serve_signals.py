"""`python -m controlplane serve` with the local provider stops on SIGTERM/SIGINT once sessions exist (an
in-process agent used to take the process's signal handlers over, so SIGTERM stopped one agent instead)."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from controlplane.client import AsyncClient
from tests.archives import tar_of
from tests.planes import PlaneProcess, new_instance, remove_data_dir, short_tmp

EXIT_WITHIN_S = 5.0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_served_local_plane_stops_cleanly_on_a_signal_after_creating_sessions(sig: signal.Signals) -> None:
    data_dir = short_tmp()
    process = PlaneProcess(data_dir, new_instance("sig"), pool_size=0)
    process.env["CONTROLPLANE_PROVIDER__TYPE"] = "local"
    try:
        target = await process.start()
        async with AsyncClient(target, process.token()) as client:
            first = await client.create_session(workspace_archive=tar_of({"a.txt": "hi\n"}))
            await client.create_session()
            assert (await client.run(first.id, ["cat", "a.txt"])).stdout == b"hi\n"
        assert len(list((data_dir / "sandboxes").iterdir())) == 2
        assert process.proc is not None
        sent = time.monotonic()
        process.proc.send_signal(sig)
        code = await asyncio.to_thread(process.proc.wait, 15)
        took = time.monotonic() - sent
        log = (data_dir / "serve.log").read_text()
        assert code == 0, log
        assert took < EXIT_WITHIN_S, f"took {took:.1f} s"
        # A clean stop, not a kill: the sandboxes were ended and the endpoint file removed.
        assert list((data_dir / "sandboxes").iterdir()) == []
        assert not (data_dir / "endpoint").exists()
    finally:
        if process.proc is not None and process.proc.poll() is None:
            process.kill()
        remove_data_dir(data_dir)
