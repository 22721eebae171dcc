"""A session's own certificate authority, made in memory for the credential broker: the sandbox's tools trust
its certificate, and the broker presents a leaf from it for each host it intercepts.

The key is never written anywhere: OpenSSL's server context can only load a key from a path, so the leaf's
key and certificate pass through an anonymous in-memory file (memfd) that is closed as soon as it is read.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections import OrderedDict

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY = datetime.timedelta(days=7)
"""Short on purpose: the CA exists only for its session (8 hours at most by default, `lifetime.max_lifetime_s`),
and it is remade when a plane restarts. A plane whose sessions may live longer gives the broker a longer one."""

_SKEW = datetime.timedelta(minutes=5)
"""notBefore is set a little in the past so a clock a few seconds behind does not reject a fresh certificate."""

_LEAVES_PER_SESSION = 64
"""A `*.domain` credential lets a tool ask for any number of names; the cache of their leaves stays bounded."""


def _serial() -> int:
    return x509.random_serial_number()


class SessionCa:
    """One session's CA key and certificate, and the server contexts of the leaves it issued (cached per host).

    Leaves use ECDSA P-256 (fast to make, accepted by OpenSSL, BoringSSL (Bun), GnuTLS (git) and Go). The CA
    has `pathLenConstraint=0`: it can sign leaves, never another CA. It carries no name constraints: it is made
    before the session's hosts reach the broker, its key never leaves the control plane's memory, and it is
    trusted only inside its own sandbox, whose every connection goes through this proxy anyway.
    """

    def __init__(self, session_id: str, validity: datetime.timedelta = CA_VALIDITY) -> None:
        now = datetime.datetime.now(datetime.UTC)
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ocsandbox egress broker"),
                x509.NameAttribute(NameOID.COMMON_NAME, f"session {session_id[:40]} CA"),
            ]
        )
        public = self._key.public_key()
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(public)
            .serial_number(_serial())
            .not_valid_before(now - _SKEW)
            .not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.pem = self.certificate.public_bytes(serialization.Encoding.PEM)
        self._contexts: OrderedDict[str, ssl.SSLContext] = OrderedDict()

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a leaf for `host` (a DNS name or an IP literal), made on first use."""
        key = host.lower()
        context = self._contexts.get(key)
        if context is not None:
            self._contexts.move_to_end(key)
            return context
        context = self._make_context(key)
        self._contexts[key] = context
        while len(self._contexts) > _LEAVES_PER_SESSION:
            self._contexts.popitem(last=False)
        return context

    def _make_context(self, host: str) -> ssl.SSLContext:
        now = datetime.datetime.now(datetime.UTC)
        leaf_key = ec.generate_private_key(ec.SECP256R1())
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        ca_public = self._key.public_key()
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self.certificate.subject)
            .public_key(leaf_key.public_key())
            .serial_number(_serial())
            .not_valid_before(now - _SKEW)
            # Never outlive the CA: a chain with a leaf valid past its issuer is refused by strict verifiers.
            .not_valid_after(self.certificate.not_valid_after_utc)
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(leaf_key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_public), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # http/1.1 only: the broker parses HTTP/1.1, so a client must not start speaking h2 to it.
        context.set_alpn_protocols(["http/1.1"])
        context.options |= ssl.OP_NO_RENEGOTIATION
        material = leaf.public_bytes(serialization.Encoding.PEM) + leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        _load_chain(context, material)
        return context


def _load_chain(context: ssl.SSLContext, material: bytes) -> None:
    """Loads a PEM certificate and key into `context` without the key touching a disk: an anonymous memory file,
    read by OpenSSL through its /proc path, closed at once."""
    fd = os.memfd_create("ocsb-leaf", os.MFD_CLOEXEC)
    try:
        os.write(fd, material)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
