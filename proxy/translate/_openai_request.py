"""An OpenAI chat completions request as a client sends it, for the translators to other formats.

Every field of OpenAI's schema is declared, and no other (`forbid_unknown_fields`): a field
this module does not know is refused by name, never dropped. Which values a translator can
carry over is its own decision.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

ABSENT = msgspec.Raw(b"null")
"""A `Raw` field left out (msgspec takes no `Raw` in a union: absent and null are one)."""


def absent(value: msgspec.Raw) -> bool:
    return bytes(value) == b"null"


class TextPart(msgspec.Struct, tag_field="type", tag="text", forbid_unknown_fields=True):
    text: str


class ImageURL(msgspec.Struct, forbid_unknown_fields=True):
    url: str
    detail: str | None = None


class ImagePart(msgspec.Struct, tag_field="type", tag="image_url", forbid_unknown_fields=True):
    image_url: ImageURL


class RefusalPart(msgspec.Struct, tag_field="type", tag="refusal", forbid_unknown_fields=True):
    refusal: str


class SystemMessage(msgspec.Struct, tag_field="role", tag="system", forbid_unknown_fields=True):
    content: str | list[TextPart]
    name: str | None = None


class DeveloperMessage(
    msgspec.Struct, tag_field="role", tag="developer", forbid_unknown_fields=True
):
    content: str | list[TextPart]
    name: str | None = None


class UserMessage(msgspec.Struct, tag_field="role", tag="user", forbid_unknown_fields=True):
    content: str | list[TextPart | ImagePart]
    name: str | None = None


class FunctionCall(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    arguments: str


class ToolCall(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    function: FunctionCall
    type: str = "function"


class AssistantMessage(
    msgspec.Struct, tag_field="role", tag="assistant", forbid_unknown_fields=True
):
    content: str | list[TextPart | RefusalPart] | None = None
    tool_calls: list[ToolCall] | None = None
    refusal: str | None = None
    name: str | None = None
    audio: Any = None
    function_call: Any = None


class ToolMessage(msgspec.Struct, tag_field="role", tag="tool", forbid_unknown_fields=True):
    tool_call_id: str
    content: str | list[TextPart]


Message = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage


class FunctionDef(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    description: str | None = None
    parameters: msgspec.Raw = ABSENT  # msgspec takes no Raw in a union: absent or null
    strict: bool | None = None


class ToolDef(msgspec.Struct, tag_field="type", tag="function", forbid_unknown_fields=True):
    function: FunctionDef


class Name(msgspec.Struct, forbid_unknown_fields=True):
    name: str


class NamedChoice(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    function: Name | None = None
    allowed_tools: Any = None
    custom: Any = None


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class ResponseFormat(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    json_schema: Any = None


class Request(msgspec.Struct, forbid_unknown_fields=True):
    messages: list[Message]
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    safety_identifier: str | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # Accepted only at a value that asks for nothing Anthropic would not do anyway.
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    seed: int | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    modalities: list[str] | None = None
    service_tier: str | None = None
    functions: list[Any] | None = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    function_call: Any = None
    prompt_cache_key: Any = None
