"""The signed checkpoint a WACZ carries (``evidence export --format wacz --checkpoint``):
``evidence/checkpoint`` and its timestamp ``evidence/checkpoint.tsr``, package resources
like the others, so the WACZ's signature covers their hashes.

A WACZ holds no ledger, so this is as far as it goes: the checkpoint is signed by the
operator's key, timestamped and cosigned as the examiner asks, and of the log the WARC
says it is part of (its warcinfo record's ``isPartOf``); each record names the ledger entry
behind it (``Evidence-Log-Index``), and the check counts those the checkpoint signs (an
inclusion proof, ``evidence-verify proof``, shows one is in the log). An archive carries
the ledger itself and is checked whole (``archive``).
"""

from __future__ import annotations

import gzip
import zipfile
from collections.abc import Iterator
from pathlib import Path

from .checkpoint import VerifierKey, check_checkpoint
from .policy import Proofs
from .verdict import Verdict

NOTE, TOKEN = "evidence/checkpoint", "evidence/checkpoint.tsr"


def check_wacz_checkpoint(path: str | Path, verdict: Verdict, key: VerifierKey | None,
                          proofs: Proofs) -> None:
    """Add to ``verdict`` what the WACZ's carried checkpoint says, and what is wrong."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            if NOTE not in names:  # (a TSA root alone may be for the signature's time)
                if key is not None or proofs.witnesses:
                    verdict.problem("the WACZ carries no checkpoint, and a checkpoint key, "
                                    "TSA root or witness was named to check one")
                return
            note = zf.read(NOTE)
            if proofs.timestamp is None and TOKEN in names:
                proofs.timestamp = zf.read(TOKEN)
            if key is None:
                verdict.notes.append("the WACZ carries a checkpoint, not checked: name the "
                                     "operator's checkpoint key (--checkpoint-key)")
                return
            signed, cp = check_checkpoint(note, key, NOTE)
            if cp is None:
                verdict.problems += [f"checkpoint: {p}" for p in signed.problems]
                return
            proofs.check(note, cp, verdict)
            origin, covered, beyond = None, 0, 0
            for fields in _heads(zf, "archive/data.warc.gz"):
                if fields.get("warc-type") == "warcinfo":
                    origin = origin or fields.get("ispartof")
                index = fields.get("evidence-log-index", "")
                if index.isdigit():
                    covered, beyond = ((covered + 1, beyond) if int(index) < cp.tree_size
                                       else (covered, beyond + 1))
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as exc:
        verdict.problem(f"the WACZ cannot be read for its checkpoint: {exc}")
        return
    verdict.facts |= {"checkpoint_key": cp.verified_by, "checkpoint_size": cp.tree_size,
                      "checkpoint_covers": covered}
    if origin != cp.origin:
        verdict.problem(f"the checkpoint is of log {cp.origin}, the WARC is part of {origin}")
    if beyond:
        verdict.notes.append(f"{beyond} record(s) name a ledger entry after the checkpoint's "
                             f"{cp.tree_size}: not covered by it")


def _heads(zf: zipfile.ZipFile, name: str) -> Iterator[dict[str, str]]:
    """Each record's header fields, names lowercased (a warcinfo's block fields too)."""
    with zf.open(name) as raw, gzip.open(raw) as warc:
        while line := warc.readline():
            if not line.strip():
                continue
            fields: dict[str, str] = {}
            while (line := warc.readline()).strip():
                key, _, value = line.decode("utf-8", "replace").partition(":")
                fields[key.strip().lower()] = value.strip()
            block = warc.read(int(fields.get("content-length", "0")))
            if fields.get("warc-type") == "warcinfo":
                for text in block.decode("utf-8", "replace").splitlines():
                    key, _, value = text.partition(":")
                    fields.setdefault(key.strip().lower(), value.strip())
            yield fields


def check_wacz_timestamp(path: str | Path, verdict: Verdict, proofs: Proofs) -> None:
    """The domain form's RFC 3161 timestamp (``timeSignature``, the TSA's reply over the
    signature's base64 text, as authsign makes it), against the examiner's TSA roots."""
    import base64
    import binascii
    import json

    from .errors import VerifyError
    from .policy import check_timestamp

    if not proofs.tsa_roots:
        return
    try:
        with zipfile.ZipFile(path) as zf:
            signed = json.loads(zf.read("datapackage-digest.json")).get("signedData") or {}
        if not isinstance(signed, dict) or "timeSignature" not in signed:
            return
        token = base64.b64decode(str(signed["timeSignature"]), validate=True)
        moment, tsa = check_timestamp(str(signed.get("signature", "")).encode("ascii"),
                                      token, proofs.tsa_roots)
    except VerifyError as exc:
        verdict.problem(f"the signature's timestamp: {exc}")
        return
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, binascii.Error,
            UnicodeEncodeError, AttributeError) as exc:
        verdict.problem(f"the signature's timestamp cannot be read: {exc}")
        return
    verdict.facts |= {"signature_timestamped_at": moment, "signature_tsa": tsa}
