"""Fetch slots: a page's place among its host's requests in flight, and their spacing.

A worker task takes a slot on the page's host before its request (at most ``--per-host``
requests in flight on one host), waits for the host's next request start (``--delay``,
robots.txt ``Crawl-delay``, a backoff: exact spacing, reserved before sleeping), and gives
the slot back once the request is over: when the page starts to commit (it is parsed and
committed while the slot serves the next request), when it is settled without a request
(robots.txt refuses it: its settlement commits while the slot serves the next request,
``unrequested``), or when its worker task is done with it.

The relation ``check`` asserts at every change, beside the scheduler's
(``_crawl.scheduler``): a request in flight is a page a worker task holds whose request
is not over,

    requests <= working - settling
    requests <= 2 * workers                 what the scheduler claims per fetch slot
    requests  = the sum of each host's requests  (none has more than ``--per-host``)

So a one-host crawl has at most ``--per-host`` (by default ``--workers``) requests in
flight; a crawl of several hosts may have up to two per ``--workers`` fetch slot, the one
requesting and its next claim, each on its own host.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import anyio

from .._net import acquire
from .scheduler import CLAIMED_PER_FETCH, CountsBroken, Host, Job, Scheduler

__all__ = ["FetchSlots", "Slot"]


@dataclass
class Slot:
    """A worker task's page on its host: whether it holds one of the host's slots, whether
    its request is over (it commits: ``FetchSlots.committing``), and the job claimed with
    its commit, which the worker takes next (``Scheduler.ride``)."""

    job: Job
    host: Host
    held: bool = False
    settling: bool = False
    next: Job | None = None


class FetchSlots:
    """The host slots of one run's worker tasks; ``requests`` is how many are held."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.requests = 0  # requests in flight: pages holding a slot on their host

    def slot(self, job: Job) -> Slot:
        """A worker task starts ``job`` (claimed ahead by the scheduler)."""
        return Slot(job, self.scheduler.host(job.host))

    async def take(self, slot: Slot) -> None:
        """Wait for one of the page's host's ``--per-host`` slots."""
        host = slot.host
        if host.slots is None:
            host.slots = anyio.Semaphore(self.scheduler.per_host)
        await acquire(host.slots)
        slot.held = True
        host.requests += 1
        self.requests += 1
        self.check()

    async def polite(self, slot: Slot, halt: anyio.Event) -> bool:
        """Space request starts on a host by its delay (and any backoff), exactly; False if
        ``halt`` was set meanwhile (the run stops: the request is not made)."""
        host = slot.host
        now = time.monotonic()
        start = max(now, host.next_request)
        host.next_request = start + self.scheduler.delay(slot.job.host)  # reserved first
        if start > now:
            with anyio.move_on_after(start - now):
                await halt.wait()
        return not halt.is_set()

    def committing(self, slot: Slot) -> None:
        """The page's request is over, and it is parsed and commits: its slot on the host
        serves the next request, and the scheduler may claim for it."""
        if slot.settling:
            return
        self.give_back(slot)
        slot.settling = True
        self.scheduler.committing(slot.job)

    def unrequested(self, slot: Slot) -> None:
        """The page is settled without a request (robots.txt refuses it or cannot be had,
        an incremental crawl finds it not due): its slot on the host serves the next
        request while the settlement commits. Held until then, a URL the scheduler claimed
        for that slot waited for a commit that the page's own request never needed (with
        the write lock held elsewhere, for as long as it was held). Unlike ``committing``,
        the page still counts among the scheduler's fetches until it is finished: no
        request was over, so no more URLs are claimed ahead than before."""
        self.give_back(slot)

    def finish(self, slot: Slot) -> Job | None:
        """The worker task is done with the page; the job it goes on with, if one rode
        the page's commit."""
        self.give_back(slot)
        self.scheduler.finish(slot.job, settling=slot.settling, then=slot.next)
        return slot.next

    def give_back(self, slot: Slot) -> None:
        """The page no longer takes one of its host's requests in flight (once)."""
        if slot.held:
            slot.held = False
            slot.host.requests -= 1
            self.requests -= 1
            assert slot.host.slots is not None
            slot.host.slots.release()
            self.check()

    def check(self) -> None:
        """Fail (``CountsBroken``) if a slot is held by no page that is fetching (with
        ``Scheduler.thorough``: or ``requests`` is not the sum of the slots each host
        counts held, or a host holds more than ``--per-host``)."""
        if not __debug__:
            return
        scheduler = self.scheduler
        broken = ""
        if not 0 <= self.requests <= scheduler.working - scheduler.settling:
            broken = "requests <= working - settling"
        elif self.requests > CLAIMED_PER_FETCH * scheduler.workers:
            broken = "requests <= 2 * workers"
        elif scheduler.thorough and (
                self.requests != sum(h.requests for h in scheduler.hosts.values())
                or any(h.requests > scheduler.per_host for h in scheduler.hosts.values())):
            broken = "requests = the host slots held, at most --per-host on each"
        if broken:
            raise CountsBroken(f"{broken}: requests {self.requests}, {scheduler.counts()}")
