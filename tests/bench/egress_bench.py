"""A session's network through its proxy beside the same requests from the host (issue 24): what the proxy costs.

One Docker control plane in this process (the image the plane is configured with: `OCSB_TEST_IMAGE`, else
ocsb-sandbox:latest; it must carry the sandbox's forwarder and curl) whose operator `[egress]` allows
127.0.0.1/32 and maps `bench.test` to it, one tenant whose cap allows `bench.test`, and one session with
`network_allow=["bench.test"]`. The test server is Python's `http.server` in a process of its own on 127.0.0.1
(in this process it would share the GIL with the proxy and slow the proxied side only), serving a 10 MiB file
and a small one, once over plain HTTP and once over HTTPS with a certificate from a CA made here.

Both sides run the same curl command line and report curl's own `%{time_total}` (the process start and the
Exec round trip are outside it): in the sandbox through `http_proxy`/`https_proxy` (absolute-URI for HTTP,
CONNECT for HTTPS, relayed by the sandbox's forwarder to the session's proxy in this process), on the host
straight to 127.0.0.1 (`--noproxy '*'`, `--resolve bench.test:PORT:127.0.0.1`, so the Host header and the
certificate's name are the same). Host and sandbox samples alternate in small blocks, so a change in the
machine's load falls on both. Rows: the 10 MiB download's median throughput (ratio proxied / direct) and a
small request's p50/p99 latency (the added ms), for HTTP and for HTTPS (CONNECT, tunnelled untouched).

Diagnostic rows split the path: a raw-socket Python client (a process of its own) GETs the same files from the
session proxy's Unix socket on the host (no container, no forwarder) and from the server directly, alternating;
its ratio is the proxy's own share, the rest of the curl rows' loss is the forwarder and the container's hop.
"""

from __future__ import annotations

import asyncio
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from controlplane import app
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from controlplane.sandbox.layout import SandboxDirs
from tests.bench.bench import cleanup
from tests.bench.bench_common import IMAGE, percentile, progress, scratch_dir
from tests.bench.bench_plane import Plane
from tests.unit.egress_tls import LoopbackCa

HOST = "bench.test"
BIG = 10 * 1024 * 1024
BIG_FILE, SMALL_FILE = "10m.bin", "small.txt"
SANDBOX_CA = "/tmp/bench-egress-ca.pem"
DOWNLOADS, DOWNLOADS_QUICK = 7, 3
SMALL, SMALL_QUICK = 50, 20
BLOCK = 10
"""Small requests per side before the other side's turn."""

# The server: the stdlib's static file server on 127.0.0.1, optionally behind TLS; it prints its port.
SERVER = """
import functools, http.server, ssl, sys
root, cert, key = sys.argv[1], sys.argv[2], sys.argv[3]
class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=root))
if cert:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


# The diagnostic client: raw HTTP/1.1 GETs, alternating between the session proxy's Unix socket (absolute-URI,
# no forwarder, no container) and the server itself (origin-form), each timed to the last byte; prints
# "proxy SECONDS BYTES" and "direct SECONDS BYTES" lines. A process of its own, as the server is.
RAW_CLIENT = """
import socket, sys, time
sock, port, path, count = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
host = "bench.test:%d" % port
def get(family, address, target):
    start = time.perf_counter()
    s = socket.socket(family, socket.SOCK_STREAM)
    s.connect(address)
    s.sendall(("GET %s HTTP/1.1\\r\\nHost: %s\\r\\nConnection: close\\r\\n\\r\\n" % (target, host)).encode())
    got = 0
    while True:
        chunk = s.recv(262144)
        if not chunk:
            break
        got += len(chunk)
    s.close()
    return time.perf_counter() - start, got
for _ in range(count):
    print("direct %f %d" % get(socket.AF_INET, ("127.0.0.1", port), path))
    print("proxy %f %d" % get(socket.AF_UNIX, sock, "http://" + host + path))
"""


@contextmanager
def file_server(root: Path, cert: Path | None = None, key: Path | None = None) -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(root), str(cert or ""), str(key or "")],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.strip():
            raise RuntimeError(f"the test server did not start (exit {proc.poll()})")
        yield int(line)
    finally:
        proc.terminate()  # the server this section started, by its own handle
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def curl_loop(url: str, count: int, extra: str) -> str:
    """`count` curls of `url`, one line `time_total size_download http_code` each; the same text on both sides."""
    return (f"for i in $(seq {count}); do curl -sS --max-time 60 {extra} -o /dev/null "
            f"-w '%{{time_total}} %{{size_download}} %{{http_code}}\\n' '{url}' || echo fail; done")


def parse(out: str, count: int, size: int, where: str) -> list[float]:
    """Seconds per request; any failed, short or non-200 request fails the row (a figure of errors is no figure)."""
    lines = out.split("\n")[:-1] if out.endswith("\n") else out.split("\n")
    seconds = []
    for line in lines:
        parts = line.split()
        if len(parts) != 3 or parts[2] != "200" or int(parts[1]) != size:
            raise RuntimeError(f"{where}: a request failed or was short: {line!r}")
        seconds.append(float(parts[0]))
    if len(seconds) != count:
        raise RuntimeError(f"{where}: {len(seconds)} of {count} requests reported: {out[-300:]!r}")
    return seconds


async def host_side(url: str, port: int, count: int, size: int, ca: Path | None) -> list[float]:
    extra = f"--noproxy '*' --resolve {HOST}:{port}:127.0.0.1" + (f" --cacert {ca}" if ca else "")
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    done = await asyncio.to_thread(subprocess.run, ["sh", "-c", curl_loop(url, count, extra)], capture_output=True,
                                   env=env, timeout=180, check=False)
    return parse(done.stdout.decode(), count, size, f"host curl ({done.stderr.decode(errors='replace')[-200:]})")


async def sandbox_side(client: AsyncClient, session_id: str, url: str, count: int, size: int,
                       https: bool) -> list[float]:
    extra = f"--cacert {SANDBOX_CA}" if https else ""
    done = await client.run(session_id, command=curl_loop(url, count, extra), merge_stderr=True, timeout_ms=180_000)
    return parse(done.stdout.decode(errors="replace"), count, size, "sandbox curl")


async def alternate(client: AsyncClient, session_id: str, url: str, port: int, total: int, block: int, size: int,
                    ca: Path | None) -> tuple[list[float], list[float]]:
    """(sandbox seconds, host seconds), taken in alternating blocks of `block`."""
    proxied: list[float] = []
    direct: list[float] = []
    while len(proxied) < total:
        n = min(block, total - len(proxied))
        direct += await host_side(url, port, n, size, ca)
        proxied += await sandbox_side(client, session_id, url, n, size, ca is not None)
    return proxied, direct


async def start(instance: str) -> Plane:
    data_dir = scratch_dir("oce")
    token = secrets.token_hex(16)
    tenant = {"name": "bench", "token": token, "egress": {"allow_hosts": [HOST]}}
    settings = load_settings(None, data_dir=data_dir, instance=instance, tenants=[tenant],
                             provider={"type": "docker", "image": image()},
                             egress={"allow_cidrs": ["127.0.0.1/32"], "hosts": {HOST: "127.0.0.1"}},
                             pool={"size": 0}, server={"listen": "127.0.0.1:0"})
    plane = await app.start(settings)
    return Plane(plane, AsyncClient(plane.address, token), instance, data_dir)


def image() -> str:
    """The image the plane runs, picked as the other Docker sections pick it."""
    return os.environ.get("OCSB_TEST_IMAGE", IMAGE)


async def proxy_alone(socket_path: Path, port: int, path: str, count: int,
                      size: int) -> tuple[list[float], list[float]]:
    """(via the proxy's socket, direct) seconds of the raw client's GETs of `path`."""
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", RAW_CLIENT, str(socket_path), str(port),
                                                    path, str(count)], capture_output=True, timeout=180, check=False)
    seconds: dict[str, list[float]] = {"proxy": [], "direct": []}
    for line in done.stdout.decode().splitlines():
        side, took, got = line.split()
        if int(got) < size:  # headers and the whole body, or the proxy refused
            raise RuntimeError(f"raw client: {side} GET of {path} got {got} bytes")
        seconds[side].append(float(took))
    if len(seconds["proxy"]) != count or len(seconds["direct"]) != count:
        raise RuntimeError(f"raw client failed: {done.stderr.decode(errors='replace')[-300:]}")
    return seconds["proxy"], seconds["direct"]


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def diag_lines(big: tuple[list[float], list[float]], small: tuple[list[float], list[float]],
               cpu_per_mib: float) -> list[str]:
    through, host = mib_s(big[0]), mib_s(big[1])
    p, d = percentile(small[0], 50) * 1000, percentile(small[1], 50) * 1000
    return [
        f"{'diag: proxy alone, 10 MiB, http':44} {len(big[0]):>4} {through:>10.1f} {host:>10.1f}"
        f"   {through / host:.2f} (python raw GET to the proxy's socket)",
        f"{'diag: proxy alone, small request p50 ms':44} {len(small[0]):>4} {p:>10.2f} {d:>10.2f}   {p - d:+.2f} ms",
        f"diag: the proxy's CPU (this process, during the proxy-alone downloads): {cpu_per_mib:.2f} ms per MiB",
    ]


def mib_s(seconds: list[float]) -> float:
    return BIG / (1024 * 1024) / statistics.median(seconds)


async def measure(client: AsyncClient, session_id: str, scheme: str, port: int, ca: Path | None,
                  quick: bool) -> list[str]:
    downloads, small = (DOWNLOADS_QUICK, SMALL_QUICK) if quick else (DOWNLOADS, SMALL)
    base = f"{scheme}://{HOST}:{port}"
    progress(f"egress {scheme}: 10 MiB x{downloads} per side, small request x{small} per side")
    big_proxied, big_direct = await alternate(client, session_id, f"{base}/{BIG_FILE}", port, downloads, 1, BIG, ca)
    small_size = len(small_text())
    proxied, direct = await alternate(client, session_id, f"{base}/{SMALL_FILE}", port, small, BLOCK, small_size, ca)
    through, host = mib_s(big_proxied), mib_s(big_direct)
    p = [percentile(proxied, q) * 1000 for q in (50, 99)]
    d = [percentile(direct, q) * 1000 for q in (50, 99)]
    how = "CONNECT, tunnelled" if scheme == "https" else "absolute-URI"
    return [
        f"{'10 MiB download, ' + scheme + ' (' + how + ')':44} {downloads:>4} {through:>10.1f} {host:>10.1f}"
        f"   {through / host:.2f} of the host's throughput (median MiB/s)",
        f"{'small request, ' + scheme + ' p50 ms':44} {small:>4} {p[0]:>10.2f} {d[0]:>10.2f}   {p[0] - d[0]:+.2f} ms",
        f"{'small request, ' + scheme + ' p99 ms':44} {small:>4} {p[1]:>10.2f} {d[1]:>10.2f}   {p[1] - d[1]:+.2f} ms",
    ]


def small_text() -> bytes:
    return b"a small response from the bench's test host\n"


async def curl_version(client: AsyncClient | None = None, session_id: str = "") -> str:
    if client is None:
        done = await asyncio.to_thread(subprocess.run, ["curl", "--version"], capture_output=True, check=False)
        out = done.stdout.decode()
    else:
        out = (await client.run(session_id, ["curl", "--version"])).stdout.decode()
    return " ".join(out.split()[:2]) or "curl ?"


async def section(quick: bool) -> list[str]:
    if shutil.which("curl") is None:
        return ["egress rows skipped: no curl on the host, so the host side could not run the sandbox's command"]
    instance = f"bench-eg-{secrets.token_hex(3)}"
    root = scratch_dir("oces")
    (root / BIG_FILE).write_bytes(os.urandom(BIG))  # random: nothing on the way can compress it
    (root / SMALL_FILE).write_bytes(small_text())
    ca = LoopbackCa(root)
    ca.server_context(HOST)  # writes server-*.crt (chain) and its key beside the CA
    cert = next(root.glob("server-*.crt"))
    planes: list[Plane] = []
    notes: list[str] = []
    lines: list[str] = []
    try:
        with file_server(root) as http_port, file_server(root, cert, cert.with_suffix(".key")) as https_port:
            progress(f"egress: starting control plane {instance}, one session with network_allow=[{HOST!r}]")
            p = await start(instance)
            planes.append(p)
            session = await p.client.create_session(network_allow=[HOST])
            pem = ca.ca_file.read_text()
            wrote = await p.client.run(session.id, ["sh", "-c", 'printf "%s" "$1" > "$2"', "sh", pem, SANDBOX_CA])
            if wrote.exit_code != 0:
                raise RuntimeError(f"writing the test CA into the sandbox failed: {wrote.stderr!r}")
            lines.append(f"image {image()}; {await curl_version()} on the host, "
                         f"{await curl_version(p.client, session.id)} in the sandbox; curl's time_total both sides")
            lines.append(f"{'row':44} {'n':>4} {'proxied':>10} {'host':>10}   proxied vs host")
            for scheme, port, trust in (("http", http_port, None), ("https", https_port, ca.ca_file)):
                try:
                    lines += await measure(p.client, session.id, scheme, port, trust, quick)
                except Exception as exc:  # the HTTP rows stand even if the HTTPS ones fail
                    lines.append(f"{scheme}: the measurement failed: {exc!r} (the image, {image()}, needs the "
                                 "sandbox's egress forwarder and curl)")
            try:
                sock = SandboxDirs(p.data_dir).egress_socket_path(session.sandbox_id)
                downloads, small = (DOWNLOADS_QUICK, SMALL_QUICK) if quick else (DOWNLOADS, SMALL)
                progress(f"egress diag: the proxy alone, 10 MiB x{downloads}, small x{small} per side")
                # Only the proxy runs in this process meanwhile: the client and the server are processes of their own.
                cpu = cpu_s()
                big = await proxy_alone(sock, http_port, f"/{BIG_FILE}", downloads, BIG)
                cpu_per_mib = (cpu_s() - cpu) * 1000 / (downloads * BIG / (1024 * 1024))
                small_pair = await proxy_alone(sock, http_port, f"/{SMALL_FILE}", small, len(small_text()))
                lines += diag_lines(big, small_pair, cpu_per_mib)
            except Exception as exc:
                lines.append(f"diag: the proxy-alone measurement failed: {exc!r}")
            await p.client.delete_session(session.id)
    finally:
        await cleanup([instance], planes, [], notes)
    return lines + [n for n in notes if "STILL LEFT" in n or "failed" in n]
