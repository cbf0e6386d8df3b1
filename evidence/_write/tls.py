"""TLS for the writer service when it listens beyond this machine, and the addresses it
may listen on.

The rule (docs/scale.md): the service listens on a loopback address with a token, and on
any other address only with TLS *and* a token. TLS authenticates the service to its
clients (they check its certificate against the CA file they are given) and keeps the
token and the messages private on the way; the token authenticates the client. The
operator brings the certificate and key; ``make_self_signed`` makes a pair for a test
deployment (``evidence tls-cert``), whose certificate is also the CA file its workers trust.

Contexts are TLS 1.2 or newer with Python's default ciphers; a client always verifies the
certificate and the host name (an IP address in the certificate's subjectAltName when it
dials an IP).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from .._errors import ServiceError

__all__ = ["TLSFiles", "client_context", "make_self_signed", "parse_listen", "server_context"]


@dataclass(frozen=True, kw_only=True)
class TLSFiles:
    """The service's certificate chain and private key, as PEM files."""

    cert: str
    key: str


def server_context(files: TLSFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert, files.key)
    except (OSError, ssl.SSLError) as exc:
        raise ServiceError(f"cannot load the TLS certificate {files.cert} and key {files.key}: "
                           f"{getattr(exc, 'strerror', None) or exc}",
                           hint="give PEM files (make a pair for a test deployment with "
                           "'evidence tls-cert')") from None
    return context


def client_context(ca_file: str | None) -> ssl.SSLContext:
    """Verify the service against ``ca_file`` (its self-signed certificate, or the CA that
    signed it), or against the system's CAs."""
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ServiceError(f"cannot load the CA file {ca_file}: "
                           f"{getattr(exc, 'strerror', None) or exc}",
                           hint="give the service's certificate (PEM) with --tls-ca") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def parse_listen(text: str, *, tls: bool, what: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` to listen on: an IP literal (``localhost`` is 127.0.0.1), never a name
    to resolve. A non-loopback address needs TLS."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ServiceError(f"{what} {text!r}: expected HOST:PORT, e.g. 127.0.0.1:7400",
                           hint="give an IP address and a port (0 picks a free one)")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host == "localhost":
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ServiceError(f"{what} {text!r}: {host!r} is not an IP address",
                           hint="give the address to listen on as an IP literal") from None
    if not address.is_loopback and not tls:
        raise ServiceError(
            f"{what} {text!r}: {host} is not a loopback address, and the service listens "
            "beyond this machine only with TLS",
            hint="add --tls-cert FILE --tls-key FILE (a pair for a test deployment: "
            "evidence tls-cert --host ADDRESS --out DIR)")
    return str(address), int(port_text)


def parse_connect(text: str, *, tls: bool) -> tuple[str, int]:
    """``HOST:PORT`` to dial: a loopback IP without TLS; with TLS, any IP or host name (the
    certificate is checked against it)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) <= 65535:
        raise ServiceError(f"--connect {text!r}: expected HOST:PORT, e.g. 127.0.0.2:7400",
                           hint="give the coordinator's address and port")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if not tls:
            raise ServiceError(f"--connect {text!r}: a host name needs TLS",
                               hint="add --tls-ca FILE (the service's certificate)") from None
        return host, int(port_text)
    if not address.is_loopback and not tls:
        raise ServiceError(f"--connect {text!r}: {host} is not a loopback address; the "
                           "connection must use TLS", hint="add --tls-ca FILE (the "
                           "service's certificate)")
    return str(address), int(port_text)


def make_self_signed(hosts: list[str], out: os.PathLike[str] | str, *,
                     days: int = 365) -> tuple[Path, Path]:
    """A new ECDSA P-256 key and a self-signed certificate for ``hosts`` (IP addresses or
    names, all in its subjectAltName), written to ``out/cert.pem`` (0644) and
    ``out/key.pem`` (0600). Refuses to overwrite either."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    if not hosts:
        raise ServiceError("a certificate needs at least one host",
                           hint="give --host ADDRESS (the address workers dial)")
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    directory = Path(out)
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    for path in (cert_path, key_path):
        if path.exists():
            raise ServiceError(f"{path} exists; not overwriting it", path=str(path),
                               hint="choose another --out directory")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    key_bytes = key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key_bytes)
    fd = os.open(cert_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path
