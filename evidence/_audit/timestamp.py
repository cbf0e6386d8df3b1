"""Trusted time for signed checkpoints: RFC 3161 timestamp tokens from a TSA.

A checkpoint's ``time`` line is what the signer's clock said. A time-stamping authority
(RFC 3161) signs, with its own key and by its own clock, a hash of the exact bytes of the
checkpoint: its token says the checkpoint existed at ``genTime``, on the TSA's word and
not the operator's. The TSA never sees the checkpoint, only its SHA-256.

The whole DER ``TimeStampResp`` is kept beside the checkpoint file (``cp`` -> ``cp.tsr``):
that is the form ``openssl ts -verify -data cp -in cp.tsr -CAfile TSA-ROOT.pem`` reads,
so an examiner checks it with no tool of ours.

``request_timestamp`` POSTs a query (SHA-256 of the checkpoint, a fresh 64-bit nonce,
``certReq`` so the TSA embeds its certificate) and checks the reply before anything is
kept: granted, for our hash and our nonce, and, given the TSA's certificate, signed by that
certificate. ``check_timestamp`` is the examiner's check: the imprint is the SHA-256 of
the checkpoint's bytes, the CMS signature verifies, the signer's certificate has the
timeStamping extended key usage (critical, RFC 3161 section 2.3) and chains to a root the
verifier names (never to a certificate the token brings along).

The ASN.1 and CMS are rfc3161-client's (maintained, used by sigstore-python), not code of
ours.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import re
import urllib.error
import urllib.parse
import urllib.request

import msgspec
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from rfc3161_client import (
    HashAlgorithm,
    TimestampRequestBuilder,
    TimeStampResponse,
    VerificationError,
    VerifierBuilder,
    decode_timestamp_response,
)

from .._errors import ProofError

__all__ = ["TSR_SUFFIX", "Timestamp", "check_timestamp", "load_certificates",
           "request_timestamp"]

TSR_SUFFIX = ".tsr"  # the token beside its checkpoint: cp -> cp.tsr
_QUERY_TYPE = "application/timestamp-query"
_REPLY_TYPE = "application/timestamp-reply"
_MAX_REPLY = 1024 * 1024  # a reply is a few KiB (one certificate chain); refuse a flood


class Timestamp(msgspec.Struct, frozen=True, kw_only=True):
    """What a token says (read from it; trusted only once ``check_timestamp`` passed)."""

    time: str  # genTime, UTC, as "2026-12-05T14:00:00Z" (the TSA's precision)
    serial: int  # the TSA's serial number of the token
    policy: str  # the TSA policy OID it was issued under
    tsa: str  # the signer certificate's subject (RFC 4514)
    der: bytes  # the whole TimeStampResp, as kept in cp.tsr


def load_certificates(data: bytes, what: str) -> list[x509.Certificate]:
    """PEM certificates (one or more, e.g. a TSA's root, or its chain); ``ProofError`` if
    there are none."""
    try:
        found = x509.load_pem_x509_certificates(data)
    except ValueError:
        found = []
    if not found:
        raise ProofError(f"{what} holds no PEM certificate",
                         hint="give the certificate in PEM (-----BEGIN CERTIFICATE-----)")
    return found


def _decode(der: bytes, what: str) -> TimeStampResponse:
    try:
        response = decode_timestamp_response(der)
        response.tst_info  # noqa: B018 (a response without a token raises here)
    except (ValueError, TypeError) as exc:
        raise ProofError(f"{what} is not an RFC 3161 timestamp response ({exc})") from None
    return response


def _summary(response: TimeStampResponse, der: bytes) -> Timestamp:
    info = response.tst_info
    moment = info.gen_time
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=_dt.UTC)
    signer = _signer(response)
    return Timestamp(time=moment.astimezone(_dt.UTC).isoformat().replace("+00:00", "Z"),
                     serial=int(info.serial_number), policy=info.policy.dotted_string,
                     tsa=signer.subject.rfc4514_string() if signer is not None else "",
                     der=der)


def _signer(response: TimeStampResponse) -> x509.Certificate | None:
    """The embedded certificate the one SignerInfo names (issuer and serial)."""
    infos = list(response.signed_data.signer_infos)
    if len(infos) != 1:
        return None
    for der in response.signed_data.certificates:
        cert = x509.load_der_x509_certificate(der)
        if cert.issuer == infos[0].issuer and cert.serial_number == infos[0].serial_number:
            return cert
    return None


def _verify(response: TimeStampResponse, digest: bytes, roots: list[x509.Certificate], *,
            tsa_cert: x509.Certificate | None = None, nonce: int | None = None) -> None:
    builder = VerifierBuilder()
    for root in roots:
        builder = builder.add_root_certificate(root)
    if tsa_cert is not None:
        builder = builder.tsa_certificate(tsa_cert)
    if nonce is not None:
        builder = builder.nonce(nonce)
    try:
        builder.build().verify(response, digest)
    except VerificationError as exc:
        chain = re.search(r"Verify error: ([^\"]+)", str(exc))
        if chain:
            raise ProofError("the timestamp's signer does not chain to the TSA root named "
                             f"({chain[1]})") from None
        if "Mismatch between messages" in str(exc):
            raise ProofError("the timestamp is over other bytes than this checkpoint's") \
                from None
        raise ProofError(f"the timestamp does not verify: {exc}") from None


def _check_url(url: str) -> None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ProofError(f"{url!r} is not a TSA URL", hint="give the TSA's http:// or "
                         "https:// URL, e.g. https://freetsa.org/tsr")


def request_timestamp(data: bytes, url: str, *, tsa_cert: list[x509.Certificate] | None = None,
                      timeout: float = 30.0) -> Timestamp:
    """A token from the TSA at ``url`` over SHA-256(``data``), checked before it is returned:
    granted, our hash, our nonce; with ``tsa_cert`` (the TSA's certificate first, then any
    of its chain), also signed by that certificate and chained to the last one given."""
    _check_url(url)
    if tsa_cert and tsa_cert[-1].issuer != tsa_cert[-1].subject:
        raise ProofError("the TSA certificate file does not end in a root (a self-issued "
                         "certificate): the timestamp's signature could not be checked",
                         hint="append the TSA's root certificate to the PEM file")
    digest = hashlib.sha256(data).digest()
    query = (TimestampRequestBuilder().data(data).hash_algorithm(HashAlgorithm.SHA256)
             .nonce(nonce=True).cert_request(cert_request=True).build())
    request = urllib.request.Request(url, data=query.as_bytes(), method="POST",
                                     headers={"Content-Type": _QUERY_TYPE,
                                              "Accept": _REPLY_TYPE})
    try:
        # Straight to the TSA: never through a proxy an environment variable names.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=timeout) as reply:
            der = reply.read(_MAX_REPLY + 1)
    except urllib.error.HTTPError as exc:
        raise ProofError(f"the TSA at {url} refused the query: HTTP {exc.code} {exc.reason}",
                         hint="check the TSA URL (it takes an RFC 3161 query by POST)") \
            from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ProofError(f"the TSA at {url} could not be reached: {reason}",
                         hint="check the URL and the network; nothing was written") from None
    if len(der) > _MAX_REPLY:
        raise ProofError(f"the TSA at {url} sent more than {_MAX_REPLY} bytes",
                         hint="check the TSA URL")
    try:
        response = _decode(der, f"the TSA's reply ({url})")
    except ProofError as exc:
        raise ProofError(str(exc), hint="check the TSA URL (it takes an RFC 3161 query by "
                         "POST)") from None
    if response.status != 0:  # PKIStatus granted; grantedWithMods is not what we asked for
        raise ProofError(f"the TSA at {url} did not grant the timestamp (status "
                         f"{response.status})", hint="check the TSA's terms and URL")
    info = response.tst_info
    if info.message_imprint.message != digest:
        raise ProofError(f"the TSA at {url} timestamped another hash than the checkpoint's",
                         hint="check the TSA URL; nothing was written")
    if info.nonce != query.nonce:
        raise ProofError(f"the TSA at {url} answered with another nonce than ours (a replayed "
                         "or misrouted reply)", hint="check the TSA URL; nothing was written")
    if tsa_cert:
        try:
            _verify(response, digest, [tsa_cert[-1]], tsa_cert=tsa_cert[0], nonce=query.nonce)
        except ProofError as exc:
            raise ProofError(f"the TSA at {url}: {exc}", hint="--tsa-cert must be the "
                             "certificate of the TSA at --tsa, then its chain up to its root"
                             ) from None
    return _summary(response, der)


def check_timestamp(data: bytes, der: bytes, roots: list[x509.Certificate]) -> Timestamp:
    """Verify a token (a whole ``TimeStampResp``, as in ``cp.tsr``) over ``data`` against
    the verifier's own ``roots``; ``ProofError`` says why it does not hold."""
    if not roots:
        raise ProofError("no TSA root to check the timestamp against",
                         hint="name the TSA's root certificate (--tsa-root PEM)")
    response = _decode(der, "the timestamp")
    if response.status != 0:
        raise ProofError(f"the timestamp response was not granted (status {response.status})")
    _verify(response, hashlib.sha256(data).digest(), roots)
    return _summary(response, der)


def certificate_fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 of the certificate's DER, hex: how a root is named in a report."""
    return hashlib.sha256(cert.public_bytes(Encoding.DER)).hexdigest()
