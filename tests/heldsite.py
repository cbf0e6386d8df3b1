"""A demo site that holds chosen pages until the test lets them go.

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
