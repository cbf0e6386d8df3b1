#!/usr/bin/env python3
"""Coverage-guided fuzzing (atheris) of what hostile input reaches first (issue 6).

Targets (each states the property every input must keep):

  decode   decode_message(bytes) returns a message that re-encodes to itself, or raises
           MessageError; the first byte picks msgpack or JSON
  url      normalize_url / resolve_reference return a key that is a fixed point, or raise
           URLError
  links    extract_links(bytes) never raises; every ref fits a Discovery message that
           decodes back, and every ref's URL keys or raises URLError
  writer   decode, then submit through a real writer into one store: an ack or a
           MessageError; every 500 inputs verify(store) must find nothing wrong
  frame    the service's framing (evidence._write.wire, new and still changing): a client frame
           decodes or raises ProtocolError, and every message a submit frame carries
           decodes or raises MessageError. Its stream side (length prefixes, truncation,
           slow senders) needs a socket-level harness still to be written.

Usage:
  pip install atheris
  python tools/fuzz.py decode -runs=200000            # libFuzzer flags after the target
  python tools/fuzz.py links -max_total_time=600 corpus/links
  python tools/fuzz.py writer -runs=20000
  python tools/fuzz.py decode --replay crash-1234     # rerun one input, no atheris needed

Exit status: libFuzzer's (non-zero with a crash-* file written) or, with --replay, 1 if
the property fails.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

try:
    import atheris
except ImportError:  # --replay works without it
    atheris = None

DOC = "http://h.example/dir/page.html"


def _imports() -> None:
    global anyio, msgspec, evidence, extract_links
    import anyio
    import msgspec

    import evidence
    from evidence._crawl.links import extract_links

    with contextlib.suppress(ImportError):  # the service may not be in this checkout
        import evidence._write.wire  # instrumented with the rest


def target_decode(data: bytes) -> None:
    fmt = "json" if data[:1] in (b"{", b" ", b"[") else "msgpack"
    try:
        message = evidence.decode_message(data, format=fmt)
    except evidence.MessageError:
        return
    encoded = evidence.canonical_encode(message)
    assert evidence.decode_message(encoded) == message, "does not re-encode to itself"


def target_url(data: bytes) -> None:
    # A leading NUL asks for lone surrogates (undecodable bytes kept as U+DC80..U+DCFF).
    text = data.decode("utf-8", "surrogateescape" if data[:1] == b"\x00" else "replace")
    base, _, href = text.partition("\n")
    for candidate in (text, "http://" + text, href):
        try:
            key = evidence.normalize_url(candidate)
        except evidence.URLError:
            continue
        assert evidence.normalize_url(key) == key, f"not a fixed point: {key!r}"
    try:
        resolved = evidence.resolve_reference(base or DOC, href)
    except evidence.URLError:
        return
    with contextlib.suppress(evidence.URLError):
        evidence.normalize_url(resolved)


def target_links(data: bytes) -> None:
    result = extract_links(data, DOC, max_bytes=64 * 1024, max_links=200)
    message = evidence.Discovery(
        message_id="d1", run_id="r1", source_attempt_id="a1",
        source_artifact=evidence.ArtifactRef("body", "ab" * 32, len(data)),
        refs=result.refs, truncated=result.truncated)
    assert evidence.decode_message(evidence.canonical_encode(message)) == message
    for ref in result.refs:
        with contextlib.suppress(evidence.URLError):
            evidence.normalize_url(ref.url)


class _WriterTarget:
    """One store for the whole run; a writer per input (anyio.run costs ~1 ms)."""

    def __init__(self) -> None:
        import datetime as dt

        self._dir = tempfile.TemporaryDirectory(prefix="fuzz-writer-")
        self.store = evidence.Store.create(Path(self._dir.name) / "store")
        t = dt.datetime(2025, 3, 3, tzinfo=dt.UTC)
        self._submit([evidence.SessionStarted(message_id="s", session_id="s1", started_at=t),
                      evidence.RunStarted(message_id="r", run_id="r1", session_id="s1",
                                          started_at=t)])
        self.inputs = 0

    def _submit(self, messages: list) -> list:
        async def run() -> list:
            async with evidence.Writer(self.store) as writer:
                return [await writer.submit(m) for m in messages]
        return anyio.run(run)

    def __call__(self, data: bytes) -> None:
        fmt = "json" if data[:1] == b"{" else "msgpack"
        try:
            message = evidence.decode_message(data, format=fmt)
        except evidence.MessageError:
            return
        try:
            [ack] = self._submit([message])
        except evidence.MessageError:  # refused before the queue (e.g. cannot be encoded)
            return
        assert ack.status in ("committed", "duplicate", "rejected", "conflict"), ack
        self.inputs += 1
        if self.inputs % 500 == 0:
            report = evidence.verify(self.store)
            assert report.ok, [f.message for f in report.errors][:3]


def target_frame(data: bytes) -> None:
    from evidence._write import wire as _wire

    try:
        frame = _wire.decode_client_frame(data)
    except _wire.ProtocolError:
        return
    for payload in getattr(frame, "messages", ()):
        with contextlib.suppress(evidence.MessageError):
            evidence.decode_message(bytes(memoryview(payload)))  # msgspec.Raw


TARGETS: dict[str, Callable[[], Callable[[bytes], None]]] = {
    "decode": lambda: target_decode,
    "url": lambda: target_url,
    "links": lambda: target_links,
    "writer": _WriterTarget,
    "frame": lambda: target_frame,
}


def seeds() -> list[bytes]:
    """A few valid inputs, written to an empty corpus directory to start from."""
    import datetime as dt

    t = dt.datetime(2025, 3, 3, tzinfo=dt.UTC)
    messages = [
        evidence.SessionStarted(message_id="m1", session_id="s2", started_at=t,
                                config={"seeds": ["http://e.com/"], "depth": [1, {"a": None}]}),
        evidence.FetchAttempt(message_id="m2", attempt_id="a2", run_id="r1",
                              url="http://e.com/p?q=1#f", sequence=3, started_at=t,
                              elapsed_ms=2.5, outcome="response", http_status=200,
                              body=evidence.ArtifactRef("body", "ab" * 32, 10)),
    ]
    out = [evidence.canonical_encode(m) for m in messages]
    out += [msgspec.json.encode(m) for m in messages]
    out += [b'<a href="/x">', b"<base href='//o.example/'><a href=y>", b"http://\xc3\xa9.com/a/../b"]
    with contextlib.suppress(ImportError, AttributeError, TypeError):  # the service's frames
        from evidence._write import wire as _wire

        raw = [msgspec.Raw(encoded) for encoded in out[:2]]
        out += [_wire.encode_frame(frame)[_wire.HEADER.size:] for frame in (
            _wire.Submit(id=1, messages=raw), _wire.Ping(id=2),
            _wire.Hello(versions=[1], token="t", client="fuzz"))]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("target", choices=sorted(TARGETS))
    parser.add_argument("--replay", metavar="FILE", help="run one input and exit")
    args, libfuzzer = parser.parse_known_args()
    if args.replay:
        _imports()
        target = TARGETS[args.target]()
        try:
            target(Path(args.replay).read_bytes())
        except BaseException as exc:
            print(f"{args.target}: property failed: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            return 1
        print(f"{args.target}: ok")
        return 0
    if atheris is None:
        print("atheris is not installed: pip install atheris (or use --replay FILE)",
              file=sys.stderr)
        return 2
    with atheris.instrument_imports():
        _imports()
    corpus = [a for a in libfuzzer if not a.startswith("-")]
    for directory in corpus:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        if not any(path.iterdir()):
            for i, seed in enumerate(seeds()):
                (path / f"seed-{i}").write_bytes(seed)
    target = TARGETS[args.target]()
    atheris.Setup([sys.argv[0], *libfuzzer], target)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
