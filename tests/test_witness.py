"""Witnesses (issue 32 point 3): a C2SP tlog-witness that cosigns a checkpoint only when the
log it cosigned last is a prefix of it, kept durably; checkpoints that collect its
cosignatures; and a verifier policy that requires them.

The witness is a real ``evidence witness serve`` process on 127.0.0.1 (killed with SIGKILL
and restarted on the same state); the log is a real store grown message by message.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evidence import Store
from evidence._audit.checkpoints import checkpoint, parse_checkpoint
from evidence._audit.keys import SigningKey, VerifierKey
from evidence._audit.proofs import prove_consistency
from evidence._audit.witness import (
    Cosigner,
    CosignerKey,
    Witness,
    add_cosignatures,
    check_cosignatures,
)
from evidence._cli.main import main
from evidence._errors import ProofError

from .conftest import Factory, submit_all

ROOT = Path(__file__).resolve().parent.parent
VECTORS = json.loads((Path(__file__).parent / "vectors" / "c2sp-notes.json").read_text())


# --- published vectors -------------------------------------------------------------------

def test_the_signed_note_spec_example_verifies_and_a_changed_byte_does_not() -> None:
    v = VECTORS["signed-note"]
    key = VerifierKey.from_text(v["vkey"])
    cp_text, _, sig_line = v["note"].partition("\n\n")
    blob = base64.b64decode(sig_line.split(" ")[2])
    assert blob[:4] == key.key_id.to_bytes(4, "big")
    assert key.verify(blob[4:], (cp_text + "\n").encode())
    assert not key.verify(blob[4:], (cp_text.replace("example", "exampl3") + "\n").encode())


def test_a_published_cosignature_gives_its_timestamp() -> None:
    v = VECTORS["cosignature-v1-timestamp"]
    blob = base64.b64decode(v["signature"])
    assert int.from_bytes(blob[4:12], "big") == v["timestamp"]


# --- keys and cosignatures, in process ---------------------------------------------------

def test_a_cosignature_is_over_the_header_time_and_whole_body() -> None:
    w = Cosigner.generate("witness.example/w1")
    text = "evidence/store-x\n3\n" + base64.b64encode(bytes(32)).decode() + "\nchain 1 " + \
        base64.b64encode(bytes(32)).decode() + "\n"
    line = w.cosign(text, 1700000000)
    cp = parse_checkpoint(text + "\n" + line)
    assert w.public_key.timestamp_of(text, cp.signatures[0]) == 1700000000
    other = text.replace("chain 1", "chain 2")  # extension lines are covered too
    assert w.public_key.timestamp_of(other, cp.signatures[0]) is None
    assert CosignerKey.from_text(w.public_key.to_text()).to_text() == w.public_key.to_text()
    assert Cosigner.from_text(w.to_text()).public_key.to_text() == w.public_key.to_text()
    with pytest.raises(ProofError, match="not a witness key"):  # a log key is not one
        CosignerKey.from_text(SigningKey.generate("log").public_key.to_text())


# --- the witness's rules, against a real store --------------------------------------------

LOG_KEY = SigningKey.generate("evidence-ops")


def grow(store: Store, make: Factory, n: int) -> None:
    for i in range(n):
        submit_all(store, [make.attempt(f"http://example.com/{time.monotonic_ns()}-{i}",
                                        body=make.body(b"%d" % i))])


def request(cp_note: str, old: int, proof: list[bytes] = ()) -> bytes:
    return (f"old {old}\n" + "".join(base64.b64encode(h).decode() + "\n" for h in proof)
            + "\n" + cp_note).encode()


@pytest.fixture
def log(tmp_path: Path) -> Iterator[tuple[Store, Factory]]:
    store = Store.create(tmp_path / "store")
    make = Factory(store)
    submit_all(store, [make.session(), make.run()])
    try:
        yield store, make
    finally:
        store.close()


def test_a_witness_cosigns_growth_and_refuses_forks_rollbacks_and_strangers(
        log: tuple[Store, Factory], tmp_path: Path) -> None:
    store, make = log
    w = Witness(Cosigner.generate("w1"), {f"evidence/{store.store_id}": [LOG_KEY.public_key]},
                tmp_path / "state")
    grow(store, make, 3)
    first = checkpoint(store, LOG_KEY)
    assert w.add_checkpoint(request(first.note(), 0)).status == 200
    # Again with old 0: the witness says which size it holds.
    again = w.add_checkpoint(request(first.note(), 0))
    assert (again.status, again.body, again.content_type) == (
        409, f"{first.tree_size}\n".encode(), "text/x.tlog.size")
    grow(store, make, 4)
    second = checkpoint(store, LOG_KEY)
    path = prove_consistency(store, first.tree_size, second.tree_size).path
    assert w.add_checkpoint(request(second.note(), first.tree_size, path)).status == 200
    # A wrong proof, a fork (same size, another root), a rollback, a stranger's log.
    assert w.add_checkpoint(request(second.note(), second.tree_size, path)).status == 422
    fork = LOG_KEY.sign_note(second.text.replace(
        base64.b64encode(second.root).decode(), base64.b64encode(bytes(32)).decode()))
    assert w.add_checkpoint(request(fork, second.tree_size)).status == 422
    assert w.add_checkpoint(request(first.note(), second.tree_size)).status == 400
    stranger = SigningKey.generate("evidence-ops")  # same name, another key
    assert w.add_checkpoint(request(stranger.sign_note(second.text), 0)).status == 403
    other = second.text.replace(f"evidence/{store.store_id}", "evidence/another")
    assert w.add_checkpoint(request(LOG_KEY.sign_note(other), 0)).status == 404
    assert w.add_checkpoint(b"old 01\n\n" + second.note().encode()).status == 400
    # What it holds is the second checkpoint, cosigned.
    held = parse_checkpoint(w.latest(_origin_hash(second.origin)).body)
    assert (held.tree_size, held.root) == (second.tree_size, second.root)
    assert check_cosignatures(held, [w.cosigner.public_key])[0]
    w.close()


def _origin_hash(origin: str) -> str:
    import hashlib
    return hashlib.sha256(origin.encode()).hexdigest()


@settings(max_examples=20, deadline=None)
@given(steps=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=6),
       forks=st.lists(st.booleans(), min_size=6, max_size=6))
def test_any_sequence_of_growth_and_forks_is_cosigned_only_where_it_only_grew(
        steps: list[int], forks: list[bool], tmp_path_factory: pytest.TempPathFactory) -> None:
    """Whatever the order of growth and forged checkpoints (a root the log never had), the
    witness cosigns exactly those consistent with the last one it cosigned: the first it
    sees (it cannot know better), the log's real growth after a real one, the same
    checkpoint again; never a fork of what it cosigned."""
    root = tmp_path_factory.mktemp("any")
    store = Store.create(root / "store")
    make = Factory(store)
    submit_all(store, [make.session(), make.run()])
    w = Witness(Cosigner.generate("w1"), {f"evidence/{store.store_id}": [LOG_KEY.public_key]},
                root / "state")
    last: tuple[int, bytes, bool] | None = None  # what it cosigned last: size, root, real?
    try:
        for n, forged in zip(steps, forks, strict=False):
            grow(store, make, n)
            cp = checkpoint(store, LOG_KEY)
            note, cp_root = cp.note(), cp.root
            if forged:
                cp_root = bytes(32)
                note = LOG_KEY.sign_note(cp.text.replace(
                    base64.b64encode(cp.root).decode(), base64.b64encode(cp_root).decode()))
            held = 0 if last is None else last[0]
            path = prove_consistency(store, held, cp.tree_size).path if held else []
            reply = w.add_checkpoint(request(note, held, path))
            expected = last is None or (last[0], last[1]) == (cp.tree_size, cp_root) or (
                last[2] and not forged)
            assert (reply.status == 200) == expected, (reply, last, forged)
            if reply.status == 200:
                last = (cp.tree_size, cp_root, not forged)
        # What the witness holds is the last checkpoint it cosigned.
        latest = w.latest(_origin_hash(f"evidence/{store.store_id}"))
        if last is None:
            assert latest.status == 404
        else:
            held_cp = parse_checkpoint(latest.body)
            assert (held_cp.tree_size, held_cp.root) == last[:2]
    finally:
        w.close()
        store.close()


# --- the real process, the CLI, and durability ---------------------------------------------

class Served:
    def __init__(self, proc: subprocess.Popen, url: str) -> None:
        self.proc, self.url = proc, url

    def kill(self) -> None:
        """SIGKILL, as a machine that loses power or an OOM kill would."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate()


def start(key: Path, state: Path, log: str) -> Served:
    proc = subprocess.Popen([sys.executable, "-m", "evidence", "witness", "serve",
                             "--key", str(key), "--state", str(state), "--trust", log],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        _, err = proc.communicate()
        raise AssertionError(f"the witness did not start: {err}")
    return Served(proc, line.split(" at ")[1].split("/add-checkpoint")[0])


def test_checkpoints_collect_cosignatures_and_the_witness_keeps_its_state_across_sigkill(
        log: tuple[Store, Factory], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    store, make = log
    keyfile, wkey = tmp_path / "log.key", tmp_path / "w.key"
    LOG_KEY.write(keyfile)
    assert main(["witness", "keygen", str(wkey), "--name", "witness.test/w1"]) == 0
    capsys.readouterr()
    grow(store, make, 2)
    origin = f"evidence/{store.store_id}"
    served = start(wkey, tmp_path / "state", f"{origin}={keyfile}.pub")
    try:
        cp1 = tmp_path / "cp1"
        assert main(["checkpoint", str(store.path), "--key", str(keyfile), "--out", str(cp1),
                     "--witness", served.url, "--witness-key", f"{wkey}.pub"]) == 0
        grow(store, make, 3)
        cp2 = tmp_path / "cp2"
        assert main(["checkpoint", str(store.path), "--key", str(keyfile), "--out", str(cp2),
                     "--witness", served.url, "--witness-key", f"{wkey}.pub",
                     "--json"]) == 0
        assert "witness.test/w1" in json.loads(capsys.readouterr().out)["witnesses"]
        # SIGKILL, and a new process on the same state: it still holds cp2's size.
        served.kill()
        served = start(wkey, tmp_path / "state", f"{origin}={keyfile}.pub")
        first = parse_checkpoint(cp1.read_bytes())
        answer = httpx.post(served.url + "/add-checkpoint",
                            content=request(cp1.read_text(), first.tree_size), trust_env=False)
        assert answer.status_code == 409
        assert int(answer.text) == parse_checkpoint(cp2.read_bytes()).tree_size
        # The verifier's policy: a proof checked against cp2 needs the witness's cosignature.
        proof = tmp_path / "p.json"
        assert main(["prove", str(store.path), "--index", "2", "--checkpoint", str(cp2),
                     "--out", str(proof)]) == 0
        capsys.readouterr()
        assert main(["check-proof", str(proof), "--public-key", f"{keyfile}.pub",
                     "--witness-key", f"{wkey}.pub"]) == 0
        assert "cosigned by witness witness.test/w1" in capsys.readouterr().out
        other = tmp_path / "other.key"
        Cosigner.generate("witness.test/w2").write(other)
        assert main(["check-proof", str(proof), "--public-key", f"{keyfile}.pub",
                     "--witness-key", f"{wkey}.pub", "--witness-key", f"{other}.pub"]) == 1
        assert "no cosignature by witness witness.test/w2" in capsys.readouterr().out
        assert main(["check-proof", str(proof), "--public-key", f"{keyfile}.pub",
                     "--witness-key", f"{wkey}.pub", "--witness-key", f"{other}.pub",
                     "--witnesses", "1"]) == 0
        # A cosignature moved onto a forged checkpoint does not count.
        cp = parse_checkpoint(cp2.read_bytes())
        fake = msgspec.structs.replace(cp, text=cp.text.replace(
            base64.b64encode(cp.root).decode(), base64.b64encode(bytes(32)).decode()))
        assert not check_cosignatures(fake, [CosignerKey.from_text(
            (tmp_path / "w.key.pub").read_text())])[0]
    finally:
        served.kill()


def test_a_witness_that_refuses_fails_the_checkpoint_and_nothing_is_written(
        log: tuple[Store, Factory], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    store, make = log
    grow(store, make, 2)
    w = Witness(Cosigner.generate("w1"), {"evidence/someone-else": [LOG_KEY.public_key]},
                tmp_path / "state")
    from evidence._audit.witness import serve_witness
    keyfile, wpub = tmp_path / "log.key", tmp_path / "w.pub"
    LOG_KEY.write(keyfile)
    wpub.write_text(w.cosigner.public_key.to_text())
    try:
        with serve_witness(w) as url:
            status = main(["checkpoint", str(store.path), "--key", str(keyfile), "--out",
                           str(tmp_path / "cp"), "--witness", url, "--witness-key", str(wpub)])
    finally:
        w.close()
    err = capsys.readouterr().err
    assert status == 2 and "refused the checkpoint (HTTP 404" in err
    assert not (tmp_path / "cp").exists()
    with pytest.raises(ProofError, match="could not be reached"):
        add_cosignatures(checkpoint(store, LOG_KEY),
                         [("http://127.0.0.1:9", w.cosigner.public_key)], lambda old: [])


def test_one_state_directory_is_held_by_one_witness(tmp_path: Path) -> None:
    first = Witness(Cosigner.generate("w1"), {}, tmp_path / "s")
    try:
        with pytest.raises(ProofError, match="another witness process"):
            Witness(Cosigner.generate("w1"), {}, tmp_path / "s")
    finally:
        first.close()
