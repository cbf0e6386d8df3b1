"""Trusted time: RFC 3161 timestamps over signed checkpoints (issue 32).

The TSA is a real one, not a mock: ``openssl ts -reply`` behind a small HTTP server on
127.0.0.1, with its own CA made by openssl when the fixture starts
(``evidence.testing.tsa``). Every token is cross-checked with ``openssl ts -verify``, so
what ``check-proof`` accepts, a tool that is not ours accepts too, and the other way round.
A test that cannot start the TSA fails with the reason; it never skips.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from evidence import Store
from evidence._cli.main import main as cli_main
from evidence.testing.tsa import TestTSA, TSAError

from .conftest import Factory, submit_all


def _start() -> TestTSA:
    try:
        return TestTSA.start()
    except TSAError as exc:
        pytest.fail(f"the test TSA could not be started (CI installs openssl): {exc}")


@pytest.fixture(scope="module")
def tsa() -> Iterator[TestTSA]:
    authority = _start()
    try:
        yield authority
    finally:
        authority.close()


@pytest.fixture(scope="module")
def other_tsa() -> Iterator[TestTSA]:
    """A second TSA with a CA of its own: what a verifier that names the first refuses."""
    authority = _start()
    try:
        yield authority
    finally:
        authority.close()


@pytest.fixture
def signed_store(tmp_path: Path) -> Path:
    """A store of two messages and a signing key (KEY, KEY.pub) beside it."""
    with Store.create(tmp_path / "st") as store:
        make = Factory(store)
        submit_all(store, [make.session(), make.run()])
    assert cli_main(["keygen", str(tmp_path / "key"), "--name", "example.com/crawl"]) == 0
    return tmp_path / "st"


def openssl_verify(data: Path, token: Path, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["openssl", "ts", "-verify", "-data", str(data), "-in", str(token),
                           "-CAfile", str(root)], capture_output=True, text=True, check=False)


def stamp(tmp_path: Path, store: Path, tsa: TestTSA, name: str = "cp", *extra: str) -> int:
    return cli_main(["checkpoint", str(store), "--key", str(tmp_path / "key"), "--out",
                     str(tmp_path / name), "--tsa", tsa.url, *extra])


def check(tmp_path: Path, *extra: str, checkpoint: str = "cp") -> int:
    return cli_main(["check-proof", str(tmp_path / "proof"), "--checkpoint",
                     str(tmp_path / checkpoint), "--public-key", str(tmp_path / "key.pub"),
                     *extra])


def test_a_timestamped_checkpoint_verifies_with_openssl_and_with_check_proof(
        tmp_path: Path, signed_store: Path, tsa: TestTSA, other_tsa: TestTSA,
        capsys) -> None:
    assert stamp(tmp_path, signed_store, tsa) == 0
    err = capsys.readouterr().err
    assert f"wrote {tmp_path / 'cp.tsr'}" in err and "CN=evidence test TSA" in err
    done = openssl_verify(tmp_path / "cp", tmp_path / "cp.tsr", tsa.root_pem)
    assert done.returncode == 0 and "Verification: OK" in done.stdout, done.stderr
    assert cli_main(["prove", str(signed_store), "--index", "1", "--checkpoint",
                     str(tmp_path / "cp"), "--out", str(tmp_path / "proof")]) == 0
    capsys.readouterr()
    assert check(tmp_path, "--tsa-root", str(tsa.root_pem)) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: ") and "timestamped at 20" in out
    assert "chained to the TSA root given" in out
    assert check(tmp_path, "--tsa-root", str(tsa.root_pem), "--json") == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ok"] and result["chain_bound"] is True
    assert result["tsa"] == "CN=evidence test TSA" and result["timestamped_at"].endswith("Z")
    # Without a root named, the token is not checked, and the report says so.
    assert check(tmp_path) == 0
    assert "was not checked: name the TSA's root with --tsa-root" in capsys.readouterr().out
    # The proof carries the checkpoint and its token: it travels alone.
    (tmp_path / "cp").unlink()
    (tmp_path / "cp.tsr").unlink()
    argv = ["check-proof", str(tmp_path / "proof"), "--public-key", str(tmp_path / "key.pub")]
    assert cli_main([*argv, "--tsa-root", str(tsa.root_pem)]) == 0
    assert "timestamped at 20" in capsys.readouterr().out
    assert cli_main([*argv, "--tsa-root", str(other_tsa.root_pem)]) == 1
    assert "does not chain to the TSA root named" in capsys.readouterr().out


def test_a_token_of_another_checkpoint_or_another_tsa_is_refused_by_both_verifiers(
        tmp_path: Path, signed_store: Path, tsa: TestTSA, other_tsa: TestTSA,
        capsys) -> None:
    assert stamp(tmp_path, signed_store, tsa) == 0
    assert stamp(tmp_path, signed_store, tsa, "cp2") == 0  # signed later: other bytes
    assert cli_main(["prove", str(signed_store), "--index", "0", "--to-size", "2",
                     "--out", str(tmp_path / "proof")]) == 0  # carries no checkpoint
    capsys.readouterr()
    # The token of cp2 presented as cp's.
    swapped = tmp_path / "swapped.tsr"
    swapped.write_bytes((tmp_path / "cp2.tsr").read_bytes())
    assert check(tmp_path, "--tsa-root", str(tsa.root_pem), "--timestamp", str(swapped)) == 1
    assert "the timestamp is over other bytes than this checkpoint's" in \
        capsys.readouterr().out
    assert openssl_verify(tmp_path / "cp", swapped, tsa.root_pem).returncode != 0
    # A root that did not issue the TSA's certificate.
    assert check(tmp_path, "--tsa-root", str(other_tsa.root_pem)) == 1
    out = capsys.readouterr().out
    assert "does not chain to the TSA root named" in out
    assert openssl_verify(tmp_path / "cp", tmp_path / "cp.tsr",
                          other_tsa.root_pem).returncode != 0
    # A root named and no token: trusted time was asked for and is not there.
    (tmp_path / "cp.tsr").unlink()
    assert check(tmp_path, "--tsa-root", str(tsa.root_pem)) == 1
    assert "no RFC 3161 timestamp for the checkpoint" in capsys.readouterr().out
    # A flipped byte of the token's signature or content.
    token = bytearray((tmp_path / "cp2.tsr").read_bytes())
    token[-10] ^= 0x01
    (tmp_path / "bad.tsr").write_bytes(bytes(token))
    assert check(tmp_path, "--tsa-root", str(tsa.root_pem), "--timestamp",
                 str(tmp_path / "bad.tsr"), checkpoint="cp2") == 1
    assert openssl_verify(tmp_path / "cp2", tmp_path / "bad.tsr",
                          tsa.root_pem).returncode != 0


def test_tsa_cert_pins_the_authority_before_anything_is_written(
        tmp_path: Path, signed_store: Path, tsa: TestTSA, other_tsa: TestTSA,
        capsys) -> None:
    chain = tmp_path / "tsa-chain.pem"
    chain.write_bytes(tsa.cert_pem.read_bytes() + tsa.root_pem.read_bytes())
    assert stamp(tmp_path, signed_store, tsa, "cp", "--tsa-cert", str(chain)) == 0
    assert openssl_verify(tmp_path / "cp", tmp_path / "cp.tsr", tsa.root_pem).returncode == 0
    capsys.readouterr()
    # The TSA at the URL is not the one pinned: nothing is written.
    assert stamp(tmp_path, signed_store, other_tsa, "cp3", "--tsa-cert", str(chain)) == 2
    err = capsys.readouterr().err
    assert "Error: " in err and "does not chain to the TSA root named" in err
    assert "Try: --tsa-cert must be the certificate of the TSA at --tsa" in err
    assert not (tmp_path / "cp3").exists() and not (tmp_path / "cp3.tsr").exists()
    # Only the TSA's own certificate, no root: its signature could not be checked.
    assert stamp(tmp_path, signed_store, tsa, "cp4", "--tsa-cert", str(tsa.cert_pem)) == 2
    assert "does not end in a root" in capsys.readouterr().err
    assert not (tmp_path / "cp4").exists()


@pytest.mark.parametrize("case", ["no-out", "cert-without-tsa", "not-http", "nothing-there",
                                  "tsr-exists"])
def test_tsa_usage_errors_exit_two_and_write_nothing(
        tmp_path: Path, signed_store: Path, tsa: TestTSA, case: str, capsys) -> None:
    key = str(tmp_path / "key")
    out = tmp_path / "cp"
    argv = {
        "no-out": ["--tsa", tsa.url],
        "cert-without-tsa": ["--out", str(out), "--tsa-cert", str(tsa.cert_pem)],
        "not-http": ["--out", str(out), "--tsa", "ftp://127.0.0.1/tsr"],
        "nothing-there": ["--out", str(out), "--tsa", "http://127.0.0.1:9/tsr"],
        "tsr-exists": ["--out", str(out), "--tsa", tsa.url],
    }[case]
    if case == "tsr-exists":
        (tmp_path / "cp.tsr").write_bytes(b"an earlier token")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert cli_main(["checkpoint", str(signed_store), "--key", key, *argv]) == 2
    err = capsys.readouterr().err
    said = {"no-out": "--tsa needs --out FILE", "cert-without-tsa": "--tsa-cert names",
            "not-http": "is not a TSA URL", "nothing-there": "could not be reached",
            "tsr-exists": "a timestamp is never overwritten"}[case]
    assert said in err and "Error: " in err and "Try: " in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if case == "tsr-exists":
        assert (tmp_path / "cp.tsr").read_bytes() == b"an earlier token"
