"""The stream filter: every byte passes as sent except the usage-only chunk, however it is split;
and the event reader the translators parse streams with."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pytest

from proxy.sse import Event, EventReader, UsageChunkFilter
from proxy.usage import TokenUsage


def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o-mini",
        "choices": choices,
        **extra,
    }


def delta(content: str, finish: str | None = None) -> list[dict[str, Any]]:
    return [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]


USAGE = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}


def event(payload: dict[str, Any] | str, end: str = "\n\n") -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}{end}".encode()


def openai_stream(end: str = "\n\n") -> tuple[bytes, bytes]:
    """A stream with usage requested, and the same stream without its usage-only chunk."""
    events = [
        event(
            chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}}], usage=None), end
        ),
        event(chunk(delta("Hel"), usage=None), end),
        event(chunk(delta("lo"), usage=None), end),
        event(chunk(delta("", "stop"), usage=None), end),
    ]
    usage_only = event(chunk([], usage=USAGE), end)
    done = event("[DONE]", end)
    return b"".join([*events, usage_only, done]), b"".join([*events, done])


def filtered(pieces: Iterable[bytes]) -> tuple[bytes, UsageChunkFilter]:
    usage_filter = UsageChunkFilter()
    out = b"".join(usage_filter.feed(piece) for piece in pieces)
    return out + usage_filter.flush(), usage_filter


@pytest.mark.parametrize("end", ["\n\n", "\r\n\r\n", "\r\r"], ids=["lf", "crlf", "cr"])
def test_usage_only_chunk_is_dropped_and_its_usage_kept(end: str) -> None:
    stream, expected = openai_stream(end)
    out, usage_filter = filtered([stream])
    assert out == expected
    assert usage_filter.usage == TokenUsage(input_tokens=9, output_tokens=3)


def test_stream_without_a_usage_chunk_passes_byte_for_byte() -> None:
    _, stream = openai_stream()
    out, usage_filter = filtered([stream])
    assert out == stream
    assert usage_filter.usage is None


def test_usage_details_are_kept_and_their_chunk_dropped() -> None:
    usage = {
        **USAGE,
        "prompt_tokens_details": {"cached_tokens": 4, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 1},
    }
    out, usage_filter = filtered([event(chunk([], usage=usage)), event("[DONE]")])
    assert out == event("[DONE]")
    assert usage_filter.usage == TokenUsage(
        input_tokens=9, output_tokens=3, cache_read_tokens=4, reasoning_tokens=1
    )


@pytest.mark.parametrize(
    "kept",
    [
        event(chunk(delta("hi"), usage=USAGE)),
        event(chunk(delta("hi"), usage=None)),
        event(chunk([], usage=None)),
        event(chunk([])),
        event('{"choices": [], "usage": {"prompt_tokens": "many"}}'),
        event('{"choices": [], "usage": {"prompt_tokens": 1}'),
        event('[{"choices": [], "usage": {}}]'),
        b'event: usage\ndata: {"note": "\\"usage\\" and \\"choices\\" in text"}\n\n',
        b": keep-alive\n\n",
        event("[DONE]"),
    ],
    ids=[
        "usage-on-a-content-chunk",
        "null-usage",
        "no-choices-null-usage",
        "no-usage-key",
        "unreadable-usage",
        "truncated-json",
        "not-an-object",
        "the-words-in-text",
        "comment",
        "done",
    ],
)
def test_every_other_event_passes_untouched(kept: bytes) -> None:
    out, usage_filter = filtered([kept])
    assert out == kept
    assert usage_filter.usage is None


def test_an_event_gluing_the_usage_chunk_to_other_data_passes_whole() -> None:
    """Two `data:` lines are one event's data: nothing in it may be dropped on its own."""
    glued = (
        b"data: " + json.dumps(chunk(delta("hi"))).encode() + b"\n"
        b"data: " + json.dumps(chunk([], usage=USAGE)).encode() + b"\n\n"
    )
    out, _ = filtered([glued])
    assert out == glued


def test_an_unterminated_last_event_is_passed_on_flush() -> None:
    tail = event(chunk(delta("bye")), end="")
    usage_filter = UsageChunkFilter()
    assert usage_filter.feed(event(chunk(delta("hi"))) + tail) == event(chunk(delta("hi")))
    assert usage_filter.flush() == tail
    assert usage_filter.flush() == b""


def test_an_unterminated_usage_only_chunk_is_dropped_on_flush() -> None:
    usage_filter = UsageChunkFilter()
    assert usage_filter.feed(event(chunk([], usage=USAGE), end="\n")) == b""
    assert usage_filter.flush() == b""
    assert usage_filter.usage == TokenUsage(input_tokens=9, output_tokens=3)


def test_an_event_is_held_only_until_its_blank_line_arrives() -> None:
    first = event(chunk(delta("a")))
    usage_filter = UsageChunkFilter()
    assert usage_filter.feed(first[:-1]) == b""
    assert usage_filter.feed(first[-1:]) == first


def test_many_events_in_one_chunk_come_out_in_order() -> None:
    events = [event(chunk(delta(f"piece {i}"))) for i in range(2_000)]
    usage_only = event(chunk([], usage=USAGE))
    out, usage_filter = filtered([b"".join([*events[:1_000], usage_only, *events[1_000:]])])
    assert out == b"".join(events)
    assert usage_filter.usage == TokenUsage(input_tokens=9, output_tokens=3)


# -- the same output however the stream is cut ------------------------------------------------


def mixed_stream() -> tuple[bytes, bytes]:
    """Terminators of every kind in one stream, chosen to sit next to each other."""
    parts = [
        (event(chunk(delta("a\rb")), "\r\n\r\n"), True),
        (b": ping\r\r", True),
        (event(chunk([], usage=USAGE), "\n\n"), False),
        (event(chunk(delta("c")), "\r\r"), True),
        (event("[DONE]", "\r\n\r\n"), True),
    ]
    return b"".join(p for p, _ in parts), b"".join(p for p, keep in parts if keep)


STREAMS = {
    "lf": openai_stream("\n\n"),
    "crlf": openai_stream("\r\n\r\n"),
    "cr": openai_stream("\r\r"),
    "mixed": mixed_stream(),
}


@pytest.mark.parametrize("name", STREAMS)
def test_output_is_the_same_for_a_cut_at_every_byte(name: str) -> None:
    stream, expected = STREAMS[name]
    whole, _ = filtered([stream])
    assert whole == expected
    for cut in range(len(stream) + 1):
        out, usage_filter = filtered([stream[:cut], stream[cut:]])
        assert out == expected, f"cut at byte {cut}"
        assert usage_filter.usage == TokenUsage(input_tokens=9, output_tokens=3), (
            f"cut at byte {cut}"
        )


@pytest.mark.parametrize("name", STREAMS)
def test_output_is_the_same_fed_one_byte_at_a_time(name: str) -> None:
    stream, expected = STREAMS[name]
    out, usage_filter = filtered(stream[i : i + 1] for i in range(len(stream)))
    assert out == expected
    assert usage_filter.usage == TokenUsage(input_tokens=9, output_tokens=3)


def test_output_is_the_same_for_every_pair_of_cuts() -> None:
    """Three pieces, cut at every pair of bytes, of a short stream with every terminator."""
    stream = (
        b'data: {"choices":[{"delta":{}}]}\r\n\r\n'
        b": ping\r\r"
        b'data: {"choices":[],"usage":{"prompt_tokens":1}}\n\n'
        b'data: {"choices":[]}\r\r'
        b"data: [DONE]\r\n\r\n"
    )
    expected = stream.replace(b'data: {"choices":[],"usage":{"prompt_tokens":1}}\n\n', b"")
    for first in range(len(stream) + 1):
        for second in range(first, len(stream) + 1):
            pieces = [stream[:first], stream[first:second], stream[second:]]
            out, usage_filter = filtered(pieces)
            assert out == expected, f"cuts at {first} and {second}"
            assert usage_filter.usage == TokenUsage(input_tokens=1)


def test_cut_output_is_the_events_so_far() -> None:
    """What comes out before the end is whole events only, never part of one."""
    stream, expected = STREAMS["lf"]
    for cut in range(len(stream) + 1):
        usage_filter = UsageChunkFilter()
        early = usage_filter.feed(stream[:cut])
        assert expected.startswith(early)
        assert early == b"" or early.endswith(b"\n\n")


# -- the served model, and usage read without dropping the chunk --------------------------------


def test_the_served_model_is_read_from_the_first_chunk() -> None:
    stream, _ = openai_stream()
    _, usage_filter = filtered([stream])
    assert usage_filter.model == "gpt-4o-mini"


def test_the_model_is_read_from_a_stream_without_usage() -> None:
    _, stream = openai_stream()
    _, usage_filter = filtered([stream])
    assert usage_filter.model == "gpt-4o-mini"


def test_the_model_of_the_usage_chunk_is_kept_when_it_is_the_first_to_name_one() -> None:
    stream = event({"choices": [{"index": 0, "delta": {"content": "a"}}]}) + event(
        chunk([], usage=USAGE)
    )
    _, usage_filter = filtered([stream])
    assert usage_filter.model == "gpt-4o-mini"


@pytest.mark.parametrize("name", STREAMS)
def test_without_drop_every_byte_passes_at_once_and_usage_is_read(name: str) -> None:
    stream, _ = STREAMS[name]
    for cut in range(len(stream) + 1):
        usage_filter = UsageChunkFilter(drop=False)
        first, second = stream[:cut], stream[cut:]
        assert usage_filter.feed(first) == first
        assert usage_filter.feed(second) == second
        assert usage_filter.flush() == b""
        assert usage_filter.usage == TokenUsage(input_tokens=9, output_tokens=3), f"cut {cut}"


def test_without_drop_an_unterminated_usage_chunk_is_read_on_flush() -> None:
    usage_filter = UsageChunkFilter(drop=False)
    tail = event(chunk([], usage=USAGE), end="")
    assert usage_filter.feed(tail) == tail
    assert usage_filter.flush() == b""
    assert usage_filter.usage == TokenUsage(input_tokens=9, output_tokens=3)


def test_a_chunk_with_usage_null_is_never_decoded_for_usage() -> None:
    """The fast path: `"usage":null` settles it, however much the event looks like usage."""
    usage_filter = UsageChunkFilter()
    kept = b'data: {"model":"m","choices":[],"usage":null}\n\n'
    assert usage_filter.feed(kept) == kept
    assert usage_filter.usage is None


# -- the event reader ---------------------------------------------------------------------------

ANTHROPIC_EVENTS = (
    b"event: message_start\n"
    b'data: {"type":"message_start"}\n\n'
    b": a comment\n\n"
    b"event: ping\n"
    b'data: {"type": "ping"}\n\n'
    b"id: 7\nretry: 10\n"
    b'data: {"a":\n'
    b"data:1}\n\n"
    b"event: lonely\n\n"
)
PARSED = [
    Event(b"message_start", b'{"type":"message_start"}'),
    Event(b"ping", b'{"type": "ping"}'),
    Event(b"", b'{"a":\n1}'),
]


def read(pieces: Iterable[bytes]) -> list[Event]:
    reader = EventReader()
    events = [e for piece in pieces for e in reader.feed(piece)]
    return events + reader.flush()


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
def test_events_are_read_whatever_the_line_endings(end: str) -> None:
    stream = ANTHROPIC_EVENTS.replace(b"\n", end.encode())
    assert read([stream]) == PARSED


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
def test_events_are_the_same_for_a_cut_at_every_byte(end: str) -> None:
    stream = ANTHROPIC_EVENTS.replace(b"\n", end.encode())
    for cut in range(len(stream) + 1):
        assert read([stream[:cut], stream[cut:]]) == PARSED, f"cut at byte {cut}"
    assert read(stream[i : i + 1] for i in range(len(stream))) == PARSED


def test_a_crlf_split_between_its_two_bytes_ends_one_line() -> None:
    reader = EventReader()
    assert reader.feed(b"data: a\r") == []
    assert reader.feed(b"") == []
    assert reader.feed(b"\ndata: b\r") == []
    assert reader.feed(b"\n\r") == [Event(b"", b"a\nb")]
    assert reader.feed(b"\n") == []
    assert reader.flush() == []


def test_flush_hands_over_an_event_whose_blank_line_never_came() -> None:
    reader = EventReader()
    assert reader.feed(b"data: [DONE]") == []
    assert reader.flush() == [Event(b"", b"[DONE]")]
    assert reader.flush() == []


def test_only_complete_events_come_out_before_the_end() -> None:
    reader = EventReader()
    assert reader.feed(b"event: a\ndata: 1\n") == []
    assert reader.feed(b"\nevent: b\n") == [Event(b"a", b"1")]
