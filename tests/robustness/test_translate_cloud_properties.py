"""Property tests of the cloud translators' streams: a ConverseStream's event-stream frames and a
Gemini SSE stream, cut anywhere (inside a frame's prelude, a checksum, a CRLF, a UTF-8
character), give the client the same events as the whole stream, in both client formats; and
bytes that are no stream end it with an error, never an exception."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.errors import ProxyError
from proxy.translate import (
    _anthropic_request,
    _openai_request,
    anthropic_converse,
    anthropic_gemini,
    openai_converse,
    openai_gemini,
)
from tests.support import eventstream
from tests.support.streams import cuts

PROPERTIES = settings(max_examples=60, deadline=None)
SAMPLES = Path(__file__).parent.parent / "proxy" / "samples"
CONVERSE = b"".join(
    eventstream.event(name, payload)
    for name, payload in json.loads((SAMPLES / "converse_stream.json").read_bytes())
)
GEMINI = (SAMPLES / "gemini_stream.sse").read_bytes()
Reader = Callable[[], Any]
READERS: dict[str, tuple[bytes, Reader]] = {
    "converse-openai": (CONVERSE, lambda: openai_converse.stream(1, True, "chatcmpl-p", "m")),
    "converse-anthropic": (CONVERSE, lambda: anthropic_converse.stream("msg_p", "m")),
    "gemini-openai": (GEMINI, lambda: openai_gemini.stream(1, True, "chatcmpl-p", "m")),
    "gemini-anthropic": (GEMINI, lambda: anthropic_gemini.stream("msg_p", "m")),
}


def run(reader: Any, pieces: list[bytes]) -> bytes:
    return b"".join(reader.feed(piece) for piece in pieces) + reader.finish()


def frame_edges(stream: bytes) -> list[int]:
    """Where each frame ends, and the bytes around: a frame's prelude and CRCs are 4 bytes."""
    edges, at = [], 0
    while at < len(stream):
        at += int.from_bytes(stream[at : at + 4], "big")
        edges.extend(range(max(at - 6, 0), min(at + 14, len(stream) + 1)))
    return edges


def utf8_inner(stream: bytes) -> list[int]:
    """Offsets inside multi-byte UTF-8 characters and CRLF pairs."""
    return [i for i, byte in enumerate(stream) if byte >= 0x80 or byte == 0x0A]


_MADE_ID = re.compile(rb"call_[0-9a-f]{24}")


def same_ids(events: bytes) -> bytes:
    """The events with the tool call ids made up for calls Gemini named none alike: they are
    random, so each translation of one stream has its own."""
    return _MADE_ID.sub(b"call_made", events)


def check(name: str, pieces: list[bytes]) -> None:
    stream, make = READERS[name]
    whole, cut = make(), make()
    expected = same_ids(run(whole, [stream]))
    assert same_ids(run(cut, pieces)) == expected
    assert (cut.usage, cut.model, cut.errored) == (whole.usage, whole.model, whole.errored)
    assert not whole.errored


@PROPERTIES
@given(data=st.data(), name=st.sampled_from(["converse-openai", "converse-anthropic"]))
def test_converse_frames_cut_anywhere_give_the_same_events(name: str, data: st.DataObject) -> None:
    check(name, data.draw(cuts(CONVERSE, favour=[frame_edges(CONVERSE), utf8_inner(CONVERSE)])))


@PROPERTIES
@given(data=st.data(), name=st.sampled_from(["gemini-openai", "gemini-anthropic"]))
def test_gemini_events_cut_anywhere_give_the_same_events(name: str, data: st.DataObject) -> None:
    check(name, data.draw(cuts(GEMINI, favour=[utf8_inner(GEMINI)])))


@PROPERTIES
@given(noise=st.binary(max_size=300), name=st.sampled_from(sorted(READERS)))
def test_bytes_that_are_no_stream_end_it_with_an_error(noise: bytes, name: str) -> None:
    _, make = READERS[name]
    reader = make()
    out = run(reader, [noise])
    assert reader.errored
    assert b"error" in out


def _stopped_at(stream: bytes) -> int:
    """Where a stream's answer is whole: after Converse's `messageStop` frame (its usage follows,
    but the answer is all there), after Gemini's last event (which holds the finish reason)."""
    if stream is GEMINI:
        return len(stream)
    at = 0
    while at < len(stream):
        length = int.from_bytes(stream[at : at + 4], "big")
        if b"messageStop" in stream[at : at + length]:
            return at + length
        at += length
    raise AssertionError("no messageStop")


@PROPERTIES
@given(
    name=st.sampled_from(sorted(READERS)),
    at=st.integers(min_value=0, max_value=10_000),
)
def test_a_stream_cut_before_its_answer_ended_is_an_error(name: str, at: int) -> None:
    stream, make = READERS[name]
    cut = at % len(stream)
    reader = make()
    out = run(reader, [stream[:cut]])
    if cut < _stopped_at(stream):
        assert reader.errored
        assert b"[DONE]" not in out and b"message_stop" not in out
    else:
        assert not reader.errored
        assert out.endswith(
            (b"data: [DONE]\n\n", b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
        )


OPENAI_FIELDS = frozenset(_openai_request.Request.__struct_fields__)
ANTHROPIC_FIELDS = frozenset(_anthropic_request.Request.__struct_fields__)
unknown_names = st.from_regex(r"[a-z][a-z_]{2,20}", fullmatch=True)


@PROPERTIES
@given(name=unknown_names, value=st.one_of(st.integers(), st.text(max_size=5), st.booleans()))
def test_a_field_no_translator_knows_is_refused_by_name(name: str, value: object) -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    message = {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    for translate, body, known in (
        (openai_converse.request, chat, OPENAI_FIELDS),
        (openai_gemini.request, chat, OPENAI_FIELDS),
        (anthropic_converse.request, message, ANTHROPIC_FIELDS),
        (anthropic_gemini.request, message, ANTHROPIC_FIELDS),
    ):
        if name in known:
            continue
        with pytest.raises(ProxyError) as refused:
            translate(json.dumps({**body, name: value}).encode(), "m")
        assert refused.value.status == 400 and refused.value.param == name
