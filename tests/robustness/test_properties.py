"""Properties that must hold for any input: the SSE reader and the usage filter however a stream is
cut, the spool's line scanner on torn and damaged segments, and internal API signatures."""

from __future__ import annotations

import json
import re
import string
import tempfile
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.spend import _lines
from proxy.spend.spool import SpendSpool
from proxy.sse import Event, EventReader, UsageChunkFilter
from proxy.usage import TokenUsage
from tests.proxy.spool_support import (
    SteppedClock,
    line,
    record,
    replica_dir,
    segment_records,
    stamped,
)
from tests.proxy.test_sse import chunk, delta, event
from tests.support.streams import cuts
from vkgate import signing
from vkgate.signing import SignatureProblem
from vkgate.spend import SpendRecord

# Example counts keep the file near 10 s: generating the inputs is most of the cost, and every
# kind of input (line ending, cut, damage, edit) is still drawn many times over.
STREAMS = settings(max_examples=60, deadline=None)
SEGMENTS = settings(max_examples=80, deadline=None)
ON_DISK = settings(max_examples=20, deadline=None)
SIGNATURES = settings(max_examples=100, deadline=None)

# Text that may go on one SSE line: anything but the line endings themselves.
LINE_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12)
SAMPLE_TEXT = st.one_of(
    st.text(max_size=10),
    st.sampled_from(["é", "日本語", "🙂", '"usage"', '"choices":[],"usage":{}', "data: x"]),
)


def awkward_cuts(stream: bytes) -> st.SearchStrategy[list[bytes]]:
    """Cuts that often split a CRLF, a UTF-8 character or a field name."""
    crlf = [at + 1 for at in range(len(stream)) if stream[at : at + 2] == b"\r\n"]
    utf8 = [at for at, byte in enumerate(stream) if 0x80 <= byte <= 0xBF]
    names = [
        at
        for field in re.finditer(rb"data:|event:", stream)
        for at in range(field.start() + 1, field.end())
    ]
    return cuts(stream, favour=[crlf, utf8, names])


def dumps(payload: Any, compact: bool) -> str:
    # Raw UTF-8 rather than \u escapes, so that cuts can land inside a character.
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":") if compact else None)


# -- the event reader ------------------------------------------------------------------------


def anthropic_payloads() -> st.SearchStrategy[dict[str, Any]]:
    """The shapes of Anthropic's streamed events (their `type` is also the event's name)."""
    tokens = st.integers(0, 10**6)
    index = st.integers(0, 3)
    return st.one_of(
        st.builds(
            lambda model, n: {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "usage": {"input_tokens": n, "output_tokens": 1},
                },
            },
            SAMPLE_TEXT,
            tokens,
        ),
        st.builds(
            lambda i: {
                "type": "content_block_start",
                "index": i,
                "content_block": {"type": "text", "text": ""},
            },
            index,
        ),
        st.builds(
            lambda i, text: {
                "type": "content_block_delta",
                "index": i,
                "delta": {"type": "text_delta", "text": text},
            },
            index,
            SAMPLE_TEXT,
        ),
        st.builds(
            lambda i, text: {
                "type": "content_block_delta",
                "index": i,
                "delta": {"type": "input_json_delta", "partial_json": text},
            },
            index,
            SAMPLE_TEXT,
        ),
        st.builds(lambda i: {"type": "content_block_stop", "index": i}, index),
        st.builds(
            lambda n: {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": n},
            },
            tokens,
        ),
        st.just({"type": "message_stop"}),
        st.just({"type": "ping"}),
        st.builds(
            lambda text: {"type": "error", "error": {"type": "overloaded_error", "message": text}},
            SAMPLE_TEXT,
        ),
    )


def openai_payloads() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.builds(lambda text: chunk(delta(text)), SAMPLE_TEXT),
        st.builds(lambda text: chunk(delta(text), usage=None), SAMPLE_TEXT),
        st.just(chunk([], usage={"prompt_tokens": 9, "completion_tokens": 3})),
    )


# A field line, with what it does: ("data", value), ("event", value), or None when it is to be
# ignored. The values are what a reader must make of the line, per the SSE spec.
Field = tuple[bytes, tuple[str, bytes] | None]

IGNORED_NAMES = ["id", "retry", "Data", "DATA", "data ", " data", "dat", "datum", "Event", "x"]


@st.composite
def field_lines(draw: st.DrawFn, name: str, value: bytes) -> Field:
    """One field line that sets `name` to `value`, in any of the spellings the spec allows."""
    spellings = [b"%b: %b" % (name.encode(), value)]
    if not value.startswith(b" "):  # one leading space is always dropped
        spellings.append(b"%b:%b" % (name.encode(), value))
    if not value:
        spellings.append(name.encode())  # a bare field name: an empty value
    return draw(st.sampled_from(spellings)), (name, value)


@st.composite
def ignored_lines(draw: st.DrawFn) -> Field:
    """A comment or a field the reader must skip."""
    text = draw(LINE_TEXT).encode()
    comment = b":" + text
    unknown = draw(st.sampled_from(IGNORED_NAMES)).encode() + b":" + text
    bare = draw(st.sampled_from(IGNORED_NAMES)).encode()
    return draw(st.sampled_from([comment, unknown, bare])), None


@st.composite
def reader_events(draw: st.DrawFn) -> list[Field]:
    """One event's lines: a provider's shapes, or any mix of fields, with ignored lines among."""
    compact = draw(st.booleans())
    kind = draw(st.sampled_from(["anthropic", "openai", "done", "any"]))
    if kind == "anthropic":
        payload = draw(anthropic_payloads())
        lines = [
            draw(field_lines("event", payload["type"].encode())),
            draw(field_lines("data", dumps(payload, compact).encode())),
        ]
    elif kind == "openai":
        lines = [draw(field_lines("data", dumps(draw(openai_payloads()), compact).encode()))]
    elif kind == "done":
        lines = [draw(field_lines("data", b"[DONE]"))]
    else:
        name_or_data = st.sampled_from(["data", "event"])
        lines = draw(
            st.lists(
                st.tuples(name_or_data, LINE_TEXT).flatmap(
                    lambda field: field_lines(field[0], field[1].encode())
                ),
                max_size=4,
            )
        )
    for extra in draw(st.lists(ignored_lines(), max_size=3)):
        lines.insert(draw(st.integers(0, len(lines))), extra)
    return lines


def expected_event(lines: list[Field]) -> Event | None:
    """What the spec makes of an event's lines: the last name, the data lines joined by LF."""
    name = b""
    data: list[bytes] = []
    for _, effect in lines:
        if effect is None:
            continue
        field, value = effect
        if field == "event":
            name = value
        else:
            data.append(value)
    return Event(name, b"\n".join(data)) if data else None


ENDINGS = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def sse_streams(draw: st.DrawFn) -> tuple[bytes, list[Event]]:
    """A stream of events, every line ended by LF, CRLF or CR at random, and the events in it.

    The last event may lack its blank line, or even its last line ending: `flush` takes it.
    """
    events = draw(st.lists(reader_events(), max_size=6))
    stream = bytearray()
    previous = ""
    for index, lines in enumerate(events):
        for text, _ in lines:
            previous = draw(ENDINGS)
            stream += text + previous.encode()
        if index == len(events) - 1 and draw(st.booleans()):
            if draw(st.booleans()) and lines:
                del stream[len(stream) - len(previous) :]
            break
        blank = draw(ENDINGS)
        if previous == "\r" and blank == "\n":
            blank = "\r\n"  # CR then LF is one line ending, not a line and a blank line
        stream += blank.encode()
        previous = blank
    parsed = [expected_event(lines) for lines in events]
    return bytes(stream), [e for e in parsed if e is not None]


def read(pieces: list[bytes]) -> list[Event]:
    reader = EventReader()
    events = [e for piece in pieces for e in reader.feed(piece)]
    return events + reader.flush()


@STREAMS
@given(case=sse_streams())
def test_the_reader_finds_the_events_the_spec_defines(case: tuple[bytes, list[Event]]) -> None:
    """Any line endings, comments and unknown fields skipped, one space after the colon dropped."""
    stream, expected = case
    assert read([stream]) == expected


@STREAMS
@given(case=sse_streams(), data=st.data())
def test_the_reader_finds_the_same_events_however_the_stream_is_cut(
    case: tuple[bytes, list[Event]], data: st.DataObject
) -> None:
    stream, expected = case
    pieces = data.draw(awkward_cuts(stream))
    assert read(pieces) == expected


@STREAMS
@given(case=sse_streams())
def test_the_reader_finds_the_same_events_fed_one_byte_at_a_time(
    case: tuple[bytes, list[Event]],
) -> None:
    stream, expected = case
    assert read([stream[i : i + 1] for i in range(len(stream))]) == expected


# -- the usage filter ------------------------------------------------------------------------

TERMINATORS = st.sampled_from(["\n\n", "\r\n\r\n", "\r\r"])


@dataclass(frozen=True)
class FilterCase:
    parts: list[tuple[bytes, bool]]
    """Each event's bytes, and whether it reaches the client (all but the usage-only chunk)."""
    usage: TokenUsage | None
    model: str

    @property
    def stream(self) -> bytes:
        return b"".join(part for part, _ in self.parts)

    @property
    def expected(self) -> bytes:
        return b"".join(part for part, kept in self.parts if kept)


@st.composite
def openai_streams(draw: st.DrawFn) -> FilterCase:
    """A chat completion stream with keep-alive comments, perhaps its usage-only chunk anywhere
    and perhaps `[DONE]`, each event ended by its own kind of blank line, the last perhaps by none.
    """
    compact = draw(st.booleans())
    model = draw(SAMPLE_TEXT)
    # With usage asked for, every other chunk carries `"usage": null`.
    extra: dict[str, Any] = {"usage": None} if draw(st.booleans()) else {}
    texts = draw(st.lists(SAMPLE_TEXT, max_size=5))
    payloads = [chunk(delta(text), model=model, **extra) for text in texts]
    payloads.append(chunk(delta("", "stop"), model=model, **extra))
    parts: list[tuple[bytes, bool]] = [
        (event(dumps(p, compact), draw(TERMINATORS)), True) for p in payloads
    ]
    for text in draw(st.lists(SAMPLE_TEXT, max_size=2)):
        text = text.replace("\r", "").replace("\n", "")
        comment = b": " + text.encode() + draw(TERMINATORS).encode()
        parts.insert(draw(st.integers(0, len(parts))), (comment, True))
    usage: TokenUsage | None = None
    if draw(st.booleans()):
        prompt, completion, cached, reasoning = draw(st.tuples(*[st.integers(0, 10**7)] * 4))
        body: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if draw(st.booleans()):
            body["prompt_tokens_details"] = {"cached_tokens": cached}
            body["completion_tokens_details"] = {"reasoning_tokens": reasoning}
        else:
            cached = reasoning = 0
        usage = TokenUsage(
            input_tokens=prompt,
            output_tokens=completion,
            cache_read_tokens=cached,
            reasoning_tokens=reasoning,
        )
        usage_only = event(dumps(chunk([], model=model, usage=body), compact), draw(TERMINATORS))
        parts.insert(draw(st.integers(0, len(parts))), (usage_only, False))
    if draw(st.booleans()):  # not every provider ends with it
        parts.append((event("[DONE]", draw(TERMINATORS)), True))
    if draw(st.booleans()):  # the provider closed the stream before the last blank line
        last, kept = parts[-1]
        parts[-1] = (last.rstrip(b"\r\n"), kept)
    return FilterCase(parts, usage, model)


def filtered(pieces: list[bytes], usage_filter: UsageChunkFilter) -> bytes:
    out = b"".join(usage_filter.feed(piece) for piece in pieces)
    return out + usage_filter.flush()


@STREAMS
@given(case=openai_streams(), data=st.data())
def test_the_filter_drops_only_the_usage_chunk_however_the_stream_is_cut(
    case: FilterCase, data: st.DataObject
) -> None:
    pieces = data.draw(awkward_cuts(case.stream))
    usage_filter = UsageChunkFilter()
    assert filtered(pieces, usage_filter) == case.expected
    assert usage_filter.usage == case.usage
    assert usage_filter.model == case.model


@STREAMS
@given(case=openai_streams(), data=st.data())
def test_the_filter_hands_on_whole_events_only(case: FilterCase, data: st.DataObject) -> None:
    """Before the end, what has come out always stops where an event that was sent stops."""
    boundaries = {0, *accumulate(len(part) for part, kept in case.parts if kept)}
    usage_filter = UsageChunkFilter()
    out = b""
    for piece in data.draw(awkward_cuts(case.stream)):
        out += usage_filter.feed(piece)
        assert case.expected.startswith(out)
        assert len(out) in boundaries


@STREAMS
@given(case=openai_streams(), data=st.data())
def test_without_drop_every_piece_passes_at_once_and_usage_is_still_read(
    case: FilterCase, data: st.DataObject
) -> None:
    usage_filter = UsageChunkFilter(drop=False)
    for piece in data.draw(awkward_cuts(case.stream)):
        assert usage_filter.feed(piece) == piece
    assert usage_filter.flush() == b""
    assert usage_filter.usage == case.usage
    assert usage_filter.model == case.model


# -- the spool's segments ----------------------------------------------------------------------

REPLICA = "r0"
# Strings that look like a line's checksum suffix or start, to mislead a scanner.
LINE_LIKE = st.sampled_from([" 00000000", " deadbeef\n", '"} 0badf00d', '{"id":"1"} 12345678'])


@st.composite
def spend_records(draw: st.DrawFn, most: int = 6) -> list[SpendRecord]:
    """Records as one replica stamped them, in order, with any text in their strings."""
    text = st.one_of(st.text(max_size=16), LINE_LIKE)
    count = draw(st.integers(1, most))
    return [
        SpendRecord(
            id=f"{seq:032x}",
            kind=draw(st.sampled_from(["admit", "confirm", "fail"])),
            replica_id=REPLICA,
            seq=seq,
            request_id=draw(text),
            at="2026-03-10T11:00:00.000000Z",
            route="/v1/chat/completions",
            end_user=draw(st.none() | text),
            model=draw(st.none() | text),
            status=draw(st.sampled_from([0, 200, 429, 502])),
            input_tokens=draw(st.integers(0, 2**40)),
            output_tokens=draw(st.integers(0, 2**40)),
            latency_ms=draw(st.floats(0, 1e6, allow_nan=False)),
        )
        for seq in range(1, count + 1)
    ]


def scanned_json(data: bytes, *, decode: bool) -> list[bytes]:
    return [bytes(json) for json in _lines.scan(data, decode=decode).records]


def json_part(raw: bytes) -> bytes:
    return raw[: -_lines.SUFFIX_LEN]


@settings(max_examples=30, deadline=None)
@given(records=spend_records(), decode=st.booleans())
def test_a_segment_torn_at_any_byte_yields_exactly_the_whole_lines_before_the_tear(
    records: list[SpendRecord], decode: bool
) -> None:
    lines = [line(r) for r in records]
    segment = b"".join(lines)
    ends = list(accumulate(len(raw) for raw in lines))
    for tear in range(len(segment) + 1):
        whole = bisect_right(ends, tear)
        scan = _lines.scan(segment[:tear], decode=decode)
        got = [bytes(json) for json in scan.records]
        assert got == [json_part(raw) for raw in lines[:whole]], f"torn at byte {tear}"
        assert [msgspec.json.decode(j, type=SpendRecord) for j in got] == records[:whole]
        assert scan.good_end == (ends[whole - 1] if whole else 0)
        assert scan.torn == tear - scan.good_end
        assert scan.corrupt == 0


@ON_DISK
@given(records=spend_records(), data=st.data())
def test_a_torn_open_segment_is_cut_back_to_its_whole_lines_on_start_up(
    records: list[SpendRecord], data: st.DataObject
) -> None:
    """The same through the spool: only whole records ship, and the sequence reuses the rest."""
    lines = [line(r) for r in records]
    segment = b"".join(lines)
    tear = data.draw(st.integers(0, len(segment)), label="tear")
    whole = records[: bisect_right(list(accumulate(len(raw) for raw in lines)), tear)]
    good = b"".join(lines[: len(whole)])
    with tempfile.TemporaryDirectory() as root:
        directory = replica_dir(Path(root), REPLICA)
        (directory / f"{1:020d}.open").write_bytes(segment[:tear])
        spool = SpendSpool.open(Path(root), SteppedClock())
        try:
            assert [r for _, recs in segment_records(spool) for r in recs] == whole
            if whole:
                assert (directory / f"{1:020d}.seg").read_bytes() == good
            assert spool.stats().torn_bytes == tear - len(good)
            fresh = record()
            spool.append(fresh)
            assert fresh.seq == len(whole) + 1
        finally:
            spool.close()


@st.composite
def damaged_segments(draw: st.DrawFn) -> tuple[list[bytes], int, bytes]:
    """Lines, the index of the one damaged, and the segment with 1 to 3 of its bytes changed."""
    lines = [line(r) for r in draw(spend_records())]
    hit = draw(st.integers(0, len(lines) - 1))
    damaged = bytearray(lines[hit])
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(damaged) - 1))
        damaged[at] ^= draw(st.integers(1, 255))  # any other byte
    segment = b"".join([*lines[:hit], bytes(damaged), *lines[hit + 1 :]])
    return lines, hit, segment


GLUED = [line(stamped(REPLICA, 1)), line(stamped(REPLICA, 2))]


@SEGMENTS
@given(case=damaged_segments(), decode=st.booleans())
# A damaged `\n` glues two lines together: the intact second one must still be found.
@example(case=(GLUED, 0, GLUED[0][:-1] + b"\x00" + GLUED[1]), decode=True)
def test_damaged_bytes_in_one_line_lose_at_most_that_line_and_alter_no_record(
    case: tuple[list[bytes], int, bytes], decode: bool
) -> None:
    lines, hit, segment = case
    every = [json_part(raw) for raw in lines]
    but_the_damaged = every[:hit] + every[hit + 1 :]
    # All of them only when the JSON survived and the checksum still reads the same number.
    assert scanned_json(segment, decode=decode) in (but_the_damaged, every)


@ON_DISK
@given(case=damaged_segments())
@example(case=(GLUED, 0, GLUED[0][:-1] + b"\x00" + GLUED[1]))
def test_an_open_segment_with_a_damaged_line_keeps_every_other_record_on_start_up(
    case: tuple[list[bytes], int, bytes],
) -> None:
    """Start-up cuts a torn tail off on disk: a damaged line must not make it cut a whole one."""
    lines, hit, segment = case
    records = [msgspec.json.decode(json_part(raw), type=SpendRecord) for raw in lines]
    with tempfile.TemporaryDirectory() as root:
        (replica_dir(Path(root), REPLICA) / f"{1:020d}.open").write_bytes(segment)
        spool = SpendSpool.open(Path(root), SteppedClock())
        try:
            shipped = [r for _, recs in segment_records(spool) for r in recs]
            assert shipped in (records[:hit] + records[hit + 1 :], records)
        finally:
            spool.close()


@SEGMENTS
@given(records=spend_records(), garbage=st.binary(min_size=1, max_size=300), decode=st.booleans())
def test_garbage_after_the_last_line_is_cut_off_as_torn(
    records: list[SpendRecord], garbage: bytes, decode: bool
) -> None:
    segment = b"".join(line(r) for r in records)
    scan = _lines.scan(segment + garbage, decode=decode)
    assert [bytes(json) for json in scan.records] == [msgspec.json.encode(r) for r in records]
    assert (scan.good_end, scan.torn, scan.corrupt) == (len(segment), len(garbage), 0)


@SEGMENTS
@given(
    records=spend_records(),
    garbage=st.lists(st.binary(max_size=80).map(lambda b: b.replace(b"\n", b"")), min_size=1),
)
def test_lines_with_a_good_checksum_ship_only_when_decoded_or_written_by_this_process(
    records: list[SpendRecord], garbage: list[bytes]
) -> None:
    """A checksum vouches that a line is as written: a previous process's segments are decoded
    again, so what is not a record is refused; this process's own are trusted as written."""
    segment = b"".join(line(r) for r in records)
    tail = b"".join(json + _lines.checksum_suffix(json) for json in garbage)
    written = [msgspec.json.encode(r) for r in records]
    assert scanned_json(segment + tail, decode=True) == written
    assert scanned_json(segment + tail, decode=False) == written + [
        json for json in garbage if len(json) > 0
    ]


@ON_DISK
@given(
    records=spend_records(most=3),
    garbage=st.binary(max_size=200),
    where=st.sampled_from(["alone", "after", "before", "between"]),
    suffix=st.sampled_from([".open", ".seg"]),
)
def test_any_bytes_in_a_segment_file_are_recovered_and_loaded_without_an_exception(
    records: list[SpendRecord], garbage: bytes, where: str, suffix: str
) -> None:
    lines = [line(r) for r in records]
    body = {
        "alone": garbage,
        "after": b"".join(lines) + garbage,
        "before": garbage + b"".join(lines),
        "between": lines[0] + garbage + b"".join(lines[1:]),
    }[where]
    with tempfile.TemporaryDirectory() as root:
        directory = replica_dir(Path(root), REPLICA)
        (directory / f"{1:020d}{suffix}").write_bytes(body)
        (directory / "seq").write_text(f"{len(records)}\n")
        spool = SpendSpool.open(Path(root), SteppedClock())
        try:
            shipped = [r for _, recs in segment_records(spool) for r in recs]
            # Garbage may swallow the line it runs into, but never becomes or alters a record.
            assert all(r in records for r in shipped)
            assert [r.seq for r in shipped] == sorted({r.seq for r in shipped})
            survivors = {
                "alone": [],
                "after": records,
                "before": records[1:],
                "between": records[:1] + records[2:],
            }[where]
            assert all(r in shipped for r in survivors)
        finally:
            spool.close()


# -- internal API signatures -----------------------------------------------------------------

METHODS = st.one_of(
    st.sampled_from(["GET", "POST", "PUT", "DELETE", "get", "Post"]), st.text(min_size=1)
)
PATHS = st.one_of(
    st.sampled_from(
        [
            "/api/internal/gateway/changes?since=3&timeout_s=10",
            "/api/internal/gateway/config/vk_1",
            "/api/internal/gateway/health",
        ]
    ),
    st.text(),
)
BODIES = st.one_of(st.just(b""), st.binary(max_size=200), st.just(b"\xff\xfe\x00\x80"))
# HMAC pads a short key with zero bytes, so "k" and "k\0" are one key: not a flaw of this code,
# and an environment variable cannot hold a NUL anyway.
SECRETS = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=80)
TIMESTAMPS = st.integers(0, 10**15 - 1)  # what the header format allows: up to 15 digits
SKEWS = st.floats(-signing.MAX_SKEW_SECONDS, signing.MAX_SKEW_SECONDS)


class Signed(msgspec.Struct):
    secret: str
    method: str
    path: str
    body: bytes
    timestamp: int
    now: float

    @property
    def signature(self) -> str:
        return signing.sign(self.secret, self.method, self.path, self.timestamp, self.body)

    def verify(self, **changed: Any) -> SignatureProblem | None:
        fields: dict[str, Any] = {
            "secret": self.secret,
            "method": self.method,
            "path_and_query": self.path,
            "body": self.body,
            "timestamp": str(self.timestamp),
            "signature": self.signature,
            "now": self.now,
            **changed,
        }
        return signing.verify(**fields)


signed_requests = st.builds(
    lambda secret, method, path, body, timestamp, skew: Signed(
        secret, method, path, body, timestamp, timestamp + skew
    ),
    SECRETS,
    METHODS,
    PATHS,
    BODIES,
    TIMESTAMPS,
    SKEWS,
)


@st.composite
def one_edit(draw: st.DrawFn, text: str, alphabet: st.SearchStrategy[str]) -> str:
    """`text` with one character replaced by another, one inserted or one removed."""
    edits = ["insert", "replace", "delete"] if text else ["insert"]
    at = draw(st.integers(0, max(len(text) - 1, 0)))
    edit = draw(st.sampled_from(edits))
    if edit == "insert":
        return text[:at] + draw(alphabet) + text[at:]
    if edit == "delete":
        return text[:at] + text[at + 1 :]
    return text[:at] + draw(alphabet.filter(lambda c: c != text[at])) + text[at + 1 :]


@st.composite
def one_byte_edit(draw: st.DrawFn, body: bytes) -> bytes:
    as_text = body.decode("latin-1")  # one character per byte
    byte = st.integers(0, 255).map(lambda b: chr(b))
    return draw(one_edit(as_text, byte)).encode("latin-1")


@SIGNATURES
@given(request=signed_requests)
def test_a_signed_request_verifies(request: Signed) -> None:
    assert request.verify() is None
    headers = signing.signed_headers(
        request.secret, request.method, request.path, request.body, request.timestamp + 0.5
    )
    assert (
        signing.verify(
            request.secret,
            request.method,
            request.path,
            request.body,
            headers[signing.TIMESTAMP_HEADER],
            headers[signing.SIGNATURE_HEADER],
            request.now,
        )
        is None
    )


@SIGNATURES
@given(request=signed_requests, data=st.data())
def test_a_changed_body_is_a_mismatch(request: Signed, data: st.DataObject) -> None:
    body = data.draw(one_byte_edit(request.body))
    assert request.verify(body=body) is SignatureProblem.MISMATCH


@SIGNATURES
@given(request=signed_requests, data=st.data())
def test_a_changed_path_or_query_is_a_mismatch(request: Signed, data: st.DataObject) -> None:
    path = data.draw(one_edit(request.path, st.characters(codec="utf-8")))
    assert request.verify(path_and_query=path) is SignatureProblem.MISMATCH


@SIGNATURES
@given(request=signed_requests, data=st.data())
def test_a_changed_method_is_a_mismatch_unless_only_its_case_changed(
    request: Signed, data: st.DataObject
) -> None:
    """HTTP clients upper-case the method, so the signature covers it upper-cased."""
    swapped = st.integers(0, len(request.method) - 1).map(
        lambda at: request.method[:at] + request.method[at].swapcase() + request.method[at + 1 :]
    )
    method = data.draw(one_edit(request.method, st.characters(codec="utf-8")) | swapped)
    same = method.upper() == request.method.upper()
    assert request.verify(method=method) is (None if same else SignatureProblem.MISMATCH)


@SIGNATURES
@given(request=signed_requests, data=st.data())
def test_a_changed_timestamp_never_verifies(request: Signed, data: st.DataObject) -> None:
    sent = str(request.timestamp)
    # Zero-padding is no change: the signature covers the number, not how it is written.
    changed = data.draw(
        one_edit(sent, st.characters(codec="utf-8")).filter(
            lambda t: not (t.isascii() and t.isdigit() and int(t) == request.timestamp)
        )
    )
    assert request.verify(timestamp=changed) is not None
    if re.fullmatch(r"[0-9]{1,15}", changed):
        # Fresh as far as the clock goes: the signature is what refuses it.
        assert request.verify(timestamp=changed, now=float(changed)) is SignatureProblem.MISMATCH


@SIGNATURES
@given(request=signed_requests, data=st.data())
def test_a_changed_signature_is_refused_unless_only_a_letters_case_changed(
    request: Signed, data: st.DataObject
) -> None:
    genuine = request.signature
    at = data.draw(st.integers(0, len(genuine) - 1))
    new = data.draw(st.characters().filter(lambda c: c != genuine[at]))
    problem = request.verify(signature=genuine[:at] + new + genuine[at + 1 :])
    if new == genuine[at].upper():
        assert problem is None
    elif new in string.hexdigits:
        assert problem is SignatureProblem.MISMATCH
    else:
        assert problem is SignatureProblem.MALFORMED


@SIGNATURES
@given(request=signed_requests, other=SECRETS)
def test_a_signature_made_with_another_secret_is_a_mismatch(request: Signed, other: str) -> None:
    if other == request.secret:
        other += "x"
    forged = signing.sign(other, request.method, request.path, request.timestamp, request.body)
    assert request.verify(signature=forged) is SignatureProblem.MISMATCH


@SIGNATURES
@given(
    request=signed_requests,
    timestamp=st.none() | st.text() | TIMESTAMPS.map(str),
    signature=st.none() | st.text() | st.text("0123456789abcdefABCDEF", min_size=64, max_size=64),
)
def test_any_header_values_get_an_answer_never_an_exception(
    request: Signed, timestamp: str | None, signature: str | None
) -> None:
    problem = request.verify(timestamp=timestamp, signature=signature)
    genuine = (str(request.timestamp), request.signature)
    forged = (timestamp, (signature or "").lower()) != genuine
    assert isinstance(problem, SignatureProblem) if forged else problem is None
