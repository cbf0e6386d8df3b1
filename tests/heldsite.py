"""Demo sites that hold chosen pages until the test lets them go (HeldSite), or answer
only as many as the test allows (MeteredSite).

A test that must act on a crawl while it is still running (status, stop, a worker host
stopped or joining) cannot count on slow pages to keep it running: on a loaded machine the
crawl finishes before `evidence stop` (a new interpreter) gets there, and the test is red by
chance. Here the crawl cannot finish while its pages are held, whatever the load: the test
waits on what it needs to see, acts, then calls ``release()``. A held request is answered
normally once released (or after ``HOLD_LIMIT`` seconds, so a failing test never hangs), and
the site's own stop drops it, as ``TestSite`` drops its slow requests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from evidence._demo.site import SiteConfig, TestSite

HOLD_LIMIT = 120.0  # seconds; well past any wait of the tests, well inside their timeout


def pages_from(first: int) -> Callable[[str], bool]:
    """Hold ``/p/N`` for every N >= ``first`` (``pages_from(0)``: every page)."""

    def held(path: str) -> bool:
        number = path.removeprefix("/p/")
        return number != path and number.isdigit() and int(number) >= first

    return held


class HeldSite(TestSite):
    """A ``TestSite`` whose requests for ``held`` paths wait until ``release()``."""

    __test__ = False

    def __init__(self, config: SiteConfig | None = None, *,
                 held: Callable[[str], bool] | None = None) -> None:
        super().__init__(config)
        self._held = held or pages_from(0)
        self._released = threading.Event()
        self._dropping = threading.Event()
        self._waiting = 0
        self._waiting_lock = threading.Lock()

    def release(self) -> None:
        """Answer the held requests, and every later one at once."""
        self._released.set()

    @property
    def waiting(self) -> int:
        """How many requests are held right now."""
        with self._waiting_lock:
            return self._waiting

    def stop(self) -> None:
        self._dropping.set()  # a held request is dropped, as a slow one is
        self._released.set()
        super().stop()

    def _respond(self, method: str, path: str, headers: Mapping[str, str]):  # type: ignore[no-untyped-def]
        if self._held(path) and not self._released.is_set():
            with self._waiting_lock:
                self._waiting += 1
            try:
                self._released.wait(HOLD_LIMIT)
            finally:
                with self._waiting_lock:
                    self._waiting -= 1
            if self._dropping.is_set():
                return None
        return super()._respond(method, path, headers)


class MeteredSite(TestSite):
    """A ``TestSite`` that answers only as many page requests as the test has allowed
    (``allow``); later ones wait, and the site's stop drops them. Where ``HeldSite`` holds
    chosen pages until one release, this lets the crawl on a few pages at a time: it cannot
    run out of pages before the test is done with it, however fast the machine."""

    __test__ = False

    def __init__(self, config: SiteConfig) -> None:
        super().__init__(config)
        self._gate = threading.Condition()
        self._allowed: int | None = 0  # None: every request from now on
        self.answered = 0

    def allow(self, more: int | None) -> None:
        """``more`` page requests answered; None: all of them."""
        with self._gate:
            self._allowed = None if more is None or self._allowed is None else (
                self._allowed + more)
            self._gate.notify_all()

    def _respond(self, method: str, path: str, headers: Mapping[str, str]):  # type: ignore[no-untyped-def]
        if path.startswith("/p/"):
            deadline = time.monotonic() + HOLD_LIMIT  # a failing test does not hang
            with self._gate:
                while self._allowed is not None and self.answered >= self._allowed:
                    if self._stopping.is_set() or time.monotonic() > deadline:
                        return None
                    self._gate.wait(0.1)
                self.answered += 1
        return super()._respond(method, path, headers)
