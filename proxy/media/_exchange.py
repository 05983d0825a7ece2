"""One audio or image request on its way to an OpenAI-format credential, and what it used."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from proxy.formats import StreamPipe
from proxy.media._reading import EventTap, RawStream, Reading
from proxy.providers import Operation, Upstream
from proxy.providers.base import WireFormat
from proxy.usage import TokenUsage
from vkgate.spend import UsageSource

if TYPE_CHECKING:
    from proxy.dispatch import Outcome
    from vkgate.spend import SpendRecord


NOT_REPORTED = TokenUsage()
"""What `usage_of` says of an answer without usage: read, and found to report none."""


class MediaExchange:
    """The parts every audio and image route shares: same-format pass-through with `model`
    replaced, answers read for their usage, and the outcome record measured.

    A route subclasses it for how its body is patched (`patched`), how its answer is read
    (`read`) and what units its record carries (`units`).
    """

    client = WireFormat.OPENAI
    estimates_output = False
    """An answer's audio or image is no text whose tokens a tokenizer could count."""
    output_is = ""
    """The modality of every output token when the provider does not break them down."""

    def __init__(
        self,
        operation: Operation,
        *,
        stream: bool,
        events: bool,
        same_format_headers: Mapping[str, str] | None = None,
    ) -> None:
        self._operation = operation
        self.stream = stream
        self._events = events
        """A stream of typed server-sent events (else raw bytes, as audio is)."""
        self.same_format_headers = same_format_headers or {}
        self._bodies: dict[bytes, bytes] = {}
        self._reading: Reading | None = None
        """What the answer the client got said it used (the last one read: dispatch commits
        to an answer right after reading it)."""
        self._pipe: EventTap | RawStream | None = None

    def operation(self, upstream: Upstream) -> Operation:
        return self._operation

    def body_for(self, upstream: Upstream) -> bytes:
        body = self._bodies.get(upstream.model_json)
        if body is None:
            body = self._bodies[upstream.model_json] = self.patched(upstream)
        return body

    def patched(self, upstream: Upstream) -> bytes:
        raise NotImplementedError

    def read(self, data: bytes) -> Reading:
        """A plain answer's usage; `MalformedAnswer` when it cannot be an answer."""
        raise NotImplementedError

    def usage_of(
        self, upstream: Upstream, status: int, data: bytes
    ) -> tuple[TokenUsage | None, str | None]:
        self._reading = None
        if status >= 300:
            return None, None
        reading = self.read(data)
        self._reading = reading
        # Never None: dispatch would run a tokenizer over the answer (megabytes of base64 for
        # images) to estimate what `measure` never uses.
        return reading.usage or NOT_REPORTED, reading.model

    def render(self, upstream: Upstream, status: int, data: bytes) -> bytes:
        return data

    def pipe(self, upstream: Upstream) -> StreamPipe:
        pipe = self._pipe = EventTap(self.output_is) if self._events else RawStream()
        return pipe

    def measure(self, record: SpendRecord, outcome: Outcome) -> None:
        """The record's usage: tokens by modality as the provider reported them, and the
        route's units (never a tokenizer's count of an upload)."""
        served = 200 <= record.status < 300
        reading = self._pipe.reading if self._pipe is not None else self._reading
        if not served or reading is None:
            reading = Reading()
        usage = reading.usage
        if usage is not None and served:
            record.input_tokens = max(usage.input_tokens, 0)
            record.output_tokens = max(usage.output_tokens, 0)
            record.input_audio_tokens = reading.input_audio_tokens
            record.input_image_tokens = reading.input_image_tokens
            record.output_audio_tokens = reading.output_audio_tokens
            record.output_image_tokens = reading.output_image_tokens
            record.usage_source = UsageSource.PROVIDER
        else:
            record.input_tokens = record.output_tokens = 0
            record.usage_source = UsageSource.NONE
        if served:
            self.units(record, reading)

    def units(self, record: SpendRecord, reading: Reading) -> None:
        """The route's own units on a served request's record."""
        raise NotImplementedError
