"""Proof that travels with the evidence (issue 32): an export carries the signed checkpoint,
its RFC 3161 timestamp and its cosignatures, and ``evidence verify ARCHIVE`` checks the
archive as ``evidence verify`` checks a store, against that checkpoint.

The attacks are made as someone holding the database and the archive would make them: the
store edited with its guards dropped and the commit-log chain recomputed, exported again,
and the genuine checkpoint (with its timestamp) moved into that archive, its manifest
entries made true. tests/test_verifier.py runs ``evidence-verify`` on the same archives.
"""

from __future__ import annotations

import base64
import gzip
import json
import shutil
import subprocess
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import blake3
import msgspec
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from evidence import CrawlConfig, Crawler, Store
from evidence._archive.archive import restore
from evidence._archive.carried import read_checkpoint_file
from evidence._archive.export import export
from evidence._archive.proofcheck import check_wacz_checkpoint, verify_archive
from evidence._archive.wacz import export_wacz
from evidence._audit.keys import SigningKey
from evidence._audit.witness import Cosigner, Witness, serve_witness
from evidence._cli.main import main as cli_main
from evidence._demo.site import SiteConfig, TestSite
from evidence._errors import CorruptStoreError, ProofError
from evidence.testing.tsa import TestTSA

from .conftest import Factory, submit_all
from .test_checkpoint_binding import Raw


@pytest.fixture(scope="module")
def tsa() -> Iterator[TestTSA]:
    authority = TestTSA.start()
    try:
        yield authority
    finally:
        authority.close()


def make_store(path: Path, sessions: int = 12) -> None:
    """A store of ``sessions`` batches, then one that quarantined a conflict."""
    with Store.create(path) as store:
        make = Factory(store)
        made = [make.session(f"s{i}") for i in range(sessions)]
        acks = [a for m in made for a in submit_all(store, [m])]
        acks += submit_all(store, [msgspec.structs.replace(made[0], mode="incremental")])
        assert [a.status for a in acks] == ["committed"] * sessions + ["conflict"]


def handed_over(out: Path, tsa: TestTSA) -> dict[str, Path]:
    """What an operator hands an examiner: an archive carrying a checkpoint signed with
    their key, timestamped and witnessed by nobody; the key; the TSA's root. Beside them,
    the tampered archives an attacker who holds the database and the archive can make."""
    key = SigningKey.generate("example.com/crawl")
    private, pub = key.write(out / "key")
    make_store(out / "st")
    cp = out / "cp"
    witness = Cosigner.generate("witness.example/w1")
    _, witness_pub = witness.write(out / "w1")
    Cosigner.generate("witness.example/w2").write(out / "w2")
    with Store.open(out / "st", read_only=True) as store:
        origin = f"evidence/{store.store_id}"
    held = Witness(witness, {origin: [key.public_key]}, out / "w1-state")
    try:
        with serve_witness(held) as url:
            assert cli_main(["checkpoint", str(out / "st"), "--key", str(private), "--out",
                             str(cp), "--witness", url, "--witness-key", str(witness_pub),
                             "--tsa", tsa.url]) == 0
    finally:
        held.close()
    assert cli_main(["export", str(out / "st"), "--out", str(out / "archive"),
                     "--checkpoint", str(cp)]) == 0
    # Another store of the same operator, and its own checkpoint and timestamp.
    make_store(out / "other", sessions=3)
    assert cli_main(["checkpoint", str(out / "other"), "--key", str(private), "--out",
                     str(out / "other-cp"), "--tsa", tsa.url]) == 0
    raw = Raw(Store.open(out / "st"), None)
    try:
        with raw.unguarded("commit_log", "ingest_ledger"):
            moved = raw.execute("SELECT committed_at FROM commit_log WHERE batch_seq = 10")[0][0]
            backdated = "2024" + moved[4:]
            raw.execute("UPDATE commit_log SET committed_at = ? WHERE batch_seq = 10",
                        (backdated,))
            raw.execute("UPDATE ingest_ledger SET received_at = ? WHERE batch_seq = 10",
                        (backdated,))
            raw.rechain()
        export(out / "st", out / "x-time")
        with raw.unguarded("commit_log", "quarantine"):
            raw.execute("DELETE FROM quarantine")
            raw.execute("UPDATE commit_log SET quarantined = NULL")
            raw.rechain()
        export(out / "st", out / "x-both")
    finally:
        raw.conn.close()
    graft(out / "x-time", out / "archive", "checkpoint", "checkpoint.tsr")
    graft(out / "x-both", out / "archive", "checkpoint", "checkpoint.tsr")
    shutil.copytree(out / "archive", out / "x-other")
    graft_file(out / "x-other", "checkpoint", (out / "other-cp").read_bytes())
    graft_file(out / "x-other", "checkpoint.tsr", (out / "other-cp.tsr").read_bytes())
    shutil.copytree(out / "archive", out / "x-stamp")
    graft_file(out / "x-stamp", "checkpoint.tsr", (out / "other-cp.tsr").read_bytes())
    return {"archive": out / "archive", "cp": cp, "pub": pub, "root": tsa.root_pem,
            "w1": out / "w1.pub", "w2": out / "w2.pub",
            "x-time": out / "x-time", "x-both": out / "x-both", "x-other": out / "x-other",
            "x-stamp": out / "x-stamp", "dir": out}


def graft(archive: Path, source: Path, *names: str) -> None:
    for name in names:
        graft_file(archive, name, (source / name).read_bytes())


def graft_file(archive: Path, name: str, data: bytes) -> None:
    """Put ``data`` into the archive as ``name`` and make its manifest entry true."""
    (archive / name).write_bytes(data)
    manifest = json.loads((archive / "manifest.json").read_bytes())
    manifest["files"][name] = {"bytes": len(data), "blake3": blake3.blake3(data).hexdigest()}
    (archive / "manifest.json").write_text(json.dumps(manifest, indent=2))


@pytest.fixture(scope="module")
def handed(tmp_path_factory: pytest.TempPathFactory, tsa: TestTSA) -> dict[str, Path]:
    return handed_over(tmp_path_factory.mktemp("carried"), tsa)


def test_an_export_carries_the_checkpoint_and_its_timestamp(handed, tmp_path: Path) -> None:
    archive = handed["archive"]
    assert (archive / "checkpoint").read_bytes() == handed["cp"].read_bytes()
    assert (archive / "checkpoint.tsr").read_bytes() == Path(
        str(handed["cp"]) + ".tsr").read_bytes()
    files = json.loads((archive / "manifest.json").read_bytes())["files"]
    assert {"checkpoint", "checkpoint.tsr"} <= set(files)
    # OpenSSL alone checks the carried timestamp over the carried checkpoint.
    done = subprocess.run(["openssl", "ts", "-verify", "-data", str(archive / "checkpoint"),
                           "-in", str(archive / "checkpoint.tsr"), "-CAfile",
                           str(handed["root"])], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "Verification: OK" in done.stdout, done.stderr
    # restore keeps it; the restored store exports with it to the same bytes.
    restore(archive, tmp_path / "r")
    assert (tmp_path / "r" / "checkpoint").read_bytes() == handed["cp"].read_bytes()
    export(tmp_path / "r", tmp_path / "again",
           checkpoint=read_checkpoint_file(tmp_path / "r" / "checkpoint"))
    for path in sorted(p for p in archive.rglob("*") if p.is_file()):
        assert (tmp_path / "again" / path.relative_to(archive)).read_bytes() == \
            path.read_bytes(), path


def test_the_genuine_archive_verifies_against_what_it_carries(handed, capsys) -> None:
    code = cli_main(["verify", str(handed["archive"]), "--public-key", str(handed["pub"]),
                     "--tsa-root", str(handed["root"]), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["ok"], result
    assert result["carried"] and result["signed_by"].startswith("example.com/crawl+")
    assert result["timestamped_at"].endswith("Z") and result["tsa"] == "CN=evidence test TSA"
    assert result["report"]["checkpoint"].startswith("the log through batch 13")
    assert result["report"]["checks"]["checkpoint"] == 1  # a count, as every check's is
    assert cli_main(["verify", str(handed["archive"])]) == 0  # unpinned: a note says so
    assert "signature was not checked" in capsys.readouterr().out
    # The cosignature travels too: the witness policy is the examiner's.
    argv = ["verify", str(handed["archive"]), "--public-key", str(handed["pub"]),
            "--witness-key", str(handed["w1"])]
    assert cli_main(argv) == 0
    assert "cosigned by witness.example/w1" in capsys.readouterr().out
    assert cli_main([*argv, "--witness-key", str(handed["w2"])]) == 1
    assert "1 of the 2 witness cosignatures needed" in capsys.readouterr().out
    assert cli_main([*argv, "--witness-key", str(handed["w2"]), "--witnesses", "1"]) == 0


@pytest.mark.parametrize(("name", "kinds"), [
    ("x-time", {"log_time", "checkpoint_mismatch"}),  # a commit time moved two years back
    ("x-both", {"log_time", "checkpoint_mismatch"}),  # and a quarantine record dropped
    ("x-other", {"checkpoint_mismatch"}),  # a checkpoint of another store
])
def test_a_tampered_archive_is_refused(handed, name: str, kinds: set[str]) -> None:
    check = verify_archive(handed[name], public_key=_key(handed))
    found = {f.kind for f in check.report.errors}  # type: ignore[attr-defined]
    assert not check.ok and found == kinds, (found, check.problems)
    assert cli_main(["verify", str(handed[name]), "--public-key", str(handed["pub"])]) == 1
    if name != "x-other":  # restore refuses it too: it is not the log that was signed
        with pytest.raises(CorruptStoreError, match="the carried checkpoint"):
            restore(handed[name], handed["dir"] / f"restored-{name}")
        assert not (handed["dir"] / f"restored-{name}").exists()


def test_a_timestamp_over_other_bytes_is_refused(handed, capsys) -> None:
    check = verify_archive(handed["x-stamp"], public_key=_key(handed),
                           tsa_roots=_roots(handed))
    assert check.report.ok and not check.ok  # type: ignore[attr-defined]
    assert check.problems == ["timestamp: the timestamp is over other bytes than this "
                              "checkpoint's"]
    assert cli_main(["verify", str(handed["x-stamp"]), "--public-key", str(handed["pub"]),
                     "--tsa-root", str(handed["root"])]) == 1
    assert "over other bytes" in capsys.readouterr().out


def test_export_refuses_a_checkpoint_it_does_not_reach(handed, tmp_path: Path,
                                                       capsys) -> None:
    argv = ["export", str(handed["dir"] / "other"), "--out", str(tmp_path / "a"),
            "--checkpoint", str(handed["cp"])]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "Error: the store does not hold what the checkpoint signs" in err and "Try:" in err
    assert not (tmp_path / "a").exists()
    assert cli_main([*argv[:4], "--checkpoint", str(handed["dir"] / "other-cp"), "--run",
                     "r1"]) == 2
    assert "cannot carry a checkpoint" in capsys.readouterr().err
    (tmp_path / "stray.tsr").write_bytes(Path(str(handed["dir"] / "other-cp.tsr")).read_bytes())
    (tmp_path / "stray").write_bytes(handed["cp"].read_bytes())
    with pytest.raises(ProofError, match="timestamp of other bytes"):
        read_checkpoint_file(tmp_path / "stray")
    assert not (tmp_path / "a").exists()


def _key(handed):
    from evidence._audit.keys import VerifierKey

    return VerifierKey.from_text(handed["pub"].read_text())


def _roots(handed):
    from evidence._audit.timestamp import load_certificates

    return load_certificates(handed["root"].read_bytes(), "root")


# --- a WACZ carries it too ------------------------------------------------------------

@pytest.fixture(scope="module")
def crawled(tmp_path_factory: pytest.TempPathFactory, tsa: TestTSA) -> Path:
    """A crawled store, its key (key, key.pub) and a timestamped checkpoint cp beside it."""
    out = tmp_path_factory.mktemp("crawled")
    with TestSite(SiteConfig(pages=3)) as site, Store.create(out / "st") as store:
        anyio.run(Crawler(store, CrawlConfig(seeds=[site.url])).run)
    SigningKey.generate("example.com/crawl").write(out / "key")
    assert cli_main(["checkpoint", str(out / "st"), "--key", str(out / "key"), "--out",
                     str(out / "cp"), "--tsa", tsa.url]) == 0
    return out


def test_a_wacz_carries_the_checkpoint_its_timestamp_and_signs_them(
        crawled: Path, handed, tmp_path: Path, capsys) -> None:
    wacz = tmp_path / "x.wacz"
    assert cli_main(["export", str(crawled / "st"), "--format", "wacz", "--out", str(wacz),
                     "--new-key", str(tmp_path / "wk"), "--checkpoint",
                     str(crawled / "cp")]) == 0
    capsys.readouterr()
    with zipfile.ZipFile(wacz) as zf:
        listed = {r["path"] for r in json.loads(zf.read("datapackage.json"))["resources"]}
        assert zf.read("evidence/checkpoint") == (crawled / "cp").read_bytes()
        indexed = gzip.decompress(zf.read("archive/data.warc.gz")).count(
            b"\r\nEvidence-Log-Index: ")
    assert {"evidence/checkpoint", "evidence/checkpoint.tsr"} <= listed  # hashed, signed
    argv = ["verify", str(wacz), "--public-key", str(tmp_path / "wk.pub"),
            "--checkpoint-key", str(crawled / "key.pub"), "--tsa-root", str(handed["root"])]
    assert cli_main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    proof = result["checkpoint"]
    assert result["ok"] and proof["ok"] and proof["signed_by"].startswith("example.com/crawl")
    assert proof["covered"] == indexed > 6 and proof["beyond"] == 0  # every record
    assert proof["origin"] == "evidence/" + Store.open(crawled / "st", read_only=True).store_id
    assert proof["timestamped_at"].endswith("Z")
    # The operator's checkpoint key is not some other key; a WACZ without one is said so.
    assert cli_main([*argv[:4], "--checkpoint-key", str(handed["pub"])]) == 1
    assert "not signed by example.com/crawl" in capsys.readouterr().out
    plain = tmp_path / "plain.wacz"
    with Store.open(crawled / "st", read_only=True) as store:
        export_wacz(store, plain)
        assert not check_wacz_checkpoint(plain).carried
        with pytest.raises(ProofError, match="does not hold what the checkpoint signs"):
            export_wacz(store, tmp_path / "other.wacz",
                        checkpoint=read_checkpoint_file(handed["dir"] / "other-cp"))
    assert not (tmp_path / "other.wacz").exists()
    assert cli_main(["verify", str(plain), "--checkpoint-key", str(crawled / "key.pub")]) == 1
    assert "no checkpoint is carried" in capsys.readouterr().out


def test_a_domain_signed_wacz_carries_an_rfc3161_timestamp_authsign_accepts(
        crawled: Path, tsa: TestTSA, tmp_path: Path, capsys) -> None:
    """export --format wacz --key --cert --tsa: timeSignature is the TSA's reply over the
    signature text, timestampCert its chain; authsign (wacz validate --verify-auth's
    verifier), trusting the domain's and the TSA's roots, accepts the file; so does
    openssl."""
    from .test_waczcheck import _certificates

    key, chain, root = _certificates(tmp_path, ec.SECP384R1())
    (tmp_path / "tsa-chain.pem").write_bytes(tsa.cert_pem.read_bytes()
                                             + tsa.root_pem.read_bytes())
    wacz = tmp_path / "d.wacz"
    assert cli_main(["export", str(crawled / "st"), "--format", "wacz", "--out", str(wacz),
                     "--key", str(key), "--cert", str(chain), "--tsa", tsa.url,
                     "--tsa-cert", str(tmp_path / "tsa-chain.pem")]) == 0
    with zipfile.ZipFile(wacz) as zf:
        signed = json.loads(zf.read("datapackage-digest.json"))["signedData"]
    (tmp_path / "sig.txt").write_text(signed["signature"])
    (tmp_path / "sig.tsr").write_bytes(base64.b64decode(signed["timeSignature"]))
    done = subprocess.run(["openssl", "ts", "-verify", "-data", "sig.txt", "-in", "sig.tsr",
                           "-CAfile", str(tsa.root_pem)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "Verification: OK" in done.stdout, done.stderr

    def fingerprint(path: Path) -> str:
        return x509.load_pem_x509_certificate(path.read_bytes()).fingerprint(
            hashes.SHA256()).hex()

    (tmp_path / "roots.yaml").write_text(
        f"domain_cert_roots:\n  - {fingerprint(root)}\n"
        f"timestamp_cert_roots:\n  - {fingerprint(tsa.root_pem)}\n")
    with warnings.catch_warnings():  # authsign's own deprecations
        warnings.simplefilter("ignore")
        from authsign.verifier import Verifier

        verdict = Verifier(str(tmp_path / "roots.yaml"))(signed)
    assert verdict and dict(verdict)["observer"] == "archive.example.org"
    # evidence verify checks it against the TSA root the examiner names, and no other.
    argv = ["verify", str(wacz), "--public-key", str(root), "--tsa-root"]
    assert cli_main([*argv, str(tsa.root_pem)]) == 0
    assert "the signature timestamped at " in capsys.readouterr().out
    assert cli_main([*argv, str(root)]) == 1  # the domain's root did not issue the TSA
    assert "the signature's timestamp: the timestamp's signer does not chain to the TSA root" in \
        capsys.readouterr().out
    assert cli_main(["export", str(crawled / "st"), "--format", "wacz", "--out",
                     str(tmp_path / "anon.wacz"), "--new-key", str(tmp_path / "k"),
                     "--tsa", tsa.url]) == 2  # the anonymous form has no timestamp
    assert not (tmp_path / "anon.wacz").exists() and not (tmp_path / "k").exists()
