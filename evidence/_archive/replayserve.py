"""Serving a capture to a person's browser, through pywb, on 127.0.0.1.

    with ReplayServer("site.evidence") as server:     # or a .wacz file
        print(server.pages[0].replay_url)             # http://127.0.0.1:PORT/evidence/<ts>/<url>

Which replay system, and why pywb: it installs from PyPI with the rest of the project
(``pip install -e '.[replay]'``, also in the ``test`` extra), runs as a local server with
no network of its own (live-web proxying is off unless asked), and replays a WARC with a
CDXJ index as they are: the files of our WACZ export are its collection, unchanged.
ReplayWeb.page, the other candidate, replays the WACZ itself inside the browser (a service
worker), so it needs its JavaScript bundle from the npm registry and a browser session to
run; it opens the same WACZ file (``evidence export --format wacz``) for anyone who has it.

What happens: a store is exported to a WACZ in a temporary directory; a WACZ given as a
file is first checked whole (``_archive.waczcheck``: zip, package hashes, signature, record
digests, index offsets, and the signer when ``public_key`` pins it) and refused if anything
fails, since a browser shows replayed bytes with the authority of an archive. With
``unverified`` it is served anyway, and every replayed page says so in a red banner above
it (pywb's own banner template, with ours prepended, from the collection's ``templates/``);
``check`` holds the verdict either way. Then its ``archive/data.warc.gz`` and its index
become the pywb collection ``evidence`` (``indexes/index.cdx.gz`` inflated, or an older
WACZ's ``indexes/index.cdx``, as ``index.cdxj``, which is how pywb finds it), and pywb's
``wayback`` server runs in a child process bound to 127.0.0.1 only. Pages come from the
WACZ's ``pages/pages.jsonl``; each replays at ``/evidence/<14-digit time>/<url>`` (framed
replay: pywb's banner above the page). pywb is GPL-3.0; it runs as a separate program and
is not part of this package.
"""

from __future__ import annotations

import contextlib
import gzip
import html
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from .._errors import EvidenceError
from .cdxj import timestamp14

if TYPE_CHECKING:
    from .waczcheck import WaczCheck

__all__ = ["ReplayPage", "ReplayServer"]

COLLECTION = "evidence"
_CONFIG = """# Written by evidence replay --serve: collections/evidence, replay only, no live web.
framed_replay: true
"""
# Above every replayed page of a WACZ served with --unverified (raw text: pywb's banner
# template is not autoescaped; the values are escaped before they go in).
_BANNER = """{{% raw %}}<div id="evidence-unverified" style="background:#b00020;color:#fff;
font:bold 15px sans-serif;padding:8px 12px">UNVERIFIED: {source} failed verification; what
follows may not be what was captured.<ul style="margin:4px 0;font-weight:normal">{problems}</ul>
</div>{{% endraw %}}
"""
# The child ends with its parent, even a killed one: Linux's PR_SET_PDEATHSIG (prctl
# option 1) sends it SIGTERM; a parent already gone before that is seen by getppid().
#
# One lookup rule is added to pywb's: a capture answers only a request of its own method.
# pywb looks a POST up by its post-append key (``__wb_method=post&...``, as the index
# keys it) and, finding none, falls back to its fuzzy match, which takes any capture of
# the URL without its query: a GET of /api would get a POST's answer, and a POST the GET's.
# The wrapper below refuses a fuzzy candidate whose method (the index line's ``method``,
# GET when it has none) is not the one asked (``__wb_method=`` in the key, else GET); every
# other fuzzy rule (cache-busting query arguments, a POST of another body) stands.
_START = "\n".join([
    "import ctypes, os, re, signal, sys",
    "ctypes.CDLL(None).prctl(1, signal.SIGTERM)",
    "if os.getppid() != int(sys.argv.pop(1)): sys.exit(0)",
    "from pywb.warcserver.index.fuzzymatcher import FuzzyMatcher",
    "_general = FuzzyMatcher.match_general_fuzzy_query",
    "_asked = re.compile(r'[?&]__wb_method=([a-z]+)')",
    "def _same_method(self, url, urlkey, cdx, rx_cache):",
    "    found = _asked.search(urlkey)",
    "    if (cdx.get('method') or 'GET').lower() != (found.group(1) if found else 'get'):",
    "        return False",
    "    return _general(self, url, urlkey, cdx, rx_cache)",
    "FuzzyMatcher.match_general_fuzzy_query = _same_method",
    "from pywb.apps.cli import wayback",
    "sys.argv[0] = 'wayback'",
    "sys.exit(wayback())"])


_INDEXES = ("indexes/index.cdx.gz", "indexes/index.cdx")  # the first one a WACZ has


def _copy_index(src: IO[bytes], dst: IO[bytes], *, compressed: bool) -> None:
    """The WACZ's index as the plain CDXJ pywb reads, without the 304 revisits.

    A compressed index (``index.cdx.gz``) is gzip members of sorted lines: read in turn
    they are the whole sorted index. A revisit record of a 304 (server-not-modified: the
    page was unchanged at that time) is left out of what pywb looks up: pywb answers a
    revisit whose status is a redirection with its head alone, and a browser that asked
    without a validator gets an empty 304; without it, the page at that time replays from
    the capture the 304 confirmed, which is what the server said it still was.
    """
    reader: Iterable[bytes] = gzip.GzipFile(fileobj=src, mode="rb") if compressed else src
    for line in reader:
        fields = line.split(b" ", 2)
        if len(fields) == 3 and b'"warc/revisit"' in fields[2]:
            entry = json.loads(fields[2])
            if entry.get("mime") == "warc/revisit" and entry.get("status") == "304":
                continue
        dst.write(line)


@dataclass(frozen=True)
class ReplayPage:
    url: str
    ts: str
    title: str
    replay_url: str


@dataclass
class ReplayServer:
    """pywb serving one store or WACZ on 127.0.0.1 (``port`` 0: a free one)."""

    source: str | os.PathLike[str]
    port: int = 0
    start_timeout: float = 60.0
    public_key: bytes | None = None  # DER SPKI the WACZ's signer must have
    unverified: bool = False  # serve a WACZ that fails its check, under a warning banner
    pages: list[ReplayPage] = field(default_factory=list)
    check: WaczCheck | None = None
    _dir: Path | None = None
    _process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{COLLECTION}/"

    def __enter__(self) -> ReplayServer:
        try:
            import pywb  # noqa: F401 - only to say so early when it is missing
        except ImportError:
            raise EvidenceError("replay --serve needs pywb, which is not installed",
                                hint="pip install -e '.[replay]' (or pip install pywb)"
                                ) from None
        self._dir = Path(tempfile.mkdtemp(prefix="evidence-replay-"))
        try:
            wacz = self._wacz()
            self._collection(wacz)
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def wait(self) -> int:
        """Until the server exits (Ctrl-C ends it); its exit status."""
        assert self._process is not None
        return self._process.wait()

    def _wacz(self) -> Path:
        source = Path(self.source)
        if source.is_file():
            if not zipfile.is_zipfile(source):
                raise EvidenceError(f"{source} is neither a store directory nor a WACZ file",
                                    hint="give a store, or a file made by evidence export "
                                    "--format wacz", path=str(source))
            self._verify(source)
            return source
        from .._store.db import Store
        from .wacz import export_wacz

        assert self._dir is not None
        with Store.open(source, read_only=True) as store:
            export_wacz(store, self._dir / "replay.wacz")
        return self._dir / "replay.wacz"

    def _verify(self, source: Path) -> None:
        from .waczcheck import check_wacz

        self.check = check = check_wacz(source, public_key=self.public_key)
        if check.ok:
            return
        if not self.unverified:
            shown = "; ".join(check.problems[:3])
            more = len(check.problems) - 3
            raise EvidenceError(
                f"{source} fails verification, so it is not served: {shown}"
                + (f" (and {more} more)" if more > 0 else ""),
                hint=f"see every problem with: evidence verify {source}; to look at it "
                "anyway, add --unverified (each page then carries a warning)",
                path=str(source))
        assert self._dir is not None
        import importlib.resources

        original = (importlib.resources.files("pywb") / "templates" / "banner.html").read_text()
        problems = "".join(f"<li>{html.escape(p)}</li>" for p in check.problems[:5])
        (self._dir / "templates").mkdir(exist_ok=True)
        (self._dir / "templates" / "banner.html").write_text(
            _BANNER.format(source=html.escape(str(source)), problems=problems) + original)

    def _collection(self, wacz: Path) -> None:
        assert self._dir is not None
        home = self._dir / "collections" / COLLECTION
        (home / "archive").mkdir(parents=True)
        (home / "indexes").mkdir()
        (self._dir / "config.yaml").write_text(_CONFIG)
        with zipfile.ZipFile(wacz) as zf:
            names = set(zf.namelist())
            index_name = next((n for n in _INDEXES if n in names), None)
            if index_name is None or "pages/pages.jsonl" not in names:
                raise EvidenceError(f"{wacz} has no indexes/index.cdx.gz (or index.cdx) or "
                                    "pages/pages.jsonl",
                                    hint="replay a WACZ made by evidence export --format wacz",
                                    path=str(wacz))
            for name in sorted(names):
                if name.startswith("archive/") and name.endswith((".warc", ".warc.gz")):
                    with zf.open(name) as src, open(home / "archive" / Path(name).name,
                                                    "wb") as dst:
                        shutil.copyfileobj(src, dst)
            with zf.open(index_name) as src, open(home / "indexes" / "index.cdxj",
                                                  "wb") as dst:
                _copy_index(src, dst, compressed=index_name.endswith(".gz"))
            lines = zf.read("pages/pages.jsonl").decode("utf-8").splitlines()
        for line in lines[1:]:
            page = json.loads(line)
            ts = timestamp14(page["ts"])
            self.pages.append(ReplayPage(url=page["url"], ts=ts, title=page.get("title", ""),
                                         replay_url=""))

    def _start(self) -> None:
        assert self._dir is not None
        if not self.port:
            with socket.socket() as probe:  # a free port (pywb cannot report one it picked)
                probe.bind(("127.0.0.1", 0))
                self.port = probe.getsockname()[1]
        log = open(self._dir / "pywb.log", "wb")  # noqa: SIM115 - the child owns it
        with log:
            self._process = subprocess.Popen(
                [sys.executable, "-c", _START, str(os.getpid()), "--bind", "127.0.0.1", "--port",
                 str(self.port), "--directory", str(self._dir)],
                cwd=self._dir, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._process.poll() is not None:
                tail = (self._dir / "pywb.log").read_text(errors="replace")[-2000:]
                raise EvidenceError(f"pywb exited with status {self._process.returncode}: "
                                    f"{tail}", hint="is the port free? try --port")
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=1):
                break
            if time.monotonic() > deadline:
                raise EvidenceError(f"pywb did not start listening within "
                                    f"{self.start_timeout:g} s", hint="see its log above")
            time.sleep(0.1)
        self.pages = [ReplayPage(p.url, p.ts, p.title, f"{self.url}{p.ts}/{p.url}")
                      for p in self.pages]
