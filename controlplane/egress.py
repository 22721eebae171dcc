"""Outbound HTTP from the control plane, guarded against SSRF.

Every hop's host is resolved once and each address vetted; the request then goes to a vetted
address itself (Host header and TLS SNI carry the name), so a second DNS answer cannot redirect it.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import re
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import httpx

from controlplane.errors import ConfigError, ControlPlaneError

MAX_BYTES = 5 * 1024 * 1024
MAX_REDIRECTS = 10
BROWSER_USER_AGENT = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/143.0.0.0 Safari/537.36"
)
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata.goog"})
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254")
)
"""Instance-metadata endpoints of the big clouds (AWS, AWS ECS, Alibaba, AWS over IPv6)."""

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_LAN = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"))
"""RFC 1918 and unique-local ranges (`is_private` also covers documentation and other special ranges)."""
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_SENSITIVE_HEADERS = ("authorization", "cookie", "proxy-authorization", "x-api-key")
"""Credentials that must not follow a redirect to another origin."""

T = TypeVar("T")


class EgressError(ControlPlaneError):
    """An outbound request failed; `str(exc)` is a message a person (or model) can act on."""


class EgressRefusedError(EgressError):
    """The egress policy forbids the destination; nothing was connected to."""


class ResponseTooLargeError(EgressError):
    pass


class FetchFailedError(EgressError):
    """Resolution, connection, TLS or protocol failure."""


class FetchConnectError(FetchFailedError):
    """No connection could be made to any of the destination's addresses."""


class FetchTimeoutError(EgressError):
    pass


class FetchAbortedError(EgressError):
    pass


@dataclass(frozen=True)
class EgressPolicy:
    """What the operator lets the control plane reach on a tool's behalf.

    `allow_cidrs` admits addresses that would otherwise be refused (any reason, metadata included);
    `allow_hosts` trusts names (`host` or `*.domain`), whose addresses are then not vetted.
    """

    allow_cidrs: tuple[str, ...] = ()
    allow_hosts: tuple[str, ...] = ()
    max_bytes: int = MAX_BYTES
    user_agent: str = BROWSER_USER_AGENT
    tls_context: ssl.SSLContext | None = None
    """Trust store for https; None means the default CA bundle."""
    _networks: tuple[IPNetwork, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "allow_cidrs", tuple(self.allow_cidrs))
        object.__setattr__(self, "allow_hosts", tuple(_normal_host(h) for h in self.allow_hosts))
        try:
            networks = tuple(ipaddress.ip_network(c, strict=False) for c in self.allow_cidrs)
        except ValueError as exc:
            raise ConfigError(f"egress allow_cidrs: {exc}") from exc
        object.__setattr__(self, "_networks", networks)
        if self.max_bytes <= 0:
            raise ConfigError("egress max_bytes must be positive")

    def allows_host(self, host: str) -> bool:
        name = _normal_host(host)
        for allowed in self.allow_hosts:
            if allowed == name or (allowed.startswith("*.") and name.endswith(allowed[1:])):
                return True
        return False

    def allows_address(self, address: IPAddress) -> bool:
        return any(address.version == n.version and address in n for n in self._networks)

    def trusting(self, hosts: Iterable[str]) -> EgressPolicy:
        """This policy with `hosts` added to the trusted names (e.g. an operator-configured endpoint)."""
        return EgressPolicy(self.allow_cidrs, (*self.allow_hosts, *hosts), self.max_bytes, self.user_agent,
                            self.tls_context)


def _normal_host(host: str) -> str:
    return host.strip().lower().rstrip(".")


# ---------------------------------------------------------------------------------------------
# vetting addresses


def refusal_reason(address: IPAddress) -> str | None:
    """Why the platform refuses `address` by default ("a loopback address", ...), or None if it is public."""
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            reason = refusal_reason(embedded)
            return None if reason is None else f"an IPv6 form of {embedded}, {reason}"
    if address.is_unspecified:
        return "an unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if isinstance(address, ipaddress.IPv4Address) and address in _CGNAT:
        return "a carrier-grade NAT (shared) address"
    if any(address.version == n.version and address in n for n in _LAN):
        return "a private address"
    if address.is_reserved or not address.is_global:
        return "a reserved or non-public address"
    return None


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, 6to4, NAT64, compatible, Teredo), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _NAT64 or (address in _IPV4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


@dataclass(frozen=True)
class Destination:
    """One hop: the URL by name and the vetted addresses to connect to, in resolver order."""

    url: httpx.URL
    addresses: tuple[IPAddress, ...]


async def vet(url: httpx.URL | str, policy: EgressPolicy) -> Destination:
    """Resolves `url`'s host and checks every address; raises EgressRefusedError before anything connects."""
    url = _normalized(url)
    host = _normal_host(url.host)
    trusted = policy.allows_host(host)
    if host in METADATA_HOSTS and not trusted:
        raise _refused(url, f"{host} is a cloud metadata host")
    literal = _ip_literal(host)
    addresses = (literal,) if literal is not None else await _resolve(url)
    if not trusted:
        for address in addresses:
            reason = refusal_reason(address)
            if reason is not None and not policy.allows_address(address):
                what = f"{address} is {reason}" if literal is not None else f"{host} resolves to {address}, {reason}"
                raise _refused(url, what)
    return Destination(url, addresses)


def _refused(url: httpx.URL, what: str) -> EgressRefusedError:
    return EgressRefusedError(f"Refusing to fetch {url}: {what} (blocked by the platform's egress policy)")


def _normalized(url: httpx.URL | str) -> httpx.URL:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise FetchFailedError(f"Invalid URL {str(url)!r}: {exc}") from exc
    if parsed.scheme not in ("http", "https"):
        raise EgressRefusedError(f"Refusing to fetch {parsed}: only http and https URLs can be fetched")
    if not parsed.host:
        raise FetchFailedError(f"Invalid URL {str(url)!r}: it names no host")
    # An empty path prints as "http://host:port"; show and request it as "/", as a browser would.
    return parsed.copy_with(raw_path=parsed.raw_path)


def _ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


async def _resolve(url: httpx.URL) -> tuple[IPAddress, ...]:
    host = url.raw_host.decode("ascii")
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, url.port or _default_port(url),
                                                             type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise FetchFailedError(f"Unable to resolve {url.host}: {exc.strerror or exc}") from exc
    found: dict[IPAddress, None] = {}
    for *_, sockaddr in infos:
        # A scoped link-local answer ("fe80::1%eth0") is still link-local: classify without the scope.
        found[ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])] = None
    if not found:
        raise FetchFailedError(f"Unable to resolve {url.host}: no addresses")
    return tuple(found)


def _default_port(url: httpx.URL) -> int:
    return 443 if url.scheme == "https" else 80


# ---------------------------------------------------------------------------------------------
# fetching


class Fetched:
    """A response whose body has not been read yet; `read()` enforces the policy's size cap."""

    def __init__(self, response: httpx.Response, url: httpx.URL, max_bytes: int) -> None:
        self._response = response
        self.url = url
        """The final URL (by name), after redirects."""
        self.max_bytes = max_bytes

    @property
    def status(self) -> int:
        return self._response.status_code

    @property
    def headers(self) -> httpx.Headers:
        return self._response.headers

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    async def read(self) -> bytes:
        """The (decoded) body; ResponseTooLargeError when the declared or actual size exceeds the cap."""
        declared = re.match(r"\s*(\d+)", self.headers.get("content-length", ""))
        if declared and int(declared.group(1)) > self.max_bytes:
            raise ResponseTooLargeError(too_large_message(self.max_bytes))
        body = bytearray()
        try:
            async for chunk in self._response.aiter_bytes():
                body += chunk
                if len(body) > self.max_bytes:
                    raise ResponseTooLargeError(too_large_message(self.max_bytes))
        except httpx.HTTPError as exc:
            raise FetchFailedError(f"Failed to read the response from {self.url}: {_describe(exc)}") from exc
        return bytes(body)


def too_large_message(max_bytes: int) -> str:
    mib = 1024 * 1024
    limit = f"{max_bytes // mib}MB" if max_bytes % mib == 0 else f"{max_bytes} bytes"
    return f"Response too large (exceeds {limit} limit)"


@asynccontextmanager
async def open_url(
    url: str,
    policy: EgressPolicy,
    *,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    content: bytes | None = None,
) -> AsyncIterator[Fetched]:
    """Sends a request through the policy, following up to MAX_REDIRECTS redirects (each hop vetted)."""
    current = _normalized(url)
    sent = dict(headers or {})
    async with httpx.AsyncClient(
        trust_env=False, follow_redirects=False, timeout=None, verify=policy.tls_context or _default_tls(),
    ) as client:
        for _hop in range(MAX_REDIRECTS + 1):
            destination = await vet(current, policy)
            response = await _send(client, destination, method, sent, content)
            location = response.headers.get("location")
            if response.status_code not in REDIRECT_STATUSES or location is None:
                try:
                    yield Fetched(response, current, policy.max_bytes)
                finally:
                    await response.aclose()
                return
            await response.aclose()
            target = _follow(current, location)
            if response.status_code == 303 or (response.status_code in (301, 302) and method == "POST"):
                method, content = "GET", None
                sent = {k: v for k, v in sent.items() if k.lower() not in ("content-type", "content-length")}
            if _origin(target) != _origin(current):
                sent = {k: v for k, v in sent.items() if k.lower() not in _SENSITIVE_HEADERS}
            current = target
    raise FetchFailedError(f"Too many redirects (more than {MAX_REDIRECTS}) fetching {url}")


def _follow(current: httpx.URL, location: str) -> httpx.URL:
    try:
        return _normalized(current.join(location))
    except httpx.InvalidURL as exc:
        raise FetchFailedError(f"Invalid redirect location {location!r} from {current}: {exc}") from exc


def _origin(url: httpx.URL) -> tuple[str, str, int]:
    return url.scheme, _normal_host(url.host), url.port or _default_port(url)


async def _send(
    client: httpx.AsyncClient, destination: Destination, method: str, headers: Mapping[str, str], content: bytes | None,
) -> httpx.Response:
    """Connects to the vetted addresses in turn (the next one only when connecting fails)."""
    url = destination.url
    extensions = {"sni_hostname": url.host} if url.scheme == "https" else {}
    failure: httpx.HTTPError | None = None
    for address in destination.addresses:
        request = client.build_request(
            method, url.copy_with(host=str(address)), headers={**headers, "Host": url.netloc.decode("ascii")},
            content=content, extensions=extensions,
        )
        try:
            return await client.send(request, stream=True)
        except httpx.ConnectError as exc:
            failure = exc
        except httpx.HTTPError as exc:
            raise FetchFailedError(f"Request to {url} failed: {_describe(exc)}") from exc
    raise FetchConnectError(f"Unable to connect to {url}: {_describe(failure)}")


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "no address to connect to"
    return str(exc) or type(exc).__name__


@functools.cache
def _default_tls() -> ssl.SSLContext:
    # Building a context loads the CA bundle; once per process is enough.
    return httpx.create_ssl_context()


async def bounded(work: Awaitable[T], *, seconds: float, abort: asyncio.Event | None = None) -> T:
    """`work`'s result, or FetchTimeoutError after `seconds`, or FetchAbortedError once `abort` is set.

    The work is cancelled either way, which closes its connection.
    """
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(abort.wait()) if abort is not None else None
    try:
        waiting = {task} if stopper is None else {task, stopper}
        done, _ = await asyncio.wait(waiting, timeout=max(seconds, 0), return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        if abort is not None and abort.is_set():
            raise FetchAbortedError("The request was aborted")
        raise FetchTimeoutError(f"The request timed out after {seconds:g} seconds")
    finally:
        for pending in (task, stopper):
            if pending is not None and not pending.done():
                pending.cancel()
                # wait() (unlike awaiting the task) lets our own cancellation through and raises nothing of its.
                await asyncio.wait([pending])
                if not pending.cancelled():
                    pending.exception()
