"""What an audio or image answer says it used, read from its JSON or from its event stream."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from proxy.sse import Event, EventReader
from proxy.usage import MalformedAnswer, TokenUsage


@dataclass(slots=True)
class Reading:
    """The usage an answer reported, in every unit the provider gave."""

    usage: TokenUsage | None = None
    input_audio_tokens: int = 0
    output_audio_tokens: int = 0
    input_image_tokens: int = 0
    output_image_tokens: int = 0
    audio_seconds: float | None = None
    """As the provider reported it (`usage.seconds`, or `verbose_json`'s `duration`)."""
    images: int = 0
    image_size: str | None = None
    image_quality: str | None = None
    model: str | None = None


class _Details(msgspec.Struct):
    audio_tokens: int | None = None
    image_tokens: int | None = None
    text_tokens: int | None = None


class MediaUsage(msgspec.Struct):
    """Every `usage` shape of the audio and image APIs: tokens (with details by modality, named
    `input_token_details` by audio and `input_tokens_details` by images) or a duration."""

    type: str | None = None
    seconds: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    input_token_details: _Details | None = None
    input_tokens_details: _Details | None = None
    output_tokens_details: _Details | None = None


class _Answer(msgspec.Struct):
    """A transcription, translation or image answer: only what accounting reads is decoded."""

    model: str | None = None
    usage: MediaUsage | None = None
    duration: float | None = None
    data: list[msgspec.Raw] | None = None
    size: str | None = None
    quality: str | None = None


class _Event(msgspec.Struct):
    type: str = ""
    usage: MediaUsage | None = None
    size: str | None = None
    quality: str | None = None


_answer = msgspec.json.Decoder(_Answer)
_event = msgspec.json.Decoder(_Event)


def add_usage(reading: Reading, usage: MediaUsage, *, output_is: str = "") -> None:
    """`usage` into `reading`; `output_is` names the modality every output token has when the
    provider does not break them down (`audio` for speech, `image` for images)."""
    if usage.seconds is not None:
        reading.audio_seconds = max(usage.seconds, 0.0)
    if usage.input_tokens is None and usage.output_tokens is None:
        return
    inputs = max(usage.input_tokens or 0, 0)
    outputs = max(usage.output_tokens or 0, 0)
    reading.usage = TokenUsage(input_tokens=inputs, output_tokens=outputs)
    details = usage.input_token_details or usage.input_tokens_details
    if details is not None:
        reading.input_audio_tokens = min(max(details.audio_tokens or 0, 0), inputs)
        reading.input_image_tokens = min(max(details.image_tokens or 0, 0), inputs)
    out = usage.output_tokens_details
    if out is not None:
        reading.output_audio_tokens = min(max(out.audio_tokens or 0, 0), outputs)
        reading.output_image_tokens = min(max(out.image_tokens or 0, 0), outputs)
    elif output_is == "audio":
        reading.output_audio_tokens = outputs
    elif output_is == "image":
        reading.output_image_tokens = outputs


def json_answer(data: bytes, *, output_is: str = "") -> Reading:
    """A JSON answer's usage; `MalformedAnswer` when it is not JSON at all."""
    try:
        answer = _answer.decode(data)
    except (msgspec.ValidationError, RecursionError):
        return Reading()  # JSON of another shape: nothing reported
    except msgspec.DecodeError:
        raise MalformedAnswer from None
    reading = Reading(model=answer.model, image_size=answer.size, image_quality=answer.quality)
    if answer.usage is not None:
        add_usage(reading, answer.usage, output_is=output_is)
    if reading.audio_seconds is None and answer.duration is not None:
        reading.audio_seconds = max(answer.duration, 0.0)
    if answer.data is not None:
        reading.images = len(answer.data)
    return reading


class RawStream:
    """An answer streamed as the provider sends it (audio bytes): nothing is read from it."""

    __slots__ = ("reading",)
    errored = False

    def __init__(self) -> None:
        self.reading = Reading()

    @property
    def usage(self) -> TokenUsage | None:
        return None

    @property
    def model(self) -> str | None:
        return None

    def feed(self, data: bytes) -> bytes:
        return data

    def finish(self) -> bytes:
        return b""


class EventTap:
    """A typed event stream (`transcript.text.done`, `image_generation.completed`,
    `speech.audio.done`, …) passed through untouched, its usage read on the way.

    Events with a `usage` are decoded (only their type, usage, size and quality); each
    `….completed` event of an image stream is one image made.
    """

    __slots__ = ("_output_is", "_pending", "_reader", "reading")
    errored = False

    def __init__(self, output_is: str = "") -> None:
        self._reader = EventReader()
        self._output_is = output_is
        self._pending: list[bytes] = []
        """Chunks with no event's end in them: an image event is megabytes of base64, and
        handing each chunk to the reader would copy its growing line again and again."""
        self.reading = Reading()

    @property
    def usage(self) -> TokenUsage | None:
        return self.reading.usage

    @property
    def model(self) -> str | None:
        return None

    def feed(self, data: bytes) -> bytes:
        self._pending.append(data)
        if b"\n\n" in data or b"\r\n\r\n" in data or data[:1] in (b"\n", b"\r"):
            self._take()
        return data

    def finish(self) -> bytes:
        self._take()
        self._read(self._reader.flush())
        return b""

    def _take(self) -> None:
        if self._pending:
            joined = b"".join(self._pending)
            self._pending.clear()
            self._read(self._reader.feed(joined))

    def _read(self, events: list[Event]) -> None:
        for _, data in events:
            if b'"usage"' not in data and b".completed" not in data:
                continue  # a delta: nothing to account
            try:
                event = _event.decode(data)
            except msgspec.DecodeError:
                continue
            if event.type.startswith("image_") and event.type.endswith(".completed"):
                self.reading.images += 1
                self.reading.image_size = event.size or self.reading.image_size
                self.reading.image_quality = event.quality or self.reading.image_quality
            if event.usage is not None:
                self._add(event.usage)

    def _add(self, usage: MediaUsage) -> None:
        reading = self.reading
        if reading.usage is None or usage.input_tokens is None:
            add_usage(reading, usage, output_is=self._output_is)
            return
        # One usage per image in a stream of several: they add up.
        before = (
            reading.usage,
            (
                reading.input_audio_tokens,
                reading.input_image_tokens,
                reading.output_audio_tokens,
                reading.output_image_tokens,
            ),
        )
        add_usage(reading, usage, output_is=self._output_is)
        (earlier, counts), now = before, reading.usage
        assert now is not None
        now.input_tokens += earlier.input_tokens
        now.output_tokens += earlier.output_tokens
        reading.input_audio_tokens += counts[0]
        reading.input_image_tokens += counts[1]
        reading.output_audio_tokens += counts[2]
        reading.output_image_tokens += counts[3]
