"""A submitted message on its way to the ledger, and what its submitter waits on.

``Pending`` is made at submit (``Writer.submit_group``: the canonical bytes, their hash,
the fetch keys of its URLs), queued by the writer task, batched, and written by the
transaction (``commit.py``); the ack or error it ends with wakes its group's waiter. It is
the one value every part of the writer shares, so it lives on its own below them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator

import anyio

from .._model.acks import Ack
from .._model.merkle import leaf_hash
from .._model.messages import Message, ledger_entry

__all__ = ["TAGS", "EventWaiter", "Pending", "Waiter", "leaf_of", "resolve"]

TAGS = {kind: kind.__struct_config__.tag  # the ledger's kind column, per message type
         for kind in Message.__args__}


class Pending:
    """One submitted message on its way to the ledger (a plain class: one per message)."""

    __slots__ = ("ack", "done", "encoded", "error", "keys", "message",
                 "payload_hash", "submitted_at", "submitter")

    def __init__(self, message: Message, encoded: bytes, payload_hash: str,
                 submitted_at: float, keys: dict[str, str], done: Waiter,
                 submitter: str | None = None) -> None:
        self.message = message
        self.encoded = encoded
        self.submitter = submitter  # a worker host's identity (ledger_entry), or None
        self.payload_hash = payload_hash
        self.submitted_at = submitted_at
        self.keys = keys  # fetch keys of its URLs, computed at submit, off the commit thread
        self.done = done  # shared by its group: a group commits in one batch
        self.ack: Ack | None = None
        self.error: BaseException | None = None


def leaf_of(pending: Pending) -> bytes:
    """The message's Merkle leaf hash: of its bytes, and its submitter if it has one."""
    return leaf_hash(ledger_entry(pending.encoded, pending.submitter))


class EventWaiter:
    """An ``anyio.Event`` behind the small part of the future API the writer uses."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = anyio.Event()

    def done(self) -> bool:
        return self._event.is_set()

    def set_result(self, result: None) -> None:
        self._event.set()

    def __await__(self) -> Generator[object, None, None]:
        return self._event.wait().__await__()


Waiter = asyncio.Future[None] | EventWaiter


def resolve(waiter: Waiter) -> None:
    """Wake a group's submitter (once: a group's messages share one waiter)."""
    if not waiter.done():  # an asyncio future is also done when its waiter was cancelled
        waiter.set_result(None)
