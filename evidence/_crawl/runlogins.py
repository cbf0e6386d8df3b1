"""A run's logins (``_crawl.login``): the first, before any page, and logging in again when
a page shows the crawl was logged out, one login at a time and at most ``max_logins`` a
run for each origin.

Separate from the engine (``_crawl.crawler``) because it is state of its own (how many
logins each origin's recipe ran, when the last one ended, the login pages' sequence
numbers) that the engine only starts and a page worker only asks (``PageWorker.relogin``);
and from ``_crawl.login`` because it fetches, renders and commits, which a recipe and its
run in Chromium do not.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence

import anyio

from .._errors import EvidenceError
from .._model.messages import Message, utc_now
from .._store.backend import ArtifactBackend
from .fetch import FetchResult
from .loginrecipe import LoginRecipe
from .render import RENDER_SEQUENCE, Renderer
from .renderscope import source_capture
from .secrets import RequestOptions

__all__ = ["LOGIN_SEQUENCE", "RunLogins"]

#: The login page's fetches are numbered from here in their run: above any claim's, below
#: the browser's requests (``RENDER_SEQUENCE``), so no (url, sequence) pair collides.
LOGIN_SEQUENCE = RENDER_SEQUENCE >> 1

log = logging.getLogger("evidence.crawl")


class RunLogins:
    """The logins of one run: ``fetch`` requests a page (counted as the run's),
    ``commit`` commits messages; ``renderer`` (set once the run's browser is open) runs a
    recipe on the login page's capture."""

    def __init__(self, *, artifacts: ArtifactBackend,
                 fetch: Callable[[str, int], Awaitable[FetchResult]],
                 commit: Callable[[Sequence[Message]], Awaitable[None]]) -> None:
        self._artifacts, self._fetch, self._commit = artifacts, fetch, commit
        # How many each origin's recipe ran, when the last ended.
        self._logins: dict[str, int] = {}
        self._logged_in_at: dict[str, dt.datetime] = {}
        self._login_lock = anyio.Lock()
        self._login_sequence = itertools.count(LOGIN_SEQUENCE)
        self.renderer: Renderer | None = None

    async def first(self, request: RequestOptions | None) -> None:
        """Log in with each recipe before the first page; a login that does not hold
        fails the run (its render, recorded, says why)."""
        for recipe in request.logins if request is not None else ():
            error = await self.login(recipe, "the run starts")
            if error is not None:
                raise EvidenceError(f"the login at {recipe.url} failed: {error}",
                                    hint="check the [[logins]] table of the secrets file "
                                    "(its selectors and values); the render of the login "
                                    "is recorded: evidence show STORE URL")

    async def login(self, recipe: LoginRecipe, why: str) -> str | None:
        """Fetch the login page, log in on its capture in Chromium, commit both; None when
        the check held, else what went wrong."""
        assert self.renderer is not None
        self._logins[recipe.origin] = self._logins.get(recipe.origin, 0) + 1
        result = await self._fetch(recipe.url, next(self._login_sequence))
        await self._commit([result.attempt])
        if result.status != 200:
            return (f"the login page answered {result.attempt.outcome}"
                    f"{f', HTTP {result.status}' if result.status else ''}")
        source = await anyio.to_thread.run_sync(source_capture, self._artifacts,
                                                result.attempt)
        rendered = await self.renderer.login(source, recipe, why)
        await self._commit([rendered.render, *rendered.attempts])
        self._logged_in_at[recipe.origin] = utc_now()
        done = rendered.render.outcome == "rendered"
        log.info("login at %s (%s): %s", recipe.url, why,
                 "logged in" if done else rendered.render.error,
                 extra={"event": "crawl.login", "render_id": rendered.render.render_id})
        return None if done else (rendered.render.error or rendered.render.outcome)

    async def relogin(self, recipe: LoginRecipe, why: str,
                      fetched_at: dt.datetime) -> str | None:
        """A page showed the crawl logged out: log in again (one login at a time), unless
        a login ended after the page's request began. What to say in the page's retry, or
        None when no login is left (or it failed): the page then settles as it came."""
        async with self._login_lock:
            last = self._logged_in_at.get(recipe.origin)
            if last is not None and fetched_at < last:
                return "logged in again since it was requested"
            used = self._logins.get(recipe.origin, 0)
            if used >= recipe.max_logins:
                log.warning("logged out at %s (%s), and the %d logins allowed are used",
                            recipe.origin, why, recipe.max_logins,
                            extra={"event": "crawl.login_exhausted"})
                return None
            error = await self.login(recipe, f"logged out: {why}")
            if error is not None:
                return None
            return f"logged in again, login {used + 1} of {recipe.max_logins}"
