"""The proof commands: ``keygen``, ``checkpoint``, ``prove``, ``check-proof``.

Signed checkpoints of the Merkle log and the inclusion and consistency proofs a third
party checks offline, each a few lines over ``_audit.keys``, ``_audit.checkpoints`` and
``_audit.proofs``. Exit status: 0 when all is well, 1 when a proof does not hold, 2 for an
error (printed by ``_cli.main`` as ``Error:`` / ``Try:``).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from .._errors import ProofError
from .common import local_directory, local_path, print_json, store_location, write_output

if TYPE_CHECKING:  # the commands import what they run: a CLI start loads only its own
    from .._audit.proofs import ConsistencyProof, InclusionProof

__all__ = ["add_commands"]


def _read(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ProofError(f"cannot read {path}: {exc.strerror}", path=path) from None


def _cmd_keygen(args: argparse.Namespace) -> int:
    """``keygen`` (a store's signing key) and ``witness keygen`` (a witness's)."""
    if args.witness_key_pair:
        from .._audit.witness import Cosigner as Key
    else:
        from .._audit.keys import SigningKey as Key  # type: ignore[assignment]

    key = Key.generate(args.name)
    private, public = key.write(args.key)
    print(f"private key {private} (keep it secret), public key {public}:")
    print(key.public_key.to_text())
    return 0


def _cmd_checkpoint(args: argparse.Namespace) -> int:
    from .._audit.checkpoints import checkpoint
    from .._audit.keys import SigningKey
    from .._audit.timestamp import TSR_SUFFIX, load_certificates, request_timestamp
    from .._store.db import Store

    tsa_cert, tsr = None, None
    witnesses = _witnesses(args)
    if args.tsa_cert and not args.tsa:
        raise ProofError("--tsa-cert names the certificate of the TSA given by --tsa",
                         hint="add --tsa URL, or leave out --tsa-cert")
    if args.tsa:
        if not args.out:
            raise ProofError("--tsa needs --out FILE: the timestamp is kept beside the "
                             f"checkpoint, as FILE{TSR_SUFFIX}", hint="add --out FILE")
        tsr = Path(args.out + TSR_SUFFIX)
        if tsr.exists():
            raise ProofError(f"{tsr} already exists; a timestamp is never overwritten",
                             hint="choose another --out FILE", path=str(tsr))
        if args.tsa_cert:
            tsa_cert = load_certificates(_read(args.tsa_cert), args.tsa_cert)
    with Store.open(args.store, read_only=True) as store:
        if args.new_key:
            key = SigningKey.generate(f"evidence/{store.store_id}")
            _, public = key.write(args.new_key)
            print(f"new key {args.new_key}, public key {public}", file=sys.stderr)
        else:
            key = SigningKey.from_text(_read(args.key))
        cp = checkpoint(store, key)
        cosigned: dict[str, int] = {}
        if witnesses:
            from .._audit.proofs import prove_consistency
            from .._audit.witness import add_cosignatures

            size = cp.tree_size
            cp, cosigned = add_cosignatures(
                cp, witnesses, lambda old: prove_consistency(store, old, size).path)
    note = cp.note()
    # Before anything is written: a TSA that fails leaves no checkpoint without its token.
    stamp = (request_timestamp(note.encode(), args.tsa, tsa_cert=tsa_cert) if args.tsa
             else None)
    if args.json:
        print_json({"origin": cp.origin, "store_id": cp.store_id, "tree_size": cp.tree_size,
                     "root": cp.root.hex(), "time": cp.time, "key": key.public_key.to_text(),
                     "chain": None if cp.chain is None else {
                         "batch": cp.chain.number, "hash": cp.chain.digest.hex()},
                     "note": note, "witnesses": cosigned,
                     "timestamp": None if stamp is None else {
                         "file": str(tsr), "time": stamp.time, "tsa": stamp.tsa,
                         "serial": stamp.serial, "policy": stamp.policy}})
        if args.out:
            Path(args.out).write_bytes(note.encode())
    else:
        write_output(note, args.out)
    for name, when in cosigned.items():
        if not args.json:
            print(f"cosigned by witness {name} at {when} (POSIX time)", file=sys.stderr)
    if stamp is not None and tsr is not None:
        with open(tsr, "xb") as f:  # the DER TimeStampResp, as openssl ts -verify reads it
            f.write(stamp.der)
        if not args.json:
            print(f"timestamp {stamp.time} by {stamp.tsa} (serial {stamp.serial}): wrote "
                  f"{tsr}", file=sys.stderr)
    return 0


def _witnesses(args: argparse.Namespace) -> list:  # [(url, CosignerKey)]
    """``--witness URL`` and ``--witness-key FILE``, paired in the order given."""
    urls, keys = args.witness or [], args.witness_key or []
    if len(urls) != len(keys):
        raise ProofError(f"{len(urls)} --witness and {len(keys)} --witness-key: give each "
                         "witness's URL and its public key", hint="repeat both, in pairs")
    from .._audit.witness import CosignerKey

    return [(url, CosignerKey.from_text(_read(key))) for url, key in zip(urls, keys,
                                                                           strict=True)]


def _cmd_witness_serve(args: argparse.Namespace) -> int:
    import signal

    from .._audit.keys import VerifierKey
    from .._audit.witness import Cosigner, Witness, serve_witness

    logs: dict[str, list[VerifierKey]] = {}
    for given in args.trust:
        origin, sep, path = given.partition("=")
        if not sep or not origin or not path:
            raise ProofError(f"--trust {given!r}: give ORIGIN=PUBLIC-KEY-FILE",
                             hint="the origin is the checkpoint's first line, e.g. "
                             "evidence/store-0190...; the file is the store owner's KEY.pub")
        logs.setdefault(origin, []).append(VerifierKey.from_text(_read(path)))
    cosigner = Cosigner.from_text(_read(args.key))
    host, _, port = args.listen.rpartition(":")
    if not port.isdigit() or not host:
        raise ProofError(f"--listen {args.listen!r}: give HOST:PORT",
                         hint="e.g. --listen 127.0.0.1:7380 (port 0: any free port)")
    witness = Witness(cosigner, logs, args.state)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with serve_witness(witness, host, int(port), args.prefix) as url:
            print(f"witness {cosigner.name} at {url}/add-checkpoint, state in {args.state}",
                  flush=True)
            print(cosigner.public_key.to_text(), flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    finally:
        witness.close()
    return 0


def _cmd_prove(args: argparse.Namespace) -> int:
    from .._audit.checkpoints import parse_checkpoint
    from .._audit.proofs import encode_proof, prove_consistency, prove_inclusion
    from .._audit.timestamp import TSR_SUFFIX
    from .._store.db import Store

    size = args.to_size
    cp, note, token = None, None, None
    if args.checkpoint:
        raw = _read(args.checkpoint)
        cp = parse_checkpoint(raw)
        size, note = cp.tree_size, raw.decode()
        beside = Path(args.checkpoint + TSR_SUFFIX)
        if args.checkpoint != "-" and beside.is_file():
            token = _read(str(beside))  # the proof carries the checkpoint's timestamp too
    proof: ConsistencyProof | InclusionProof
    with Store.open(args.store, read_only=True) as store:
        if args.from_size is not None:
            proof = prove_consistency(store, args.from_size, size)
            root = proof.new_root
        else:
            proof = prove_inclusion(store, args.attempt, log_index=args.index, tree_size=size)
            root = proof.root
    if cp is not None and (cp.origin, cp.root) != (proof.origin, root):
        raise ProofError(f"the checkpoint ({cp.origin}, size {cp.tree_size}) does not match "
                         "this store's log at that size",
                         hint="use a checkpoint of this store; if it is, run 'evidence verify'")
    if note is not None:
        proof = msgspec.structs.replace(proof, checkpoint=note, timestamp=token)
    data = encode_proof(proof)
    if args.out:
        Path(args.out).write_bytes(data)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.buffer.write(data)
    return 0


def _check_witnessed(args: argparse.Namespace, proof: bytes, result) -> dict | None:
    """With ``--witness-key``: the checkpoint's valid cosignatures by those witnesses; too
    few of them fail the result (``--witnesses N``, default all given)."""
    if not args.witness_key:
        return None
    from .._audit.checkpoints import parse_checkpoint
    from .._audit.proofs import decode_proof
    from .._audit.witness import CosignerKey, check_cosignatures

    keys = [CosignerKey.from_text(_read(path)) for path in args.witness_key]
    need = len(keys) if args.witnesses is None else args.witnesses
    if not 1 <= need <= len(keys):
        raise ProofError(f"--witnesses {need}: between 1 and the {len(keys)} --witness-key "
                         "given", hint="name at least that many witness keys")
    try:
        text = (_read(args.checkpoint) if args.checkpoint
                else (decode_proof(proof).checkpoint or "").encode())
        cp = parse_checkpoint(text)
    except ProofError as exc:
        result.ok = False
        result.problems.append(f"witnesses: {exc}")
        return {}
    enough, found, problems = check_cosignatures(cp, keys, need)
    if not enough:
        result.ok = False
        result.problems.append(f"{len(found)} of the {need} witness cosignatures needed")
        result.problems.extend(problems)
    return found


def _cmd_check_proof(args: argparse.Namespace) -> int:
    from .._audit.proofs import check_proof, decode_proof
    from .._audit.timestamp import TSR_SUFFIX, load_certificates

    roots = ([c for path in args.tsa_root for c in load_certificates(_read(path), path)]
             if args.tsa_root else None)
    token = None
    if args.timestamp:
        token = _read(args.timestamp)
    elif args.checkpoint and args.checkpoint != "-" and Path(
            args.checkpoint + TSR_SUFFIX).is_file():
        token = _read(args.checkpoint + TSR_SUFFIX)  # kept beside its checkpoint
    proof = _read(args.proof)
    try:
        carried = decode_proof(proof)
    except ProofError:
        carried = None  # check_proof says what is wrong with it
    if args.checkpoint is None and carried is not None and carried.checkpoint is None:
        raise ProofError("the proof carries no checkpoint: give the one it was made for",
                         hint="add --checkpoint FILE (or make the proof with 'evidence prove "
                         "--checkpoint FILE', which puts it in)")
    result = check_proof(proof, _read(args.checkpoint) if args.checkpoint else None,
                         _read(args.public_key),
                         old_checkpoint=_read(args.old_checkpoint) if args.old_checkpoint
                         else None, timestamp=token, tsa_roots=roots)
    witnessed = _check_witnessed(args, proof, result)
    if args.json:
        print_json({**msgspec.to_builtins(result), "witnesses": witnessed})
    elif result.ok:
        print(f"OK: {result.statement}")
        for name, when in (witnessed or {}).items():
            print(f"    cosigned by witness {name} at {when} (POSIX time)")
        print(f"    signed by {result.key}, root {result.root}")
        if result.timestamped_at is not None:
            print(f"    timestamped at {result.timestamped_at} by {result.tsa} (RFC 3161, "
                  "chained to the TSA root given)")
        elif token is not None or (carried is not None and carried.timestamp is not None):
            print("    a timestamp is kept with the checkpoint but was not checked: name the "
                  "TSA's root with --tsa-root PEM")
    else:
        print("FAILED: the proof does not hold")
        for problem in result.problems:
            print(f"  - {problem}")
    return 0 if result.ok else 1


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add keygen, checkpoint, prove and check-proof to the ``evidence`` parser."""
    p = sub.add_parser(
        "keygen", help="create an Ed25519 key for signing checkpoints",
        description="Write a new signing key to KEY (mode 0600, never overwritten) and its "
        "public key to KEY.pub, in the signed-note key formats.")
    p.add_argument("key", metavar="KEY", type=local_path, help="file for the private key")
    p.add_argument("--name", default="evidence",
                   help="the key name in signatures: no spaces or '+', e.g. example.com/crawl")
    p.set_defaults(func=_cmd_keygen, witness_key_pair=False)

    p = sub.add_parser(
        "checkpoint", help="sign the log's current size and root",
        description="Recompute the log from the ledger and sign (store id, tree size, root, "
        "time, the commit-log chain head, the pre-006 quarantine rows) as a C2SP checkpoint "
        "with Ed25519; with --tsa, also get an RFC 3161 timestamp over it.")
    p.add_argument("store", metavar="STORE", type=store_location,
                   help="the store directory")
    key = p.add_mutually_exclusive_group(required=True)
    key.add_argument("--key", metavar="KEY", help="the private key file (see keygen)")
    key.add_argument("--new-key", metavar="FILE", type=local_path,
                     help="create a key named after the store in FILE (and FILE.pub), sign "
                     "with it")
    p.add_argument("--out", metavar="FILE", type=local_path,
                   help="write the checkpoint here, not to stdout")
    p.add_argument("--tsa", metavar="URL",
                   help="also get an RFC 3161 timestamp over the signed checkpoint from the "
                   "time-stamping authority at URL (http or https), written beside it as "
                   "FILE.tsr (needs --out)")
    p.add_argument("--tsa-cert", metavar="PEM",
                   help="the TSA's certificate, then its chain up to its root: the timestamp "
                   "must be signed by it, or nothing is written")
    p.add_argument("--witness", metavar="URL", action="append",
                   help="also get a cosignature from the witness at URL (C2SP tlog-witness, "
                   "its add-checkpoint prefix; repeatable, each with a --witness-key); a "
                   "witness that refuses fails the command and nothing is written")
    p.add_argument("--witness-key", metavar="FILE", action="append",
                   help="the public key of the --witness in the same position (KEY.pub of "
                   "'evidence witness keygen')")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_cmd_checkpoint)

    w = sub.add_parser(
        "witness", help="an independent witness that cosigns checkpoints of logs that only "
        "grow", description="A C2SP tlog-witness: it cosigns a checkpoint only when a "
        "consistency proof shows the last one it cosigned for that log is a prefix of it "
        "(docs/verify.md#witnesses).").add_subparsers(dest="witness_command",
                                                      metavar="COMMAND", required=True)
    p = w.add_parser("keygen", help="create the witness's Ed25519 key",
                     description="Write a new witness key to KEY (mode 0600, never "
                     "overwritten) and its public key to KEY.pub (cosignature v1 form).")
    p.add_argument("key", metavar="KEY", type=local_path, help="file for the private key")
    p.add_argument("--name", required=True,
                   help="the witness's name in cosignatures: no spaces or '+', e.g. "
                   "witness.example/w1")
    p.set_defaults(func=_cmd_keygen, witness_key_pair=True)
    p = w.add_parser("serve", help="serve the witness over HTTP until stopped",
                     description="Serve POST PREFIX/add-checkpoint and GET "
                     "PREFIX/<origin hash>/checkpoint; the state of each log (the last "
                     "checkpoint cosigned) is kept durably in --state.")
    p.add_argument("--key", required=True, metavar="KEY", type=local_path,
                   help="the witness's private key (see 'evidence witness keygen')")
    p.add_argument("--state", required=True, metavar="DIR", type=local_directory,
                   help="the witness's state directory (created if missing)")
    p.add_argument("--trust", required=True, action="append", metavar="ORIGIN=KEY.pub",
                   help="a log to witness: its origin (a checkpoint's first line) and the "
                   "public key that signs its checkpoints (repeatable)")
    p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="where to serve (default 127.0.0.1:0, any free port; the URL is "
                   "printed)")
    p.add_argument("--prefix", default="", help="a URL path prefix (default none)")
    p.set_defaults(func=_cmd_witness_serve)

    p = sub.add_parser(
        "prove", help="an inclusion or consistency proof",
        description="Print an RFC 9162 inclusion proof for an attempt's ledger entry, or a "
        "consistency proof between two tree sizes, as JSON.")
    p.add_argument("store", metavar="STORE", type=store_location,
                   help="the store directory")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--attempt", metavar="ID", help="prove this fetch attempt is logged")
    what.add_argument("--index", type=int, metavar="N", help="prove ledger entry N is logged")
    what.add_argument("--from-size", type=int, metavar="N",
                      help="prove the log at size N is a prefix of the log now")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--to-size", type=int, metavar="M",
                      help="prove against the tree of size M (default: the current size)")
    size.add_argument("--checkpoint", metavar="FILE",
                      help="prove against this checkpoint's size (and check its root); the "
                      "proof carries the checkpoint, and its timestamp (FILE.tsr) if there is "
                      "one")
    p.add_argument("--out", metavar="FILE", type=local_path,
                   help="write the proof here, not to stdout")
    p.set_defaults(func=_cmd_prove)

    p = sub.add_parser(
        "check-proof", help="verify a proof offline, against a signed checkpoint",
        description="Verify a proof against a checkpoint and the signer's public key, without "
        "the store. Exit 0 if it holds, 1 if not.")
    p.add_argument("proof", metavar="PROOF", help="the proof file ('-' for stdin)")
    p.add_argument("--checkpoint", metavar="FILE",
                   help="the signed checkpoint (default: the one the proof carries)")
    p.add_argument("--public-key", required=True, metavar="FILE",
                   help="the signer's public key (KEY.pub)")
    p.add_argument("--old-checkpoint", metavar="FILE",
                   help="consistency: the older checkpoint the proof starts from")
    p.add_argument("--tsa-root", metavar="PEM", action="append",
                   help="check the checkpoint's RFC 3161 timestamp against this TSA root "
                   "certificate (repeatable); the proof fails without a valid timestamp")
    p.add_argument("--timestamp", metavar="FILE",
                   help="the timestamp (DER TimeStampResp; default: CHECKPOINT.tsr when it "
                   "exists)")
    p.add_argument("--witness-key", metavar="FILE", action="append",
                   help="require a valid cosignature on the checkpoint by this witness "
                   "(KEY.pub; repeatable)")
    p.add_argument("--witnesses", type=int, metavar="N",
                   help="how many of the --witness-key witnesses must have cosigned "
                   "(default: all of them)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_cmd_check_proof)
