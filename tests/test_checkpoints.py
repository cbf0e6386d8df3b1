"""The ephemeral runner (issue 29): a crawl checkpoints its store to S3, the machine is
thrown away, a new one restores the newest checkpoint and resumes the same session, each
page fetched once; failed checkpoints are retried, a failed final one fails the run.

Real SeaweedFS, real crawls of the demo site on 127.0.0.1, the real command in a
subprocess (so its exit status and output are what a runner sees).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from evidence import Store
from evidence._archive.checkpoint import CHECKPOINT, checkpoints, read_checkpoint
from evidence._archive.remote import Remote
from evidence._demo.site import SiteConfig, TestSite
from evidence.testing.seaweed import SeaweedS3

from .conftest import new_s3_url
from .s3proxy import Action, S3Proxy, Seen
from .test_crawl import done_pages


def evidence(*args: str, env: dict[str, str], cwd: Path | None = None
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "evidence", *args], capture_output=True,
                          text=True, env=env, timeout=300, cwd=cwd)


@pytest.fixture
def env(seaweed: SeaweedS3) -> dict[str, str]:
    import os

    return {**os.environ, **seaweed.environ}


def test_a_crawl_restored_from_its_checkpoint_on_a_new_machine_resumes_the_same_session(
        tmp_path: Path, seaweed: SeaweedS3, env: dict[str, str]) -> None:
    url = new_s3_url(seaweed, "runner")
    first, second = tmp_path / "machine-1" / "s", tmp_path / "machine-2" / "s"
    with TestSite(SiteConfig(pages=30)) as site:
        run1 = evidence("crawl", site.url, "--store", str(first), "--workers", "2",
                        "--max-documents", "12", "--checkpoint", url, "--every", "0.2s",
                        "--json", env=env)
        assert run1.returncode == 0, run1.stderr
        one = json.loads(run1.stdout)
        assert one["outcome"] == "capped" and not one["session_completed"]
        assert "checkpoint " in run1.stderr
        shutil.rmtree(tmp_path / "machine-1")  # the machine and its disk are gone

        restored = evidence("restore", url, "--store", str(second), "--json", env=env)
        assert restored.returncode == 0, restored.stderr
        report = json.loads(restored.stdout)
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
    verified = evidence("verify", str(second), "--full", env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    with Remote(url, environ=env) as remote:
        ids = checkpoints(remote)
        taken = [read_checkpoint(remote, i) for i in ids]
    assert len(ids) >= 3 and all(t is not None for t in taken)
    # Payloads are shared: each checkpoint uploads only what the prefix lacked.
    assert sum(t.uploaded for t in taken if t) == taken[-1].artifacts  # type: ignore[union-attr]


def test_restore_takes_the_newest_complete_checkpoint_and_skips_an_unfinished_one(
        tmp_path: Path, seaweed: SeaweedS3, env: dict[str, str]) -> None:
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
        restored = evidence("restore", url, "--store", str(tmp_path / "r"), "--json",
                            env=env)
        assert restored.returncode == 0, restored.stderr
        assert json.loads(restored.stdout)["checkpoint_id"] == only
        # With no complete one left, restore refuses and creates nothing.
        remote.client.delete(remote.key(f"checkpoints/{only}/{CHECKPOINT}"))
    refused = evidence("restore", url, "--store", str(tmp_path / "r2"), env=env)
    assert refused.returncode == 2
    assert "no complete checkpoint" in refused.stderr and "Try:" in refused.stderr
    assert not (tmp_path / "r2").exists()
    with Store.open(tmp_path / "r") as store:
        assert store.store_id == complete.store_id


def _failing_manifests(fail: threading.Event):
    def rule(seen: Seen, _n: int) -> Action:
        if seen.method == "PUT" and seen.path.split("?")[0].endswith(CHECKPOINT) \
                and fail.is_set():
            return Action(kind="status", status=403)
        return Action()
    return rule


def test_a_failed_checkpoint_is_retried_and_a_failed_final_one_fails_the_run(
        tmp_path: Path, seaweed: SeaweedS3, env: dict[str, str]) -> None:
    port = int(seaweed.endpoint.rsplit(":", 1)[1])
    fail = threading.Event()
    slow = {f"/p/{i}": 0.05 for i in range(20)}
    with S3Proxy(upstream=("127.0.0.1", port), rule=_failing_manifests(fail)) as proxy, \
            TestSite(SiteConfig(pages=20, slow=slow)) as site:
        via = {**env, "AWS_ENDPOINT_URL": proxy.endpoint}
        url = new_s3_url(seaweed, "failing").split("?")[0]  # the endpoint: the proxy
        fail.set()
        # Every checkpoint's manifest is refused: the periodic ones are logged and the crawl
        # goes on to completion; the final one fails the command with the reason.
        run = evidence("crawl", site.url, "--store", str(tmp_path / "s"), "--workers", "1",
                       "--checkpoint", url, "--every", "0.1s", env=via)
        assert run.returncode == 2, run.stderr
        assert "checkpoint to" in run.stderr and "failed" in run.stderr
        assert "the run's final checkpoint" in run.stderr and "Try:" in run.stderr
        assert done_pages(tmp_path / "s"), "the crawl itself went on"
        fail.clear()  # the store's endpoint answers again: the next run's checkpoints work
        again = evidence("crawl", site.url, "--store", str(tmp_path / "s"), "--checkpoint",
                         url, "--full", env=via)
        assert again.returncode == 0, again.stderr
    with Remote(url, environ=env) as remote:
        complete = [c for c in (read_checkpoint(remote, i) for i in checkpoints(remote)) if c]
    assert complete, "a checkpoint was written once the object store took it"
