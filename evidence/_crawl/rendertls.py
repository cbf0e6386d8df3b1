"""The render proxy's TLS: how the browser's HTTPS requests are recorded like the others.

The browser asks the proxy for a tunnel (``CONNECT host:443``). The proxy answers as the
host itself: it completes TLS with the browser using a certificate for that host, made on
the spot and signed by a certificate authority that exists only for this crawl's
renderer, reads the request inside, and makes it with the crawler's own client, which
verifies the real server's certificate as for every other request (and records the
request and response as they crossed that connection, inside its TLS).

The browser trusts these certificates, and only these, by the hash of their public key:
every host certificate shares one key, and the browser is started with
``--ignore-certificate-errors-spki-list=<base64 SHA-256 of that key's
SubjectPublicKeyInfo>``. Nothing is installed in a trust store; the keys live in memory
and in a private temporary directory removed on close.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import ipaddress
import os
import shutil
import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["RenderTLS"]


class RenderTLS:
    """A throwaway certificate authority and the server contexts it signs, one per host."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="evidence-render-tls-"))
        os.chmod(self._dir, 0o700)
        now = dt.datetime.now(dt.UTC)
        self._start, self._end = now - dt.timedelta(hours=1), now + dt.timedelta(days=7)
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                             "evidence render proxy (this crawl only)")])
        self._ca_name = name
        self._ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                    .public_key(self._ca_key.public_key())
                    .serial_number(x509.random_serial_number())
                    .not_valid_before(self._start).not_valid_after(self._end)
                    .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                    .sign(self._ca_key, hashes.SHA256()))
        self._key = ec.generate_private_key(ec.SECP256R1())  # every host certificate's key
        key_pem = self._key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption())
        self._key_file = self._dir / "host.key"
        fd = os.open(self._key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(key_pem)
        self._contexts: dict[str, ssl.SSLContext] = {}

    @property
    def spki_hash(self) -> str:
        """base64 SHA-256 of the host key's SubjectPublicKeyInfo (what the browser trusts)."""
        der = self._key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        return base64.b64encode(hashlib.sha256(der).digest()).decode()

    def browser_flags(self) -> tuple[str, ...]:
        return (f"--ignore-certificate-errors-spki-list={self.spki_hash}",)

    def context_for(self, host: str) -> ssl.SSLContext:
        """A server context presenting a certificate for ``host`` (a name or an address)."""
        host = host.strip("[]").lower()
        context = self._contexts.get(host)
        if context is not None:
            return context
        try:
            alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            alt = x509.DNSName(host)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
                .issuer_name(self._ca_name).public_key(self._key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(self._start).not_valid_after(self._end)
                .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .sign(self._ca_key, hashes.SHA256()))
        chain = self._dir / f"host-{len(self._contexts)}.pem"
        chain.write_bytes(cert.public_bytes(serialization.Encoding.PEM)
                          + self._ca.public_bytes(serialization.Encoding.PEM))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(chain, self._key_file)
        context.set_alpn_protocols(["http/1.1"])  # one request per tunnel, HTTP/1.1
        self._contexts[host] = context
        return context

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)
