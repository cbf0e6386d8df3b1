"""The ephemeral runner (issue 29): a crawl checkpoints its store to S3, the machine is
thrown away, a new one restores the newest checkpoint and resumes the same session, each
page fetched once; failed checkpoints are retried, a failed final one fails the run.

Real SeaweedFS, real crawls of the demo site on 127.0.0.1, the real command in a
subprocess (so its exit status and output are what a runner sees).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evidence import EvidenceError, Store, check_log, verify
from evidence._archive.checkpoint import (
    CHECKPOINT,
    Checkpointer,
    checkpoints,
    read_checkpoint,
    restore_checkpoint,
)
from evidence._archive.remote import Remote
from evidence._cli.main import main
from evidence._demo.site import SiteConfig, TestSite
from evidence.testing.seaweed import SeaweedS3

from .conftest import Factory, new_s3_url, submit_all
from .s3proxy import Action, S3Proxy, Seen
from .test_crawl import done_pages


def evidence(*args: str, env: dict[str, str], cwd: Path | None = None
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "evidence", *args], capture_output=True,
                          text=True, env=env, timeout=300, cwd=cwd)


@pytest.fixture
def env(seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The object store's credentials, here (for the commands run in this process) and
    for the subprocesses."""
    for name, value in seaweed.environ.items():
        monkeypatch.setenv(name, value)
    return dict(os.environ)


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``evidence ARGS`` run here (a restore or a verify needs no process of its own)."""
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def test_a_crawl_restored_from_its_checkpoint_on_a_new_machine_resumes_the_same_session(
        tmp_path: Path, seaweed: SeaweedS3, env: dict[str, str],
        capsys: pytest.CaptureFixture[str]) -> None:
    url = new_s3_url(seaweed, "runner")
    first, second = tmp_path / "machine-1" / "s", tmp_path / "machine-2" / "s"
    slow = {f"/p/{i}": 0.1 for i in range(30)}  # 12 pages at 2 workers: 0.6 s at least
    with TestSite(SiteConfig(pages=30, slow=slow)) as site:
        run1 = evidence("crawl", site.url, "--store", str(first), "--workers", "2",
                        "--max-documents", "12", "--checkpoint", url, "--every", "0.1s",
                        "--json", env=env)
        assert run1.returncode == 0, run1.stderr
        one = json.loads(run1.stdout)
        assert one["outcome"] == "capped" and not one["session_completed"]
        assert "checkpoint " in run1.stderr
        shutil.rmtree(tmp_path / "machine-1")  # the machine and its disk are gone

        status, out, err = in_process(capsys, "restore", url, "--store", str(second),
                                      "--json")
        assert status == 0, err
        report = json.loads(out)
        assert report["open_sessions"] == [one["session_id"]]

        run2 = evidence("crawl", "--store", str(second), "--checkpoint", url, "--json",
                        env=env)
        assert run2.returncode == 0, run2.stderr
        two = json.loads(run2.stdout)
        counts = site.request_counts()
        reachable = site.reachable_pages()
    assert two["session_id"] == one["session_id"] and two["resumed"]
    assert two["outcome"] == "completed" and two["session_completed"]
    done = done_pages(second)
    assert set(done) == reachable and all(n == 1 for n in done.values())
    # The last checkpoint of run 1 was taken after its last commit: nothing run 1 fetched
    # is fetched again (the loss window is empty), and run 2 fetched the rest.
    assert all(counts[p] == 1 for p in reachable), {p: counts[p] for p in reachable
                                                     if counts[p] != 1}
    assert in_process(capsys, "verify", str(second), "--full")[0] == 0
    with Remote(url, environ=env) as remote:
        ids = checkpoints(remote)
        taken = [read_checkpoint(remote, i) for i in ids]
    assert len(ids) >= 3 and all(t is not None for t in taken)
    # Payloads are shared: each checkpoint uploads only what the prefix lacked.
    assert sum(t.uploaded for t in taken if t) == taken[-1].artifacts  # type: ignore[union-attr]


def test_a_store_restored_from_a_checkpoint_taken_mid_crawl_resumes_exactly(
        tmp_path: Path, seaweed: SeaweedS3, env: dict[str, str],
        capsys: pytest.CaptureFixture[str]) -> None:
    """The loss window: a checkpoint taken while pages were claimed and in flight. The URLs
    claimed then are requeued as after a crash, the pages committed after it are fetched
    again, and the session completes with each page recorded once and verify clean."""
    url = new_s3_url(seaweed, "midway")
    slow = {f"/p/{i}": 0.15 for i in range(25)}  # 14 pages at 2 workers: 1 s at least
    with TestSite(SiteConfig(pages=25, slow=slow)) as site:
        run1 = evidence("crawl", site.url, "--store", str(tmp_path / "gone"), "--workers",
                        "2", "--max-documents", "14", "--checkpoint", url, "--every",
                        "0.1s", "--json", env=env)
        assert run1.returncode == 0, run1.stderr
        session = json.loads(run1.stdout)["session_id"]
        with Remote(url, environ=env) as remote:
            taken = [c for c in (read_checkpoint(remote, i) for i in checkpoints(remote)) if c]
        with Store.open(tmp_path / "gone", read_only=True) as store:
            final_size = store.connection.execute(
                "SELECT count(*) FROM ingest_ledger").fetchall()[0][0]
        # A checkpoint with pages done, claimed (in flight) and still to come.
        midway = next(c for c in taken if c.open_sessions == [session] and all(
            c.frontier.get(state) for state in ("done", "in_flight", "queued")))
        assert midway.tree_size < final_size
        shutil.rmtree(tmp_path / "gone")
        status, _out, err = in_process(capsys, "restore", url, "--store", str(tmp_path / "s"),
                                       "--checkpoint", midway.checkpoint_id)
        assert status == 0, err
        with Store.open(tmp_path / "s", read_only=True) as store:
            claimed = store.connection.execute(
                "SELECT count(*) FROM frontier WHERE state = 'in_flight'").fetchall()[0][0]
        assert claimed, "the checkpoint caught URLs claimed and in flight"
        before = site.request_counts()
        run2 = evidence("crawl", "--store", str(tmp_path / "s"), "--json", env=env)
        assert run2.returncode == 0, run2.stderr
        again = site.request_counts() - before
        reachable = site.reachable_pages()
    two = json.loads(run2.stdout)
    assert two["session_id"] == session and two["session_completed"]
    done = done_pages(tmp_path / "s")
    assert set(done) == reachable and all(n == 1 for n in done.values())
    assert all(again[p] <= 1 for p in reachable)
    # What the checkpoint held done was not fetched again; the loss window was.
    with Store.open(tmp_path / "s", read_only=True) as store:
        requeued = store.connection.execute(
            "SELECT count(*) FROM crawl_run WHERE reason LIKE 'no end recorded%'"
        ).fetchall()[0][0]
    assert requeued == 1, "the run the checkpoint caught running is closed as after a crash"
    assert sum(again[p] for p in reachable) < len(reachable)
    assert in_process(capsys, "verify", str(tmp_path / "s"), "--full")[0] == 0


def test_restore_takes_the_newest_complete_checkpoint_and_skips_an_unfinished_one(
        tmp_path: Path, seaweed: SeaweedS3, env: dict[str, str],
        capsys: pytest.CaptureFixture[str]) -> None:
    url = new_s3_url(seaweed, "unfinished")
    with TestSite(SiteConfig(pages=5)) as site:
        crawled = evidence("crawl", site.url, "--store", str(tmp_path / "s"),
                           "--checkpoint", url, env=env)
        assert crawled.returncode == 0, crawled.stderr
    with Remote(url, environ=env) as remote:
        (only,) = checkpoints(remote)
        complete = read_checkpoint(remote, only)
        assert complete is not None
        # A newer checkpoint whose upload was cut before its manifest: not a checkpoint.
        remote.put_bytes("checkpoints/99990101T000000.000000Z-000000/evidence.db", b"torn")
        status, out, err = in_process(capsys, "restore", url, "--store", str(tmp_path / "r"),
                                      "--json")
        assert status == 0, err
        assert json.loads(out)["checkpoint_id"] == only
        # A new store may not take over another store's checkpoints: refused before it is
        # created.
        status, _out, err = in_process(capsys, "crawl", "http://127.0.0.1:9/", "--store",
                                       str(tmp_path / "new"), "--checkpoint", url)
        assert status == 2 and "a new store checkpoints to a prefix of its own" in err, err
        assert not (tmp_path / "new").exists()
        # With no complete one left, restore refuses and creates nothing.
        remote.client.delete(remote.key(f"checkpoints/{only}/{CHECKPOINT}"))
    status, _out, err = in_process(capsys, "restore", url, "--store", str(tmp_path / "r2"))
    assert status == 2
    assert "no complete checkpoint" in err and "Try:" in err
    assert not (tmp_path / "r2").exists()
    with Store.open(tmp_path / "r") as store:
        assert store.store_id == complete.store_id


class _Manifests:
    """An S3 proxy rule: refuse (403, not retried) the first ``failing`` checkpoint
    manifests sent through it, then let them through."""

    def __init__(self) -> None:
        self.failing = 0
        self.refused = 0

    def __call__(self, seen: Seen, _n: int) -> Action:
        if seen.method == "PUT" and seen.path.split("?")[0].endswith(CHECKPOINT) \
                and self.refused < self.failing:
            self.refused += 1
            return Action(kind="status", status=403)
        return Action()


def test_a_failed_checkpoint_is_retried_and_a_failed_final_one_fails_the_run(
        tmp_path: Path, seaweed: SeaweedS3, env: dict[str, str]) -> None:
    port = int(seaweed.endpoint.rsplit(":", 1)[1])
    manifests = _Manifests()
    slow = {f"/p/{i}": 0.1 for i in range(10)}
    with S3Proxy(upstream=("127.0.0.1", port), rule=manifests) as proxy, \
            TestSite(SiteConfig(pages=10, slow=slow)) as site:
        via = {**env, "AWS_ENDPOINT_URL": proxy.endpoint}
        url = new_s3_url(seaweed, "failing").split("?")[0]  # the endpoint: the proxy
        # The first two checkpoints fail: each is logged, the crawl goes on, the next works.
        manifests.failing = 2
        run = evidence("crawl", site.url, "--store", str(tmp_path / "s"), "--workers", "2",
                       "--checkpoint", url, "--every", "0.1s", env=via)
        assert run.returncode == 0, run.stderr
        assert manifests.refused == 2
        assert run.stderr.count(f"checkpoint to {url} failed") == 2, run.stderr
        # Every checkpoint fails: the final one fails the command, with the reason.
        manifests.failing, manifests.refused = 10**6, 0
        run = evidence("crawl", site.url, "--store", str(tmp_path / "s"), "--full",
                       "--max-documents", "1", "--checkpoint", url, env=via)
        assert run.returncode == 2, run.stderr
        assert "Error: the run's final checkpoint to" in run.stderr, run.stderr
        assert "403" in run.stderr and "Try: evidence backup" in run.stderr
    with Remote(url, environ=env) as remote:
        ids = checkpoints(remote)
        complete = [c for c in (read_checkpoint(remote, i) for i in ids) if c]
    assert complete and len(ids) == len(complete) + 2 + 1, "a failed one has no manifest"
    with Store.open(tmp_path / "s", read_only=True) as store:
        sessions = store.connection.execute("SELECT count(*) FROM crawl_session").fetchall()
    assert sessions == [(2,)], "the failed final checkpoint did not undo the run"


# --- any sequence of commits, checkpoints, failed checkpoints and restarts ----------------

_STEPS = st.lists(st.sampled_from(["pages", "pages", "checkpoint", "fail", "restart"]),
                  min_size=2, max_size=7)


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_STEPS, bodies=st.lists(st.integers(0, 5), min_size=14, max_size=14))
def test_any_sequence_of_commits_and_checkpoints_restores_each_complete_one_exactly(
        seaweed: SeaweedS3, env: dict[str, str], steps: list[str], bodies: list[int]) -> None:
    """Each complete checkpoint restores to the store as it was when it was taken (its
    Merkle head and its payloads, each re-hashed), whatever came before it: payloads shared
    with earlier checkpoints, checkpoints that failed before their manifest, a new process
    (a restart) taking over the prefix. Bodies repeat (the same payload in many pages)."""
    port = int(seaweed.endpoint.rsplit(":", 1)[1])
    manifests = _Manifests()
    url = new_s3_url(seaweed, "any").split("?")[0]
    with tempfile.TemporaryDirectory() as tmp, \
            S3Proxy(upstream=("127.0.0.1", port), rule=manifests) as proxy:
        via = {**env, "AWS_ENDPOINT_URL": proxy.endpoint}
        expected: dict[str, tuple[int, bytes, set[tuple[str, str]]]] = {}
        with Store.create(Path(tmp) / "s") as store:
            make, pages = Factory(store), iter(bodies)
            submit_all(store, [make.session(), make.run()])
            checkpointer = Checkpointer(store, url, environ=via)
            try:
                for step in steps:
                    if step == "pages":
                        submit_all(store, [make.attempt(
                            f"http://example.com/{make.id('p')}",
                            body=make.body(b"page %d" % next(pages, 9))) for _ in range(2)])
                    elif step == "restart":
                        checkpointer.close()
                        checkpointer = Checkpointer(store, url, environ=via)
                    elif step == "fail":
                        manifests.failing, manifests.refused = 1, 0
                        with pytest.raises(EvidenceError):
                            checkpointer.take()
                    else:
                        taken = checkpointer.take()
                        size, root, _ = check_log(store.connection)
                        payloads = {(ns, d) for ns, d in store.connection.execute(
                            "SELECT namespace, digest FROM artifact")}
                        expected[taken.checkpoint_id] = (size, root, payloads)
            finally:
                checkpointer.close()
        for checkpoint_id, (size, root, payloads) in expected.items():
            target = Path(tmp) / checkpoint_id
            restore_checkpoint(url, target, checkpoint_id=checkpoint_id, environ=via)
            with Store.open(target) as restored:
                assert check_log(restored.connection)[:2] == (size, root)
                got = {(ns, d) for ns, d in restored.connection.execute(
                    "SELECT namespace, digest FROM artifact")}
                assert got == payloads
                assert verify(restored, full=True).ok
