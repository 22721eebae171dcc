"""Sessions on a real two-node swarm: placement, tools on both nodes, hardening, closed networks."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import docker
import pytest

from controlplane.v1 import session_pb2
from tests.cluster.support import Cluster, SwarmPlane

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


def node_of(plane: SwarmPlane, sandbox_id: str) -> str:
    api: Any = docker.from_env().api
    tasks = api.tasks(filters={"service": f"ocsb-{plane.instance}-{sandbox_id}", "desired-state": "running"})
    assert len(tasks) == 1, tasks
    return str(tasks[0]["NodeID"])


def task_address(plane: SwarmPlane, sandbox_id: str) -> str:
    api: Any = docker.from_env().api
    task = api.tasks(filters={"service": f"ocsb-{plane.instance}-{sandbox_id}", "desired-state": "running"})[0]
    attachments = task["NetworksAttachments"]
    assert len(attachments) == 1
    return str(attachments[0]["Addresses"][0].split("/")[0])


async def test_sessions_land_on_both_nodes_and_run_tools(cluster: Cluster, plane: SwarmPlane) -> None:
    on_manager = await plane.clients["alpha"].create_session()
    on_worker = await plane.clients["beta"].create_session()
    assert on_manager.state == on_worker.state == session_pb2.Session.READY
    assert node_of(plane, on_manager.sandbox_id) == cluster.manager
    assert node_of(plane, on_worker.sandbox_id) == cluster.worker
    for tenant, session in (("alpha", on_manager), ("beta", on_worker)):
        client = plane.clients[tenant]
        wrote = await client.execute_tool(
            session.id, "bash", {"command": f"printf 'one\\ntwo {tenant}\\n' > notes.txt && echo done",
                                 "description": "write a file"},
        )
        assert wrote.output == "done\n"
        read = await client.execute_tool(session.id, "read", {"filePath": "/workspace/notes.txt"})
        assert read.output == (
            "<path>/workspace/notes.txt</path>\n<type>file</type>\n<content>"
            f"1: one\n2: two {tenant}\n\n(End of file - total 2 lines)\n</content>"
        )


async def test_tool_processes_are_hardened_on_the_worker(cluster: Cluster, plane: SwarmPlane) -> None:
    session = await plane.clients["beta"].create_session(cpu=0.5, memory_mb=256, pids=128)
    assert node_of(plane, session.sandbox_id) == cluster.worker
    done = await plane.clients["beta"].run(
        session.id, command="grep -E '^(CapEff|NoNewPrivs):' /proc/self/status; id -u; "
        "touch /etc/x /x 2>&1 | sed 's/.*: //'; touch /workspace/ok /tmp/ok && echo writable",
    )
    api: Any = docker.from_env().api
    spec = api.inspect_service(f"ocsb-{plane.instance}-{session.sandbox_id}")["Spec"]
    tool_uid = spec["Labels"]["ocsb.tool_uid"]  # the sandbox's own block (test_swarm_confinement.py)
    assert done.stdout.decode() == (
        f"CapEff:\t0000000000000000\nNoNewPrivs:\t1\n{tool_uid}\n"
        "Read-only file system\nRead-only file system\nwritable\n"
    )
    container, limits = spec["TaskTemplate"]["ContainerSpec"], spec["TaskTemplate"]["Resources"]["Limits"]
    assert container["CapabilityDrop"] == ["ALL"]
    assert sorted(container["CapabilityAdd"]) == ["KILL", "SETGID", "SETUID"]
    assert container["ReadOnly"] is True
    assert limits == {"NanoCPUs": 500_000_000, "MemoryBytes": 256 * 1024 * 1024, "Pids": 128}
    assert spec["TaskTemplate"]["RestartPolicy"]["Condition"] == "none"
    network = docker.from_env().api.inspect_network(f"ocsb-{plane.instance}-{session.sandbox_id}")
    assert network["Internal"] is True
    assert network["Driver"] == "overlay"


@pytest.fixture
def listeners(cluster: Cluster) -> Iterator[list[tuple[str, int]]]:
    """TCP listeners this test owns, on the manager's end of the veth pair and on the host's loopback."""
    sockets = []
    for host in (cluster.state["HOST_ADDR"], "127.0.0.1"):
        s = socket.socket()
        s.bind((host, 0))
        s.listen()
        sockets.append(s)
    yield [(s.getsockname()[0], s.getsockname()[1]) for s in sockets]
    for s in sockets:
        s.close()


PROBE = """
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(':', 1)
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, int(port)))
        print(target, 'CONNECTED')
    except OSError as exc:
        print(target, exc.strerror or type(exc).__name__)
    finally:
        s.close()
routes = [line.split()[1] for line in open('/proc/net/route').read().splitlines()[1:]]
print('default route' if '00000000' in routes else 'no default route')
"""


async def test_sessions_have_no_network_out_and_cannot_reach_each_other(
    cluster: Cluster, plane: SwarmPlane, listeners: list[tuple[str, int]]
) -> None:
    a = await plane.clients["beta"].create_session()
    b = await plane.clients["alpha"].create_session()
    relay_port = plane.plane.settings.provider.relay_port  # type: ignore[union-attr]
    api_port = plane.plane.port
    targets = [f"{h}:{p}" for h, p in listeners] + [
        f"{cluster.state['HOST_ADDR']}:{relay_port}", f"{cluster.state['WORKER_ADDR']}:{relay_port}",
        f"{cluster.state['HOST_ADDR']}:{api_port}", f"{task_address(plane, b.sandbox_id)}:22",
    ]
    for session, tenant in ((a, "beta"), (b, "alpha")):
        done = await plane.clients[tenant].run(session.id, ["python3", "-c", PROBE, *targets])
        lines = done.stdout.decode().splitlines()
        assert lines[0] == f"{targets[0]} Network is unreachable"
        # The sandbox's 127.0.0.1 is its own loopback: the host's listener there is not reached.
        assert lines[1] == f"{targets[1]} Connection refused"
        assert lines[2:4] == [f"{t} Network is unreachable" for t in targets[2:4]], lines
        assert lines[4] == f"{targets[4]} Network is unreachable"
        # b's own address is on b's network (refused: nothing listens); from a it is unreachable.
        expected = "Network is unreachable" if session is a else "Connection refused"
        assert lines[5] == f"{targets[5]} {expected}"
        assert lines[6] == "no default route"
    assert listeners[0][0] == cluster.state["HOST_ADDR"]


async def test_concurrent_sessions_spread_over_both_nodes(cluster: Cluster, plane: SwarmPlane) -> None:
    sessions = await asyncio.gather(*(plane.clients["gamma"].create_session() for _ in range(4)))
    nodes = {node_of(plane, s.sandbox_id) for s in sessions}
    assert nodes == {cluster.manager, cluster.worker}
    outputs = await asyncio.gather(*(plane.clients["gamma"].run(s.id, ["echo", s.id]) for s in sessions))
    assert [o.stdout.decode() for o in outputs] == [f"{s.id}\n" for s in sessions]
