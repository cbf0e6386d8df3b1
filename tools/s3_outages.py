"""Take the object store away in the middle of a crawl, several times, and check the crawl.

    python tools/s3_outages.py                       # 5 outages of 10 s, one process
    python tools/s3_outages.py --processes 2         # the same with 2 worker processes
    python tools/s3_outages.py --outages 3 --seconds 30 --pages 400

A real ``evidence crawl`` process crawls a site served on 127.0.0.1 (evidence._demo.site)
into a new store whose payloads are in SeaweedFS (evidence.testing.seaweed, on 127.0.0.1).
Each time the crawl has said the last outage is over and the site has answered
``--spacing`` more pages, the object store is SIGKILLed, kept down ``--seconds``, and
started again on the same port and data (``outage``); the
crawl's puts and reference checks wait meanwhile (issue 29). Then: the crawl must exit 0
with its session completed, every path the site served must have been requested once,
``evidence verify --full`` must be clean, and the crawl's log must say each outage once
(``unreachable since``) and its end once (``reachable again``; with worker processes, each
process says it of the outages it saw). Prints the downtimes and the crawl's wall time.
Exit status 0 when all of that holds. The suite runs a bounded version (5 outages of the
2-3 s a restart takes: tests/test_s3_outages.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from evidence._demo.site import SiteConfig, TestSite
from evidence.testing.seaweed import SeaweedS3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outages", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0, help="each outage (s)")
    parser.add_argument("--spacing", type=int, default=8,
                        help="pages the site answers between the outages")
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--processes", type=int, default=0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--delay", type=float, default=0.02,
                        help="seconds between requests (paces the crawl)")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="evidence-s3-outages-"))
    server = SeaweedS3.start(root / "s3")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
           **server.environ}
    env.pop("EVIDENCE_S3_OUTAGE_DEADLINE", None)  # the default (60 s) is what is tried
    downtimes: list[float] = []
    problems: list[str] = []
    try:
        with TestSite(SiteConfig(pages=args.pages)) as site:
            log = root / "crawl.log"
            started = time.monotonic()
            with log.open("w") as err:
                crawl = subprocess.Popen(
                    [sys.executable, "-m", "evidence", "crawl", site.url, "--store",
                     str(root / "store"), "--artifacts", server.url("outages"),
                     "--workers", str(args.workers), "--processes", str(args.processes),
                     "--delay", str(args.delay)], stdout=subprocess.DEVNULL, stderr=err,
                    env=env)

            def ended() -> bool:  # every outage the crawl said has its end said too
                text = log.read_text()
                return text.count("reachable again after") >= text.count(
                    "requests wait meanwhile")

            def outages() -> None:
                for _ in range(args.outages):
                    give_up = time.monotonic() + 60
                    while not ended() and crawl.poll() is None and time.monotonic() < give_up:
                        time.sleep(0.05)
                    target = len(site.requests) + args.spacing
                    while len(site.requests) < target and crawl.poll() is None:
                        time.sleep(0.005)
                    if crawl.poll() is not None:
                        return
                    downtimes.append(server.outage(args.seconds))
                    print(f"outage {len(downtimes)}: down {downtimes[-1]:.1f} s", flush=True)

            thread = threading.Thread(target=outages, daemon=True)
            thread.start()
            status = crawl.wait(timeout=3600)
            wall = time.monotonic() - started
            thread.join()
            counts = site.request_counts()
        text = log.read_text()
        if status != 0:
            problems.append(f"the crawl exited {status}:\n{text[-3000:]}")
        if len(downtimes) < args.outages:
            problems.append(f"the crawl ended after {len(downtimes)} outages: give more --pages")
        twice = sorted(p for p, n in counts.items() if n > 1)
        if twice:
            problems.append(f"{len(twice)} paths requested more than once: {twice[:5]}")
        said = text.count("requests wait meanwhile")  # the warnings, not the progress line
        over = text.count("reachable again after")
        least = len(downtimes)
        if said < least or over != said:
            problems.append(f"the log says {said} outages and {over} ends, for {least}")
        checked = subprocess.run([sys.executable, "-m", "evidence", "verify",
                                  str(root / "store"), "--full"], env=env,
                                 capture_output=True, text=True)
        if checked.returncode != 0:
            problems.append(f"verify --full: {checked.stdout}{checked.stderr}")
        for line in text.splitlines():
            if "reachable again after" in line or "requests wait meanwhile" in line:
                print("  crawl:", line[:160])
        print(f"{len(downtimes)} outages, down {sum(downtimes):.1f} s in all "
              f"({', '.join(f'{d:.1f}' for d in downtimes)}); crawl of {len(counts)} paths "
              f"took {wall:.1f} s (--processes {args.processes}); log: {said} outages said, "
              f"{over} ends; verify --full exit {checked.returncode}")
    finally:
        server.close()
    for problem in problems:
        print("PROBLEM:", problem)
    if not problems:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
