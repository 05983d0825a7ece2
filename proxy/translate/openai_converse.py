"""A client speaking OpenAI's chat completions, a provider speaking Bedrock's Converse API.

Requests: a field with no Converse equivalent is refused with a 400 naming it, never dropped; so
is any field OpenAI's schema does not have. A field at its harmless default (`n: 1`,
`logprobs: false`, `seed: null`…) is accepted. Decisions where the two APIs differ:

- System and developer messages, wherever they stand, become Converse's `system` blocks, in
  order. Tool messages become `toolResult` blocks of a user turn; consecutive messages of one
  role are merged into one turn, since Converse's roles alternate. Empty text is left out.
- Images: a base64 `data:` URL is sent as bytes; an `s3://` URL as an S3 location (its format
  read from the file's extension). Converse fetches no `http(s)` URL, so one is refused.
- `max_tokens`/`max_completion_tokens`, `temperature`, `top_p` and `stop` become
  `inferenceConfig`; `response_format` `json_schema` becomes `outputConfig.textFormat` (the
  schema as a JSON string, as Converse takes it); `reasoning_effort` `low` to `xhigh` becomes
  `outputConfig.effort`; `service_tier` `flex` and `priority` become `serviceTier`.
- `tool_choice: "none"` leaves the tools out (Converse cannot forbid calls otherwise); it is
  refused when the conversation already holds tool calls, which Converse takes only with tools.
- `user` and `safety_identifier` name the end user to vkgate (budgets, spend) and are not
  sent: Converse has no such field. `stream` picks ConverseStream; `stream_options` is
  accepted, Converse always reporting usage.

Answers: text blocks are joined into `content`, tool uses become `tool_calls`; reasoning is
left out (OpenAI's chat schema has no place for it; its tokens are in `completion_tokens`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from proxy.errors import invalid
from proxy.translate import _converse
from proxy.translate._answers import (
    OpenAIChunks,
    openai_completion,
    openai_error,
)
from proxy.translate._common import (
    data_url,
    join_turn,
    openai_error_type,
    refused,
    request_fields,
)
from proxy.translate._converse import BEDROCK
from proxy.translate._openai_request import (
    AssistantMessage,
    DeveloperMessage,
    ImageURL,
    Message,
    Request,
    SystemMessage,
    TextPart,
    ToolMessage,
    UserMessage,
    absent,
)

_encode = msgspec.json.Encoder().encode
_object = msgspec.json.Decoder(dict[str, msgspec.Raw])
_request = msgspec.json.Decoder(Request)
_EMPTY_SCHEMA = msgspec.Raw(b'{"type":"object","properties":{}}')
_EMPTY_INPUT = msgspec.Raw(b"{}")

IMAGE_FORMATS = {
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/jpg": "jpeg",
    "image/gif": "gif",
    "image/webp": "webp",
}
_EXTENSIONS = {"png": "png", "jpg": "jpeg", "jpeg": "jpeg", "gif": "gif", "webp": "webp"}
EFFORTS = frozenset({"low", "medium", "high", "xhigh"})

_HARMLESS: dict[str, tuple[object, ...]] = {
    "n": (1,),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logit_bias": ({},),
    "seed": (),
    "store": (False,),
    "metadata": ({},),
    "modalities": (["text"],),
    "functions": ([],),
    "audio": (),
    "prediction": (),
    "verbosity": (),
    "web_search_options": (),
    "function_call": (),
    "prompt_cache_key": (),
}
"""Fields with no Converse equivalent, and the values of each that ask for nothing."""


def request(body: bytes, model: str) -> bytes:
    """An OpenAI chat completions request as a Converse request (the model goes in the URL)."""
    fields = request_fields(_request, body, BEDROCK)
    for name, harmless in _HARMLESS.items():
        value = getattr(fields, name)
        if value is not None and value not in harmless:
            raise refused(name, BEDROCK)
    system, messages = _conversation(fields.messages)
    out: dict[str, Any] = {"messages": messages}
    if system:
        out["system"] = system
    if inference := _inference(fields):
        out["inferenceConfig"] = inference
    if (tools := _tool_config(fields, messages)) is not None:
        out["toolConfig"] = tools
    if output := _output_config(fields):
        out["outputConfig"] = output
    if fields.service_tier not in (None, "auto", "default"):
        if fields.service_tier not in ("flex", "priority"):
            raise refused("service_tier", BEDROCK, ": it takes `flex` and `priority`")
        out["serviceTier"] = {"type": fields.service_tier}
    return _encode(out)


def _inference(fields: Request) -> dict[str, Any]:
    inference: dict[str, Any] = {}
    both = fields.max_tokens is not None and fields.max_completion_tokens is not None
    if both and fields.max_tokens != fields.max_completion_tokens:
        raise invalid(
            "`max_tokens` and `max_completion_tokens` disagree: send one of them",
            param="max_completion_tokens",
        )
    limit = (
        fields.max_completion_tokens
        if fields.max_completion_tokens is not None
        else (fields.max_tokens)
    )
    if limit is not None:
        inference["maxTokens"] = limit
    if fields.temperature is not None:
        inference["temperature"] = fields.temperature
    if fields.top_p is not None:
        inference["topP"] = fields.top_p
    if fields.stop is not None:
        stop = [fields.stop] if isinstance(fields.stop, str) else fields.stop
        if stop:
            inference["stopSequences"] = stop
    return inference


def _output_config(fields: Request) -> dict[str, Any]:
    output: dict[str, Any] = {}
    response_format = fields.response_format
    if response_format is not None and response_format.type != "text":
        if response_format.type != "json_schema" or not isinstance(
            response_format.json_schema, dict
        ):
            raise refused("response_format", BEDROCK, ": only `text` and `json_schema` can be")
        spec = response_format.json_schema
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise invalid(
                "`response_format.json_schema.schema` must be a JSON schema object",
                param="response_format.json_schema.schema",
            )
        definition: dict[str, Any] = {"schema": _encode(schema).decode()}
        for name in ("name", "description"):
            if isinstance(spec.get(name), str):
                definition[name] = spec[name]
        output["textFormat"] = {"type": "json_schema", "structure": {"jsonSchema": definition}}
    effort = fields.reasoning_effort
    if effort is not None:
        if effort not in EFFORTS:
            raise refused("reasoning_effort", BEDROCK, ": it takes low, medium, high and xhigh")
        output["effort"] = effort
    return output


def _conversation(messages: list[Message]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        at = f"messages[{i}]"
        if isinstance(message, SystemMessage | DeveloperMessage):
            _no_name(message.name, at)
            system.extend(_texts(message.content))
        elif isinstance(message, UserMessage):
            _no_name(message.name, at)
            join_turn(turns, "user", _user_content(message, at))
        elif isinstance(message, AssistantMessage):
            join_turn(turns, "assistant", _assistant_content(message, at))
        else:
            join_turn(turns, "user", [_tool_result(message)])
    return system, turns


def _no_name(name: str | None, at: str) -> None:
    if name is not None:
        raise refused(f"{at}.name", BEDROCK, ": it has no participant names")


def _texts(content: str | list[TextPart]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}] if content else []
    return [{"text": part.text} for part in content if part.text]


def _user_content(message: UserMessage, at: str) -> list[dict[str, Any]]:
    if isinstance(message.content, str):
        return _texts(message.content)
    blocks: list[dict[str, Any]] = []
    for j, part in enumerate(message.content):
        if isinstance(part, TextPart):
            blocks.extend(_texts([part]))
        else:
            blocks.append(image(part.image_url, f"{at}.content[{j}].image_url"))
    return blocks


def image(image_url: ImageURL, at: str) -> dict[str, Any]:
    """An OpenAI image part as a Converse image block."""
    return image_block(image_url.url, image_url.detail, f"{at}.url", f"{at}.detail")


def image_block(url: str, detail: str | None, at: str, at_detail: str) -> dict[str, Any]:
    """An image URL as a Converse image block; `at` and `at_detail` name the URL and the
    detail level in the client's request."""
    if detail not in (None, "auto"):
        raise refused(at_detail, BEDROCK, ": it has no image detail levels")
    if url.startswith("s3://"):
        extension = url.rpartition(".")[2].lower()
        if extension not in _EXTENSIONS:
            raise invalid(f"`{at}` must name a .png, .jpg, .gif or .webp object", param=at)
        return {"image": {"format": _EXTENSIONS[extension], "source": {"s3Location": {"uri": url}}}}
    if not url.startswith("data:"):
        raise invalid(
            f"`{at}` must be a base64 `data:` URL or an `s3://` URL: Bedrock fetches no "
            "http(s) URL",
            param=at,
        )
    media_type, data = data_url(url, at)
    if media_type not in IMAGE_FORMATS:
        raise invalid(
            f"`{at}` holds an image type Bedrock does not take "
            "(it takes image/png, image/jpeg, image/gif and image/webp)",
            param=at,
        )
    return {"image": {"format": IMAGE_FORMATS[media_type], "source": {"bytes": data}}}


def _assistant_content(message: AssistantMessage, at: str) -> list[dict[str, Any]]:
    _no_name(message.name, at)
    for name in ("audio", "function_call"):
        if getattr(message, name) is not None:
            raise refused(f"{at}.{name}", BEDROCK)
    blocks: list[dict[str, Any]] = []
    content = message.content
    if isinstance(content, str):
        blocks.extend(_texts(content))
    elif content is not None:
        for part in content:
            blocks.extend(_texts(part.text if isinstance(part, TextPart) else part.refusal))
    if message.refusal is not None:
        blocks.extend(_texts(message.refusal))
    for j, call in enumerate(message.tool_calls or ()):
        here = f"{at}.tool_calls[{j}]"
        if call.type != "function":
            raise refused(f"{here}.type", BEDROCK, ": only function tool calls can be")
        arguments = arguments_object(call.function.arguments, f"{here}.function.arguments")
        blocks.append(
            {"toolUse": {"toolUseId": call.id, "name": call.function.name, "input": arguments}}
        )
    if not blocks:
        raise invalid(f"`{at}` has neither content nor tool_calls", param=f"{at}.content")
    return blocks


def arguments_object(arguments: str, param: str) -> msgspec.Raw:
    """Tool call arguments as the JSON object Converse's `input` must be, byte for byte."""
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


def _tool_result(message: ToolMessage) -> dict[str, Any]:
    text = (
        message.content
        if isinstance(message.content, str)
        else "".join(part.text for part in message.content)
    )
    return {"toolResult": {"toolUseId": message.tool_call_id, "content": [{"text": text}]}}


def _has_tool_blocks(messages: list[dict[str, Any]]) -> bool:
    return any(
        "toolUse" in block or "toolResult" in block
        for message in messages
        for block in message["content"]
    )


def _tool_config(fields: Request, messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    if fields.parallel_tool_calls is False and fields.tools:
        raise refused("parallel_tool_calls", BEDROCK, ": it cannot forbid parallel calls")
    if not fields.tools:
        if fields.tool_choice not in (None, "none", "auto"):
            raise invalid("`tool_choice` needs `tools`", param="tool_choice")
        return None
    choice = fields.tool_choice
    if choice == "none":
        if _has_tool_blocks(messages):
            raise refused(
                "tool_choice",
                BEDROCK,
                ': `"none"` leaves the tools out, and Converse takes a conversation holding '
                "tool calls only with its tools",
            )
        return None
    tools = []
    for tool in fields.tools:
        function = tool.function
        spec: dict[str, Any] = {"name": function.name}
        if function.description is not None:
            spec["description"] = function.description
        schema = _EMPTY_SCHEMA if absent(function.parameters) else function.parameters
        spec["inputSchema"] = {"json": schema}
        if function.strict:
            spec["strict"] = True
        tools.append({"toolSpec": spec})
    config: dict[str, Any] = {"tools": tools}
    if choice == "required":
        config["toolChoice"] = {"any": {}}
    elif choice == "auto":
        config["toolChoice"] = {"auto": {}}
    elif choice is not None:
        if choice.type != "function" or choice.function is None:
            raise refused("tool_choice", BEDROCK, ": only a named function can be forced")
        config["toolChoice"] = {"tool": {"name": choice.function.name}}
    return config


# -- answers --------------------------------------------------------------------------------------


def response(data: bytes, created: int, answer_id: str, model: str) -> bytes:
    """A Converse answer as an OpenAI `chat.completion` (Converse names no id and no model:
    `answer_id` and the credential's `model` stand in)."""
    return openai_completion(_converse.answer(data, answer_id, model), created)


def error(status: int, data: bytes) -> bytes:
    """A Bedrock error body as OpenAI's, keeping Bedrock's message."""
    return openai_error(
        _converse.error_message(status, data), openai_error_type(status), "provider_error"
    )


def stream(created: int, include_usage: bool, answer_id: str, model: str) -> _converse.StreamReader:
    """ConverseStream frames as OpenAI `chat.completion.chunk` events."""
    return _converse.StreamReader(OpenAIChunks(created, include_usage), answer_id, model)
