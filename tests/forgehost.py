"""A dishonest worker host: a real process speaking the worker protocol, patched to lie.

    python -m tests.forgehost ADDRESS TOKEN_FILE NAME BIND MODE

It connects as ``evidence worker`` does (``role: worker``, its own token), says ready, waits
for its first order, and then, by MODE:

- ``attempt``: submits, under the name the coordinator gave it, an attempt for
  ``https://bank.example/account/1``, a URL it was never leased; prints the answer's error
  code, then tries to join again and prints how that is answered;
- ``failed``: answers the order with a forged ``Failed`` frame and prints how its channel
  then ends;
- ``alter``: serves every order as ``evidence worker`` does (a real fetch, payloads into
  the object store, the evidence submitted under its name), except that it replaces
  ``Page`` with ``Fake`` in every body before storing it; it ends when the run does.

Each line it prints starts with ``forger:``; the test reads them from its stdout.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec

from evidence._crawl.frontier import CrawlConfig
from evidence._crawl.http import crawl_client
from evidence._crawl.netpolicy import NetworkPolicy
from evidence._crawl.pages import PageWorker
from evidence._crawl.workerchannel import (
    Beat,
    Bye,
    Done,
    Failed,
    Order,
    Ready,
    Setup,
    _down,
    _read,
)
from evidence._crawl.workerhost import HostOptions, _connect, _Refused
from evidence._errors import ServiceError
from evidence._model.messages import FetchAttempt, new_id, utc_now
from evidence._store.artifactspec import open_artifacts
from evidence._write.wire import encode_frame, read_token
from evidence.client import AsyncClient, ClientLimits

FORGED_URL = "https://bank.example/account/1"


def say(text: str) -> None:
    print(f"forger: {text}", flush=True)


async def main(address: str, token_file: str, name: str, bind: str, mode: str) -> None:
    host, port = address.rsplit(":", 1)
    options = HostOptions(address=(host, int(port)), token=read_token(token_file), tls=None,
                          local_host=bind, name=name)
    with anyio.fail_after(60):  # the coordinator may not listen yet
        while True:
            try:
                stream, reader = await _connect(options)
                break
            except (OSError, _Refused):
                await anyio.sleep(0.05)
    setup = await _read(reader, _down)
    assert isinstance(setup, Setup)
    await stream.send(encode_frame(Ready(pid=0)))
    if mode == "alter":
        await _alter(options, setup, stream, reader)
        return
    while not isinstance(order := await _read(reader, _down), Order):
        pass
    say(f"leased {order.page.url} as {setup.name}")
    if mode == "failed":
        await stream.send(encode_frame(Failed(id=order.id, error="forged failure")))
        try:
            with anyio.fail_after(60):
                while await _read(reader, _down) is not None:
                    pass
            say("channel ended")
        except Exception as exc:
            say(f"channel ended: {type(exc).__name__}")
        return
    forged = FetchAttempt(message_id=new_id("m-"), attempt_id=new_id("a-"),
                          run_id=setup.run_id, url=FORGED_URL, sequence=1,
                          started_at=utc_now(), elapsed_ms=1.0, outcome="skipped",
                          error="forged")
    quick = ClientLimits(reconnect_timeout=2.0, backoff_max=0.2)
    try:
        async with AsyncClient(address=address, token=options.token, name=setup.name,
                               local_host=bind, limits=quick) as client:
            acks = await client.submit_group([forged])
            say(f"accepted: {[a.status for a in acks]}")
    except ServiceError as exc:
        say(f"refused: {exc.code}")
    try:
        again, _ = await _connect(options)
        await again.aclose()
        say("joined again")
    except ServiceError as exc:
        say(f"join refused: {exc.code}")


class _Altering:
    """An artifact store that stores every body with ``Page`` replaced by ``Fake``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.local = inner.local

    def batch(self) -> Any:
        return self._inner.batch()

    def put(self, namespace: str, data: bytes) -> Any:
        if namespace in ("body", "content"):
            data = data.replace(b"Page", b"Fake")
        return self._inner.put(namespace, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def _alter(options: HostOptions, setup: Setup, stream: Any, reader: Any) -> None:
    config = msgspec.convert(setup.config, CrawlConfig)
    artifacts = open_artifacts(setup.artifacts, local=Path(os.devnull), create=False,
                               read_only=False)
    http = crawl_client(connections=2, timeout=setup.timeout,
                        policy=NetworkPolicy(allow=config.allow_network, seeds=config.seeds))
    address = f"{options.address[0]}:{options.address[1]}"
    async with AsyncClient(address=address, token=options.token, name=setup.name,
                           local_host=options.local_host) as service, http:
        pages = PageWorker(config=config, session_id=setup.session_id, run_id=setup.run_id,
                           artifacts=_Altering(artifacts), client=http,
                           submit=service.submit_group, deadline=setup.deadline)
        served = 0
        while (frame := await _read(reader, _down)) is not None:
            if isinstance(frame, Bye):
                break
            if isinstance(frame, Beat):
                await stream.send(encode_frame(Beat()))
            elif isinstance(frame, Order):
                effects = await pages.page(frame.page)
                await stream.send(encode_frame(Done(id=frame.id, effects=effects)))
                served += 1
    artifacts.close()
    say(f"served {served} pages, altered")


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:6])
