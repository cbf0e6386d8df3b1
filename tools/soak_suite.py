"""Run the test suite several times in a row while CPU-bound processes compete for the machine.

    python tools/soak_suite.py                      # 5 runs of README's command beside 2 hogs
    python tools/soak_suite.py --runs 1 --json      # one run, a JSON report on stdout
    python tools/soak_suite.py --runs 3 -- tests/test_crawl.py -x   # pytest's own arguments

A suite that is never red by chance (issue 34) passes every run here: each run is
``python -m pytest -q`` (README's test command, so pyproject's addopts apply: several
processes) plus what follows ``--``, while ``--hogs`` processes spin on the CPU from before
the first run to after the last (2 on a 2-core machine: the suite gets about half of it).
A test that depends on timing it does not control fails here sooner or later.

For each run it reports the exit status, the counts of passed, failed, errored and skipped
tests (from pytest's JUnit XML), the failed tests by id, the wall time and the CPU time the
run used (user and system, of pytest and the processes it waited for: what the suite costs
whatever else the machine runs); then how much CPU the hogs burned, which shows they ran.
Each run's output and XML stay in ``--out`` (default: a new temporary directory, named in
the report). Exit status 0 when every run passed, 1 when one did not, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_HOG = "while True:\n    pass\n"


@dataclass
class Run:
    run: int
    exit_status: int
    seconds: float
    cpu_seconds: float  # user + system of pytest and everything it waited for
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)  # test ids that failed or errored
    output: str = ""  # the file holding this run's pytest output


@contextlib.contextmanager
def hogs(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` processes spinning on the CPU until the block ends (then SIGKILLed)."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            started.append(subprocess.Popen([sys.executable, "-c", _HOG],
                                            stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL))
        yield started
    finally:
        for proc in started:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
            proc.wait()


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process not yet reaped (Linux /proc), in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def junit_counts(path: Path) -> tuple[int, int, int, int, list[str]]:
    """(passed, failed, errors, skipped, failed ids) from a pytest JUnit XML file."""
    passed = failed = errors = skipped = 0
    failures: list[str] = []
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcomes = {child.tag for child in case}
        if "failure" in outcomes:
            failed += 1
            failures.append(test_id)
        elif "error" in outcomes:
            errors += 1
            failures.append(test_id)
        elif "skipped" in outcomes:
            skipped += 1
        else:
            passed += 1
    return passed, failed, errors, skipped, failures


def run_suite(number: int, out: Path, pytest_args: Sequence[str]) -> Run:
    xml = out / f"run-{number}.xml"
    log = out / f"run-{number}.txt"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               f"--junitxml={xml}", *pytest_args]
    started, cpu = time.monotonic(), _children_cpu()
    with log.open("wb") as output:
        status = subprocess.run(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=output,
                                stderr=subprocess.STDOUT, check=False).returncode
    run = Run(run=number, exit_status=status, seconds=round(time.monotonic() - started, 1),
              cpu_seconds=round(_children_cpu() - cpu, 1), output=str(log))
    if xml.exists():
        run.passed, run.failed, run.errors, run.skipped, run.failures = junit_counts(xml)
    return run


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{seconds % 60:04.1f}"


def describe(run: Run) -> str:
    verdict = "passed" if run.exit_status == 0 else f"FAILED (exit status {run.exit_status})"
    line = (f"run {run.run}: {verdict} in {_minutes(run.seconds)} ({run.cpu_seconds:.0f} s "
            f"of CPU): {run.passed} passed, {run.failed} failed, {run.errors} errors, "
            f"{run.skipped} skipped")
    return "\n".join([line, *(f"    {test_id}" for test_id in run.failures)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/soak_suite.py",
        description="Run the test suite (python -m pytest -q, as README says) several times "
        "in a row while CPU-bound processes run, and report each run's outcome, failed "
        "tests and wall time. Arguments after '--' go to pytest.",
        epilog="Exit status: 0 every run passed, 1 a run did not, 2 usage error.")
    parser.add_argument("--runs", type=int, default=5, metavar="N",
                        help="runs of the suite, one after another (default 5)")
    parser.add_argument("--hogs", type=int, default=2, metavar="K",
                        help="CPU-bound processes running meanwhile (default 2)")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="where each run's output and JUnit XML go (default: a new "
                        "temporary directory)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of text")
    parser.add_argument("pytest_args", nargs="*", metavar="-- PYTEST-ARGS",
                        help="more arguments for pytest (after '--')")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.hogs < 0:
        parser.error("--hogs must not be negative")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} exists and is not a directory")
    out = args.out or Path(tempfile.mkdtemp(prefix="soak-suite-"))
    out.mkdir(parents=True, exist_ok=True)

    runs: list[Run] = []
    started = time.monotonic()
    with hogs(args.hogs) as spinning:
        for number in range(1, args.runs + 1):
            run = run_suite(number, out, args.pytest_args)
            runs.append(run)
            if not args.json:
                print(describe(run), flush=True)
        burned = [round(cpu_seconds(p.pid), 1) for p in spinning]
    report = {
        "runs": [asdict(r) for r in runs],
        "passed_runs": sum(r.exit_status == 0 for r in runs),
        "failed_runs": sum(r.exit_status != 0 for r in runs),
        "seconds": round(time.monotonic() - started, 1),
        "hogs": args.hogs,
        "hog_cpu_seconds": burned,
        "cpus": os.cpu_count(),
        "pytest_args": args.pytest_args,
        "out": str(out),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{report['passed_runs']} of {len(runs)} runs passed in "
              f"{_minutes(report['seconds'])}, beside {args.hogs} CPU hogs (CPU seconds "
              f"each: {', '.join(map(str, burned)) or 'none'}) on {report['cpus']} CPUs; "
              f"output in {out}")
    return 0 if report["failed_runs"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
