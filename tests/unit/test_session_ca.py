"""A session's CA as the credential broker makes it: a valid chain to the leaf a client sees, HTTP/1.1 only, one
CA per session (also when threads ask at once), forgotten with the session, its validity."""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from controlplane.egress_proxy.broker import CredentialBroker
from tests.unit.egress_tls import (
    HOST,
    Front,
    LoopbackCa,
    Upstream,
    client_context,
    credential,
    routes,
    tunnel,
)


@pytest.fixture
def test_ca(tmp_path: Path) -> LoopbackCa:
    return LoopbackCa(tmp_path)


async def test_the_client_sees_a_valid_chain_from_the_session_ca_and_http11_only(test_ca: LoopbackCa) -> None:
    broker = CredentialBroker(test_ca.ca_file)
    async with Upstream(test_ca.server_context(HOST), routes()) as up, Front(
        broker, credential(), {HOST: up.port}
    ) as front:
        ca_pem = broker.session_ca_pem(front.session_id)

        def run() -> tuple[str | None, str | None, bytes]:
            sock = tunnel(front.port, HOST, up.port, client_context(ca_pem, ["h2", "http/1.1"]))
            offered_both = sock.selected_alpn_protocol()
            leaf = sock.getpeercert(binary_form=True)
            sock.close()
            only_h2 = tunnel(front.port, HOST, up.port, client_context(ca_pem, ["h2"]))
            offered_h2 = only_h2.selected_alpn_protocol()
            only_h2.close()
            assert leaf is not None
            return offered_both, offered_h2, leaf

        offered_both, offered_h2, leaf_der = await asyncio.to_thread(run)
    assert offered_both == "http/1.1"
    assert offered_h2 is None, "h2 is never agreed: the broker speaks HTTP/1.1"
    ca = x509.load_pem_x509_certificate(ca_pem)
    leaf = x509.load_der_x509_certificate(leaf_der)
    leaf.verify_directly_issued_by(ca)
    assert leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName) == [HOST]
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca
    assert constraints.value.path_length == 0
    assert isinstance(ca.public_key(), ec.EllipticCurvePublicKey)
    assert ca.not_valid_after_utc - ca.not_valid_before_utc <= datetime.timedelta(days=7, minutes=5)
    assert leaf.not_valid_after_utc <= ca.not_valid_after_utc


async def test_sessions_get_their_own_cas_and_forget_drops_one(test_ca: LoopbackCa) -> None:
    broker = CredentialBroker(test_ca.ca_file)
    a, b = broker.session_ca_pem("a"), broker.session_ca_pem("b")
    assert a != b
    assert broker.session_ca_pem("a") == a, "made once per session"
    async with Upstream(test_ca.server_context(HOST), routes()) as up, Front(
        broker, credential(), {HOST: up.port}, session_id="a"
    ) as front:

        def handshake(ca: bytes) -> None:
            tunnel(front.port, HOST, up.port, client_context(ca)).close()

        await asyncio.to_thread(handshake, a)
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.to_thread(handshake, b)
        broker.forget("a")
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.to_thread(handshake, a)
    assert broker.session_ca_pem("a") != a, "a forgotten session's CA is gone; a new one would be made"


def test_a_session_has_one_ca_even_when_threads_ask_at_once() -> None:
    broker = CredentialBroker()
    barrier = threading.Barrier(8)

    def ask() -> list[bytes]:
        barrier.wait()
        return [broker.session_ca_pem(f"s{k}") for k in range(30)]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: ask(), range(8)))
    assert all(answer == answers[0] for answer in answers)


def test_a_plane_with_longer_sessions_gets_longer_cas() -> None:
    default = x509.load_pem_x509_certificate(CredentialBroker().session_ca_pem("s"))
    longer = x509.load_pem_x509_certificate(
        CredentialBroker(ca_validity=datetime.timedelta(days=30)).session_ca_pem("s")
    )
    assert default.not_valid_after_utc - default.not_valid_before_utc == datetime.timedelta(days=7, minutes=5)
    assert longer.not_valid_after_utc - longer.not_valid_before_utc == datetime.timedelta(days=30, minutes=5)
