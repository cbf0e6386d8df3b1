"""A payload that cannot be read is an error, never a gap (issue 29).

A gap says what the store lacks: a payload deleted (``artifact_missing``) or whose bytes do
not match its digest (``artifact_corrupt``). A read that fails (an object store killed,
answering 5xx, a file the user may not open) says nothing about the evidence: export,
backup and restore try it again a few times, then stop with ``ArtifactReadError``
(``Error:``/``Try:``, exit 2) and leave nothing at their target; compare gives no verdict.
The failures are real: SeaweedFS SIGKILLed mid-read, 503s from a proxy in front of it, a
payload file the user nobody may not open.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from evidence import ArtifactRef, Store, compare
from evidence._archive.archive import backup
from evidence._archive.export import export
from evidence._archive.segments import ArchivePayloads
from evidence._archive.snapshot import READ_TRIES
from evidence._errors import ArtifactReadError
from evidence._store.s3 import open_s3
from evidence.testing.seaweed import SeaweedS3

from .conftest import Factory, new_s3_url, submit_all
from .s3proxy import Action, S3Proxy, Seen
from .test_read_only import as_nobody, world_dir

# How long the S3 client itself retries a failing store here (its outage deadline), and how
# long the proxy of the first test keeps failing one payload: past the client's deadline, so
# the client gives up and the archive's own retry is what reads it.
CLIENT_DEADLINE = "0.3"
FAILING_FOR = 1.0


def fill(store: Store, pages: int = 6, *, put: Callable[[str, bytes], ArtifactRef] | None = None
         ) -> list[ArtifactRef]:
    """A session, a run and ``pages`` attempts, each with its own body; the bodies (put by
    ``put``, the store's own put by default)."""
    make = Factory(store)
    put = put or store.artifacts.put
    bodies = [put("body", f"<html>page {i}</html>".encode() * (i + 1)) for i in range(pages)]
    submit_all(store, [make.session(), make.run(), *(
        make.attempt(f"http://example.com/{i}", body=body) for i, body in enumerate(bodies))])
    return bodies


def nothing_left(parent: Path, *names: str) -> bool:
    """No target and no hidden build directory of one under ``parent``."""
    return not any(p.name == name or p.name.startswith(f".{name}.")
                   for p in parent.iterdir() for name in names)


@pytest.fixture
def s3_env(seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in seaweed.environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("EVIDENCE_S3_OUTAGE_DEADLINE", CLIENT_DEADLINE)


@pytest.fixture
def behind_proxy(tmp_path: Path, seaweed: SeaweedS3, s3_env: None
                 ) -> Iterator[Callable[[Callable[[Seen], Action]], tuple[Path, list]]]:
    """A store whose payloads are in the session's SeaweedFS, reached through a proxy that
    answers each request by a rule of the test's: (store path, its payloads)."""
    proxies: list[S3Proxy] = []

    def make(rule: Callable[[Seen], Action]) -> tuple[Path, list]:
        proxy = S3Proxy(upstream=("127.0.0.1", int(seaweed.endpoint.rsplit(":", 1)[1])),
                        rule=lambda seen, _index: rule(seen))
        proxies.append(proxy)
        url = new_s3_url(seaweed, "reads").replace(seaweed.endpoint, proxy.endpoint)
        with Store.create(tmp_path / "store", artifacts=url) as store:
            # Each body its own object, as a worker host puts it (a writer's own puts are
            # sealed into one segment object): a rule can fail one payload's reads alone.
            worker = open_s3(url, create=False, read_only=False)
            try:
                bodies = fill(store, put=worker.put)
            finally:
                worker.close()
        return tmp_path / "store", bodies

    yield make
    for proxy in proxies:
        proxy.close()


def reads_of(ref: ArtifactRef) -> Callable[[Seen], bool]:
    """Whether a request reads ``ref``'s object (GET: its bytes; HEAD: its size)."""
    return lambda seen: seen.method in ("GET", "HEAD") and seen.path.split("?")[0].endswith(
        f"/{ref.namespace}/{ref.digest}")


def test_a_read_that_fails_and_then_works_is_tried_again_and_is_no_gap(
        behind_proxy, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """One payload's reads are answered 503 for a while, past the S3 client's own outage
    deadline: the client gives up, the archive tries again, and a later try works: the
    archive holds every payload, and records no gap."""
    failing: list[Callable[[Seen], bool]] = []
    counted = {"reads": 0}
    first: list[float] = []
    lock = threading.Lock()

    def rule(seen: Seen) -> Action:
        if failing and failing[0](seen):
            with lock:
                counted["reads"] += 1
                first.append(first[0] if first else time.monotonic())
                if time.monotonic() - first[0] < FAILING_FOR:
                    return Action("status", status=503)
        return Action()

    store, bodies = behind_proxy(rule)
    failing.append(reads_of(bodies[2]))
    with caplog.at_level(logging.WARNING, logger="evidence.archive"):
        manifest = export(store, tmp_path / "archive")
    assert [g for g in manifest.gaps if g.kind.startswith("artifact")] == []
    assert manifest.artifacts == len(bodies)
    assert counted["reads"] >= 3  # the client's tries, the archive's, and the one that worked
    retried = [r.getMessage() for r in caplog.records if "trying again" in r.getMessage()]
    assert 1 <= len(retried) < READ_TRIES and all(bodies[2].digest in r for r in retried)
    held = ArchivePayloads(tmp_path / "archive" / "artifacts")
    with held.open(bodies[2]) as handle:
        assert handle.read() == b"<html>page 2</html>" * 3
    held.close()


@pytest.mark.parametrize("command", ["export", "backup", "compare"])
def test_a_read_that_keeps_failing_ends_the_command_and_leaves_nothing(
        behind_proxy, tmp_path: Path, command: str) -> None:
    """Every read of one payload is answered 503: after ``READ_TRIES`` tries the command
    raises ArtifactReadError naming the payload; nothing appears at the target."""
    failing: list[Callable[[Seen], bool]] = []
    counted = {"reads": 0}

    def rule(seen: Seen) -> Action:
        if failing and failing[0](seen):
            counted["reads"] += 1
            return Action("status", status=503)
        return Action()

    store, bodies = behind_proxy(rule)
    failing.append(reads_of(bodies[4]))
    run = {"export": lambda: export(store, tmp_path / "out"),
           "backup": lambda: backup(store, tmp_path / "out"),
           "compare": lambda: compare(store, store)}[command]
    with pytest.raises(ArtifactReadError) as failed:
        run()
    message = str(failed.value)
    assert f"body/{bodies[4].digest}" in message and f"({READ_TRIES} tries)" in message
    assert "503" in message and failed.value.hint
    assert counted["reads"] >= READ_TRIES
    assert nothing_left(tmp_path, "out")


def test_export_backup_and_compare_stop_when_the_object_store_is_killed_mid_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three commands, each a process of its own, each holding a read of a payload when
    SeaweedFS is SIGKILLed: each exits 2 with Error:/Try: naming the payload it could not
    read, and leaves nothing at its target (before issue 29: exit 0, every payload a gap)."""
    commands = {"export": ["export", "{store}", "--out", str(tmp_path / "archive")],
                "backup": ["backup", "{store}", "--out", str(tmp_path / "copy")],
                "compare": ["compare", "{store}", "{store}"]}
    asked = {name: threading.Event() for name in commands}
    armed, release = threading.Event(), threading.Event()

    def rule(seen: Seen, _index: int) -> Action:
        for name, event in asked.items():
            if not armed.is_set():
                break  # the stores are being filled
            if f"/{name}/body/" in seen.path and seen.method in ("GET", "HEAD"):
                event.set()
                return Action(hold=release)
        return Action()

    with SeaweedS3.start(tmp_path / "s3") as s3, S3Proxy(
            upstream=("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])), rule=rule) as proxy:
        for name, value in s3.environ.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("EVIDENCE_S3_OUTAGE_DEADLINE", CLIENT_DEADLINE)
        for name in commands:
            url = s3.url(name).replace(s3.endpoint, proxy.endpoint)
            with Store.create(tmp_path / name, artifacts=url) as store:
                fill(store)
        armed.set()
        running = {name: subprocess.Popen(
            [sys.executable, "-m", "evidence", *(a.format(store=tmp_path / name) for a in args)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
            for name, args in commands.items()}
        try:
            for name, event in asked.items():
                assert event.wait(120), f"{name} never read a payload"
            s3.kill()
        finally:
            release.set()
            done = {name: (p.wait(timeout=300), *p.communicate()) for name, p in running.items()}
        # Killed before the command starts: the store's payload location cannot be opened.
        before = subprocess.run([sys.executable, "-m", "evidence", "export",
                                 str(tmp_path / "export"), "--out", str(tmp_path / "later")],
                                capture_output=True, text=True, env=dict(os.environ),
                                timeout=300)
    assert before.returncode == 2, before.stdout + before.stderr
    assert f"at {proxy.endpoint} failed" in before.stderr and "\nTry: " in before.stderr
    assert "Traceback" not in before.stderr
    for name, (status, out, err) in done.items():
        assert status == 2, (name, out, err)
        error = err[err.index("Error: "):]  # after the log lines of the tries
        assert error.startswith("Error: cannot read payload body/"), (name, err)
        assert f"({READ_TRIES} tries)" in error and "\nTry: " in error, (name, err)
        assert "Traceback" not in err, (name, err)
    assert nothing_left(tmp_path, "archive", "copy", "later")


def test_a_payload_file_the_user_may_not_open_fails_the_command_and_is_no_gap() -> None:
    """A store whose payloads are one file each, read as the user nobody, one of them
    mode 000: EACCES is no verdict on the payload, so export, backup and compare --full
    (which reads it; without --full, compare looks at its size only) exit 2 naming its
    file (before issue 29: an archive with an artifact_corrupt gap, exit 0); and so does
    restore of an archive whose payload file is mode 000 (it said "altered or damaged")."""
    with world_dir() as d:
        with Store.create(d / "store", artifact_layout="files") as store:
            bodies = fill(store)
            locked = store.artifacts.path_for(bodies[1])  # type: ignore[attr-defined]
        locked.chmod(0o000)
        (d / "out").mkdir(mode=0o777)
        (d / "out").chmod(0o777)
        export(d / "store", d / "archive")  # as root, whom no mode stops
        in_archive = d / "archive" / "artifacts" / "segment-000000"  # every payload's
        in_archive.chmod(0o000)
        # The archive's segment holds every payload: each of them fails, each is tried
        # READ_TRIES times (on a few threads), and the error names one of them.
        digests = "|".join(b.digest for b in bodies)
        for args, file, readers in (
                (["export", str(d / "store"), "--out", str(d / "out" / "archive")], locked,
                 [bodies[1].digest]),
                (["backup", str(d / "store"), "--out", str(d / "out" / "copy")], locked,
                 [bodies[1].digest]),
                (["compare", str(d / "store"), str(d / "store"), "--full"], locked,
                 [bodies[1].digest]),
                (["restore", str(d / "archive"), "--store", str(d / "out" / "new")],
                 in_archive, [b.digest for b in bodies])):
            done = as_nobody(*args)
            assert done.returncode == 2, (args, done.stdout, done.stderr)
            tries, error = done.stderr.split("Error: ")  # each try that failed is logged
            retried = re.findall(r"reading payload body/(\w+) failed .*; trying again", tries)
            assert set(retried) <= set(readers), done.stderr
            named = re.match(rf"cannot read payload body/({digests}) \({READ_TRIES} tries\): "
                             rf"could not open artifact {re.escape(str(file))}: "
                             "Permission denied\nTry: ", error)
            assert named and retried.count(named[1]) == READ_TRIES - 1, done.stderr
            assert "Traceback" not in done.stderr
        assert list((d / "out").iterdir()) == []
