"""Proofs: signed checkpoints, inclusion and consistency, checked offline; any mutation fails."""

from __future__ import annotations

import datetime as dt
import hashlib
import tempfile
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evidence import CorruptStoreError, RuleEvaluated, Store
from evidence._audit.checkpoints import SignedCheckpoint, checkpoint, open_checkpoint
from evidence._audit.keys import SigningKey, VerifierKey
from evidence._audit.proofs import (
    ConsistencyProof,
    InclusionProof,
    check_proof,
    decode_proof,
    encode_proof,
    prove_consistency,
    prove_inclusion,
)
from evidence._errors import NotFoundError, ProofError

from .conftest import Factory, reference_mth, submit_all
from .test_verify import run_cli

# The signed-note reference example from golang.org/x/mod/sumdb/note (note_test.go). Ed25519
# is deterministic, so our signer must reproduce Go's note byte for byte: then Go's
# note.Open, and any C2SP checkpoint tool, accept our checkpoints.
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_TEXT = ("If you think cryptography is the answer to your problem,\n"
           "then you don't know what your problem is.\n")
GO_NOTE = GO_TEXT + ("\n\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1"
                     "FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n")
KEY = SigningKey.from_text(GO_SKEY)
WHEN = dt.datetime(2025, 3, 3, 12, 0, tzinfo=dt.UTC)


def test_our_signed_note_is_byte_for_byte_gos() -> None:
    assert KEY.sign_note(GO_TEXT) == GO_NOTE
    assert KEY.public_key.to_text() == GO_VKEY
    assert VerifierKey.from_text(GO_VKEY) == KEY.public_key
    assert SigningKey.from_text(KEY.to_text()).to_text() == GO_SKEY


def test_every_mangled_public_key_is_refused() -> None:
    raw = bytearray(GO_VKEY.encode())
    for i in range(len(raw)):
        raw[i] += 1
        with pytest.raises(ProofError):
            VerifierKey.from_text(bytes(raw))
        raw[i] -= 1


@pytest.mark.parametrize("name", ["", "a b", "a+b", "tab\there"])
def test_key_names_follow_the_note_rules(name: str) -> None:
    with pytest.raises(ProofError):
        SigningKey.generate(name)


def test_a_key_file_is_private_and_never_overwritten(tmp_path: Path) -> None:
    key = SigningKey.generate("example.com/crawl")
    private, public = key.write(tmp_path / "k")
    assert private.stat().st_mode & 0o777 == 0o600
    assert SigningKey.from_text(private.read_text()).to_text() == key.to_text()
    assert VerifierKey.from_text(public.read_text()) == key.public_key
    with pytest.raises(ProofError, match="never overwritten"):
        key.write(tmp_path / "k")
    assert "PRIVATE" not in repr(key)


# --- checkpoints ---------------------------------------------------------------------

mth = reference_mth


def ledger_root(store: Store, size: int | None = None) -> bytes:
    payloads = [p for (p,) in store.connection.execute(
        "SELECT payload FROM ingest_ledger ORDER BY log_index")]
    return mth([hashlib.sha256(b"\x00" + p).digest() for p in payloads[:size]])


def test_a_checkpoint_signs_store_id_size_root_and_time(populated_store: Store) -> None:
    cp = checkpoint(populated_store, KEY, now=WHEN)
    origin = f"evidence/{populated_store.store_id}"
    lines = cp.text.split("\n")
    assert lines == [origin, "6", lines[2], "time 2025-03-03T12:00:00.000000Z", lines[4],
                     "legacy-quarantine 0 47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=", ""]
    assert lines[4].startswith("chain 7 ")  # 6 accepted messages in 6 batches, then the
    # conflict's batch (tests/test_checkpoint_binding.py checks what the line binds)
    assert (cp.origin, cp.store_id, cp.tree_size, cp.time) == (
        origin, populated_store.store_id, 6, "2025-03-03T12:00:00.000000Z")
    assert cp.root == ledger_root(populated_store)  # recomputed here from the raw payloads
    assert open_checkpoint(cp.note(), GO_VKEY) == cp


def test_a_log_that_does_not_verify_is_never_signed(populated_store: Store) -> None:
    populated_store.connection.execute("DROP TRIGGER commit_log_no_update")
    populated_store.connection.execute("UPDATE commit_log SET root = zeroblob(32) "
                                       "WHERE batch_seq = 6")
    with pytest.raises(CorruptStoreError, match="will not sign"):
        checkpoint(populated_store, KEY)


def test_every_byte_of_a_checkpoint_is_bound_by_its_signature(populated_store: Store) -> None:
    note = checkpoint(populated_store, KEY, now=WHEN).note().encode()
    for i in range(len(note)):
        for bit in (0x01, 0x20):
            mutated = bytearray(note)
            mutated[i] ^= bit
            with pytest.raises(ProofError):
                open_checkpoint(bytes(mutated), KEY.public_key)


def test_other_keys_signatures_are_ignored_but_ours_is_required(populated_store: Store) -> None:
    cp = checkpoint(populated_store, KEY, now=WHEN)
    witness = SigningKey.generate("witness.example/w1")
    cosigned = cp.note() + witness.sign_note(cp.text).split("\n\n")[-1]
    assert open_checkpoint(cosigned, KEY.public_key).tree_size == 6
    with pytest.raises(ProofError, match="not signed by"):
        open_checkpoint(cp.note(), witness.public_key)
    impostor = SigningKey.generate("PeterNeumann")  # same name, another key id: ignored
    with pytest.raises(ProofError, match="not signed by"):
        open_checkpoint(impostor.sign_note(cp.text), KEY.public_key)


# --- proofs on random stores ---------------------------------------------------------

def build_store(root: Path, kinds: list[int]) -> tuple[Store, list[SignedCheckpoint], list]:
    """A store written message by message (one batch each), checkpointed after every commit."""
    store = Store.create(root)
    make = Factory(store)
    attempts = []
    checkpoints = [checkpoint(store, KEY, now=WHEN)]
    for message in [make.session(), make.run()]:
        submit_all(store, [message])
        checkpoints.append(checkpoint(store, KEY, now=WHEN))
    for i, kind in enumerate(kinds):
        if kind == 0 or not attempts:
            message = make.attempt(f"http://example.com/{i}", body=make.body(b"%d" % i))
            attempts.append(message)
        elif kind == 1:
            message = make.discovery(attempts[-1], attempts[-1].body, [f"http://x.example/{i}"])
        else:
            message = RuleEvaluated(message_id=make.id("m"), run_id="r1", url=attempts[-1].url,
                                    rule_id="r", rule_version=str(i), input_hash="0" * 64,
                                    verdict="pass", evaluated_at=make.now)
        submit_all(store, [message])
        checkpoints.append(checkpoint(store, KEY, now=WHEN))
    return store, checkpoints, attempts


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=0, max_size=9))
def test_inclusion_and_consistency_verify_for_every_size(kinds: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store, checkpoints, attempts = build_store(Path(tmp) / "s", kinds)
        with store:
            for cp in checkpoints:
                assert cp.root == ledger_root(store, cp.tree_size)
                for index in range(cp.tree_size):
                    proof = prove_inclusion(store, log_index=index, tree_size=cp.tree_size)
                    assert check_proof(encode_proof(proof), cp.note(), GO_VKEY).ok
                for old in checkpoints[: cp.tree_size + 1]:
                    proof = prove_consistency(store, old.tree_size, cp.tree_size)
                    result = check_proof(proof, cp, KEY.public_key, old_checkpoint=old)
                    assert result.ok, result.problems
            for attempt in attempts:
                result = check_proof(prove_inclusion(store, attempt.attempt_id),
                                     checkpoints[-1], KEY.public_key)
                assert result.ok and result.entry["attempt_id"] == attempt.attempt_id


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory):
    store, checkpoints, _ = build_store(tmp_path_factory.mktemp("grown") / "s",
                                        [0, 1, 2, 0, 0, 1, 0, 2, 0, 0, 0])
    with store:
        yield store, checkpoints


def flip(data: bytes, at: int) -> bytes:
    mutated = bytearray(data)
    mutated[at % len(data)] ^= 0x01
    return bytes(mutated)


def mutate(proof, how: int, n: int):
    """One change to one field of a proof."""
    replace = msgspec.structs.replace
    path = list(proof.path)
    if how == 0:
        return replace(proof, origin=proof.origin + "x")
    if how == 1:
        return replace(proof, version=2)
    if how == 2 and path:
        path[n % len(path)] = flip(path[n % len(path)], n)
        return replace(proof, path=path)
    if how == 3 and path:
        del path[n % len(path)]
        return replace(proof, path=path)
    if how == 4:
        return replace(proof, path=[*path, path[0] if path else bytes(32)])
    if isinstance(proof, InclusionProof):
        return [replace(proof, log_index=(proof.log_index + 1 + n) % (proof.tree_size + 2)),
                replace(proof, tree_size=proof.tree_size + 1 + n % 3),
                replace(proof, entry=flip(proof.entry, n)),
                replace(proof, leaf_hash=flip(proof.leaf_hash, n)),
                replace(proof, root=flip(proof.root, n))][(how - 5) % 5]
    return [replace(proof, old_size=proof.old_size + 1 + n % 3),
            replace(proof, old_size=max(proof.old_size - 1 - n % 3, 0)),
            replace(proof, old_root=flip(proof.old_root, n)),
            replace(proof, new_root=flip(proof.new_root, n)),
            replace(proof, new_size=proof.new_size - 1)][(how - 5) % 5]


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_mutated_proof_fails(grown, data) -> None:
    store, checkpoints = grown
    cp = data.draw(st.sampled_from(checkpoints[1:]), "checkpoint")
    old = data.draw(st.sampled_from(checkpoints[: cp.tree_size + 1]), "old")
    if data.draw(st.booleans(), "inclusion"):
        index = data.draw(st.integers(0, cp.tree_size - 1), "index")
        proof = prove_inclusion(store, log_index=index, tree_size=cp.tree_size)
    else:
        proof = prove_consistency(store, old.tree_size, cp.tree_size)
    assert check_proof(proof, cp, KEY.public_key, old_checkpoint=old).ok
    mutated = mutate(proof, data.draw(st.integers(0, 9), "how"), data.draw(st.integers(0, 99)))
    if mutated == proof:
        return  # e.g. an empty path has no element to flip
    result = check_proof(encode_proof(mutated), cp.note(), GO_VKEY, old_checkpoint=old.note())
    assert not result.ok and result.problems and result.statement == ""


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_any_mutated_checkpoint_or_key_fails(grown, data) -> None:
    store, checkpoints = grown
    cp = checkpoints[-1]
    proof = encode_proof(prove_inclusion(store, log_index=data.draw(st.integers(0, 12))))
    note, key = cp.note().encode(), GO_VKEY.encode()
    if data.draw(st.booleans(), "mutate the key"):
        key = flip(key, data.draw(st.integers(0, len(key) - 1)))
    else:
        note = flip(note, data.draw(st.integers(0, len(note) - 1)))
    assert not check_proof(proof, note, key).ok


def test_a_proof_names_the_attempt_it_proves(populated_store: Store) -> None:
    attempt_id = populated_store.connection.execute(
        "SELECT attempt_id FROM fetch_attempt").fetchall()[0][0]
    cp = checkpoint(populated_store, KEY, now=WHEN)
    proof = prove_inclusion(populated_store, attempt_id)
    assert decode_proof(encode_proof(proof)) == proof
    result = check_proof(encode_proof(proof).decode(), cp.note(), GO_VKEY)
    assert result.ok and result.log_index == 2 and result.entry["url"] == "http://example.com/"
    assert result.statement.startswith(f"fetch_attempt {attempt_id} (http://example.com/) is "
                                       "entry 2 of log evidence/")
    with pytest.raises(NotFoundError):
        prove_inclusion(populated_store, "a-unknown")


def test_a_proof_at_another_size_than_the_checkpoint_fails(grown) -> None:
    store, checkpoints = grown
    old = checkpoints[5]
    now = prove_inclusion(store, log_index=2)  # at the current size
    result = check_proof(now, old, KEY.public_key)
    assert not result.ok and "make the proof with --checkpoint" in result.problems[0]
    assert check_proof(prove_inclusion(store, log_index=2, tree_size=old.tree_size), old,
                       KEY.public_key).ok


def test_a_consistency_proof_without_the_old_checkpoint_states_the_old_root(grown) -> None:
    store, checkpoints = grown
    proof = prove_consistency(store, 4)
    result = check_proof(proof, checkpoints[-1], KEY.public_key)
    assert result.ok and proof.old_root.hex() in result.statement
    assert proof.old_root == checkpoints[4].root
    forged = msgspec.structs.replace(proof, old_root=checkpoints[5].root)
    assert not check_proof(forged, checkpoints[-1], KEY.public_key).ok


@pytest.mark.parametrize("bad", [b"", b"{}", b"not json", b'{"type": "inclusion"}',
                                 b'{"type": "other", "version": 1}'])
def test_unreadable_proofs_fail_without_raising(populated_store: Store, bad: bytes) -> None:
    cp = checkpoint(populated_store, KEY, now=WHEN)
    result = check_proof(bad, cp.note(), GO_VKEY)
    assert not result.ok and result.problems


def test_sizes_outside_the_log_are_refused(populated_store: Store) -> None:
    with pytest.raises(ProofError):
        prove_inclusion(populated_store, log_index=6)
    with pytest.raises(ProofError):
        prove_consistency(populated_store, 3, 7)
    with pytest.raises(ProofError):
        prove_consistency(populated_store, 5, 4)
    assert prove_consistency(populated_store, 0).old_root == hashlib.sha256(b"").digest()


# --- the command line, end to end ----------------------------------------------------

def test_cli_keygen_checkpoint_prove_and_check(populated_store: Store, tmp_path: Path,
                                               capsys) -> None:
    store = populated_store.path
    key, cp, proof = tmp_path / "key", tmp_path / "cp", tmp_path / "proof.json"
    attempt_id = populated_store.connection.execute(
        "SELECT attempt_id FROM fetch_attempt").fetchall()[0][0]
    assert run_cli("keygen", key, "--name", "example.com/crawl") == 0
    assert run_cli("checkpoint", store, "--key", key, "--out", cp) == 0
    assert run_cli("prove", store, "--attempt", attempt_id, "--checkpoint", cp,
                   "--out", proof) == 0
    capsys.readouterr()
    pub = f"{key}.pub"
    assert run_cli("check-proof", proof, "--checkpoint", cp, "--public-key", pub) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"OK: fetch_attempt {attempt_id} (http://example.com/) is entry 2")
    assert "signed by example.com/crawl+" in out
    # It carries the checkpoint it was made for: it is checked without one given.
    assert run_cli("check-proof", proof, "--public-key", pub) == 0
    assert capsys.readouterr().out == out

    proof.write_bytes(proof.read_bytes().replace(b'"log_index": 2', b'"log_index": 3'))
    assert run_cli("check-proof", proof, "--checkpoint", cp, "--public-key", pub) == 1
    assert "FAILED" in capsys.readouterr().out

    assert run_cli("prove", store, "--from-size", "2", "--out", proof) == 0
    assert run_cli("check-proof", proof, "--checkpoint", cp, "--public-key", pub,
                   "--json") == 0
    assert '"ok": true' in capsys.readouterr().out
    assert run_cli("check-proof", proof, "--public-key", pub) == 2  # it carries none
    assert "the proof carries no checkpoint: give the one it was made for" in \
        capsys.readouterr().out


def test_cli_checkpoint_with_a_new_key_names_it_after_the_store(populated_store: Store,
                                                                tmp_path: Path, capsys) -> None:
    assert run_cli("checkpoint", populated_store.path, "--new-key", tmp_path / "k",
                   "--json") == 0
    out = capsys.readouterr().out
    key = VerifierKey.from_text((tmp_path / "k.pub").read_text())
    assert key.name == f"evidence/{populated_store.store_id}"
    note = msgspec.json.decode(out)["note"]
    assert open_checkpoint(note, key).tree_size == 6


def test_cli_prove_refuses_a_checkpoint_of_another_store(populated_store: Store, tmp_path: Path,
                                                         capsys) -> None:
    other = Store.create(tmp_path / "other")
    make = Factory(other)
    submit_all(other, [make.session(), make.run(), make.session("s2"), make.run("r2", "s2"),
                       make.session("s3"), make.run("r3", "s3")])
    (tmp_path / "cp").write_text(checkpoint(other, KEY).note())
    other.close()
    assert run_cli("prove", populated_store.path, "--index", "1", "--checkpoint",
                   tmp_path / "cp") == 2
    assert "does not match this store" in capsys.readouterr().out


def test_consistency_proof_json_is_documented_shape(populated_store: Store) -> None:
    proof = prove_consistency(populated_store, 3)
    data = msgspec.json.decode(encode_proof(proof))
    assert set(data) == {"type", "version", "origin", "old_size", "new_size", "old_root",
                         "new_root", "path"}
    assert data["type"] == "consistency" and isinstance(proof, ConsistencyProof)
