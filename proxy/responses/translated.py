"""Which translator takes a Responses request to a provider without the Responses API, and back:
one table, by the provider's wire format.

Chat completions (`responses_openai`), Anthropic's Messages API (`responses_anthropic`),
Bedrock's Converse API (`responses_converse`) and Google's Gemini API (`responses_gemini`): each
entry says what the request is parsed for (the name a refusal gives the target), the operation
a plain and a streamed request call, and how the request, the usage, the answer, an error and a
stream are translated for the credential.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from proxy import usage as U
from proxy.errors import ProxyError
from proxy.providers.base import Operation, Upstream, WireFormat
from proxy.responses.passthrough import PassThrough
from proxy.translate import (
    _converse,
    _gemini,
    _responses_cloud,
    responses_anthropic,
    responses_converse,
    responses_gemini,
    responses_openai,
)
from proxy.translate._common import ANTHROPIC
from proxy.translate._converse import BEDROCK
from proxy.translate._gemini import GEMINI
from proxy.translate._responses_answer import Frame
from proxy.translate._responses_request import Parsed
from proxy.translate.openai_converse import error as converse_error
from proxy.translate.openai_gemini import error as gemini_error
from proxy.translate.responses_openai import CHAT
from proxy.translations import USAGE, UsageReader, anthropic_id

Pipe = (
    PassThrough
    | responses_openai.StreamTranslator
    | responses_anthropic.StreamTranslator
    | _converse.StreamReader
    | _gemini.StreamReader
)
_MAX_TOKENS = {"openai": "max_completion_tokens", "azure_openai": "max_completion_tokens"}
"""OpenAI's own API (and Azure's) refuses `max_tokens` for reasoning models."""


@dataclass(frozen=True, slots=True)
class Translation:
    target: str
    """The provider's API, as a refusal names it (and what the request is parsed for)."""
    plain: Operation
    streamed: Operation
    request: Callable[[Parsed, Upstream], bytes]
    usage: UsageReader
    response: Callable[[bytes, Frame, Upstream], bytes]
    error: Callable[[int, bytes], bytes]
    """The provider's error body (its HTTP status given), in OpenAI's shape, which Responses
    clients read."""
    stream: Callable[[Frame, Upstream], Pipe]


def _chat_request(parsed: Parsed, upstream: Upstream) -> bytes:
    return responses_openai.request(
        parsed,
        upstream.model,
        max_tokens_field=_MAX_TOKENS.get(upstream.kind, "max_tokens"),
        stream_usage=upstream.stream_usage,
    )


def _converse_response(data: bytes, frame: Frame, upstream: Upstream) -> bytes:
    # Converse names no id and no model: a made-up id (sealed) and the credential's model stand in.
    return _responses_cloud.response(_converse.answer(data, anthropic_id(), upstream.model), frame)


def _gemini_response(data: bytes, frame: Frame, upstream: Upstream) -> bytes:
    try:
        answer = _gemini.answer(data, anthropic_id(), upstream.model, "")
    except ProxyError as exc:
        if exc.param == "messages":  # a prompt the safety filters blocked: the Responses name
            exc.param = "input"
        raise
    return _responses_cloud.response(answer, frame)


TRANSLATIONS: dict[WireFormat, Translation] = {
    WireFormat.OPENAI: Translation(
        target=CHAT,
        plain=Operation.CHAT,
        streamed=Operation.CHAT,
        request=_chat_request,
        usage=U.openai_answer,
        response=lambda data, frame, up: responses_openai.response(data, frame),
        # Chat completions' errors are in OpenAI's shape already.
        error=lambda status, data: data,
        stream=lambda frame, up: responses_openai.StreamTranslator(frame),
    ),
    WireFormat.ANTHROPIC: Translation(
        target=ANTHROPIC,
        plain=Operation.MESSAGES,
        streamed=Operation.MESSAGES,
        request=lambda parsed, up: responses_anthropic.request(parsed, up.model),
        usage=U.anthropic_answer,
        response=lambda data, frame, up: responses_anthropic.response(data, frame),
        error=responses_anthropic.error,
        stream=lambda frame, up: responses_anthropic.StreamTranslator(frame),
    ),
    WireFormat.CONVERSE: Translation(
        target=BEDROCK,
        plain=Operation.CONVERSE,
        streamed=Operation.CONVERSE_STREAM,
        request=lambda parsed, up: responses_converse.request(parsed, up.model),
        usage=USAGE[WireFormat.CONVERSE],
        response=_converse_response,
        error=converse_error,
        stream=lambda frame, up: _converse.StreamReader(
            _responses_cloud.ResponsesEvents(frame), anthropic_id(), up.model
        ),
    ),
    WireFormat.GEMINI: Translation(
        target=GEMINI,
        plain=Operation.GENERATE_CONTENT,
        streamed=Operation.STREAM_GENERATE_CONTENT,
        request=lambda parsed, up: responses_gemini.request(parsed),
        usage=USAGE[WireFormat.GEMINI],
        response=_gemini_response,
        error=gemini_error,
        stream=lambda frame, up: _gemini.StreamReader(
            _responses_cloud.ResponsesEvents(frame), anthropic_id(), up.model, ""
        ),
    ),
}
