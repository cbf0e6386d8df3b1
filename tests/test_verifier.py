"""A verifier anyone can run (issue 32 point 5): ``verifier/`` (evidence-verify) installed
into a fresh virtualenv where neither evidence nor apsw is, run on an archive, proofs, a
checkpoint and WACZ files that evidence made, catching each tampering."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import anyio
import blake3
import pytest

from evidence import CrawlConfig, Crawler, Store
from evidence._archive.carried import read_checkpoint_file
from evidence._archive.export import export
from evidence._archive.wacz import export_wacz, new_signing_key
from evidence._archive.waczcheck import check_wacz as evidence_check_wacz
from evidence._archive.waczcheck import load_public_key
from evidence._audit.checkpoints import checkpoint
from evidence._audit.keys import SigningKey
from evidence._audit.proofs import encode_proof, prove_consistency, prove_inclusion
from evidence._demo.site import SiteConfig, TestSite
from evidence._model.merkle import root as merkle_root
from evidence._store.log import entry_hash

from .conftest import as_format_1
from .test_carried_checkpoint import handed_over
from .test_carried_checkpoint import tsa as tsa  # the module's TSA fixture, shared
from .test_waczcheck import tamper

ROOT = Path(__file__).resolve().parent.parent
# The examiner's environment: no path into this checkout (and run from elsewhere than it).
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.fixture(scope="session")
def verifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``evidence-verify`` command of a new virtualenv holding only it and its two
    dependencies (pip from this interpreter installs into it: the verifier builds with the
    standard library alone, so nothing but cryptography, blake3 and rfc3161-client is
    fetched)."""
    home = tmp_path_factory.mktemp("verifier-venv")
    venv.create(home, with_pip=False)
    python = home / "bin" / "python"
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                           "--quiet", "--disable-pip-version-check", str(ROOT / "verifier")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    for module in ("evidence", "apsw", "msgspec"):  # none of the producer's parts
        probe = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True,
                               cwd=home, env=CLEAN_ENV)
        assert probe.returncode != 0, f"{module} is importable in the verifier's virtualenv"
    return home / "bin" / "evidence-verify"


def verify(command: Path, *args: object) -> tuple[int, dict]:
    done = subprocess.run([str(command), *map(str, args), "--json"], capture_output=True,
                          text=True, timeout=120, cwd=command.parent, env=CLEAN_ENV)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.fixture(scope="module")
def handed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """What an operator hands an examiner: an archive, a checkpoint, its public key, an
    inclusion and a consistency proof, and a signed WACZ with its key."""
    out = tmp_path_factory.mktemp("handed")
    key = SigningKey.generate("example.org/crawl")
    with TestSite(SiteConfig(pages=3)) as site, Store.create(out / "s") as store:
        crawl = Crawler(store, CrawlConfig(seeds=[site.url]))
        anyio.run(crawl.run)
        with store.snapshot() as conn:
            early = conn.execute("SELECT min(tree_size) FROM commit_log "
                                 "WHERE tree_size > 3").fetchall()[0][0]
        cp = checkpoint(store, key)
        (out / "cp").write_text(cp.note())
        (out / "inclusion.json").write_bytes(encode_proof(prove_inclusion(
            store, log_index=cp.tree_size // 2, tree_size=cp.tree_size)))
        (out / "consistency.json").write_bytes(encode_proof(prove_consistency(
            store, early, cp.tree_size)))
        export_wacz(store, out / "site.wacz", key=new_signing_key(out / "wacz.key"))
    export(out / "s", out / "archive")
    (out / "key.pub").write_text(key.public_key.to_text() + "\n")
    return {"archive": out / "archive", "cp": out / "cp", "pub": out / "key.pub",
            "inclusion": out / "inclusion.json", "consistency": out / "consistency.json",
            "wacz": out / "site.wacz", "wacz_pub": out / "wacz.key.pub", "dir": out}


def test_what_evidence_made_verifies_without_evidence(verifier: Path, handed) -> None:
    code, report = verify(verifier, "archive", handed["archive"], "--checkpoint",
                          handed["cp"], "--public-key", handed["pub"])
    assert code == 0 and report["ok"], report
    assert report["facts"]["entries"] == report["facts"]["checkpoint_size"] > 0
    code, report = verify(verifier, "checkpoint", handed["cp"], "--public-key", handed["pub"])
    assert code == 0 and report["facts"]["key"].startswith("example.org/crawl+")
    code, report = verify(verifier, "proof", handed["inclusion"], "--checkpoint", handed["cp"],
                          "--public-key", handed["pub"])
    assert code == 0, report
    assert report["facts"]["entry"]["kind"] and " is entry " in report["facts"]["statement"]
    code, report = verify(verifier, "proof", handed["consistency"], "--checkpoint",
                          handed["cp"], "--public-key", handed["pub"])
    assert code == 0 and report["facts"]["old_size"] > 3, report
    code, report = verify(verifier, "wacz", handed["wacz"], "--public-key", handed["wacz_pub"])
    assert code == 0 and report["facts"]["pinned"], report


def _resign_sections(archive: Path) -> None:
    """What an attacker with the archive does after editing dump.sql: every BLAKE3 of the
    manifest made true again (the edits keep every length, so every offset holds)."""
    manifest = json.loads((archive / "manifest.json").read_text())
    data = (archive / "dump.sql").read_bytes()
    manifest["files"]["dump.sql"]["blake3"] = blake3.blake3(data).hexdigest()
    for section in [manifest["schema"], *manifest["tables"].values()]:
        piece = data[section["offset"]:section["offset"] + section["bytes"]]
        section["blake3"] = blake3.blake3(piece).hexdigest()
    (archive / "manifest.json").write_text(json.dumps(manifest, indent=2))


def _rewrite_ledger(archive: Path) -> None:
    """One ledger entry's bytes changed (a URL's digit), its leaf and BLAKE3 recomputed,
    every commit-log root, the hash chain and the manifest's root recomputed: consistent
    in itself."""
    text = (archive / "dump.sql").read_text()
    lines = text.split("\n")
    leaves, changed = [], False
    for i, line in enumerate(lines):
        if not line.startswith("INSERT INTO ingest_ledger VALUES("):
            continue
        blobs = re.findall(r"X'([0-9a-f]+)'", line)
        leaf_hex, payload_hex = blobs[0], blobs[1]
        payload = bytes.fromhex(payload_hex)
        if not changed and b"http://127.0.0.1:" in payload:
            at = payload.index(b"http://127.0.0.1:") + len(b"http://127.0.0.1:")
            payload = payload[:at] + (b"1" if payload[at:at + 1] != b"1" else b"2") + payload[
                at + 1:]
            changed = True
            old_hash = re.search(r"'([0-9a-f]{64})'", line).group(1)
            line = line.replace(old_hash, blake3.blake3(payload).hexdigest())
        leaf = hashlib.sha256(b"\x00" + payload).digest()
        line = line.replace(leaf_hex, leaf.hex()).replace(payload_hex, payload.hex())
        lines[i] = line
        leaves.append(leaf)
    assert changed
    prev = None
    for i, line in enumerate(lines):
        match = re.match(r"INSERT INTO commit_log VALUES\((\d+),'([^']*)',(\d+),(\d+),"
                         r"X'([0-9a-f]{64})',X'[0-9a-f]*',X'([0-9a-f]{64})',X'([0-9a-f]{64})',"
                         r"(NULL|X'[0-9a-f]*')\);", line)
        if match:  # the root recomputed, and the chain from it: what anyone can redo
            seq, at, first, size = int(match[1]), match[2], int(match[3]), int(match[4])
            new_root = merkle_root(leaves[:size])
            prev = bytes.fromhex(match[6]) if prev is None else prev
            record = None if match[8] == "NULL" else bytes.fromhex(match[8][2:-1])
            chain = entry_hash(prev, seq, first, size, new_root, at, record)
            lines[i] = (line.replace(match[5], new_root.hex(), 1)
                        .replace(f"X'{match[6]}',X'{match[7]}'",
                                 f"X'{prev.hex()}',X'{chain.hex()}'", 1))
            prev = chain
    (archive / "dump.sql").write_text("\n".join(lines))
    manifest = json.loads((archive / "manifest.json").read_text())
    manifest["log"]["root"] = merkle_root(leaves).hex()
    (archive / "manifest.json").write_text(json.dumps(manifest, indent=2))
    _resign_sections(archive)


def test_a_tampered_archive_is_caught(verifier: Path, handed, tmp_path: Path) -> None:
    payload_edit = tmp_path / "payload"
    shutil.copytree(handed["archive"], payload_edit)
    victim = payload_edit / "artifacts" / "segment-000000"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 1  # one bit of some payload, in the middle of the segment
    victim.write_bytes(bytes(data))
    code, report = verify(verifier, "archive", payload_edit)
    assert code == 1 and any("does not hash to its name" in p for p in report["problems"])

    crude = tmp_path / "crude"
    shutil.copytree(handed["archive"], crude)
    (crude / "dump.sql").write_text((crude / "dump.sql").read_text().replace(
        "http://127.0.0.1:", "http://127.0.0.2:", 1))
    code, report = verify(verifier, "archive", crude)
    assert code == 1 and any("the manifest says" in p for p in report["problems"]), report

    forged = tmp_path / "forged"
    shutil.copytree(handed["archive"], forged)
    _rewrite_ledger(forged)
    code, report = verify(verifier, "archive", forged)  # a log consistent in itself ...
    assert code == 1 and len(report["problems"]) == 1, report  # ... but not with its rows
    assert re.fullmatch(r"crawl_session session-\S+: config is not its ledger entry's",
                        report["problems"][0])
    assert any("nothing signed says it is the operator's log" in n for n in report["notes"])
    code, report = verify(verifier, "archive", forged, "--checkpoint", handed["cp"],
                          "--public-key", handed["pub"])  # ... but not the log signed
    assert code == 1 and any("the log was rewritten" in p for p in report["problems"]), report


def test_the_commit_log_is_checked_without_a_checkpoint(verifier: Path, handed,
                                                        tmp_path: Path) -> None:
    """A commit time moved back in the dump (same length, manifest hashes made true): the
    chain and the times catch it with nothing signed."""
    moved = tmp_path / "moved"
    shutil.copytree(handed["archive"], moved)
    text = (moved / "dump.sql").read_text()
    at = text.index("INSERT INTO commit_log VALUES(3,'") + len("INSERT INTO commit_log VALUES(3,'")
    (moved / "dump.sql").write_text(text[:at] + "2024" + text[at + 4:])
    _resign_sections(moved)
    code, report = verify(verifier, "archive", moved)
    assert code == 1
    assert "batch 3: the hash chain is broken" in report["problems"]
    assert any("commit times go back" in p for p in report["problems"]), report


def test_a_row_that_disagrees_with_its_ledger_entry_is_caught(verifier: Path, handed,
                                                              tmp_path: Path) -> None:
    """An attempt's status edited in the dump, manifest hashes made true: the log is intact,
    the row is not what its ledger entry says."""
    edited = tmp_path / "edited"
    shutil.copytree(handed["archive"], edited)
    text = (edited / "dump.sql").read_text()
    line = re.search(r"INSERT INTO fetch_attempt VALUES\(.*,'response',200,.*", text)[0]
    text = text.replace(line, line.replace(",'response',200,", ",'response',404,", 1))
    (edited / "dump.sql").write_text(text)
    _resign_sections(edited)
    code, report = verify(verifier, "archive", edited)
    assert code == 1 and len(report["problems"]) == 1, report
    assert re.fullmatch(r"fetch_attempt a-\S+: http_status is 404, its ledger entry says 200",
                        report["problems"][0])


def _vouch_for(archive: Path, name: str) -> None:
    """The manifest's size and BLAKE3 of one file made true again (an attacker's edit)."""
    manifest = json.loads((archive / "manifest.json").read_text())
    data = (archive / name).read_bytes()
    manifest["files"][name] = {"bytes": len(data), "blake3": blake3.blake3(data).hexdigest()}
    (archive / "manifest.json").write_text(json.dumps(manifest, indent=2))


def test_the_verifier_reads_both_payload_layouts_and_every_byte_of_a_segment(
        verifier: Path, handed, tmp_path: Path) -> None:
    """Format 2 (segments and a sorted index) and format 1 (a file per payload) both
    verify; a segment's bytes that no payload accounts for, and an index out of order,
    are caught even with the manifest made to vouch for them."""
    import shutil

    code, report = verify(verifier, "archive", handed["archive"])
    payloads = report["facts"]["payloads"]
    assert code == 0 and payloads >= 3, report
    old = tmp_path / "format-1"
    shutil.copytree(handed["archive"], old)
    as_format_1(old)
    code, report = verify(verifier, "archive", old)
    assert code == 0 and report["facts"]["payloads"] == payloads, report

    padded = tmp_path / "padded"
    shutil.copytree(handed["archive"], padded)
    with open(padded / "artifacts" / "segment-000000", "ab") as segment:
        segment.write(b"a note no payload accounts for")
    _vouch_for(padded, "artifacts/segment-000000")
    code, report = verify(verifier, "archive", padded)
    assert code == 1 and any("bytes no payload accounts for" in p
                             for p in report["problems"]), report

    shuffled = tmp_path / "shuffled"
    shutil.copytree(handed["archive"], shuffled)
    index = shuffled / "artifacts" / "index.tsv"
    head, first, second, *rest = index.read_text().splitlines(keepends=True)
    index.write_text(head + second + first + "".join(rest))
    _vouch_for(shuffled, "artifacts/index.tsv")
    code, report = verify(verifier, "archive", shuffled)
    assert code == 1 and any("out of order" in p for p in report["problems"]), report


def test_a_tampered_proof_or_checkpoint_is_caught(verifier: Path, handed,
                                                  tmp_path: Path) -> None:
    proof = json.loads(handed["inclusion"].read_text())
    entry = bytearray(base64.b64decode(proof["entry"]))
    entry[-1] ^= 1
    proof["entry"] = base64.b64encode(bytes(entry)).decode()
    (tmp_path / "p").write_text(json.dumps(proof))
    code, report = verify(verifier, "proof", tmp_path / "p", "--checkpoint", handed["cp"],
                          "--public-key", handed["pub"])
    assert code == 1 and any("leaf hash" in p for p in report["problems"]), report
    note = handed["cp"].read_text()
    size = note.split("\n")[1]
    (tmp_path / "cp").write_text(note.replace(f"\n{size}\n", f"\n{int(size) + 1}\n", 1))
    code, report = verify(verifier, "checkpoint", tmp_path / "cp", "--public-key", handed["pub"])
    assert code == 1 and any("does not verify" in p for p in report["problems"]), report
    # An extension line added after signing is not covered: the signature is over the body.
    body, _, signatures = note.partition("\n\n")
    (tmp_path / "cp2").write_text(body + "\nextra claim\n\n" + signatures)
    code, report = verify(verifier, "checkpoint", tmp_path / "cp2", "--public-key",
                          handed["pub"])
    assert code == 1, report
    other = SigningKey.generate("example.org/crawl")  # same name, another key
    (tmp_path / "other.pub").write_text(other.public_key.to_text())
    code, report = verify(verifier, "checkpoint", handed["cp"], "--public-key",
                          tmp_path / "other.pub")
    assert code == 1 and any("not signed by" in p for p in report["problems"])


def test_tampered_waczs_are_caught_and_both_checkers_agree(verifier: Path, handed,
                                                           tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    tamper(handed["wacz"], tmp_path / "altered.wacz")
    tamper(handed["wacz"], tmp_path / "resigned.wacz", redigest=True,
           resign=ec.generate_private_key(ec.SECP384R1()))
    pinned = load_public_key(handed["wacz_pub"])
    for name, expected in (("altered", 1), ("resigned", 1)):
        code, report = verify(verifier, "wacz", tmp_path / f"{name}.wacz", "--public-key",
                              handed["wacz_pub"])
        ours = evidence_check_wacz(tmp_path / f"{name}.wacz", public_key=pinned)
        assert code == expected and report["problems"] == ours.problems, (report, ours)
    code, report = verify(verifier, "wacz", tmp_path / "resigned.wacz")  # unpinned
    assert code == 0 and not report["facts"]["pinned"]
    assert report["notes"] == evidence_check_wacz(tmp_path / "resigned.wacz").notes


@pytest.fixture(scope="module")
def carried(tmp_path_factory: pytest.TempPathFactory, tsa) -> dict[str, Path]:
    """An archive carrying a timestamped, witnessed checkpoint, and four tampered ones
    (tests/test_carried_checkpoint.py makes them)."""
    return handed_over(tmp_path_factory.mktemp("carried"), tsa)


def test_an_archive_carries_its_proof_to_the_examiner(verifier: Path, carried) -> None:
    code, report = verify(verifier, "archive", carried["archive"], "--public-key",
                          carried["pub"], "--tsa-root", carried["root"], "--witness-key",
                          carried["w1"])
    assert code == 0 and report["ok"], report
    facts = report["facts"]
    assert facts["checkpoint"] == "carried by the archive" and facts["checkpoint_batch"] == 13
    assert facts["timestamped_at"].endswith("Z") and facts["tsa"] == "CN=evidence test TSA"
    assert list(facts["witnesses"]) == ["witness.example/w1"]
    code, report = verify(verifier, "archive", carried["archive"], "--public-key",
                          carried["pub"], "--witness-key", carried["w1"], "--witness-key",
                          carried["w2"])
    assert code == 1 and report["problems"] == ["1 of the 2 witness cosignatures needed"]
    code, report = verify(verifier, "checkpoint", carried["cp"], "--public-key",
                          carried["pub"], "--tsa-root", carried["root"], "--witness-key",
                          carried["w1"])
    assert code == 0 and report["facts"]["timestamped_at"] == facts["timestamped_at"], report
    assert report["facts"]["chain"]["batch"] == 13


def test_a_wacz_carries_its_checkpoint_to_the_examiner(verifier: Path, handed, carried,
                                                       tmp_path: Path) -> None:
    wacz = tmp_path / "carried.wacz"
    with Store.open(handed["dir"] / "s", read_only=True) as store:
        export_wacz(store, wacz, key=new_signing_key(tmp_path / "k.pem"),
                    checkpoint=read_checkpoint_file(handed["cp"]))
    code, report = verify(verifier, "wacz", wacz, "--public-key", tmp_path / "k.pem.pub",
                          "--checkpoint-key", handed["pub"])
    assert code == 0 and report["facts"]["checkpoint_covers"] > 3, report
    code, report = verify(verifier, "wacz", wacz, "--checkpoint-key", carried["pub"])
    assert code == 1 and report["problems"][0].startswith("checkpoint: the checkpoint is "
                                                          "not signed by example.com/crawl")
    code, report = verify(verifier, "wacz", wacz, "--checkpoint-key", handed["pub"],
                          "--tsa-root", carried["root"])
    assert code == 1 and report["problems"] == [
        "no RFC 3161 timestamp for the checkpoint, and a TSA root was named to check one"]
    code, report = verify(verifier, "wacz", handed["wacz"], "--checkpoint-key", handed["pub"])
    assert code == 1 and "carries no checkpoint" in report["problems"][0]


def test_a_domain_signatures_timestamp_is_checked_by_the_examiner(verifier: Path, handed,
                                                                  tsa, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    from evidence._archive.wacz import (
        WaczSigner,
        load_certificate_chain,
        load_signing_key,
        tsa_timestamper,
    )
    from evidence._audit.timestamp import load_certificates

    from .test_waczcheck import _certificates

    key, chain, root = _certificates(tmp_path, ec.SECP384R1())
    stamper = tsa_timestamper(tsa.url, load_certificates(
        tsa.cert_pem.read_bytes() + tsa.root_pem.read_bytes(), "the TSA's chain"))
    with Store.open(handed["dir"] / "s", read_only=True) as store:
        export_wacz(store, tmp_path / "d.wacz", key=WaczSigner(
            load_signing_key(key, domain=True), load_certificate_chain(chain), stamper))
    code, report = verify(verifier, "wacz", tmp_path / "d.wacz", "--public-key", root,
                          "--tsa-root", tsa.root_pem)
    assert code == 0 and report["facts"]["signature_tsa"] == "CN=evidence test TSA", report
    code, report = verify(verifier, "wacz", tmp_path / "d.wacz", "--public-key", root,
                          "--tsa-root", root)  # a root that did not issue the TSA
    assert code == 1 and report["problems"][0].startswith("the signature's timestamp: ")


@pytest.mark.parametrize(("name", "says"), [
    ("x-time", ["commit times go back", "chain recomputed up to batch 13 is not the one"]),
    ("x-both", ["commit times go back", "chain recomputed up to batch 13 is not the one"]),
    ("x-other", ["the checkpoint is for log"]),
    ("x-stamp", ["timestamp: the timestamp is over other bytes"]),
])
def test_a_tampered_archive_and_its_proof_are_refused_by_the_examiner(
        verifier: Path, carried, name: str, says: list[str]) -> None:
    code, report = verify(verifier, "archive", carried[name], "--public-key", carried["pub"],
                          "--tsa-root", carried["root"])
    assert code == 1
    for words in says:
        assert any(words in p for p in report["problems"]), (words, report["problems"])


def test_the_verifier_refuses_what_it_cannot_read(verifier: Path, handed,
                                                  tmp_path: Path) -> None:
    (tmp_path / "bad.pub").write_text("nonsense\n")
    for args in (["checkpoint", handed["cp"], "--public-key", tmp_path / "bad.pub"],
                 ["wacz", tmp_path / "missing.wacz"],
                 ["archive", handed["archive"], "--checkpoint", handed["cp"]]):
        done = subprocess.run([str(verifier), *map(str, args)], capture_output=True,
                              text=True, timeout=60, cwd=verifier.parent, env=CLEAN_ENV)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr.startswith("Error: ") and "Try: " in done.stderr
        assert "Traceback" not in done.stderr


def test_the_two_copies_of_the_wacz_checks_do_not_drift() -> None:
    """evidence-verify carries its own copy of the WACZ checks (it cannot import evidence):
    every function the two copies share is the same code, but for the few that differ by
    design (the entry point's result type, the index line without SURT keys, the key
    loader's error class)."""
    import ast

    def functions(path: Path) -> dict[str, str]:
        tree = ast.parse(path.read_text())
        return {node.name: ast.dump(node) for node in tree.body
                if isinstance(node, ast.FunctionDef | ast.ClassDef)}

    ours = functions(ROOT / "evidence" / "_archive" / "waczcheck.py")
    theirs = functions(ROOT / "verifier" / "src" / "evidence_verify" / "wacz.py")
    differ_by_design = {"check_wacz", "_check_line", "WaczCheck", "_Record",
                        "load_public_key"}  # (the last: its error class)
    shared = set(ours) & set(theirs) - differ_by_design
    assert len(shared) >= 20, sorted(shared)
    assert [name for name in sorted(shared) if ours[name] != theirs[name]] == []
    # Every check of evidence's is in the copy, but the SURT key of an index line: the copy
    # checks no keys (it carries no SURT code), so it needs no post-append key either.
    assert set(ours) - set(theirs) == {"_expected_key"}
