"""What a client sends is stored as the canonical encoding of what it means, never as the
client spelled it (docs/design.md, "The data flow": why the writer encodes a message again).

msgpack spells one value many ways, and the strict decoder accepts each: a client that
spells a message its own way (map keys in another order here) must leave in the ledger
the same bytes, payload hash and Merkle leaf as our client's spelling, so that the two
deliveries are one message (a duplicate), not a conflict.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import msgspec

from evidence import Store
from evidence._model.messages import (
    SessionStarted,
    canonical_encode,
    decode_message,
    payload_hash,
)
from evidence._write.wire import PROTOCOL_VERSION, Hello, Submit, encode_frame

from .test_service import exchange
from .test_service_fairness import serving, short_dir, store_path  # noqa: F401 (fixtures)

NOW = dt.datetime(2026, 3, 3, 12, 0, tzinfo=dt.UTC)


def respelled(canonical: bytes) -> bytes:
    """The same message spelled another way: every map's keys in reverse order."""

    def reverse(value: object) -> object:
        if isinstance(value, dict):
            return {k: reverse(v) for k, v in reversed(value.items())}
        return value

    return msgspec.msgpack.encode(reverse(msgspec.msgpack.decode(canonical)))


def test_a_message_spelled_another_way_is_stored_canonical_and_redelivery_is_a_duplicate(
        store_path: Path, short_dir: Path) -> None:  # noqa: F811 (fixtures)
    from evidence.client import Client

    message = SessionStarted(message_id="m-spelled", session_id="s-spelled", started_at=NOW,
                             config={"workers": 4, "agent": "test", "limits": {"b": 1, "a": 2}})
    canonical = canonical_encode(message)
    sent = respelled(canonical)
    assert sent != canonical and decode_message(sent) == message  # same meaning, other bytes
    sock = short_dir / "s.sock"
    with serving(store_path, sock):
        frames = exchange(sock, encode_frame(Hello(versions=[PROTOCOL_VERSION], client="odd"))
                          + encode_frame(Submit(id=1, messages=[msgspec.Raw(sent)])))
        assert [f["acks"][0]["status"] for f in frames if f["type"] == "ack"] == ["committed"]
        with Client(sock, name="ours") as ours:  # our client's spelling: the canonical one
            again = ours.submit(message)
        assert again.status == "duplicate", again.reason
    with Store.open(store_path) as store, store.snapshot() as conn:
        [(payload, digest)] = conn.execute(
            "SELECT payload, payload_hash FROM ingest_ledger WHERE message_id = ?",
            ("m-spelled",)).fetchall()
    assert bytes(payload) == canonical
    assert digest == payload_hash(canonical)
