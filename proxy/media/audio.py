"""`POST /v1/audio/speech`, `/v1/audio/transcriptions` and `/v1/audio/translations`.

Speech is JSON in and audio out, streamed to the client as the provider sends it (or its typed
events, with `stream_format: "sse"`); it is measured in the characters of its input. The other
two are uploads (multipart), answered in the `response_format` asked (JSON, text, SRT, WebVTT,
verbose JSON) or, for a streamed transcription, as typed events; they are measured in seconds
of audio: the provider's figure when it gives one (`usage`, or `verbose_json`'s `duration`),
else an estimate (`estimated_seconds`).
"""

from __future__ import annotations

import re
import struct
from typing import Annotated

import msgspec

from proxy import body as B
from proxy import multipart
from proxy.asgi import Head
from proxy.errors import invalid
from proxy.limits.budgets import Worst
from proxy.limits.cost import BYTES_PER_TOKEN_AT_MOST, BYTES_PER_TOKEN_TYPICAL, Units
from proxy.media._exchange import MediaExchange
from proxy.media._reading import Reading, json_answer
from proxy.prepared import Prepared
from proxy.providers import Operation, Upstream
from proxy.runtime import KeyRuntime
from vkgate.spend import SpendRecord, UsageSource

LOWEST_BITRATE = 6_000
"""Bits a second below which no upload's audio goes: Opus (in the `ogg` and `webm` uploads
take) reaches down to 6 kbit/s, the leanest of the formats accepted. A budget reserves an
upload's size at this rate, unless its header says its duration (WAV)."""
ESTIMATE_BITRATE = 64_000
"""Bits a second taken for an upload whose provider said nothing of its duration (`text`
answers) and whose header does not say it either: a usual rate for speech in MP3 or M4A."""
AUDIO_TOKENS_PER_SECOND_AT_MOST = 20
"""Audio tokens a second of input may make, for a budget's worst case on a model priced by
tokens: OpenAI prices gpt-4o-transcribe at about $0.006 a minute, 1,000 audio tokens a
minute at its $6 per million."""
_JSON_FORMATS = frozenset(("json", "verbose_json", "diarized_json"))
_TEXT_FORMATS = frozenset(("text", "srt", "vtt"))
_CUE = re.compile(rb"-->\s*(?:(\d+):)?(\d{1,2}):(\d{2})[.,](\d{3})")
"""The end time of an SRT or WebVTT cue (`--> 00:01:02,500`; WebVTT may leave hours out)."""

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class SpeechFields(msgspec.Struct):
    model: B.Model
    input: NonEmpty
    voice: msgspec.Raw
    stream_format: str | None = None


_speech = msgspec.json.Decoder(SpeechFields)


class SpeechExchange(MediaExchange):
    output_is = "audio"

    def __init__(self, body: bytes, requested: str, characters: int, events: bool) -> None:
        super().__init__(Operation.SPEECH, stream=True, events=events)
        self._body = body
        self._requested = requested
        self._characters = characters

    def patched(self, upstream: Upstream) -> bytes:
        return B.patch_model(self._body, self._requested, upstream.model_json)

    def read(self, data: bytes) -> Reading:
        return Reading()  # never called: speech is always streamed

    def units(self, record: SpendRecord, reading: Reading) -> None:
        record.input_characters = self._characters


def speech(runtime: KeyRuntime, head: Head, body: bytes) -> Prepared:
    fields = B.fields(_speech, body)
    if fields.stream_format not in (None, "audio", "sse"):
        raise invalid("stream_format must be audio or sse", param="stream_format")
    characters = len(fields.input)
    exchange = SpeechExchange(body, fields.model, characters, fields.stream_format == "sse")
    text = len(fields.input.encode())
    worst = Worst(text // BYTES_PER_TOKEN_AT_MOST + 1, None, Units(characters=characters))
    return Prepared(
        fields.model,
        exchange,
        head.end_user,
        body,
        meter=exchange,
        estimate=text // BYTES_PER_TOKEN_TYPICAL + 1,
        worst=worst,
    )


class TranscriptionExchange(MediaExchange):
    """A transcription or a translation: an upload, answered in the format asked."""

    def __init__(
        self,
        operation: Operation,
        form: multipart.Form,
        model: multipart.Part,
        content_type: str,
        *,
        response_format: str,
        stream: bool,
        estimated_seconds: float,
    ) -> None:
        super().__init__(
            operation,
            stream=stream,
            events=stream,
            # The body's own boundary: the form is forwarded as it came.
            same_format_headers={"Content-Type": content_type},
        )
        self._form = form
        self._model = model
        self._format = response_format
        self._estimated = estimated_seconds
        self._cues: float | None = None

    def patched(self, upstream: Upstream) -> bytes:
        return self._form.with_value(self._model, upstream.model.encode())

    def read(self, data: bytes) -> Reading:
        self._cues = None
        if self._format in _TEXT_FORMATS:
            if self._format != "text":
                self._cues = cues_end(data)
            return Reading()
        return json_answer(data)

    def units(self, record: SpendRecord, reading: Reading) -> None:
        if reading.audio_seconds is not None:
            record.audio_seconds = round(reading.audio_seconds, 3)
            record.usage_source = UsageSource.PROVIDER
        elif record.usage_source != UsageSource.PROVIDER:
            # Nothing reported (a `text`, `srt` or `vtt` answer): the subtitles' last cue,
            # else the upload's own header or size.
            seconds = self._cues if self._cues is not None else self._estimated
            record.audio_seconds = round(seconds, 3)
            record.usage_source = UsageSource.ESTIMATED


def transcription(runtime: KeyRuntime, head: Head, body: bytes) -> Prepared:
    return _upload(Operation.TRANSCRIPTION, head, body)


def translation(runtime: KeyRuntime, head: Head, body: bytes) -> Prepared:
    return _upload(Operation.TRANSLATION, head, body)


def _upload(operation: Operation, head: Head, body: bytes) -> Prepared:
    form = multipart.parse(head.content_type, body)
    model, alias = model_field(form)
    files = form.files("file")
    if len(files) != 1:
        raise invalid(
            "the form must carry exactly one audio file, as its `file` field", param="file"
        )
    (audio,) = files
    response_format = form.text("response_format") or "json"
    if response_format not in _JSON_FORMATS | _TEXT_FORMATS:
        raise invalid(
            "response_format must be json, text, srt, verbose_json, vtt or diarized_json",
            param="response_format",
        )
    stream = flag(form, "stream")
    if stream and operation is Operation.TRANSLATION:
        raise invalid("translations are not streamed", param="stream")
    header_seconds = wav_seconds(body, audio)
    prompt = len(form.text("prompt") or "")
    at_most = header_seconds if header_seconds is not None else audio.size * 8 / LOWEST_BITRATE
    exchange = TranscriptionExchange(
        operation,
        form,
        model,
        head.content_type.decode("latin-1") if head.content_type else "",
        response_format=response_format,
        stream=stream,
        estimated_seconds=(
            header_seconds if header_seconds is not None else audio.size * 8 / ESTIMATE_BITRATE
        ),
    )
    worst = Worst(
        prompt // BYTES_PER_TOKEN_AT_MOST + 1 + int(at_most * AUDIO_TOKENS_PER_SECOND_AT_MOST),
        None,
        Units(audio_seconds=at_most),
    )
    return Prepared(
        alias,
        exchange,
        head.end_user,
        body,
        meter=exchange,
        estimate=prompt // BYTES_PER_TOKEN_TYPICAL + 1,
        worst=worst,
    )


def model_field(form: multipart.Form) -> tuple[multipart.Part, str]:
    """The form's `model` part and its value: the alias routing needs."""
    part = form.first("model")
    value = form.text("model")
    if part is None or not value:
        raise invalid("the form has no `model` field", param="model")
    return part, value


def flag(form: multipart.Form, name: str) -> bool:
    """A boolean form field (`true`/`false`, as SDKs write it); absent is false."""
    value = form.text(name)
    if value is None:
        return False
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise invalid(f"{name} must be true or false, got {value[:20]!r}", param=name)
    return lowered == "true"


def wav_seconds(body: bytes, part: multipart.Part) -> float | None:
    """A WAV upload's duration from its header (its data size over its byte rate), or None
    for any other file."""
    start, end = part.start, part.end
    if (
        end - start < 44
        or body[start : start + 4] != b"RIFF"
        or body[start + 8 : start + 12] != b"WAVE"
    ):
        return None
    at = start + 12
    byte_rate = 0
    while at + 8 <= end:
        chunk, size = body[at : at + 4], struct.unpack_from("<I", body, at + 4)[0]
        if chunk == b"fmt " and size >= 16 and at + 24 <= end:
            byte_rate = struct.unpack_from("<I", body, at + 16)[0]
        elif chunk == b"data":
            if not byte_rate:
                return None
            # A streamed WAV may say 0 or 0xFFFFFFFF: what the upload holds counts then.
            held = end - at - 8
            return min(size, held) / byte_rate if 0 < size < 0xFFFFFFFF else held / byte_rate
        at += 8 + size + (size & 1)
    return None


def cues_end(data: bytes) -> float | None:
    """When the last cue of an SRT or WebVTT answer ends, in seconds; None without cues."""
    latest: float | None = None
    for hours, minutes, seconds, millis in _CUE.findall(data):
        moment = int(hours or 0) * 3600 + int(minutes) * 60 + int(seconds) + int(millis) / 1000
        latest = moment if latest is None else max(latest, moment)
    return latest
