"""A dishonest worker host: a real process speaking the worker protocol, patched to lie.

    python -m tests.forgehost ADDRESS TOKEN_FILE NAME BIND MODE

It connects as ``evidence worker`` does (``role: worker``, its own token), says ready, waits
for its first order, and then, by MODE:

- ``attempt``: submits, under the name the coordinator gave it, an attempt for
  ``https://bank.example/account/1``, a URL it was never leased; prints the answer's error
  code, then tries to join again and prints how that is answered;
- ``failed``: answers the order with a forged ``Failed`` frame and prints how its channel
  then ends.

Each line it prints starts with ``forger:``; the test reads them from its stdout.
"""

from __future__ import annotations

import sys

import anyio

from evidence._crawl.workerhost import HostOptions, _connect, _Refused
from evidence._crawl.workers import Failed, Order, Ready, Setup, _down, _read
from evidence._errors import ServiceError
from evidence._model.messages import FetchAttempt, new_id, utc_now
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


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:6])
