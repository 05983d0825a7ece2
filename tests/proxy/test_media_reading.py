"""Reading what audio and image answers used, without the rest of the proxy: typed event streams
however they are cut, JSON answers of every shape, subtitles' last cue and a WAV header's length."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import multipart
from proxy.media._reading import EventTap, json_answer
from proxy.media.audio import cues_end, wav_seconds
from proxy.usage import MalformedAnswer
from tests.support.fake_openai_media import wav
from tests.support.streams import cuts


def sse(*events: dict[str, object], ending: str = "\n") -> bytes:
    return b"".join(
        f"event: {e['type']}{ending}data: {json.dumps(e)}{ending}{ending}".encode() for e in events
    )


USAGE = {
    "input_tokens": 9,
    "input_tokens_details": {"text_tokens": 9, "image_tokens": 0},
    "output_tokens": 272,
    "total_tokens": 281,
}
IMAGES = sse(
    {"type": "image_generation.partial_image", "b64_json": "A" * 3000},
    {"type": "image_generation.completed", "b64_json": "B" * 5000, "size": "1024x1024",
     "quality": "low", "usage": USAGE},
    {"type": "image_generation.completed", "b64_json": "C" * 5000, "size": "1024x1024",
     "quality": "low", "usage": USAGE},
)  # fmt: skip


@settings(max_examples=80, deadline=None)
@given(pieces=cuts(IMAGES), crlf=st.booleans())
def test_an_image_stream_cut_anywhere_is_passed_whole_and_counted_once(
    pieces: list[bytes], crlf: bool
) -> None:
    if crlf:
        stream = IMAGES.replace(b"\n", b"\r\n")
        pieces = [stream]
    tap = EventTap("image")
    passed = b"".join(tap.feed(piece) for piece in pieces) + tap.finish()
    assert passed == b"".join(pieces)
    reading = tap.reading
    assert (reading.images, reading.image_size, reading.image_quality) == (2, "1024x1024", "low")
    assert reading.usage is not None
    assert (reading.usage.input_tokens, reading.usage.output_tokens) == (18, 544)
    assert reading.output_image_tokens == 544


def test_a_transcription_stream_reads_the_usage_of_its_done_event() -> None:
    stream = sse(
        {"type": "transcript.text.delta", "delta": "Hi"},
        {
            "type": "transcript.text.done",
            "text": "Hi",
            "usage": {
                "type": "tokens",
                "input_tokens": 20,
                "input_token_details": {"audio_tokens": 15, "text_tokens": 5},
                "output_tokens": 2,
                "total_tokens": 22,
            },
        },
    )
    tap = EventTap()
    tap.feed(stream[:7])
    tap.feed(stream[7:])
    tap.finish()
    assert tap.usage is not None and (tap.usage.input_tokens, tap.usage.output_tokens) == (20, 2)
    assert tap.reading.input_audio_tokens == 15


@pytest.mark.parametrize(
    ("answer", "seconds", "tokens"),
    [
        ({"text": "x", "usage": {"type": "duration", "seconds": 7}}, 7.0, None),
        ({"text": "x", "duration": 8.47, "usage": {"type": "duration", "seconds": 9}}, 9.0, None),
        ({"text": "x", "duration": 8.47}, 8.47, None),
        ({"text": "x"}, None, None),
        (
            {"text": "x", "usage": {"type": "tokens", "input_tokens": 5, "output_tokens": 2}},
            None,
            5,
        ),
        ({"unexpected": [1, 2]}, None, None),
        ([1, 2, 3], None, None),
    ],
)
def test_a_json_answer_says_its_seconds_or_tokens_when_it_has_them(
    answer: object, seconds: float | None, tokens: int | None
) -> None:
    reading = json_answer(json.dumps(answer).encode())
    assert reading.audio_seconds == seconds
    assert (reading.usage.input_tokens if reading.usage else None) == tokens


def test_an_answer_that_is_not_json_is_malformed() -> None:
    with pytest.raises(MalformedAnswer):
        json_answer(b"<html>bad gateway</html>")


def test_subtitles_end_at_their_last_cue() -> None:
    srt = b"1\n00:00:00,000 --> 00:00:02,500\nA\n\n2\n00:01:02,000 --> 01:00:03,250\nB\n"
    assert cues_end(srt) == 3603.25
    assert cues_end(b"WEBVTT\n\n00:01.000 --> 00:04.500\nshort form\n") == 4.5
    assert cues_end(b"no cues at all") is None


def test_a_wav_upload_says_its_own_duration_and_another_file_does_not() -> None:
    for data, seconds in ((wav(2.5), 2.5), (b"ID3" + b"\x00" * 100, None)):
        body = b"--b\r\ncontent-disposition: form-data; name=file; filename=a\r\n\r\n"
        body += data + b"\r\n--b--\r\n"
        [part] = multipart.parse(b"multipart/form-data; boundary=b", body).parts
        assert wav_seconds(body, part) == seconds
