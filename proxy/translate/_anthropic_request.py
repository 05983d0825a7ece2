"""An Anthropic Messages request as a client sends it, for the translators to the cloud formats.

Every field and block type the translators can carry over is declared, and no other
(`forbid_unknown_fields`, tagged unions): anything else is refused by name, never dropped. `null`
counts as absent.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class CacheControl(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(msgspec.Struct, tag_field="type", tag="text", forbid_unknown_fields=True):
    text: str
    cache_control: CacheControl | None = None
    citations: list[Any] | None = None


class Base64Source(msgspec.Struct, tag_field="type", tag="base64", forbid_unknown_fields=True):
    media_type: str
    data: str


class URLSource(msgspec.Struct, tag_field="type", tag="url", forbid_unknown_fields=True):
    url: str


class PlainTextSource(msgspec.Struct, tag_field="type", tag="text", forbid_unknown_fields=True):
    media_type: str
    data: str


class ImageBlock(msgspec.Struct, tag_field="type", tag="image", forbid_unknown_fields=True):
    source: Base64Source | URLSource
    cache_control: CacheControl | None = None


class DocumentBlock(msgspec.Struct, tag_field="type", tag="document", forbid_unknown_fields=True):
    source: Base64Source | URLSource | PlainTextSource
    title: str | None = None
    context: str | None = None
    citations: Any = None
    cache_control: CacheControl | None = None


class Caller(msgspec.Struct):
    type: str
    tool_id: str | None = None


class ToolUseBlock(msgspec.Struct, tag_field="type", tag="tool_use", forbid_unknown_fields=True):
    id: str
    name: str
    input: msgspec.Raw
    cache_control: CacheControl | None = None
    caller: Caller | None = None
    """Who called the tool: only the model itself (`direct`) can be translated."""


class ToolResultBlock(
    msgspec.Struct, tag_field="type", tag="tool_result", forbid_unknown_fields=True
):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


class ThinkingBlock(msgspec.Struct, tag_field="type", tag="thinking", forbid_unknown_fields=True):
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(
    msgspec.Struct, tag_field="type", tag="redacted_thinking", forbid_unknown_fields=True
):
    data: str


Block = (
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
)


class Message(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolKind(msgspec.Struct):
    type: str | None = None


class Tool(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    input_schema: msgspec.Raw
    description: str | None = None
    strict: bool | None = None
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None


class ChoiceAuto(msgspec.Struct, tag_field="type", tag="auto", forbid_unknown_fields=True):
    disable_parallel_tool_use: bool | None = None


class ChoiceAny(msgspec.Struct, tag_field="type", tag="any", forbid_unknown_fields=True):
    disable_parallel_tool_use: bool | None = None


class ChoiceTool(msgspec.Struct, tag_field="type", tag="tool", forbid_unknown_fields=True):
    name: str
    disable_parallel_tool_use: bool | None = None


class ChoiceNone(msgspec.Struct, tag_field="type", tag="none", forbid_unknown_fields=True):
    pass


ToolChoice = ChoiceAuto | ChoiceAny | ChoiceTool | ChoiceNone


class Thinking(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None
    display: str | None = None


class Metadata(msgspec.Struct, forbid_unknown_fields=True):
    user_id: str | None = None


class OutputFormat(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(msgspec.Struct, forbid_unknown_fields=True):
    effort: str | None = None
    format: OutputFormat | None = None


class Request(msgspec.Struct, forbid_unknown_fields=True):
    messages: list[Message]
    max_tokens: int
    model: str | None = None
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: Metadata | None = None
    stream: bool | None = None
    tools: list[msgspec.Raw] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    service_tier: str | None = None
    cache_control: CacheControl | None = None
    # Refused whatever their value but null.
    container: Any = None
    mcp_servers: Any = None
    context_management: Any = None


request = msgspec.json.Decoder(Request)
tool_kind = msgspec.json.Decoder(ToolKind)
tool = msgspec.json.Decoder(Tool)
