"""``evidence-verify``: one command per kind of evidence. Exit 0: verified; 1: it does not
verify (every problem is printed); 2: it could not be checked (``Error:`` and ``Try:``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .archive import check_archive
from .carried import check_wacz_checkpoint, check_wacz_timestamp
from .checkpoint import VerifierKey, check_checkpoint
from .errors import VerifyError
from .policy import Proofs, WitnessKey, load_roots
from .proof import check_proof
from .verdict import Verdict
from .wacz import check_wacz, load_public_key


def _read(path: str) -> bytes:
    try:
        return sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise VerifyError(f"cannot read {path}: {exc.strerror}",
                          hint="check the file name") from None


def _proofs(args: argparse.Namespace, checkpoint_path: str | None) -> Proofs:
    """The examiner's policy from ``--tsa-root``, ``--timestamp``, ``--witness-key`` and
    ``--witnesses``; the timestamp defaults to CP.tsr beside the checkpoint file."""
    witnesses = [WitnessKey.read(path) for path in args.witness_key or ()]
    if args.witnesses is not None and not 1 <= args.witnesses <= len(witnesses):
        raise VerifyError(f"--witnesses {args.witnesses}: between 1 and the "
                          f"{len(witnesses)} --witness-key given",
                          hint="name at least that many witness keys")
    token = None
    if args.timestamp:
        token = _read(args.timestamp)
    elif checkpoint_path and checkpoint_path != "-" and Path(checkpoint_path + ".tsr").is_file():
        token = _read(checkpoint_path + ".tsr")
    return Proofs(tsa_roots=load_roots(args.tsa_root or []), timestamp=token,
                  witnesses=witnesses, need=args.witnesses)


def _archive(args: argparse.Namespace) -> Verdict:
    if args.checkpoint is not None and args.public_key is None:
        raise VerifyError("--checkpoint needs --public-key",
                          hint="give the key that signed it (KEY.pub) too")
    key = VerifierKey.read(args.public_key) if args.public_key else None
    checkpoint = _read(args.checkpoint) if args.checkpoint else None
    if not Path(args.archive).is_dir():
        raise VerifyError(f"{args.archive} is not a directory",
                          hint="give the directory evidence export wrote")
    return check_archive(args.archive, checkpoint=checkpoint, key=key,
                         proofs=_proofs(args, args.checkpoint))


def _wacz(args: argparse.Namespace) -> Verdict:
    pinned = load_public_key(args.public_key) if args.public_key else None
    key = VerifierKey.read(args.checkpoint_key) if args.checkpoint_key else None
    proofs = _proofs(args, None)
    if not Path(args.wacz).is_file():
        raise VerifyError(f"{args.wacz} is not a file", hint="give the .wacz file")
    verdict = check_wacz(args.wacz, public_key=pinned)
    check_wacz_timestamp(args.wacz, verdict, proofs)
    check_wacz_checkpoint(args.wacz, verdict, key, proofs)
    return verdict.finish()


def _proof(args: argparse.Namespace) -> Verdict:
    key = VerifierKey.read(args.public_key)
    old = _read(args.old_checkpoint) if args.old_checkpoint else None
    return check_proof(_read(args.proof), _read(args.checkpoint), key, old_checkpoint=old,
                       subject=args.proof)


def _checkpoint(args: argparse.Namespace) -> Verdict:
    data = _read(args.checkpoint)
    proofs = _proofs(args, args.checkpoint)
    verdict, cp = check_checkpoint(data, VerifierKey.read(args.public_key), args.checkpoint)
    if cp is not None:
        proofs.check(data, cp, verdict)
    return verdict.finish()


def _policy_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tsa-root", metavar="PEM", action="append",
                   help="check the checkpoint's RFC 3161 timestamp (it fails without a "
                   "valid one) and a WACZ's domain signature's against this TSA root "
                   "certificate (repeatable)")
    p.add_argument("--timestamp", metavar="FILE",
                   help="the timestamp (DER TimeStampResp; default: CHECKPOINT.tsr beside "
                   "the checkpoint, or the one an archive carries)")
    p.add_argument("--witness-key", metavar="FILE", action="append",
                   help="require a valid cosignature on the checkpoint by this witness "
                   "(KEY.pub; repeatable)")
    p.add_argument("--witnesses", type=int, metavar="N",
                   help="how many of the --witness-key witnesses must have cosigned "
                   "(default: all of them)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evidence-verify", description="Check evidence made by evidence, offline and "
        "without it: an archive, a WACZ file, a proof, a checkpoint.")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    p = sub.add_parser("archive", help="an archive directory (evidence export)",
                       description="Check every file and payload of an archive against its "
                       "manifest, rebuild its log from the ledger (leaves, roots, the "
                       "commit-log chain from the store's identity, commit times, quarantine "
                       "records), and compare it with the checkpoint the operator signed: "
                       "the one the archive carries, or --checkpoint.")
    p.add_argument("archive", metavar="DIR")
    p.add_argument("--checkpoint", metavar="FILE",
                   help="a checkpoint of the store (default: the one the archive carries)")
    p.add_argument("--public-key", metavar="KEY", help="the operator's key (KEY.pub)")
    _policy_flags(p)
    p.set_defaults(run=_archive)
    p = sub.add_parser("wacz", help="a WACZ file (evidence export --format wacz)",
                       description="Check the zip, every package hash, the signature, each "
                       "WARC record's digests and every index line.")
    p.add_argument("wacz", metavar="FILE")
    p.add_argument("--public-key", metavar="KEY",
                   help="the signer's key (KEY.pub, PEM) or a certificate of its chain")
    p.add_argument("--checkpoint-key", metavar="KEY",
                   help="the operator's checkpoint key (KEY.pub of evidence keygen): check "
                   "the signed checkpoint the WACZ carries")
    _policy_flags(p)
    p.set_defaults(run=_wacz)
    p = sub.add_parser("proof", help="an inclusion or consistency proof (evidence prove)",
                       description="Check a proof against a checkpoint signed by the key.")
    p.add_argument("proof", metavar="PROOF", help="the proof file ('-': stdin)")
    p.add_argument("--checkpoint", required=True, metavar="FILE")
    p.add_argument("--public-key", required=True, metavar="KEY")
    p.add_argument("--old-checkpoint", metavar="FILE",
                   help="consistency: the older checkpoint, so both ends are signed")
    p.set_defaults(run=_proof)
    p = sub.add_parser("checkpoint", help="a checkpoint's signature (evidence checkpoint)",
                       description="Check the operator's signature over the whole checkpoint.")
    p.add_argument("checkpoint", metavar="FILE")
    p.add_argument("--public-key", required=True, metavar="KEY")
    _policy_flags(p)
    p.set_defaults(run=_checkpoint)
    for command in sub.choices.values():
        command.add_argument("--json", action="store_true", help="print JSON for scripts")
    return parser


def render(verdict: Verdict) -> str:
    lines = [f"{verdict.kind:<9} {verdict.subject}"]
    lines += [f"{k:<9} {v}" for k, v in verdict.facts.items()
              if v is not None and not isinstance(v, dict | list)]
    lines += [f"error     {p}" for p in verdict.problems]
    lines += [f"note      {n}" for n in verdict.notes]
    lines.append("OK" if verdict.ok else f"FAILED: {len(verdict.problems)} problem(s)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        verdict = args.run(args)
    except VerifyError as exc:
        sys.stderr.write(f"Error: {exc}\n" + (f"Try: {exc.hint}\n" if exc.hint else ""))
        return 2
    if args.json:
        print(json.dumps(verdict.to_dict(), indent=2))
    else:
        print(render(verdict))
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
