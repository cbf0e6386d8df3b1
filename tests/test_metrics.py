"""Prometheus metrics of a crawl (issue 34): ``evidence crawl --metrics HOST:PORT`` serves
text the official parser reads, with proper types, and counters that agree with the store.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from evidence._demo.site import SiteConfig
from evidence._store.db import Store
from evidence._write.metrics import metrics_address
from evidence._write.wire import ServiceError

# deployment: test_hosts' fixture (a certificate, a token, the object store), by its name
from .heldsite import HeldSite
from .test_hosts import _coordinator, _finish, _live, _log, _wait, deployment  # noqa: F401

EVIDENCE = [sys.executable, "-m", "evidence"]


def scrape(url: str) -> dict[str, dict]:
    """name -> {"type": ..., "samples": {(sample name, sorted labels): value}}."""
    response = httpx.get(url, timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {}
    for family in text_string_to_metric_families(response.text):
        families[family.name] = {"type": family.type, "samples": {
            (s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}}
    return families


def value(families: dict, name: str, sample: str | None = None, **labels: str) -> float:
    return families[name]["samples"][(sample or name, tuple(sorted(labels.items())))]


def store_counts(store: Path) -> tuple[dict[str, int], dict[str, int]]:
    """The frontier's URLs by state, and the fetch attempts by outcome, from the store."""
    with Store.open(store, read_only=True) as s, s.snapshot() as conn:
        states = dict(conn.execute("SELECT state, count(*) FROM frontier GROUP BY state"))
        outcomes = dict(conn.execute("SELECT outcome, count(*) FROM fetch_attempt "
                                     "GROUP BY outcome"))
    return states, outcomes


class Crawl:
    """``evidence crawl --metrics 127.0.0.1:0 --log-format json`` in a subprocess; its
    metrics URL read from its ``metrics.listening`` line."""

    def __init__(self, *argv: str) -> None:
        self.proc = subprocess.Popen(
            [*EVIDENCE, "--log-format", "json", "crawl", *argv, "--metrics", "127.0.0.1:0",
             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[dict] = []
        self.listening = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(json.loads(line))
            if self.lines[-1]["event"] == "metrics.listening":
                self.listening.set()

    @property
    def url(self) -> str:
        assert self.listening.wait(60), self.lines
        return next(line["data"]["url"] for line in self.lines
                    if line["event"] == "metrics.listening")

    def result(self) -> dict:
        out, _ = self.proc.communicate(timeout=120)
        self.reader.join(10)
        assert self.proc.returncode == 0, self.lines
        return json.loads(out)


@pytest.fixture
def crawls() -> Iterator[list[Crawl]]:
    started: list[Crawl] = []
    yield started
    for crawl in started:
        if crawl.proc.poll() is None:
            crawl.proc.kill()
            crawl.proc.communicate(timeout=30)


def test_a_crawl_serves_metrics_that_parse_and_agree_with_the_store(
        tmp_path: Path, crawls: list[Crawl]) -> None:
    store = tmp_path / "s"
    # One held page: the rest of the site is crawled and committed while it is in flight,
    # a quiet moment to compare the metrics with the store, which lasts until the test lets
    # it go (a 4 s slow page ended between the scrape and the store's count on a loaded
    # machine: 12 done in the metrics, 13 in the store); a broken link and a flaky page
    # give attempts of more than one outcome and a retry.
    with HeldSite(SiteConfig(pages=8, flaky={"/p/2": 1}),
                  held=lambda path: path == "/p/5") as site:
        crawls.append(Crawl(site.url, "--store", str(store)))
        crawl = crawls[0]
        during = scrape(crawl.url)
        assert httpx.get(crawl.url.replace("/metrics", "/healthz"), timeout=10).text == "ok\n"
        deadline = time.monotonic() + 60
        while True:  # until the frontier shows only the slow page left
            quiet = scrape(crawl.url)
            frontier = {dict(k[1])["state"]: v
                        for k, v in quiet["evidence_crawl_frontier_urls"]["samples"].items()}
            if frontier["queued"] == 0 and frontier["in_flight"] == 1 and frontier["done"]:
                break
            assert time.monotonic() < deadline and crawl.proc.poll() is None, frontier
            time.sleep(0.05)
        states, outcomes = store_counts(store)
        site.release()
        result = crawl.result()
    # Every family has its proper type; the histograms have buckets, _count and _sum.
    for families in (during, quiet):
        types = {name: f["type"] for name, f in families.items()}
        assert types["evidence_crawl_pages"] == "counter"
        assert types["evidence_crawl_attempts"] == "counter"
        assert types["evidence_crawl_frontier_urls"] == "gauge"
        assert types["evidence_crawl_fetches_in_flight"] == "gauge"
        assert types["evidence_writer_queue_depth"] == "gauge"
        assert types["evidence_store_wal_bytes"] == "gauge"
        for name in ("evidence_writer_commit_latency_seconds",
                     "evidence_writer_batch_size_messages",
                     "evidence_crawl_render_duration_seconds"):
            assert types[name] == "histogram"
            samples = families[name]["samples"]
            assert (f"{name}_bucket", (("le", "+Inf"),)) in samples
            assert samples[(f"{name}_bucket", (("le", "+Inf"),))] == \
                samples[(f"{name}_count", ())]
            assert (f"{name}_sum", ()) in samples
    assert value(quiet, "evidence_writer_commit_latency_seconds",
                 "evidence_writer_commit_latency_seconds_count") >= 5
    assert value(quiet, "evidence_writer_commit_latency_seconds",
                 "evidence_writer_commit_latency_seconds_sum") > 0
    # At the quiet moment the counters are what the store holds.
    assert value(quiet, "evidence_crawl_pages", "evidence_crawl_pages_total",
                 state="done") == states["done"]
    assert value(quiet, "evidence_crawl_pages", "evidence_crawl_pages_total",
                 state="queued") == 1  # the flaky page's retry
    attempts = {dict(k[1])["outcome"]: v
                for k, v in quiet["evidence_crawl_attempts"]["samples"].items()}
    assert attempts == outcomes and sum(outcomes.values()) > states["done"]  # + robots.txt
    assert {k: v for k, v in frontier.items() if v} == states
    assert value(quiet, "evidence_crawl_fetches_in_flight") == 1
    assert value(quiet, "evidence_crawl_fetched_bytes", "evidence_crawl_fetched_bytes_total") > 0
    assert value(quiet, "evidence_crawl_run_info", run_id=result["run_id"],
                 session_id=result["session_id"]) == 1
    # After the slow page, the run completed with one page more than the quiet moment.
    assert result["outcome"] == "completed"
    assert result["counts"]["done"] == states["done"] + 1


def test_metrics_are_served_on_this_machine_unless_the_operator_says_otherwise(
        tmp_path: Path) -> None:
    store = tmp_path / "s"
    done = subprocess.run([*EVIDENCE, "crawl", "http://127.0.0.1:9/", "--store", str(store),
                           "--metrics", "0.0.0.0:9464"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("Error: --metrics '0.0.0.0:9464': 0.0.0.0 is not a "
                                  "loopback address"), done.stderr
    assert "--metrics-public" in done.stderr.splitlines()[1]
    assert not store.exists()
    with pytest.raises(ServiceError, match="not an IP address"):
        metrics_address("metrics.example:9464", public=True)  # never a name to resolve
    assert metrics_address("localhost:0") == ("127.0.0.1", 0)
    assert metrics_address("0.0.0.0:9464", public=True) == ("0.0.0.0", 9464)  # not bound


def test_a_worker_host_serves_what_it_did_and_it_agrees_with_the_store(
        request: pytest.FixtureRequest) -> None:
    """``evidence worker --metrics``: the pages the coordinator leased to the host, and what
    the host's submissions recorded, counted as the service acknowledged them."""
    d = request.getfixturevalue("deployment")  # test_hosts': TLS, a token, the object store
    host_log = d["tmp"] / "host.log"
    # /p/4 held (not slow: a slow page can end before the quiet moment is seen, or between
    # it and the store's count, on a loaded machine) until the store has been counted.
    with HeldSite(SiteConfig(pages=6), held=lambda path: path == "/p/4") as site:
        coordinator = _coordinator(d, site.url)
        with host_log.open("w") as log:
            host = subprocess.Popen(
                [*EVIDENCE, "worker", "--connect", d["address"], "--token-file",
                 str(d["token"]), "--tls-ca", str(d["cert"]), "--bind", "127.0.0.3",
                 "--metrics", "127.0.0.1:0", "--log-format", "json"],
                stdout=subprocess.DEVNULL, stderr=log, env=d["env"])
        try:
            def listening() -> str | None:
                for line in host_log.read_text().splitlines():
                    if json.loads(line)["event"] == "metrics.listening":
                        return json.loads(line)["data"]["url"]
                return None

            url = _wait("the host's metrics", listening, [coordinator, host], d)

            def quiet() -> dict | None:  # only the slow page left, in flight on the host
                families = scrape(url)
                return families if (
                    value(families, "evidence_worker_pages_in_flight") == 1
                    and _live(d).get("counts", {}).get("queued", 1) == 0
                    and value(families, "evidence_worker_pages", "evidence_worker_pages_total",
                              state="done") >= 6) else None

            families = _wait("the slow page alone in flight", quiet, [coordinator, host], d)
            states, _ = store_counts(Path(d["store"]))
            site.release()
            assert coordinator.wait(120) == 0, _log(d, "coordinator")
            assert host.wait(60) == 0
        finally:
            _finish([coordinator, host])
    assert value(families, "evidence_worker_connected") == 1
    assert value(families, "evidence_worker_pages", "evidence_worker_pages_total",
                 state="done") == states["done"]  # every page was fetched by this host
    assert value(families, "evidence_worker_orders", "evidence_worker_orders_total") == \
        states["done"] + 1
    assert families["evidence_worker_attempts"]["type"] == "counter"
    lines = [json.loads(line) for line in host_log.read_text().splitlines()]
    served = [line for line in lines if line["event"] == "worker.serving"]
    assert len(served) == 1 and served[0]["run_id"].startswith("run-")


# --- the counters are what committed --------------------------------------------------

_OUTCOMES = ("network_error", "timeout")


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(deliveries=st.lists(st.tuples(st.integers(0, 6), st.sampled_from(_OUTCOMES),
                                     st.booleans()), min_size=1, max_size=24),
       group=st.integers(1, 4))
def test_any_sequence_of_deliveries_counts_the_attempts_the_store_holds(
        tmp_path_factory: pytest.TempPathFactory,
        deliveries: list[tuple[int, str, bool]], group: int) -> None:
    """First deliveries commit and count; a redelivery (duplicate), the same message id
    with another outcome (a conflict) and an attempt of a run never started (rejected)
    count nothing: the writer's tally equals the store's rows, whatever the sequence."""
    import anyio

    from evidence._model.messages import FetchAttempt, RunStarted, SessionStarted, utc_now
    from evidence._write.writer import Writer

    now = utc_now()
    messages = [FetchAttempt(message_id=f"m-{i}", attempt_id=f"a-{i}",
                             run_id="r1" if known else "r-never", url=f"http://127.0.0.1/{i}",
                             sequence=0, started_at=now, elapsed_ms=1.0, outcome=outcome,
                             error="no answer")
                for i, outcome, known in deliveries]
    path = tmp_path_factory.mktemp("tally")

    async def deliver(store: Store) -> dict[str, int]:
        async with Writer(store) as writer:
            await writer.submit_group([
                SessionStarted(message_id="m-session", session_id="s1", started_at=now),
                RunStarted(message_id="m-run", run_id="r1", session_id="s1", started_at=now)])
            for start in range(0, len(messages), group):
                await writer.submit_group(messages[start:start + group])
            return writer.statistics().recorded.attempts

    with Store.create(path / "s") as store:
        counted = anyio.run(deliver, store)
    _, outcomes = store_counts(path / "s")
    assert counted == outcomes
