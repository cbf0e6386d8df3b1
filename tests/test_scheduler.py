"""The scheduler's and the fetch slots' counters keep their stated relation (docs/design.md,
"The crawler"), driven without the network: the events a run's worker tasks cause, in any
order the engine allows, in one event loop each.

``Scheduler.check`` and ``FetchSlots.check`` run at every change (this suite turns on the
per-host sums too, in conftest.py); the driver below also holds its own model of where
each page is and compares it with the counters after every event.
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evidence._crawl.scheduler import CountsBroken, Job, Scheduler
from evidence._crawl.slots import FetchSlots, Slot

HOSTS = ["a.test", "b.test", "c.test"]


def _job(n: int, host: str) -> Job:
    return Job(f"http://{host}/{n}", 0, 0, "link", f"{host}/{n}", host)


@dataclass
class _Task:
    """A worker task's page, as the engine's ``_work`` moves it along."""

    slot: Slot
    # new -> fetching (holds its host slot) -> committing -> done, or fetching ->
    # unrequested (settled without a request: its slot given back) -> done
    phase: str = "new"


class _Run:
    """The engine's side of a run, as events: claims, worker tasks, requests, commits."""

    def __init__(self, workers: int, per_host: int, cap: int | None, in_workers: bool) -> None:
        self.tasks = workers * (4 if in_workers else 2)
        self.in_workers = in_workers  # worker processes: no claim rides a page's commit
        self.scheduler = Scheduler(workers=workers, per_host=per_host, tasks=self.tasks,
                                   max_documents=cap)
        self.slots = FetchSlots(self.scheduler)
        self.ahead: list[Job] = []  # claimed, waiting for a worker task (the channel)
        self.working: list[_Task] = []
        self.made = 0
        self.counted = 0  # pages claimed and not settled unrequested: toward the cap
        self.stopped = False

    async def event(self, kind: str, index: int) -> None:
        """One event: a URL queued, a claim, a worker task taking a claimed URL, a stop,
        or the next step of the ``index``-th page a worker task holds (which step, of
        those the engine allows in its phase, ``index`` picks too)."""
        scheduler, slots = self.scheduler, self.slots
        if kind == "queue":
            self.made += 1
            scheduler.add(_job(self.made, HOSTS[index % len(HOSTS)]))
        elif kind == "claim" and not self.stopped:
            free = scheduler.claimable()
            if free > 0:
                jobs, _ = scheduler.claim(free)
                self.ahead += jobs
                self.counted += len(jobs)
        elif kind == "start" and self.ahead and len(self.working) < self.tasks:
            scheduler.take()
            self.working.append(_Task(slots.slot(self.ahead.pop(0))))
        elif kind == "stop":
            self.stopped = True
        elif kind == "step" and self.working:
            await self.step(self.working[index % len(self.working)], index // 3 % 4)
        self.compare()

    async def step(self, task: _Task, choice: int) -> None:
        scheduler, slots = self.scheduler, self.slots
        if task.phase == "new":
            host = task.slot.host
            if self.stopped or choice == 3:  # released: the run stopped before its request
                self.finish(task)
            elif host.slots is None or host.slots.value > 0:  # else the task would wait
                await slots.take(task.slot)
                task.phase = "fetching"
        elif task.phase == "fetching":
            if choice == 0:  # robots.txt refused it: settled with no request, which
                scheduler.unrequested()  # commits while its slot serves the next one
                self.counted -= 1
                slots.unrequested(task.slot)
                task.phase = "unrequested"
            elif choice == 1:  # a retry (robots.txt unavailable), or a render's page
                scheduler.retry(task.slot.job, 0.0)
                self.finish(task)
            else:  # the request is over: the page is parsed and commits
                slots.committing(task.slot)
                task.phase = "committing"
        elif task.phase == "unrequested":
            self.finish(task)  # committed, or cancelled mid-commit
        elif task.phase == "committing":
            if choice in (0, 1) and task.slot.next is None and not self.in_workers \
                    and not self.stopped:  # its worker's next URL rides its commit
                task.slot.next = scheduler.ride()
                self.counted += task.slot.next is not None
            elif choice == 3:  # cancelled mid-commit: a riding claim is dropped
                if task.slot.next is not None:
                    scheduler.drop_riding(task.slot.next)
                    task.slot.next = None
                self.finish(task)
            else:
                self.finish(task)

    def finish(self, task: _Task) -> None:
        self.working.remove(task)
        then = self.slots.finish(task.slot)
        if then is not None:  # the same worker task goes on with it
            self.working.append(_Task(self.slots.slot(then)))

    def compare(self) -> None:
        """The counters say what the model holds."""
        s = self.scheduler
        assert s.ahead == len(self.ahead)
        assert s.working == len(self.working)
        assert s.settling == sum(t.phase == "committing" for t in self.working)
        assert s.riding == sum(t.slot.next is not None for t in self.working)
        assert self.slots.requests == sum(t.phase == "fetching" for t in self.working)
        assert s.pending == sum(len(h.jobs) for h in s.hosts.values())
        assert s.documents == self.counted
        assert self.slots.requests <= 2 * s.workers
        assert s.ahead + s.working <= self.tasks
        assert s.claimed <= 2 * self.tasks
        if self.in_workers:  # claimed and never requested: at most two per fetch slot
            assert s.ahead + sum(t.phase in ("new", "unrequested")
                                 for t in self.working) <= 2 * s.workers
        if s.cap is not None:
            assert s.documents <= s.cap

    async def drain(self) -> None:
        """Every page finishes (committed, or released by a stop): nothing stays counted."""
        self.stopped = True
        while self.working:
            await self.event("step", 3 * 3)
        s = self.scheduler
        assert (s.working, s.settling, s.riding, self.slots.requests) == (0, 0, 0, 0)
        assert s.claimed == len(self.ahead)


EVENTS = st.lists(st.tuples(
    st.sampled_from(["queue", "queue", "claim", "start", "start", *["step"] * 6]),
    st.integers(0, 11)), min_size=40, max_size=200)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=EVENTS, stop_at=st.integers(0, 250), workers=st.integers(1, 3),
       per_host=st.integers(1, 3), cap=st.none() | st.integers(0, 30),
       in_workers=st.booleans())
def test_any_sequence_of_claim_fetch_settle_stop_events_keeps_the_counters_related(
        events: list[tuple[str, int]], stop_at: int, workers: int, per_host: int,
        cap: int | None, in_workers: bool) -> None:
    async def main() -> None:
        run = _Run(workers, per_host, cap, in_workers)
        for at, (kind, index) in enumerate(events):
            await run.event("stop" if at == stop_at else kind, index)
        await run.drain()

    anyio.run(main)


async def _tight() -> _Run:
    """One fetch slot (two worker tasks): a page committing with the next URL riding its
    commit, and a second page fetching; every bound of the relation is met exactly."""
    run = _Run(workers=1, per_host=2, cap=3, in_workers=False)
    for kind, index in [("queue", 0), ("queue", 0), ("queue", 0), ("queue", 0),
                        ("claim", 0), ("start", 0), ("start", 0), ("step", 0),
                        ("step", 1), ("step", 6), ("step", 0)]:
        await run.event(kind, index)
    s = run.scheduler
    assert (s.claimed, s.ahead, s.working, s.settling, s.riding, run.slots.requests,
            s.documents, s.pending) == (3, 0, 2, 1, 1, 1, 3, 1)
    return run


@pytest.mark.parametrize(("counter", "by"), [
    ("claimed", 1), ("claimed", -1), ("working", 1), ("working", -1), ("settling", 1),
    ("settling", -1), ("riding", 1), ("riding", -1), ("pending", 1), ("pending", -1),
    ("documents", 1), ("requests", 1), ("requests", -1)])
def test_a_counter_off_by_one_breaks_the_check(counter: str, by: int,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: from a state where it holds, one counter moved by one (as a
    missed or doubled update would) is caught."""
    monkeypatch.setattr(Scheduler, "thorough", True)

    async def main() -> None:
        run = await _tight()
        run.scheduler.check()
        run.slots.check()
        owner = run.slots if counter == "requests" else run.scheduler
        setattr(owner, counter, getattr(owner, counter) + by)
        with pytest.raises(CountsBroken):
            run.scheduler.check()
            run.slots.check()

    anyio.run(main)


def test_a_claim_beyond_the_worker_tasks_is_refused_and_caught() -> None:
    """``claimable`` never lets the scheduler claim past its bound, and a claim made past
    it anyway (a bug in a caller) fails the check at once."""
    async def main() -> None:
        run = await _tight()
        assert run.scheduler.claimable() <= 0
        with pytest.raises(CountsBroken, match="ahead \\+ working <= tasks"):
            run.scheduler.claim(1)

    anyio.run(main)
