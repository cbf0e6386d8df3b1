"""What an examiner asks of a checkpoint beyond its signer's signature: trusted time and
witnesses.

**Trusted time.** An RFC 3161 timestamp (``CP.tsr``: the DER ``TimeStampResp``
``evidence checkpoint --tsa`` keeps, or ``checkpoint.tsr`` inside an archive) over the
checkpoint file's exact bytes. It is checked against the TSA roots the examiner names
(``--tsa-root``), never against a certificate the token brings along: the message imprint
is the SHA-256 of the checkpoint, the CMS signature verifies, the signer's certificate has
the timeStamping extended key usage and chains to a named root. The ASN.1 and CMS are
rfc3161-client's (the library sigstore-python uses). What it proves: the checkpoint, and
all it binds, existed no later than the token's time, on the TSA's word.

**Witnesses.** C2SP tlog-cosignature v1: a signature line by a witness key,
``base64(key id || u64 time || Ed25519 signature)`` over ``"cosignature/v1\\ntime
<time>\\n"`` and the checkpoint's body. The key is ``<name>+<hex key id>+<base64(0x04 ||
32 bytes)>``, key id = SHA-256(name || "\\n" || 0x04 || key)[:4]. A cosignature over
another body, by another key, or dated more than five minutes ahead does not count; at
least ``need`` of the named witnesses (default all) must have cosigned.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .checkpoint import Checkpoint
from .errors import VerifyError
from .verdict import Verdict

_HEX8 = re.compile(r"[0-9a-f]{8}")
_FUTURE = 300  # seconds a cosignature may be dated ahead of the examiner's clock


@dataclass(frozen=True)
class WitnessKey:
    name: str
    key_id: int
    public: bytes

    @classmethod
    def read(cls, path: str | Path) -> WitnessKey:
        try:
            text = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise VerifyError(f"cannot read the witness key {path}: {exc.strerror}",
                              hint="give the witness's KEY.pub") from None
        name, _, rest = text.partition("+")
        hex_id, _, encoded = rest.partition("+")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if not name or not _HEX8.fullmatch(hex_id) or len(raw) != 33 or raw[0] != 0x04:
            raise VerifyError(f"{path} is not a witness key (<name>+<key id>+base64(0x04 || "
                              "32 bytes))", hint="give the witness's KEY.pub")
        key_id = int.from_bytes(hashlib.sha256(name.encode() + b"\n\x04" + raw[1:])
                                .digest()[:4], "big")
        if f"{key_id:08x}" != hex_id:
            raise VerifyError(f"{path}: the key id does not match its name and key")
        return cls(name, key_id, raw[1:])

    def cosigned_at(self, cp: Checkpoint) -> int | None:
        """The time of a valid cosignature by this key on ``cp``, or None."""
        for s in cp.signatures:
            if (s.name, s.key_id) != (self.name, self.key_id) or len(s.signature) != 72:
                continue
            stamp = int.from_bytes(s.signature[:8], "big")
            message = f"cosignature/v1\ntime {stamp}\n".encode() + cp.body.encode()
            try:
                Ed25519PublicKey.from_public_bytes(self.public).verify(s.signature[8:],
                                                                       message)
            except (InvalidSignature, ValueError):
                continue
            return stamp
        return None


def load_roots(paths: list[str]) -> list[x509.Certificate]:
    roots = []
    for path in paths:
        try:
            found = x509.load_pem_x509_certificates(Path(path).read_bytes())
        except OSError as exc:
            raise VerifyError(f"cannot read {path}: {exc.strerror}",
                              hint="give the TSA's root certificate (PEM)") from None
        except ValueError:
            found = []
        if not found:
            raise VerifyError(f"{path} holds no PEM certificate",
                              hint="give the TSA's root certificate (PEM)")
        roots += found
    return roots


@dataclass
class Proofs:
    """The examiner's policy: TSA roots (and the token, when not carried), witness keys,
    and how many of them must have cosigned (None: all)."""

    tsa_roots: list[x509.Certificate] = field(default_factory=list)
    timestamp: bytes | None = None
    witnesses: list[WitnessKey] = field(default_factory=list)
    need: int | None = None

    def wanted(self) -> bool:
        return bool(self.tsa_roots or self.witnesses)

    def check(self, note: bytes, cp: Checkpoint, verdict: Verdict) -> None:
        self._time(note, verdict)
        self._witnesses(cp, verdict)

    def _time(self, note: bytes, verdict: Verdict) -> None:
        if not self.tsa_roots:
            if self.timestamp is not None:
                verdict.notes.append("the checkpoint has an RFC 3161 timestamp, not checked: "
                                     "name the TSA's root with --tsa-root")
            return
        if self.timestamp is None:
            verdict.problem("no RFC 3161 timestamp for the checkpoint, and a TSA root was "
                            "named to check one")
            return
        try:
            moment, tsa = check_timestamp(note, self.timestamp, self.tsa_roots)
        except VerifyError as exc:
            verdict.problem(f"timestamp: {exc}")
            return
        verdict.facts |= {"timestamped_at": moment, "tsa": tsa}

    def _witnesses(self, cp: Checkpoint, verdict: Verdict) -> None:
        if not self.witnesses:
            return
        found: dict[str, int] = {}
        for key in self.witnesses:
            stamp = key.cosigned_at(cp)
            if stamp is None:
                verdict.notes.append(f"no valid cosignature by witness {key.name}")
            elif stamp > time.time() + _FUTURE:
                verdict.notes.append(f"the cosignature by witness {key.name} is dated in the "
                                     "future: not counted")
            else:
                found[key.name] = stamp
        need = len(self.witnesses) if self.need is None else self.need
        verdict.facts["witnesses"] = found
        if len(found) < need:
            verdict.problem(f"{len(found)} of the {need} witness cosignatures needed")


def check_timestamp(data: bytes, der: bytes, roots: list[x509.Certificate]) -> tuple[str, str]:
    """(genTime as ISO 8601 UTC, the TSA's subject) of a token over ``data`` that chains to
    one of ``roots``; ``VerifyError`` says why it does not hold."""
    from rfc3161_client import VerificationError, VerifierBuilder, decode_timestamp_response

    try:
        response = decode_timestamp_response(der)
        info = response.tst_info
    except (ValueError, TypeError) as exc:
        raise VerifyError(f"not an RFC 3161 timestamp response ({exc})") from None
    if response.status != 0:
        raise VerifyError(f"the timestamp response was not granted (status {response.status})")
    if bytes(info.message_imprint.message) != hashlib.sha256(data).digest():
        raise VerifyError("the timestamp is over other bytes than this checkpoint's")
    builder = VerifierBuilder()
    for root in roots:
        builder = builder.add_root_certificate(root)
    try:
        builder.build().verify(response, hashlib.sha256(data).digest())
    except VerificationError as exc:
        raise VerifyError(f"the timestamp does not verify against the TSA root named: "
                          f"{exc}") from None
    moment = info.gen_time if info.gen_time.tzinfo else info.gen_time.replace(tzinfo=dt.UTC)
    signer = ""
    infos = list(response.signed_data.signer_infos)
    for cert_der in response.signed_data.certificates:
        cert = x509.load_der_x509_certificate(cert_der)
        if infos and (cert.issuer, cert.serial_number) == (infos[0].issuer,
                                                           infos[0].serial_number):
            signer = cert.subject.rfc4514_string()
    return moment.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"), signer
