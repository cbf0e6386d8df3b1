"""How much memory a connection flood leaves in a real ``evidence serve`` (issue 30).

    python tools/flood_service.py [--connections 11742] [--concurrency 512] [--kind metrics]

Starts ``evidence serve`` on a new store in a temporary directory (a Unix socket and
``--metrics`` on 127.0.0.1), reads its VmRSS from /proc, then opens ``--connections``
connections, ``--concurrency`` at a time: ``metrics`` ones each ask ``GET /metrics`` and
read the answer; ``hello`` ones say hello on the Unix socket and close. It prints VmRSS
before, at the end of the flood and after ``--settle`` seconds, as one JSON line. Only
127.0.0.1 is dialled.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def start_service(directory: Path, *extra: str) -> tuple[subprocess.Popen[str], dict]:
    store = directory / "store"
    subprocess.run([sys.executable, "-m", "evidence", "init", str(store)], check=True,
                   capture_output=True)
    proc = subprocess.Popen([sys.executable, "-m", "evidence", "serve", str(store),
                             "--socket", str(directory / "s.sock"),
                             "--metrics", "127.0.0.1:0", "--json", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    ready = json.loads(proc.stdout.readline())
    return proc, ready


def _metrics_once(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        while s.recv(65536):
            pass


def _hello_once(path: str) -> None:
    from evidence._write.wire import PROTOCOL_VERSION, Hello, encode_frame

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(path)
        s.sendall(encode_frame(Hello(versions=[PROTOCOL_VERSION], client="flood")))
        s.recv(65536)


def flood_held(ready: dict, connections: int, junk: int = 0) -> int:
    """Open every connection to /metrics first, sending only ``junk`` bytes of a request
    head that never ends, then ask on each and read the answers: the service holds them
    all at once (each waits for the rest of its request)."""
    port = int(ready["metrics"].rsplit(":", 1)[1].split("/")[0])
    held, failed = [], 0
    for _ in range(connections):
        try:
            held.append(socket.create_connection(("127.0.0.1", port), timeout=30))
            if junk:
                held[-1].sendall(b"X" * junk)
        except OSError:
            failed += 1
    for s in held:
        try:
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            while s.recv(65536):
                pass
        except OSError:
            failed += 1
        s.close()
    return failed


def flood(ready: dict, *, kind: str, connections: int, concurrency: int) -> int:
    """Open ``connections`` connections, ``concurrency`` at a time; the number that failed."""
    port = int(ready["metrics"].rsplit(":", 1)[1].split("/")[0])  # http://127.0.0.1:P/metrics
    one = (lambda: _metrics_once(port)) if kind == "metrics" else \
        (lambda: _hello_once(ready["socket"]))
    left = iter(range(connections))
    lock = threading.Lock()
    failed = [0]

    def worker() -> None:
        while True:
            with lock:
                if next(left, None) is None:
                    return
            try:
                one()
            except OSError:
                with lock:
                    failed[0] += 1

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failed[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=11742)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--kind", choices=("metrics", "hello"), default="metrics")
    parser.add_argument("--held", action="store_true",
                        help="metrics: open every connection before asking on any")
    parser.add_argument("--junk", type=int, default=0, metavar="BYTES",
                        help="--held: bytes of an unended request head sent on each first")
    parser.add_argument("--settle", type=float, default=3.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ev-flood-", dir="/tmp") as directory:
        proc, ready = start_service(Path(directory))
        try:
            time.sleep(0.5)
            before = rss_kib(proc.pid)
            started = time.monotonic()
            failed = flood_held(ready, args.connections, args.junk) if args.held else \
                flood(ready, kind=args.kind, connections=args.connections,
                      concurrency=args.concurrency)
            seconds = time.monotonic() - started
            peak = rss_kib(proc.pid)
            time.sleep(args.settle)
            after = rss_kib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
    print(json.dumps({"kind": args.kind, "held": args.held, "junk": args.junk,
                      "connections": args.connections,
                      "concurrency": args.concurrency, "failed": failed,
                      "seconds": round(seconds, 1), "rss_before_kib": before,
                      "rss_end_kib": peak, "rss_after_kib": after, "pid": os.getpid()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
