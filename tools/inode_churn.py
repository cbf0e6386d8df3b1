#!/usr/bin/env python3
"""How much a burst of deletes slows the next file creations on this filesystem.

An artifact put creates one file. On ext4 without a journal the inode allocator skips,
one by one, every inode freed in the last 60-360 seconds, so file creation right after a
large delete (a benchmark harness removing its previous store, a cleanup job) costs far
more system time than on a quiet filesystem. This measures it, in a directory you name
(put it on the filesystem the store lives on):

    python tools/inode_churn.py DIR [--files N] [--json]

Four rounds of N files (default 9,000: a 3,000-page crawl's worth) of 3,000 bytes: two into
fresh directories, then both are deleted, then two more. Each round reports the system
and wall seconds of the creations. Everything is removed at the end. Nothing is fsynced:
this is the allocator's cost alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path


def create(directory: Path, files: int) -> dict[str, float]:
    directory.mkdir(parents=True)
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    payload = b"x" * 3000
    for i in range(files):
        fd = os.open(directory / str(i), os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        try:
            os.write(fd, payload)
        finally:
            os.close(fd)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"sys_s": round(after.ru_stime - before.ru_stime, 3),
            "wall_s": round(time.monotonic() - started, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", type=Path, help="a new directory to work in (removed after)")
    parser.add_argument("--files", type=int, default=9000, help="files per round (9000)")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    args = parser.parse_args(argv)
    if args.dir.exists():
        parser.error(f"{args.dir} exists; name a new directory")
    rounds = []
    try:
        rounds.append(("fresh", create(args.dir / "a", args.files)))
        rounds.append(("fresh", create(args.dir / "b", args.files)))
        shutil.rmtree(args.dir / "a")
        shutil.rmtree(args.dir / "b")
        rounds.append(("after deleting both", create(args.dir / "c", args.files)))
        rounds.append(("after deleting both", create(args.dir / "d", args.files)))
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    if args.json:
        print(json.dumps([{"round": name, **figures} for name, figures in rounds]))
    else:
        for name, figures in rounds:
            print(f"{name:<20} {args.files} files: system {figures['sys_s']:.3f} s, "
                  f"wall {figures['wall_s']:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
