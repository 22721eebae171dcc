"""What the escape tests share with the gVisor file: host listeners that count what reaches them, the network
probe, and the words gVisor's kernel uses where runc's differ (with a probe of the reason itself)."""

from __future__ import annotations

import asyncio
import ipaddress
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import docker
import pytest

from tests.planes import Plane
from tests.security.conftest import Vector, python_probe

STAT_PROBE = """
import errno, os, sys
for path in sys.argv[1:]:
    try:
        os.listdir(path) if os.path.isdir(path) else os.stat(path)
        print(path, "OK")
    except OSError as e:
        print(path, errno.errorcode[e.errno])
"""
"""What gVisor's coreutils messages hide: os.stat and os.listdir (stat and getdents, not statx) give the errno."""


def on_gvisor(expected: str) -> str:
    """`expected` (runc's words) as coreutils print it on gVisor (Debian's runsc 2022): its kernel answers their
    statx of a missing or closed path with EINVAL, whatever the reason. A gVisor test then checks the reason
    itself with STAT_PROBE: the property (not found, or denied) is the same as on runc."""
    expected = re.sub(r"(?m)^ls: cannot (?:access|open directory) ('[^']*'): .*$",
                      r"ls: cannot access \1: Invalid argument", expected)
    return re.sub(r"(?m)^stat: cannot statx ('[^']*'): .*$", r"stat: cannot statx \1: Invalid argument", expected)


async def reasons(plane: Plane, session: str, vector: Vector, *paths: str) -> dict[str, str]:
    """path -> "OK" or the errno name os.stat/os.listdir get for it inside the session."""
    out = await vector.run(plane.client, session, python_probe(STAT_PROBE, *paths))
    return dict(line.rsplit(" ", 1) for line in out.splitlines())


@dataclass
class Listener:
    """A TCP and a UDP listener on one host address, counting whatever reaches them."""

    host: str
    tcp_port: int = 0
    udp_port: int = 0
    hits: list[str] = field(default_factory=list)


class _Counting(asyncio.DatagramProtocol):
    def __init__(self, hits: list[str]) -> None:
        self.hits = hits

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        self.hits.append(f"udp {addr}")


def docker0_address() -> str:
    """The host's address on Docker's default bridge. Some engines list no `Gateway` for it; the bridge then
    has the subnet's first address, as Docker gives it."""
    config = docker.from_env().networks.get("bridge").attrs["IPAM"]["Config"][0]
    if config.get("Gateway"):
        return str(config["Gateway"])
    return str(next(ipaddress.ip_network(config["Subnet"]).hosts()))


@pytest.fixture
async def listeners() -> AsyncIterator[dict[str, Listener]]:
    found: dict[str, Listener] = {}
    closers = []
    for name, host in (("docker0", docker0_address()), ("loopback", "127.0.0.1")):
        listener = Listener(host)

        async def on_connect(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter, lst: Listener = listener
        ) -> None:
            lst.hits.append("tcp connection")
            writer.close()

        server = await asyncio.start_server(on_connect, host, 0)
        listener.tcp_port = server.sockets[0].getsockname()[1]
        transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda lst=listener: _Counting(lst.hits), local_addr=(host, 0)  # type: ignore[misc]
        )
        listener.udp_port = transport.get_extra_info("sockname")[1]
        closers += [server.close, transport.close]
        found[name] = listener
    yield found
    for close in closers:
        close()


NETWORK_PROBE = """
import socket, sys
def errname(e):
    import errno
    return errno.errorcode.get(e.errno, str(e.errno))
# Nothing below can leave the sandbox unless it has an interface besides lo or a route.
print("interfaces:", " ".join(line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]))
print("routes:", len(open("/proc/net/route").readlines()) - 1)
targets = {"docker0": sys.argv[1], "loopback": "127.0.0.1"}
ports = {"docker0": (int(sys.argv[2]), int(sys.argv[3])), "loopback": (int(sys.argv[4]), int(sys.argv[5]))}
for name, host in targets.items():
    tcp, udp = ports[name]
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((host, tcp)); print("tcp", name, "CONNECTED")
    except OSError as e:
        print("tcp", name, errname(e))
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    # A DNS query for a name, sent straight to an address: the 'DNS by raw IP' trick.
    query = bytes.fromhex("123401000001000000000000") + b"\\x05probe\\x07invalid\\x00" + bytes.fromhex("00010001")
    try:
        u.sendto(query, (host, udp)); print("udp", name, "sent")
    except OSError as e:
        print("udp", name, errname(e))
try:
    print("resolve", socket.getaddrinfo("escape-probe.invalid", 80))
except socket.gaierror as e:
    print("resolve", {socket.EAI_AGAIN: "EAI_AGAIN", socket.EAI_NONAME: "EAI_NONAME"}.get(e.errno, e.errno))
"""
