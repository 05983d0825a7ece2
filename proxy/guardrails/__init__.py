"""Guardrails in the pipeline: the request's text checked before any provider sees it, the
answer's before the client does (a stream's through a bounded window).

A key without guardrails has no `KeyGuardrails` (None on its runtime): its requests pay
nothing. Logs, metrics and spend records name guardrails, never the text they matched.
"""

from __future__ import annotations

from typing import Any

import msgspec

from proxy.documents import (
    ANSWERED,
    Shape,
    answer_texts,
    chat_answer_texts,
    texts,
)
from proxy.guardrails._guards import (
    REQUEST,
    RESPONSE,
    GuardrailBlocked,
    KeyGuardrails,
    Verdicts,
    guardrails_of,
    screen_texts,
    skipped,
    warnings,
)
from proxy.guardrails._remote import RemoteChecks
from proxy.guardrails._stream import StreamScreen

__all__ = [
    "REQUEST",
    "RESPONSE",
    "AnswerScreen",
    "GuardrailBlocked",
    "KeyGuardrails",
    "RemoteChecks",
    "StreamScreen",
    "Verdicts",
    "guardrails_of",
    "request_passes",
    "screen_request",
    "skipped",
    "warnings",
]
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def _document(body: bytes) -> Any:
    try:
        return _decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None


def request_passes(
    guardrails: KeyGuardrails, verdicts: Verdicts, messages: list[msgspec.Raw] | None
) -> bool:
    """Whether every request guardrail passes a chat request's `messages` (each its JSON as
    sent) in this process: they all match patterns here, and find nothing (noted in
    `verdicts`). Otherwise `screen_request` reads the request."""
    if not guardrails.request:
        return True
    local = guardrails.request_local
    return local is not None and messages is not None and local.passes_messages(messages, verdicts)


async def screen_request(
    guardrails: KeyGuardrails,
    remote: RemoteChecks | None,
    verdicts: Verdicts,
    shape: Shape,
    body: bytes,
    model: str,
    *,
    looked: bool = False,
) -> bytes | None:
    """The request guardrails over the request's text: None to send it as it is, or the body
    with its redactions (a block raises `GuardrailBlocked`). `looked`: the pattern guardrails
    have read these texts already (`request_passes`), so they run in turn at once."""
    guards = guardrails.request
    if not guards:
        return None
    doc = None if shape is Shape.UPLOAD else _document(body)
    if doc is None:
        # An upload's form (audio, images to edit) holds no text these read.
        skipped(guards, verdicts, REQUEST)
        return None
    slots = texts(shape, doc)
    values = [container[key] for container, key in slots]
    local = None if looked else guardrails.request_local
    if local is not None and local.passes(values, verdicts):
        return None
    if not await screen_texts(guards, remote, verdicts, REQUEST, model, values):
        return None
    for (container, key), value in zip(slots, values, strict=True):
        container[key] = value
    return _encode(doc)


class AnswerScreen:
    """The response guardrails of one request, for its answer: plain or streamed."""

    __slots__ = (
        "_guards",
        "_local",
        "_looked",
        "_model",
        "_remote",
        "_shape",
        "_warns",
        "verdicts",
    )

    def __init__(
        self,
        guardrails: KeyGuardrails,
        remote: RemoteChecks | None,
        verdicts: Verdicts,
        shape: Shape,
        model: str,
    ) -> None:
        self._guards = guardrails.response
        self._local = guardrails.response_local
        self._warns = guardrails.warns
        self._remote = remote
        self.verdicts = verdicts
        self._shape = shape
        self._model = model
        self._looked = False
        """`passes` read the answer and found something: `plain` runs the guardrails in turn."""

    @classmethod
    def of(
        cls,
        guardrails: KeyGuardrails | None,
        remote: RemoteChecks | None,
        verdicts: Verdicts,
        shape: Shape,
        model: str,
    ) -> AnswerScreen | None:
        """The screen for a request, or None when no response guardrail applies; one that
        cannot read the route's answers (embeddings, audio, images) is skipped."""
        if guardrails is None or not guardrails.response:
            return None
        if shape not in ANSWERED:
            skipped(guardrails.response, verdicts, RESPONSE)
            return None
        return cls(guardrails, remote, verdicts, shape, model)

    def passes(self, body: bytes) -> bool:
        """Whether every response guardrail passes a plain chat answer in this process: they
        all match patterns here, and find nothing (noted in `verdicts`). Otherwise `plain`
        reads the answer."""
        local = self._local
        if local is None or self._shape is not Shape.CHAT:
            return False
        read = chat_answer_texts(body)
        if read is None:
            return False
        if local.passes(read, self.verdicts):
            return True
        self._looked = True
        return False

    async def plain(self, body: bytes) -> bytes:
        """A plain answer in the client's format, redacted where it must be (a block raises)."""
        local = None if self._looked else self._local
        doc = _document(body)
        if doc is None:
            skipped(self._guards, self.verdicts, RESPONSE)
            return body
        slots = answer_texts(self._shape, doc)
        values = [container[key] for container, key in slots]
        if local is not None and local.passes(values, self.verdicts):
            return body
        if not await screen_texts(
            self._guards, self._remote, self.verdicts, RESPONSE, self._model, values
        ):
            return body
        for (container, key), value in zip(slots, values, strict=True):
            container[key] = value
        return _encode(doc)

    def stream(self) -> StreamScreen:
        return StreamScreen(self._guards, self._remote, self.verdicts, self._shape, self._model)

    def warnings(self) -> tuple[tuple[bytes, bytes], ...]:
        """The warning header for the response stage's guardrails alone (the request stage's
        went on the answer's headers already)."""
        if not self._warns:
            return ()
        stage = RESPONSE + ":"
        return warnings({k: v for k, v in self.verdicts.items() if k.startswith(stage)})
