"""Witnesses: independent cosigners that a log only grew (C2SP tlog-witness, tlog-cosignature).

A signed checkpoint says what the store's owner says. A **witness** is someone else: a
process of its own, with its own key and its own record of the last checkpoint it cosigned
for each log. It cosigns a new checkpoint only if it is signed by a key it trusts for that
log and a consistency proof shows that the checkpoint it cosigned last is a prefix of the
new one. So an owner who rewrites history (two checkpoints of one size with different
roots, a log rolled back to fewer leaves) cannot get the same witnesses to cosign both
views, and an examiner who requires cosignatures from witnesses they trust sees a fork as a
missing cosignature.

The protocol is C2SP tlog-witness (https://c2sp.org/tlog-witness):
``POST <prefix>/add-checkpoint`` with a body of ``old <size>``, the consistency proof from
that size (base64 hashes, one a line), a blank line and the checkpoint; answered ``200``
with cosignature lines, ``409`` (``text/x.tlog.size``: the size the witness holds) when
the old size is not the witness's, ``422`` when the proof or a same-size root does not
hold, ``403`` when no trusted signature verifies, ``404`` for an unknown log, ``400`` for
a malformed request; and ``GET <prefix>/<sha256(origin) hex>/checkpoint`` for the latest
cosigned checkpoint. The cosignatures are C2SP tlog-cosignature Ed25519 v1: a note
signature line ``— <witness name> base64(key id || u64 timestamp || signature)``, key id
= SHA-256(name || 0x0A || 0x04 || public key)[:4], over ``cosignature/v1\\ntime <t>\\n``
followed by the checkpoint's whole note body (extension lines included).

The witness's state is a directory: one JSON file per log, replaced atomically (written,
fsynced, renamed, the directory fsynced) before the cosignature is sent, under one lock, so
two requests cannot both check against the same old state (the rollback race the spec
describes), and a witness killed at any point keeps the last state it answered for. One
process holds a state directory at a time (``flock``).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from .._errors import ProofError
from .._model.merkle import EMPTY_ROOT, verify_consistency
from .._store.fsync import fsync_dir, fsync_file
from .checkpoints import NoteSignature, SignedCheckpoint, parse_checkpoint
from .keys import VerifierKey, _b64, _b64decode, private_key_fields, write_key_pair

__all__ = ["Cosigner", "CosignerKey", "Witness", "WitnessReply", "add_cosignatures",
           "check_cosignatures", "serve_witness"]

_ALG_COSIGNATURE_V1 = 0x04
_EM_DASH = "\u2014"
_MAX_BODY = 64 * 1024  # a checkpoint and 63 proof lines are a few KiB
_MAX_PROOF_LINES = 63
_HEX8 = frozenset("0123456789abcdef")


def _message(text: str, timestamp: int) -> bytes:
    """What a cosignature v1 signs: a header line, a time line, the note's whole body."""
    return f"cosignature/v1\ntime {timestamp}\n".encode() + text.encode()


class CosignerKey(VerifierKey):
    """A witness's public key: ``<name>+<hex key id>+<base64(0x04 || Ed25519 key)>``, a
    note key of signature type 0x04 (cosignature v1); it checks cosignatures."""

    __slots__ = ()
    ALG = _ALG_COSIGNATURE_V1
    _NOT_OURS = ("not a witness key (cosignature v1: 0x04 || 32 bytes)",
                 "a store's checkpoint key (0x01) is not a witness key")

    def timestamp_of(self, text: str, signature: NoteSignature) -> int | None:
        """The time of a valid cosignature by this key on the note body ``text``, or None
        (another key, a malformed blob, or a signature that does not verify)."""
        if (signature.key_name, signature.key_id) != (self.name, self.key_id):
            return None
        blob = signature.signature
        if len(blob) != 8 + 64:
            return None
        timestamp = int.from_bytes(blob[:8], "big")
        if timestamp >= 1 << 63:
            return None
        try:
            Ed25519PublicKey.from_public_bytes(self.public).verify(
                blob[8:], _message(text, timestamp))
        except Exception:  # InvalidSignature, or a key the library refuses
            return None
        return timestamp


class Cosigner:
    """A witness's private key. ``repr`` never shows the secret."""

    __slots__ = ("_private", "public_key")

    def __init__(self, name: str, seed: bytes) -> None:
        if len(seed) != 32:
            raise ProofError(f"an Ed25519 private key seed is 32 bytes, not {len(seed)}")
        self._private = Ed25519PrivateKey.from_private_bytes(seed)
        public = self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.public_key = CosignerKey(name, public)

    @property
    def name(self) -> str:
        return self.public_key.name

    @classmethod
    def generate(cls, name: str) -> Cosigner:
        return cls(name, os.urandom(32))

    @classmethod
    def from_text(cls, text: str | bytes) -> Cosigner:
        """Parse ``PRIVATE+KEY+<name>+<hex key id>+<base64(0x04 || seed)>``."""
        name, hex_id, raw = private_key_fields(
            text, "create one with 'evidence witness keygen NAME FILE'")
        if len(raw) != 33 or raw[0] != _ALG_COSIGNATURE_V1:
            raise ProofError("not a witness private key (cosignature v1: 0x04)",
                             hint="a store's checkpoint key cannot cosign; create a witness "
                             "key with 'evidence witness keygen NAME FILE'")
        key = cls(name, raw[1:])
        if f"{key.public_key.key_id:08x}" != hex_id:
            raise ProofError("private key id does not match its name and key")
        return key

    def to_text(self) -> str:
        raw = bytes([_ALG_COSIGNATURE_V1]) + self._private.private_bytes_raw()
        return f"PRIVATE+KEY+{self.name}+{self.public_key.key_id:08x}+{_b64(raw)}"

    def write(self, path: str | os.PathLike[str]) -> tuple[Path, Path]:
        """The private key (mode 0600, never over an existing file) and ``<path>.pub``."""
        return write_key_pair(path, self.to_text(), self.public_key.to_text())

    def cosign(self, text: str, timestamp: int) -> str:
        """A cosignature line over the note body ``text`` at ``timestamp`` (POSIX seconds)."""
        if not 0 < timestamp < 1 << 63:
            raise ProofError("a cosignature's time is a positive POSIX timestamp")
        signature = self._private.sign(_message(text, timestamp))
        blob = self.public_key.key_id.to_bytes(4, "big") + timestamp.to_bytes(8, "big")
        return f"{_EM_DASH} {self.name} {_b64(blob + signature)}\n"

    def __repr__(self) -> str:
        return f"Cosigner(name={self.name!r}, key_id={self.public_key.key_id:08x})"


# --- the witness ---------------------------------------------------------------------

@dataclass(frozen=True)
class WitnessReply:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"


def _text(status: int, message: str) -> WitnessReply:
    return WitnessReply(status, (message.rstrip("\n") + "\n").encode())


class Witness:
    """Checks and cosigns checkpoints of the logs it knows, keeping its state in ``state``."""

    def __init__(self, cosigner: Cosigner, logs: Mapping[str, Sequence[VerifierKey]],
                 state: Path) -> None:
        self.cosigner = cosigner
        self.logs = {origin: list(keys) for origin, keys in logs.items()}  # origin -> keys
        self.state = Path(state)
        self.state.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._held = os.open(self.state / "LOCK", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._held)
            raise ProofError(f"another witness process holds {self.state}",
                             hint="stop it first; one process keeps one state directory",
                             path=str(self.state)) from None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._held)

    # The state of one log: {"origin", "size", "root" (base64), "checkpoint" (the note as
    # cosigned, with the log's signatures and ours)}.
    def _path(self, origin: str) -> Path:
        return self.state / (hashlib.sha256(origin.encode()).hexdigest() + ".json")

    def _load(self, origin: str) -> dict | None:
        try:
            return json.loads(self._path(origin).read_text())
        except FileNotFoundError:
            return None

    def _store(self, origin: str, record: dict) -> None:
        path = self._path(origin)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(record, f, sort_keys=True)
        fsync_file(tmp)
        os.replace(tmp, path)
        fsync_dir(self.state)

    def latest(self, origin_hash: str) -> WitnessReply:
        """``GET <prefix>/<origin hash>/checkpoint``."""
        if len(origin_hash) != 64 or not set(origin_hash) <= _HEX8:
            return _text(404, "no such log")
        try:
            record = json.loads((self.state / f"{origin_hash}.json").read_text())
        except FileNotFoundError:
            return _text(404, "this witness has cosigned no checkpoint of that log")
        return WitnessReply(200, record["checkpoint"].encode())

    def add_checkpoint(self, body: bytes, now: int | None = None) -> WitnessReply:
        """``POST <prefix>/add-checkpoint``: check, record, cosign (module docstring)."""
        try:
            old_size, proof, cp = _parse_request(body)
        except ProofError as exc:
            return _text(400, str(exc))
        keys = self.logs.get(cp.origin)
        if keys is None:
            return _text(404, f"this witness does not witness the log {cp.origin}")
        named = [(k, s) for k in keys for s in cp.signatures
                 if (s.key_name, s.key_id) == (k.name, k.key_id)]
        if not named:
            return _text(403, f"no signature by a key this witness trusts for {cp.origin}")
        for key, signature in named:  # one naming a trusted key must verify (signed-note)
            if not key.verify(signature.signature, cp.text.encode()):
                return _text(403, f"the signature by {key.name} does not verify")
        if old_size > cp.tree_size:
            return _text(400, f"old size {old_size} is larger than the checkpoint's "
                         f"{cp.tree_size}")
        if cp.tree_size == 0 and cp.root != EMPTY_ROOT:
            return _text(422, "a checkpoint of size 0 has the empty tree's root")
        with self._lock:
            record = self._load(cp.origin)
            held = 0 if record is None else int(record["size"])
            if old_size != held:
                return WitnessReply(409, f"{held}\n".encode(), "text/x.tlog.size")
            if old_size == 0:
                if proof:
                    return _text(422, "old size 0 takes no consistency proof")
            else:
                assert record is not None
                old_root = base64.b64decode(record["root"])
                if old_size == cp.tree_size:
                    if proof or old_root != cp.root:
                        return _text(422, f"a checkpoint of size {old_size} with another "
                                     "root than the one this witness cosigned: a fork")
                elif not verify_consistency(old_size, cp.tree_size, old_root, cp.root, proof):
                    return _text(422, f"the consistency proof from size {old_size} does "
                                 "not hold: the log did not only grow")
            timestamp = max(int(time.time()) if now is None else now, 1)
            line = self.cosigner.cosign(cp.text, timestamp)
            self._store(cp.origin, {"origin": cp.origin, "size": cp.tree_size,
                                    "root": _b64(cp.root), "checkpoint": cp.note() + line})
        return WitnessReply(200, line.encode())


def _parse_request(body: bytes) -> tuple[int, list[bytes], SignedCheckpoint]:
    if len(body) > _MAX_BODY:
        raise ProofError(f"a request over {_MAX_BODY} bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ProofError("the request is not UTF-8") from None
    head, sep, note = text.partition("\n\n")
    if not sep:
        raise ProofError("no blank line between the old size and proof, and the checkpoint")
    lines = head.split("\n")
    first = lines[0]
    number = first.removeprefix("old ")
    if not first.startswith("old ") or not number.isdigit() or \
            (number != "0" and number.startswith("0")) or len(number) > 20:
        raise ProofError("the first line must be 'old <size>'")
    if len(lines) - 1 > _MAX_PROOF_LINES:
        raise ProofError(f"more than {_MAX_PROOF_LINES} consistency proof lines")
    proof = []
    for line in lines[1:]:
        h = _b64decode(line, "a proof hash")
        if len(h) != 32:
            raise ProofError("a proof hash is 32 bytes")
        proof.append(h)
    return int(number), proof, parse_checkpoint(note)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = 30  # a client that stops sending is dropped

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, reply: WitnessReply) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        self.wfile.write(reply.body)

    def do_POST(self) -> None:
        if self.path.rstrip("/") != self.server.prefix + "/add-checkpoint":
            return self._reply(_text(404, "not found"))
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self._reply(_text(411, "a Content-Length is required"))
        if not 0 <= length <= _MAX_BODY:
            self.close_connection = True
            return self._reply(_text(413, f"at most {_MAX_BODY} bytes"))
        self._reply(self.server.witness.add_checkpoint(self.rfile.read(length)))

    def do_GET(self) -> None:
        path = self.path.removeprefix(self.server.prefix + "/")
        origin_hash, _, rest = path.partition("/")
        if rest != "checkpoint":
            return self._reply(_text(404, "not found"))
        self._reply(self.server.witness.latest(origin_hash))


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], witness: Witness, prefix: str) -> None:
        super().__init__(address, _Handler)
        self.witness = witness
        self.prefix = prefix.rstrip("/")


@contextlib.contextmanager
def serve_witness(witness: Witness, host: str = "127.0.0.1", port: int = 0,
                  prefix: str = "") -> Iterator[str]:
    """Serve ``witness`` over HTTP in a background thread; yield its base URL."""
    server = _Server((host, port), witness, prefix)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}{server.prefix}"
    finally:
        server.shutdown()
        server.server_close()


# --- a log's side ----------------------------------------------------------------------

def add_cosignatures(cp: SignedCheckpoint, witnesses: Sequence[tuple[str, CosignerKey]],
                     prove: Callable[[int], list[bytes]], *, timeout: float = 30.0
                     ) -> tuple[SignedCheckpoint, dict[str, int]]:
    """Ask each witness (its ``add-checkpoint`` URL prefix and its key) to cosign ``cp``;
    return the checkpoint with their cosignatures and {witness name: time}.

    The old size is learnt from the witness (a first request says 0; a witness that holds
    another size answers 409 with it), and ``prove(old_size)`` gives the consistency proof
    from there to ``cp``. A witness that refuses, or answers with no valid cosignature by
    its key, is a ``ProofError`` naming it: a checkpoint is not quietly left uncosigned.
    """
    import httpx

    signatures = list(cp.signatures)
    times: dict[str, int] = {}
    with httpx.Client(timeout=timeout, trust_env=False) as client:
        for url, key in witnesses:
            old, proof = 0, list[bytes]()
            for _ in range(2):
                body = f"old {old}\n" + "".join(_b64(h) + "\n" for h in proof) + "\n" + \
                    cp.note()
                try:
                    answer = client.post(url.rstrip("/") + "/add-checkpoint",
                                         content=body.encode())
                except httpx.HTTPError as exc:
                    raise ProofError(f"witness {key.name} at {url} could not be reached: "
                                     f"{exc}", hint="check --witness and that it runs") from None
                if answer.status_code != 409 or old != 0:
                    break
                held = answer.text.strip()
                if not held.isdigit() or int(held) > cp.tree_size:
                    raise ProofError(f"witness {key.name} holds size {held[:40]!r} of "
                                     f"{cp.origin}, beyond this checkpoint's {cp.tree_size}: "
                                     "the log it saw is not a prefix of this one")
                old, proof = int(held), prove(int(held))
            if answer.status_code != 200:
                raise ProofError(f"witness {key.name} refused the checkpoint (HTTP "
                                 f"{answer.status_code}: {answer.text.strip()[:300]})",
                                 hint="a 422 means the log is not consistent with what the "
                                 "witness cosigned before")
            got = parse_checkpoint(cp.note() + answer.text)
            fresh = [s for s in got.signatures[len(cp.signatures):]
                     if key.timestamp_of(cp.text, s) is not None]
            if not fresh:
                raise ProofError(f"witness {key.name} answered without a valid cosignature "
                                 "by its key", hint="check the witness key you gave")
            signatures += fresh[:1]
            times[key.name] = key.timestamp_of(cp.text, fresh[0]) or 0
    return msgspec.structs.replace(cp, signatures=signatures), times


def check_cosignatures(cp: SignedCheckpoint, keys: Sequence[CosignerKey],
                       need: int | None = None, *, now: float | None = None
                       ) -> tuple[bool, dict[str, int], list[str]]:
    """Which of ``keys`` validly cosigned ``cp``: (enough?, {name: time}, problems).
    ``need`` defaults to all of them; a cosignature from the future (more than 5 minutes
    past ``now``) is not counted."""
    now = time.time() if now is None else now
    found: dict[str, int] = {}
    problems: list[str] = []
    for key in keys:
        times = [t for s in cp.signatures if (t := key.timestamp_of(cp.text, s)) is not None]
        named = [s for s in cp.signatures if (s.key_name, s.key_id) == (key.name, key.key_id)]
        if not named:
            problems.append(f"no cosignature by witness {key.name}")
        elif not times:
            problems.append(f"the cosignature by witness {key.name} does not verify")
        elif min(times) > now + 300:
            problems.append(f"the cosignature by witness {key.name} is dated in the future")
        else:
            found[key.name] = min(times)
    need = len(keys) if need is None else need
    return len(found) >= need, found, problems
