"""Messages: strict decoding with field paths, canonical encoding, stable hashes."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import threading

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evidence import (
    FetchAttempt,
    MessageError,
    RuleEvaluated,
    SessionStarted,
    canonical_encode,
    decode_message,
    new_id,
    payload_hash,
)
from evidence._model.messages import MAX_MESSAGE_BYTES, format_time, parse_time_text

from .sources import nodes, package_modules

NOW = dt.datetime(2026, 3, 3, 12, 0, tzinfo=dt.UTC)


def attempt(**changes: object) -> FetchAttempt:
    base = FetchAttempt(message_id="m1", attempt_id="a1", run_id="r1",
                        url="http://example.com/", sequence=0, started_at=NOW,
                        elapsed_ms=1.5, outcome="response", http_status=200)
    return msgspec.structs.replace(base, **changes)


def as_json(message: object) -> dict:
    return msgspec.json.decode(msgspec.json.encode(message))


def test_roundtrip_msgpack_and_json() -> None:
    m = attempt()
    assert decode_message(canonical_encode(m)) == m
    assert decode_message(msgspec.json.encode(m), format="json") == m


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda d: d.update(kind="nonsense"), "Invalid value 'nonsense' - at `$.kind`"),
    (lambda d: d.update(surprise=1), "unknown field `surprise`"),
    (lambda d: d.pop("run_id"), "missing required field `run_id`"),
    (lambda d: d.update(sequence="7"), "Expected `int`, got `str` - at `$.sequence`"),
    (lambda d: d.update(sequence=-1), "at `$.sequence`"),
    (lambda d: d.update(started_at="2026-03-03T12:00:00"), "at `$.started_at`"),
    (lambda d: d.update(body={"namespace": "body", "digest": "zz", "size": 1}),
     "at `$.body.digest`"),
    (lambda d: d.update(message_id="has space"), "at `$.message_id`"),
    (lambda d: d.update(outcome="maybe"), "at `$.outcome`"),
])
def test_strict_decoding_names_the_field(mutate, expected: str) -> None:
    data = as_json(attempt())
    mutate(data)
    for encoded, fmt in ((msgspec.json.encode(data), "json"),
                         (msgspec.msgpack.encode(data), "msgpack")):
        with pytest.raises(MessageError, match="invalid message") as info:
            decode_message(encoded, format=fmt)
        assert expected in str(info.value)


@pytest.mark.parametrize("garbage", [b"", b"\xc1", b"\x92\x01", b"\xff" * 10, b"{]"])
def test_malformed_bytes_are_a_clear_error(garbage: bytes) -> None:
    for fmt in ("msgpack", "json"):
        with pytest.raises(MessageError, match="malformed|invalid message"):
            decode_message(garbage, format=fmt)


def test_oversized_message_is_refused_before_decoding() -> None:
    with pytest.raises(MessageError, match="exceeds the limit"):
        decode_message(b"\x00" * (MAX_MESSAGE_BYTES + 1))


def test_the_size_limit_is_checked_in_one_place() -> None:
    """``MAX_MESSAGE_BYTES`` is compared in ``_model/messages.py`` alone (``check_size``):
    the client, the writer and the decoder refuse an oversized message with one check and
    one error (issue 31: the client and the writer each had a copy of it)."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parent.parent / "evidence"
    compared = []
    for path in package_modules():
        for node in nodes(path):
            if isinstance(node, ast.Compare) and any(
                    isinstance(n, ast.Name | ast.Attribute)
                    and getattr(n, "id", getattr(n, "attr", "")) == "MAX_MESSAGE_BYTES"
                    for n in ast.walk(node)):
                compared.append(f"{path.relative_to(package).as_posix()}:{node.lineno}")
    assert len(compared) == 1 and compared[0].startswith("_model/messages.py:"), compared


def test_an_oversized_message_is_refused_when_encoded_to_be_submitted() -> None:
    from evidence._model.messages import encode_checked

    big = attempt(error="x" * (MAX_MESSAGE_BYTES + 1))
    with pytest.raises(MessageError, match="exceeds the limit") as info:
        encode_checked(big)
    assert info.value.message_id == big.message_id  # type: ignore[attr-defined]
    assert encode_checked(attempt()) == canonical_encode(attempt())


def test_canonical_encoding_ignores_dict_insertion_order() -> None:
    a = SessionStarted(message_id="m", session_id="s", started_at=NOW,
                       config={"b": 1, "a": {"y": 2, "x": 3}})
    b = SessionStarted(message_id="m", session_id="s", started_at=NOW,
                       config={"a": {"x": 3, "y": 2}, "b": 1})
    assert canonical_encode(a) == canonical_encode(b)
    assert payload_hash(canonical_encode(a)) == payload_hash(canonical_encode(b))


def test_time_zone_offsets_encode_to_the_same_instant() -> None:
    plus_two = NOW.astimezone(dt.timezone(dt.timedelta(hours=2)))
    assert canonical_encode(attempt(started_at=plus_two)) == canonical_encode(attempt())


def test_defaults_are_omitted_so_new_optional_fields_keep_old_hashes() -> None:
    # The evolution rule of docs/messages.md: an optional field at its default is not
    # encoded, so adding one later cannot change the hash of a message stored earlier.
    encoded = msgspec.msgpack.decode(canonical_encode(attempt()))
    assert "body" not in encoded and "method" not in encoded and "error" not in encoded


def test_new_ids_are_unique_and_time_ordered() -> None:
    ids = [new_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert [i[:12] for i in ids] == sorted(i[:12] for i in ids)  # the millisecond prefix


def test_threads_and_forked_children_never_draw_the_same_ids() -> None:
    """Each thread draws from its own random bytes, and a forked child from fresh ones:
    never the ids of its parent, which drew from the same pool a moment before."""
    new_id()  # this thread's pool holds bytes the child would repeat if it kept them
    ids: list[list[str]] = [[] for _ in range(4)]

    def draw(k: int) -> None:
        ids[k].extend(new_id() for _ in range(3000))

    threads = [threading.Thread(target=draw, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next 100 ids, then out at once
        os.close(read)
        os.write(write, " ".join(new_id() for _ in range(100)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read().split()
    os.waitpid(pid, 0)
    mine = [new_id() for _ in range(100)]
    every = [i for batch in ids for i in batch] + child + mine
    assert len(child) == 100
    assert len(set(every)) == len(every)
    assert {i[13:] for i in child}.isdisjoint(i[13:] for i in mine)  # the random part


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(details=st.dictionaries(st.text(max_size=8), json_values, max_size=5),
       verdict=st.sampled_from(["pass", "fail", "error", "not_applicable"]))
def test_canonical_encoding_is_a_fixed_point(details: dict, verdict: str) -> None:
    m = RuleEvaluated(message_id="m", run_id="r", url="http://e.com/", rule_id="x",
                      rule_version="1", input_hash="0" * 64, verdict=verdict,
                      evaluated_at=NOW, details=details)
    encoded = canonical_encode(m)
    assert canonical_encode(decode_message(encoded)) == encoded


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_fail_cleanly(data: bytes) -> None:
    with contextlib.suppress(MessageError):  # anything else fails the test
        decode_message(data)


@given(st.datetimes(timezones=st.just(dt.UTC)))
def test_any_time_the_store_writes_reads_back_as_the_same_utc_moment(moment: dt.datetime) -> None:
    text = format_time(moment)
    back = parse_time_text(text)
    assert back == moment and back is not None and back.tzinfo is dt.UTC
    assert back == dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)


@pytest.mark.parametrize("text", [
    "2026-12-06T05:15:29.187000", "2026-12-06T05:15:29Z", "2026-12-06T05:15:29.187000+00:00",
    "2026-12-06 05:15:29.187000Z", "20261206T051529.187000Z", "2026-12-06T05:15:29.187000Zx",
    "2026-12-6T05:15:29.187000Z", "2026-12-06T05:15:29,187000Z", "2026-13-06T05:15:29.187000Z",
    "２０２６-12-06T05:15:29.187000Z", ""])
def test_a_text_the_store_never_writes_is_not_read_as_a_time(text: str) -> None:
    with pytest.raises(ValueError):
        parse_time_text(text)
