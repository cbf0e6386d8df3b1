"""The render proxy's TLS: how the browser's HTTPS requests are recorded like the others.

The browser asks the proxy for a tunnel (``CONNECT host:443``). The proxy answers as the
host itself: it completes TLS with the browser using a certificate for that host, made on
the spot and signed by a certificate authority that exists only in this process (made
on its first render, made again after a day: ``RenderTLS.shared``), reads the request
inside, and makes it with the crawler's own client, which verifies the real server's
certificate as for every other request (and records the request and response as they
crossed that connection, inside its TLS).

The browser trusts these certificates, and only these, by the hash of their public key:
every host certificate shares one key, and the browser is started with
``--ignore-certificate-errors-spki-list=<base64 SHA-256 of that key's
SubjectPublicKeyInfo>``. Nothing is installed in a trust store, and no key touches a
disk: the keys live in this process's memory. Python's ``ssl`` loads a certificate and key
only from a file name, so each context's chain and key are written to an anonymous memory
file (``memfd_create``), loaded through its ``/proc/self/fd/N`` name and closed: there is
no directory to leave behind, whatever ends the crawl (a SIGKILL included). Crawls before
this left ``evidence-render-tls-*/host.key`` behind when killed; such a directory is
removed at the next start once the certificates made with it have expired (7 days).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import ipaddress
import os
import shutil
import ssl
import tempfile
import threading
import time

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["RenderTLS"]


class RenderTLS:
    """A throwaway certificate authority and the server contexts it signs, one per host."""

    def __init__(self) -> None:
        _remove_expired_key_dirs()
        now = dt.datetime.now(dt.UTC)
        self._start = now - dt.timedelta(hours=1)
        self._end = now + dt.timedelta(seconds=_EXPIRED)
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                             "evidence render proxy (this process only)")])
        self._ca_name = name
        self._ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                    .public_key(self._ca_key.public_key())
                    .serial_number(x509.random_serial_number())
                    .not_valid_before(self._start).not_valid_after(self._end)
                    .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                    .sign(self._ca_key, hashes.SHA256()))
        self._key = ec.generate_private_key(ec.SECP256R1())  # every host certificate's key
        self._key_pem = self._key.private_bytes(serialization.Encoding.PEM,
                                                serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption())
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
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        _load_from_memory(context, cert.public_bytes(serialization.Encoding.PEM)
                          + self._ca.public_bytes(serialization.Encoding.PEM) + self._key_pem)
        context.set_alpn_protocols(["http/1.1"])  # one request per tunnel, HTTP/1.1
        self._contexts[host] = context
        return context

    @classmethod
    def shared(cls) -> RenderTLS:
        """This process's authority, made on first use and made again once a day (its
        certificates are valid for a week): every renderer of the process uses it, so the
        browsers they start trust the same key and one kept between crawls
        (``browser.keep_browsers``) serves the next."""
        global _shared
        with _shared_lock:
            if _shared is None or time.monotonic() - _shared[1] > _RENEWED:
                _shared = (cls(), time.monotonic())
            return _shared[0]


def _load_from_memory(context: ssl.SSLContext, pem: bytes) -> None:
    """``context.load_cert_chain`` of a PEM holding the chain and then the key, never
    written to a file system (Linux: a memfd; elsewhere, a private file removed at once)."""
    if not hasattr(os, "memfd_create"):
        with tempfile.TemporaryDirectory(prefix="evidence-render-tls-") as directory:
            path = os.path.join(directory, "chain.pem")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(pem)
            context.load_cert_chain(path)
        return
    fd = os.memfd_create("evidence-render-tls", os.MFD_CLOEXEC)
    try:
        with open(fd, "wb", closefd=False) as out:
            out.write(pem)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


_EXPIRED = 7 * 24 * 3600  # the certificates' lifetime (RenderTLS: not_valid_after)
_RENEWED = 24 * 3600  # a process's authority is made again after a day (RenderTLS.shared)
_shared: tuple[RenderTLS, float] | None = None
_shared_lock = threading.Lock()


def _remove_expired_key_dirs() -> None:
    """Remove this user's ``evidence-render-tls-*`` directories (their ``host.key`` left by
    a killed crawl of an earlier version) older than the certificates made with it."""
    directory = tempfile.gettempdir()
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if (entry.name.startswith("evidence-render-tls-")
                        and entry.is_dir(follow_symlinks=False)
                        and entry.stat(follow_symlinks=False).st_uid == os.getuid()
                        and time.time() - entry.stat().st_mtime > _EXPIRED):
                    shutil.rmtree(entry.path, ignore_errors=True)
