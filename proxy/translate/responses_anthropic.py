"""A client speaking OpenAI's Responses API, a provider speaking Anthropic's Messages API.

Requests: `instructions` and system or developer messages become `system`, in order; input items
become turns, merged where Anthropic's roles must alternate: a `function_call` becomes a
`tool_use` block of the assistant turn, a `function_call_output` a `tool_result` block of a user
turn, a reasoning item this gateway returned (its `encrypted_content` holds Anthropic's
signature) the thinking block it came from. Function tools, `tool_choice`,
`parallel_tool_calls: false`, `max_output_tokens` (`DEFAULT_MAX_TOKENS` when absent: Anthropic
requires one), `temperature` (0 to 1), `top_p`, and `user` or `safety_identifier` (as
`metadata.user_id`) carry over; `text.format` json_schema becomes `output_config.format`
(Anthropic's structured outputs; its `name` is a label and is not sent), `reasoning.effort`
becomes `output_config.effort` (`minimal` as `low`; `none` sends nothing), and a
`reasoning.summary` turns on adaptive thinking, summarized. Refused with a 400 naming them:
built-in tools, `text.format` json_object (Anthropic takes a schema), a format's `description`,
`prompt_cache_key`, files, and what only a stored response can do (`previous_response_id`,
`store: true`, `background`). `text.verbosity` is the one exception, not sent and not refused:
Anthropic has no such setting, and it is a hint about length, not about what to answer.

Answers: text blocks become message items, `tool_use` blocks `function_call` items (the block's
id is the `call_id`), thinking becomes reasoning items whose summary is the thinking text and
whose `encrypted_content` is its signature, so the item can be sent back. `stop_reason`
`max_tokens` makes the response `incomplete` (`max_output_tokens`), `refusal` too
(`content_filter`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from proxy.errors import ProxyError, invalid
from proxy.sse import Event, EventReader
from proxy.translate._common import (
    ANTHROPIC,
    anthropic_image,
    join_turn,
    provider_error,
    refused,
)
from proxy.translate._responses_answer import (
    REDACTED,
    Frame,
    ResponseBuilder,
    encode,
)
from proxy.translate._responses_request import (
    Format,
    FunctionCall,
    FunctionCallOutput,
    FunctionTool,
    InputImage,
    InputText,
    Message,
    NamedFunction,
    OutputText,
    Parsed,
    Reasoning,
    Refusal,
    image_url,
)
from proxy.translate.openai_anthropic import DEFAULT_MAX_TOKENS
from proxy.translate.openai_anthropic import error as openai_error
from proxy.usage import AnthropicUsage, TokenUsage, from_anthropic, updated
from vkgate.errors import ErrorCode

__all__ = ["DEFAULT_MAX_TOKENS", "StreamTranslator", "error", "request", "response"]

_EMPTY_SCHEMA = msgspec.Raw(b'{"type":"object","properties":{}}')
_EMPTY_INPUT = msgspec.Raw(b"{}")
_EFFORT = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "xhigh"}
_INCOMPLETE = {
    "max_tokens": "max_output_tokens",
    "model_context_window_exceeded": "max_output_tokens",
    "refusal": "content_filter",
}
_object = msgspec.json.Decoder(dict[str, msgspec.Raw])

error = openai_error
"""An Anthropic error body in OpenAI's shape, which Responses clients read."""


def request(parsed: Parsed, model: str) -> bytes:
    """A Responses request as an Anthropic Messages request for `model`."""
    fields = parsed.request
    if fields.prompt_cache_key is not None:
        raise refused("prompt_cache_key", ANTHROPIC, ": it caches by `cache_control` markers")
    system, messages = _conversation(parsed)
    limit = fields.max_output_tokens
    out: dict[str, Any] = {
        "model": model,
        "max_tokens": DEFAULT_MAX_TOKENS if limit is None else limit,
    }
    if system:
        out["system"] = system[0]["text"] if len(system) == 1 else system
    out["messages"] = messages
    if fields.temperature is not None:
        if fields.temperature > 1:
            raise refused("temperature", ANTHROPIC, ": its range is 0 to 1")
        out["temperature"] = fields.temperature
    if fields.top_p is not None:
        out["top_p"] = fields.top_p
    if fields.stream:
        out["stream"] = True
    user = _user_id(fields.user, fields.safety_identifier)
    if user is not None:
        out["metadata"] = {"user_id": user}
    if parsed.tools:
        out["tools"] = [_tool(tool) for tool in parsed.tools]
    choice = _tool_choice(parsed)
    if choice is not None:
        out["tool_choice"] = choice
    config = _output_config(parsed)
    if config:
        out["output_config"] = config
    reasoning = fields.reasoning
    if reasoning is not None and (reasoning.summary or reasoning.generate_summary):
        out["thinking"] = {"type": "adaptive", "display": "summarized"}
    return encode(out)


def _user_id(user: str | None, safety_identifier: str | None) -> str | None:
    if user is not None and safety_identifier is not None and user != safety_identifier:
        raise invalid(
            "`user` and `safety_identifier` disagree: Anthropic takes one user id",
            param="safety_identifier",
        )
    return user if user is not None else safety_identifier


def _output_config(parsed: Parsed) -> dict[str, Any]:
    config: dict[str, Any] = {}
    text = parsed.request.text
    if text is not None and text.format is not None and text.format.type != "text":
        config["format"] = _format(text.format)
    reasoning = parsed.request.reasoning
    if reasoning is not None and reasoning.effort not in (None, "none"):
        config["effort"] = _EFFORT[reasoning.effort]
    return config


def _format(format: Format) -> dict[str, Any]:
    if format.type == "json_object":
        raise refused(
            "text.format", ANTHROPIC, ": it takes a JSON schema (`json_schema`), not json_object"
        )
    if format.description is not None:
        raise refused("text.format.description", ANTHROPIC, ": a format there has a schema only")
    if bytes(format.schema) == b"null":
        raise invalid("`text.format.schema` is required", param="text.format.schema")
    return {"type": "json_schema", "schema": format.schema}


def _tool(tool: FunctionTool) -> dict[str, Any]:
    out: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        out["description"] = tool.description
    out["input_schema"] = _EMPTY_SCHEMA if bytes(tool.parameters) == b"null" else tool.parameters
    if tool.strict:
        out["strict"] = True
    return out


def _tool_choice(parsed: Parsed) -> dict[str, Any] | None:
    choice = parsed.request.tool_choice
    out: dict[str, Any] | None
    if choice is None:
        out = None
    elif isinstance(choice, NamedFunction):
        out = {"type": "tool", "name": choice.name}
    else:
        out = {"type": {"auto": "auto", "none": "none", "required": "any"}[choice]}
    if parsed.request.parallel_tool_calls is False and parsed.tools:
        out = out or {"type": "auto"}
        if out["type"] != "none":
            out["disable_parallel_tool_use"] = True
    return out


Blocks = list[dict[str, Any]]


def _conversation(parsed: Parsed) -> tuple[Blocks, list[dict[str, Any]]]:
    system: Blocks = []
    if parsed.request.instructions:
        system.append({"type": "text", "text": parsed.request.instructions})
    turns: list[dict[str, Any]] = []
    for i, item in enumerate(parsed.items):
        at = f"input[{i}]"
        if isinstance(item, Message):
            if item.role in ("system", "developer"):
                system.extend(_text_blocks(item, at))
            elif item.role == "user":
                join_turn(turns, "user", _user_blocks(item, at))
            else:
                join_turn(turns, "assistant", _text_blocks(item, at))
        elif isinstance(item, FunctionCall):
            block = {
                "type": "tool_use",
                "id": item.call_id,
                "name": item.name,
                "input": _arguments(item.arguments, f"{at}.arguments"),
            }
            join_turn(turns, "assistant", [block])
        elif isinstance(item, FunctionCallOutput):
            result = {
                "type": "tool_result",
                "tool_use_id": item.call_id,
                "content": item.output
                if isinstance(item.output, str)
                else _parts(item.output, f"{at}.output"),
            }
            join_turn(turns, "user", [result])
        elif isinstance(item, Reasoning):
            join_turn(turns, "assistant", [_thinking(item, at)])
    return system, turns


def _text(text: str) -> Blocks:
    # Anthropic refuses empty text blocks.
    return [{"type": "text", "text": text}] if text else []


def _text_blocks(message: Message, at: str) -> Blocks:
    if isinstance(message.content, str):
        return _text(message.content)
    blocks: Blocks = []
    for j, part in enumerate(message.content):
        if isinstance(part, InputText | OutputText):
            blocks.extend(_text(part.text))
        elif isinstance(part, Refusal):
            blocks.extend(_text(part.refusal))
        else:
            raise refused(
                f"{at}.content[{j}]", ANTHROPIC, f": a {message.role} message holds text only"
            )
    return blocks


def _user_blocks(message: Message, at: str) -> Blocks:
    if isinstance(message.content, str):
        return _text(message.content)
    return _parts(message.content, f"{at}.content")


def _parts(parts: list[Any], at: str) -> Blocks:
    blocks: Blocks = []
    for j, part in enumerate(parts):
        here = f"{at}[{j}]"
        if isinstance(part, InputImage):
            if part.detail not in (None, "auto"):
                raise refused(f"{here}.detail", ANTHROPIC, ": it has no image detail levels")
            url = image_url(part, here, ANTHROPIC)
            blocks.append(anthropic_image(url, f"{here}.image_url"))
        elif isinstance(part, InputText | OutputText):
            blocks.extend(_text(part.text))
        else:
            raise refused(here, ANTHROPIC, ": a user message holds text and images")
    return blocks


def _arguments(arguments: str, param: str) -> msgspec.Raw:
    """The arguments as the JSON object Anthropic's `input` must be, byte for byte."""
    text = arguments.strip()
    if not text:
        return _EMPTY_INPUT
    try:
        _object.decode(text)
    except msgspec.ValidationError:
        raise invalid(f"`{param}` must be a JSON object", param=param) from None
    except msgspec.DecodeError:
        raise invalid(f"`{param}` is not valid JSON", param=param) from None
    return msgspec.Raw(text.encode())


def _thinking(item: Reasoning, at: str) -> dict[str, Any]:
    """The thinking block a reasoning item of this gateway's came from."""
    sealed = item.encrypted_content
    if not sealed:
        raise invalid(
            f"`{at}` has no `encrypted_content`: a reasoning item is sent back to Anthropic as "
            "the thinking it came from, with its signature",
            param=f"{at}.encrypted_content",
        )
    if sealed.startswith(REDACTED):
        return {"type": "redacted_thinking", "data": sealed[len(REDACTED) :]}
    return {
        "type": "thinking",
        "thinking": "".join(summary.text for summary in item.summary),
        "signature": sealed,
    }


# -- the answer, as Anthropic gives it ---------------------------------------------------------


class _Block(msgspec.Struct):
    type: str = ""
    text: str = ""
    id: str = ""
    name: str = ""
    input: msgspec.Raw = msgspec.Raw(b"null")
    thinking: str = ""
    signature: str = ""
    data: str = ""


class _Message(msgspec.Struct):
    id: str = ""
    model: str = ""
    content: list[_Block] = []
    stop_reason: str | None = None
    usage: AnthropicUsage | None = None


_message = msgspec.json.Decoder(_Message)


def _input_json(value: msgspec.Raw) -> str:
    raw = bytes(value)
    return "" if raw in (b"null", b"{}") else raw.decode()


def response(data: bytes, frame: Frame) -> bytes:
    """An Anthropic message as a response object."""
    try:
        message = _message.decode(data)
    except msgspec.DecodeError:
        raise provider_error("a message was expected") from None
    builder = ResponseBuilder(frame, events=False)
    builder.start(message.id, message.model)
    for index, block in enumerate(message.content):
        _start_block(builder, index, block)
        builder.close(index)
    usage = from_anthropic(message.usage) if message.usage else None
    builder.finish(usage, _INCOMPLETE.get(message.stop_reason or ""))
    return encode(builder.final)


def _start_block(builder: ResponseBuilder, index: int, block: _Block) -> bytes:
    """The item a block opens (with what the block holds already); b"" for blocks a response
    object has no place for (a server tool's)."""
    if block.type == "text":
        return builder.text(index, block.text)
    if block.type == "tool_use":
        return builder.call(index, block.id, block.name) + builder.arguments(
            index, _input_json(block.input)
        )
    if block.type == "thinking":
        out = builder.reasoning(index) + builder.thought(index, block.thinking)
        builder.signature(index, block.signature)
        return out
    if block.type == "redacted_thinking":
        return builder.reasoning(index, redacted=block.data)
    return b""


class _Delta(msgspec.Struct):
    type: str = ""
    text: str = ""
    partial_json: str = ""
    thinking: str = ""
    signature: str = ""
    stop_reason: str | None = None


class _ErrorDetail(msgspec.Struct):
    type: str = ""
    message: str = ""


class _StreamEvent(msgspec.Struct):
    type: str = ""
    message: _Message | None = None
    index: int = 0
    content_block: _Block | None = None
    delta: _Delta | None = None
    usage: AnthropicUsage | None = None
    error: _ErrorDetail | None = None


_event = msgspec.json.Decoder(_StreamEvent)


class StreamTranslator:
    """Anthropic's stream events, cut anywhere, as a Responses stream's typed events.

    Each block is an item, closed at its `content_block_stop`; `message_stop` ends the stream
    with `response.completed` (or `response.incomplete`) and the usage of `message_start` and
    `message_delta`. Anthropic's `error` event, an unreadable event, or a stream that ends
    before its message did, ends it with `response.failed` (an `error` event before the
    response began); `errored` tells.
    """

    def __init__(self, frame: Frame) -> None:
        self._builder = ResponseBuilder(frame)
        self._reader = EventReader()
        self._reported: AnthropicUsage | None = None
        self._stop_reason: str | None = None
        self.usage: TokenUsage | None = None
        self.model: str | None = None
        self.errored = False

    @property
    def sequence(self) -> int:
        return self._builder.sequence

    def feed(self, chunk: bytes) -> bytes:
        return self._translate(self._reader.feed(chunk))

    def finish(self) -> bytes:
        out = self._translate(self._reader.flush())
        if self._builder.ended:
            return out
        if self._stop_reason is not None:  # everything but `message_stop` arrived
            return out + self._end()
        return out + self._fail(
            ProxyError(ErrorCode.PROVIDER_ERROR, "the provider's stream ended before its answer")
        )

    def _translate(self, events: list[Event]) -> bytes:
        out: list[bytes] = []
        for event in events:
            if self._builder.ended:
                break
            if event.name == b"ping":
                continue
            try:
                decoded = _event.decode(event.data)
            except msgspec.DecodeError:
                out.append(self._fail(provider_error("a stream event was not JSON")))
                break
            out.append(self._events(decoded))
        return b"".join(out)

    def _events(self, event: _StreamEvent) -> bytes:
        builder = self._builder
        kind = event.type
        if kind == "content_block_delta" and event.delta is not None:
            delta = event.delta
            if delta.type == "text_delta":
                return builder.text(event.index, delta.text) if delta.text else b""
            if delta.type == "input_json_delta":
                return builder.arguments(event.index, delta.partial_json)
            if delta.type == "thinking_delta":
                return builder.thought(event.index, delta.thinking)
            if delta.type == "signature_delta":
                builder.signature(event.index, delta.signature)
            return b""  # citations and deltas Anthropic may add have no place here
        if kind == "message_start" and event.message is not None:
            self.model = event.message.model
            if event.message.usage is not None:
                self._report(event.message.usage)
            return builder.start(event.message.id, event.message.model)
        if kind == "content_block_start" and event.content_block is not None:
            return _start_block(builder, event.index, event.content_block)
        if kind == "content_block_stop":
            return builder.close(event.index)
        if kind == "message_delta":
            if event.usage is not None:
                self._report(event.usage)
            if event.delta is not None and event.delta.stop_reason is not None:
                self._stop_reason = event.delta.stop_reason
            return b""
        if kind == "message_stop":
            return self._end()
        if kind == "error":
            detail = event.error or _ErrorDetail(message="the provider's stream failed")
            message = detail.message or "the provider's stream failed"
            return self._fail(ProxyError(ErrorCode.PROVIDER_ERROR, message))
        return b""

    def _end(self) -> bytes:
        return self._builder.finish(self.usage, _INCOMPLETE.get(self._stop_reason or ""))

    def _fail(self, error: ProxyError) -> bytes:
        self.errored = True
        return self._builder.fail(error)

    def _report(self, usage: AnthropicUsage) -> None:
        self._reported = updated(self._reported, usage)
        self.usage = from_anthropic(self._reported)
