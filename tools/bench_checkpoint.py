#!/usr/bin/env python3
"""Benchmark checkpoints to object storage (issue 29): what ``crawl --checkpoint`` costs a
crawl, and how long a backup to S3 and a restore from it take.

A throwaway SeaweedFS (``evidence.testing.seaweed``) and the demo site (``--pages`` pages)
run on 127.0.0.1. In the same run, ``--rounds`` times each, alternating:

  plain        ``evidence crawl SITE --store S --workers 8``
  checkpoint   the same with ``--checkpoint s3://... --every 1s``

each timed as a subprocess (wall time, Python's start included: about 1.3 s here). Then, on
the last plain store: ``backup --out s3://``, ``backup --out DIR`` (the baseline) and
``restore s3://`` of that backup; ``export --out s3://`` and ``--out DIR``, and ``restore``
of each.

Examples:
  python tools/bench_checkpoint.py                # 1,000 pages, 2 rounds: about 2 minutes
  python tools/bench_checkpoint.py --pages 200 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evidence._demo.site import SiteConfig, TestSite
from evidence.testing.seaweed import SeaweedS3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--every", default="1s")
    args = parser.parse_args()
    with SeaweedS3.start() as s3, TestSite(SiteConfig(pages=args.pages)) as site, \
            tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, **s3.environ}

        def run(*argv: str) -> tuple[float, subprocess.CompletedProcess[str]]:
            started = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "evidence", *argv],
                                  capture_output=True, text=True, env=env, check=False)
            if done.returncode != 0:
                sys.exit(f"evidence {' '.join(argv)} failed:\n{done.stderr}")
            return time.monotonic() - started, done

        for round_ in range(args.rounds):
            for mode in ("plain", "checkpoint"):
                extra = (["--checkpoint", s3.url(f"crawl-{round_}"), "--every", args.every]
                         if mode == "checkpoint" else [])
                wall, done = run("crawl", site.url, "--store", f"{tmp}/{mode}-{round_}",
                                 "--workers", "8", "--json", *extra)
                pages = json.loads(done.stdout)["documents"]
                said = [line for line in done.stderr.splitlines() if "checkpoints this run"
                        in line]
                print(f"{mode:<11} round {round_}: {wall:6.2f} s for {pages} pages"
                      + (f"  ({said[-1].split('; ')[-1]})" if said else ""))
        store = f"{tmp}/plain-{args.rounds - 1}"
        size = sum(p.stat().st_size for p in Path(store).rglob("*")
                   if p.is_file())
        wall, _ = run("backup", store, "--out", s3.url("backup"))
        print(f"backup s3   {wall:6.2f} s  (store {size / 2**20:.1f} MiB)")
        wall, _ = run("backup", store, "--out", f"{tmp}/backup")
        print(f"backup dir  {wall:6.2f} s")
        wall, _ = run("restore", s3.url("backup"), "--store", f"{tmp}/restored")
        print(f"restore s3  {wall:6.2f} s  (of the backup: a checkpoint)")
        wall, _ = run("export", store, "--out", s3.url("export"))
        print(f"export s3   {wall:6.2f} s")
        wall, _ = run("export", store, "--out", f"{tmp}/export")
        print(f"export dir  {wall:6.2f} s")
        wall, _ = run("restore", s3.url("export"), "--store", f"{tmp}/from-export")
        print(f"restore s3  {wall:6.2f} s  (of the export)")
        wall, _ = run("restore", f"{tmp}/export", "--store", f"{tmp}/from-dir")
        print(f"restore dir {wall:6.2f} s  (of the export)")


if __name__ == "__main__":
    main()
