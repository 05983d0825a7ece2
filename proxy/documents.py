"""Where a request's text, tools, links and output bound lie, route by route.

Policy rules and guardrails read requests in the client's own format; these walkers find the
parts in a decoded body, as places (`Slot`s) that can be read and written, so a redaction edits
the text where it stands and the rest of the body is left as the client wrote it.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import Enum
from typing import Any

import msgspec


class Shape(Enum):
    """What a route's request body is."""

    CHAT = "chat"
    """OpenAI chat completions."""
    MESSAGES = "messages"
    """Anthropic messages."""
    RESPONSES = "responses"
    EMBEDDINGS = "embeddings"
    IMAGES = "images"
    """An image generation (JSON, `prompt`)."""
    SPEECH = "speech"
    """Text to speech (JSON, `input`)."""
    UPLOAD = "upload"
    """A multipart form (transcriptions, translations, image edits)."""
    GEMINI = "gemini"
    """Google's Gemini API generating content (`contents`)."""
    GEMINI_EMBED = "gemini_embed"
    """Google's Gemini API embedding or counting (`content`, `requests` or `contents`)."""


Slot = tuple[Any, Any]
"""A container and a key in it (`slot[0][slot[1]]`) holding a string."""


def _string(container: Any, key: Any) -> Iterator[Slot]:
    if isinstance(container, dict | list):
        try:
            value = container[key]
        except (KeyError, IndexError):
            return
        if isinstance(value, str):
            yield container, key


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dicts(value: Any) -> Iterator[dict[str, Any]]:
    for item in _items(value):
        if isinstance(item, dict):
            yield item


_CHAT_PARTS = ("text", "input_text", "output_text")


def _is_text_part(part: Any) -> bool:
    """A chat content part whose `text` a model reads."""
    return (
        isinstance(part, dict)
        and part.get("type") in _CHAT_PARTS
        and isinstance(part.get("text"), str)
    )


def _chat_content(message: dict[str, Any]) -> Iterator[Slot]:
    content = message.get("content")
    if isinstance(content, str):
        yield message, "content"
    for part in _items(content):
        if _is_text_part(part):
            yield part, "text"


def _anthropic_blocks(owner: dict[str, Any], key: str) -> Iterator[Slot]:
    blocks = owner.get(key)
    if isinstance(blocks, str):
        yield owner, key
    for block in _dicts(blocks):
        kind = block.get("type")
        if kind == "text":
            yield from _string(block, "text")
        elif kind == "tool_result":
            yield from _anthropic_blocks(block, "content")


def _gemini_parts(content: Any) -> Iterator[Slot]:
    if isinstance(content, dict):
        for part in _dicts(content.get("parts")):
            yield from _string(part, "text")


def _chat_texts(messages: Any) -> list[Slot]:
    """`_chat_content` of each message, as a list: the guardrails' hot path on the most common
    route, without a generator's frame for each message and part."""
    slots: list[Slot] = []
    if not isinstance(messages, list):
        return slots
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            slots.append((message, "content"))
        elif isinstance(content, list):
            slots.extend((part, "text") for part in content if _is_text_part(part))
    return slots


class _ChatMessage(msgspec.Struct, gc=False):
    content: Any = None


class _AnswerChoice(msgspec.Struct, gc=False):
    message: _ChatMessage | None = None


class _ChatAnswer(msgspec.Struct, gc=False):
    choices: list[_AnswerChoice] | None = None


_chat_message = msgspec.json.Decoder(_ChatMessage).decode
_chat_answer = msgspec.json.Decoder(_ChatAnswer).decode


def message_texts(message: bytes | msgspec.Raw) -> list[str] | None:
    """The texts `texts(Shape.CHAT, …)` finds in one of a chat request's messages (its JSON
    as sent), read without building the rest of it (its role, tool calls, images are skipped
    in C); None when it is not one this reads (then the whole document is read instead)."""
    try:
        content = _chat_message(message).content
    except (msgspec.DecodeError, RecursionError):
        return None
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [part["text"] for part in content if _is_text_part(part)]
    return []


def chat_answer_texts(body: bytes) -> list[str] | None:
    """The texts `answer_texts(Shape.CHAT, …)` finds in a chat completion, read alike."""
    try:
        answer = _chat_answer(body)
    except (msgspec.DecodeError, RecursionError):
        return None
    choices = answer.choices or ()
    return [
        c.message.content
        for c in choices
        if c.message is not None and isinstance(c.message.content, str)
    ]


def texts(shape: Shape, doc: Any) -> list[Slot]:
    """Every piece of text the request sends a model, in order: prompts, instructions, messages
    (tool results too); never ids, names or settings."""
    if not isinstance(doc, dict):
        return []
    if shape is Shape.CHAT:
        return _chat_texts(doc.get("messages"))
    return list(_texts(shape, doc))


def _texts(shape: Shape, doc: dict[str, Any]) -> Iterator[Slot]:
    if shape is Shape.MESSAGES:
        yield from _anthropic_blocks(doc, "system")
        for message in _dicts(doc.get("messages")):
            yield from _anthropic_blocks(message, "content")
    elif shape is Shape.RESPONSES:
        yield from _string(doc, "instructions")
        if isinstance(doc.get("input"), str):
            yield doc, "input"
        for item in _dicts(doc.get("input")):
            if item.get("type", "message") == "message":
                yield from _chat_content(item)
            elif item.get("type") == "function_call_output":
                yield from _string(item, "output")
    elif shape is Shape.EMBEDDINGS:
        if isinstance(doc.get("input"), str):
            yield doc, "input"
        inputs = _items(doc.get("input"))
        for i in range(len(inputs)):
            yield from _string(inputs, i)
    elif shape is Shape.IMAGES:
        yield from _string(doc, "prompt")
    elif shape is Shape.SPEECH:
        yield from _string(doc, "input")
        yield from _string(doc, "instructions")
    elif shape in (Shape.GEMINI, Shape.GEMINI_EMBED):
        yield from _gemini_parts(doc.get("systemInstruction"))
        yield from _gemini_parts(doc.get("content"))
        for content in _dicts(doc.get("contents")):
            yield from _gemini_parts(content)
        for request in _dicts(doc.get("requests")):
            yield from _gemini_parts(request.get("content"))


def links(shape: Shape, doc: Any) -> Iterator[str]:
    """The URLs of the request's image and file parts (inline `data:` URLs left out)."""
    if not isinstance(doc, dict):
        return
    found: list[Any] = []
    if shape is Shape.CHAT:
        for message in _dicts(doc.get("messages")):
            for part in _dicts(message.get("content")):
                for key in ("image_url", "file", "input_audio"):
                    inner = part.get(key)
                    if isinstance(inner, dict):
                        found.append(inner.get("url"))
    elif shape is Shape.MESSAGES:
        for message in _dicts(doc.get("messages")):
            for block in _dicts(message.get("content")):
                source = block.get("source")
                if isinstance(source, dict) and source.get("type") == "url":
                    found.append(source.get("url"))
    elif shape is Shape.RESPONSES:
        for item in _dicts(doc.get("input")):
            for part in _dicts(item.get("content")):
                found.extend((part.get("image_url"), part.get("file_url")))
    elif shape in (Shape.GEMINI, Shape.GEMINI_EMBED):
        for content in _dicts(doc.get("contents")):
            for part in _dicts(content.get("parts")):
                data = part.get("fileData")
                if isinstance(data, dict):
                    found.append(data.get("fileUri"))
    for url in found:
        if isinstance(url, str) and not url.startswith("data:"):
            yield url


def tools(shape: Shape, doc: Any) -> Iterator[str]:
    """The names of the tools the request offers the model: a function's name, or a built-in
    tool's type (`web_search`, `code_execution`, …)."""
    if not isinstance(doc, dict):
        return
    if shape is Shape.CHAT:
        for tool in _dicts(doc.get("tools")):
            kind = tool.get("type", "function")
            inner = tool.get(kind)
            name = inner.get("name") if isinstance(inner, dict) else None
            yield name if isinstance(name, str) else str(kind)
        for function in _dicts(doc.get("functions")):
            if isinstance(function.get("name"), str):
                yield function["name"]
    elif shape in (Shape.MESSAGES, Shape.RESPONSES):
        for tool in _dicts(doc.get("tools")):
            name = tool.get("name")
            yield name if isinstance(name, str) else str(tool.get("type", ""))
    elif shape is Shape.GEMINI:
        for tool in _dicts(doc.get("tools")):
            for key, value in tool.items():
                if key == "functionDeclarations":
                    for function in _dicts(value):
                        if isinstance(function.get("name"), str):
                            yield function["name"]
                else:
                    yield key


def output_bound(shape: Shape, doc: Any) -> tuple[Any, str, str] | None:
    """Where the request bounds its output: (container, field, its name in an error), for
    routes whose requests take a bound; the field may be absent from the container."""
    if not isinstance(doc, dict):
        return None
    if shape is Shape.CHAT:
        if "max_tokens" in doc and "max_completion_tokens" not in doc:
            return doc, "max_tokens", "max_tokens"
        return doc, "max_completion_tokens", "max_completion_tokens"
    if shape is Shape.MESSAGES:
        return doc, "max_tokens", "max_tokens"
    if shape is Shape.RESPONSES:
        return doc, "max_output_tokens", "max_output_tokens"
    if shape is Shape.GEMINI:
        config = doc.get("generationConfig")
        if not isinstance(config, dict):
            config = doc["generationConfig"] = {}
        return config, "maxOutputTokens", "generationConfig.maxOutputTokens"
    return None


def answer_texts(shape: Shape, doc: Any) -> list[Slot]:
    """The text a model answered, in a plain answer of the route's format."""
    if not isinstance(doc, dict):
        return []
    if shape is Shape.CHAT:
        choices = doc.get("choices")
        slots: list[Slot] = []
        if isinstance(choices, list):
            for choice in choices:
                message = choice.get("message") if isinstance(choice, dict) else None
                if isinstance(message, dict) and isinstance(message.get("content"), str):
                    slots.append((message, "content"))
        return slots
    return list(_answer_texts(shape, doc))


def _answer_texts(shape: Shape, doc: dict[str, Any]) -> Iterator[Slot]:
    if shape is Shape.MESSAGES:
        for block in _dicts(doc.get("content")):
            if block.get("type") == "text":
                yield from _string(block, "text")
    elif shape is Shape.RESPONSES:
        yield from _responses_output(doc)
    elif shape is Shape.GEMINI:
        for candidate in _dicts(doc.get("candidates")):
            yield from _gemini_parts(candidate.get("content"))


def _responses_output(response: dict[str, Any]) -> Iterator[Slot]:
    for item in _dicts(response.get("output")):
        if item.get("type") == "message":
            for part in _dicts(item.get("content")):
                if part.get("type") == "output_text":
                    yield from _string(part, "text")


ANSWERED = frozenset({Shape.CHAT, Shape.MESSAGES, Shape.RESPONSES, Shape.GEMINI})
"""Routes whose answers hold text a guardrail reads."""


def delta_texts(shape: Shape, doc: Any) -> Iterator[Slot]:
    """The new text one stream event carries, in the route's format."""
    if not isinstance(doc, dict):
        return
    if shape is Shape.CHAT:
        for choice in _dicts(doc.get("choices")):
            delta = choice.get("delta")
            if isinstance(delta, dict):
                yield from _string(delta, "content")
    elif shape is Shape.MESSAGES:
        delta = doc.get("delta")
        if (
            doc.get("type") == "content_block_delta"
            and isinstance(delta, dict)
            and delta.get("type") == "text_delta"
        ):
            yield from _string(delta, "text")
    elif shape is Shape.RESPONSES:
        if doc.get("type") == "response.output_text.delta":
            yield from _string(doc, "delta")
    elif shape is Shape.GEMINI:
        for candidate in _dicts(doc.get("candidates")):
            yield from _gemini_parts(candidate.get("content"))


def whole_texts(shape: Shape, doc: Any) -> Iterator[Slot]:
    """Text a stream event repeats whole after its deltas (the Responses API's `done` and
    `completed` events): screened as a plain answer's text is."""
    if shape is not Shape.RESPONSES or not isinstance(doc, dict):
        return
    kind = doc.get("type")
    if kind == "response.output_text.done":
        yield from _string(doc, "text")
    elif kind == "response.content_part.done":
        part = doc.get("part")
        if isinstance(part, dict) and part.get("type") == "output_text":
            yield from _string(part, "text")
    elif kind == "response.output_item.done":
        item = doc.get("item")
        if isinstance(item, dict):
            yield from _responses_output({"output": [item]})
    elif kind in ("response.completed", "response.incomplete", "response.failed"):
        response = doc.get("response")
        if isinstance(response, dict):
            yield from _responses_output(response)
