"""A client speaking OpenAI's chat completions, a provider speaking Google's Gemini API
(`generateContent`, as AI Studio and Vertex AI both serve it).

Requests: a field with no Gemini equivalent is refused with a 400 naming it, never dropped; so is
any field OpenAI's schema does not have. A field at its harmless default is accepted.
Decisions where the two APIs differ:

- System and developer messages become `systemInstruction`, in order. Assistant turns are the
  `model` role. Tool messages become `functionResponse` parts of a user turn, named after the
  call they answer (Gemini matches results by function name); a result that is a JSON object is
  the response itself, any other text is `{"content": text}`. Consecutive turns of one role are
  merged. Empty text is left out.
- Images: a base64 `data:` URL becomes `inlineData`; a `gs://` or `https://` URL `fileData`,
  its type read from the file's extension (Gemini decides whether it can fetch it).
- `max_tokens`/`max_completion_tokens`, `temperature`, `top_p`, `stop`, `seed`,
  `presence_penalty` and `frequency_penalty` become `generationConfig`; `response_format`
  `json_object` becomes `responseMimeType: application/json`, `json_schema` that and
  `responseJsonSchema`; `reasoning_effort` becomes `thinkingConfig.thinkingLevel` (`none`:
  `thinkingBudget: 0`).
- Tools become `functionDeclarations` (their parameters as `parametersJsonSchema`);
  `tool_choice` `auto`/`none`/`required` is `AUTO`/`NONE`/`ANY`, a named function `ANY` limited
  to it. `parallel_tool_calls: false` is refused: Gemini cannot ask for it.
- `user` and `safety_identifier` name the end user to vkgate (budgets, spend) and are not sent:
  Gemini has no such field. `stream` picks `streamGenerateContent`.

Answers: the first candidate's text is `content`, its function calls `tool_calls` (with ids that
carry Gemini's thought signatures back, see `_gemini`), thoughts are left out; a safety stop is
`finish_reason: content_filter`, a prompt the safety filters blocked a 400.
"""

from __future__ import annotations

import mimetypes
from typing import Any

import msgspec

from proxy.errors import invalid
from proxy.translate import _gemini
from proxy.translate._answers import OpenAIChunks, openai_completion, openai_error
from proxy.translate._common import data_url, join_turn, openai_error_type, refused, request_fields
from proxy.translate._gemini import GEMINI, signature_of
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
_EMPTY_ARGS = msgspec.Raw(b"{}")
EFFORT_LEVELS = frozenset({"minimal", "low", "medium", "high"})

_HARMLESS: dict[str, tuple[object, ...]] = {
    "n": (1,),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "logit_bias": ({},),
    "store": (False,),
    "metadata": ({},),
    "modalities": (["text"],),
    "service_tier": ("auto", "default"),
    "functions": ([],),
    "audio": (),
    "prediction": (),
    "verbosity": (),
    "web_search_options": (),
    "function_call": (),
    "prompt_cache_key": (),
}
"""Fields with no Gemini equivalent, and the values of each that ask for nothing."""


def request(body: bytes, model: str) -> bytes:
    """An OpenAI chat completions request as a Gemini `generateContent` request (the model goes
    in the URL)."""
    fields = request_fields(_request, body, GEMINI)
    for name, harmless in _HARMLESS.items():
        value = getattr(fields, name)
        if value is not None and value not in harmless:
            raise refused(name, GEMINI)
    system, contents = _conversation(fields.messages)
    out: dict[str, Any] = {"contents": contents}
    if system:
        out["systemInstruction"] = {"parts": system}
    if config := _generation_config(fields):
        out["generationConfig"] = config
    if fields.tools:
        out["tools"] = [
            {"functionDeclarations": [_declaration(tool.function) for tool in fields.tools]}
        ]
    if (tool_config := _tool_config(fields)) is not None:
        out["toolConfig"] = tool_config
    return _encode(out)


def _generation_config(fields: Request) -> dict[str, Any]:
    config: dict[str, Any] = {}
    both = fields.max_tokens is not None and fields.max_completion_tokens is not None
    if both and fields.max_tokens != fields.max_completion_tokens:
        raise invalid(
            "`max_tokens` and `max_completion_tokens` disagree: send one of them",
            param="max_completion_tokens",
        )
    limit = fields.max_completion_tokens
    if limit is None:
        limit = fields.max_tokens
    if limit is not None:
        config["maxOutputTokens"] = limit
    for name, field in (
        ("temperature", "temperature"),
        ("topP", "top_p"),
        ("seed", "seed"),
        ("presencePenalty", "presence_penalty"),
        ("frequencyPenalty", "frequency_penalty"),
    ):
        value = getattr(fields, field)
        if value is not None:
            config[name] = value
    if fields.stop is not None:
        stop = [fields.stop] if isinstance(fields.stop, str) else fields.stop
        if stop:
            config["stopSequences"] = stop
    response_format = fields.response_format
    if response_format is not None and response_format.type != "text":
        config["responseMimeType"] = "application/json"
        if response_format.type == "json_schema":
            spec = response_format.json_schema
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise invalid(
                    "`response_format.json_schema.schema` must be a JSON schema object",
                    param="response_format.json_schema.schema",
                )
            config["responseJsonSchema"] = schema
        elif response_format.type != "json_object":
            raise refused("response_format.type", GEMINI)
    effort = fields.reasoning_effort
    if effort is not None:
        if effort == "none":
            config["thinkingConfig"] = {"thinkingBudget": 0}
        elif effort in EFFORT_LEVELS:
            config["thinkingConfig"] = {"thinkingLevel": effort}
        else:
            raise refused("reasoning_effort", GEMINI, ": it takes none, minimal, low, medium, high")
    return config


def _conversation(messages: list[Message]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    system: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    """Each tool call's function name by its id: a result names the function it answers."""
    for i, message in enumerate(messages):
        at = f"messages[{i}]"
        if isinstance(message, SystemMessage | DeveloperMessage):
            _no_name(message.name, at)
            system.extend(_texts(message.content))
        elif isinstance(message, UserMessage):
            _no_name(message.name, at)
            _append(contents, "user", _user_parts(message, at))
        elif isinstance(message, AssistantMessage):
            _append(contents, "model", _model_parts(message, at, names))
        else:
            _append(contents, "user", [_function_response(message, at, names)])
    return system, contents


def _no_name(name: str | None, at: str) -> None:
    if name is not None:
        raise refused(f"{at}.name", GEMINI, ": it has no participant names")


def _append(contents: list[dict[str, Any]], role: str, parts: list[dict[str, Any]]) -> None:
    join_turn(contents, role, parts, key="parts")


def _texts(content: str | list[TextPart]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}] if content else []
    return [{"text": part.text} for part in content if part.text]


def _user_parts(message: UserMessage, at: str) -> list[dict[str, Any]]:
    if isinstance(message.content, str):
        return _texts(message.content)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(message.content):
        if isinstance(part, TextPart):
            parts.extend(_texts([part]))
        else:
            parts.append(_image(part.image_url, f"{at}.content[{j}].image_url"))
    return parts


def _image(image: ImageURL, at: str) -> dict[str, Any]:
    if image.detail not in (None, "auto"):
        raise refused(f"{at}.detail", GEMINI, ": it has no image detail levels")
    url = image.url
    if url.startswith("data:"):
        media_type, data = data_url(url, f"{at}.url")
        return {"inlineData": {"mimeType": media_type, "data": data}}
    return file_part(url, f"{at}.url")


def file_part(url: str, at: str) -> dict[str, Any]:
    """A file Gemini fetches itself (Cloud Storage, a public URL), its type by extension."""
    if not url.startswith(("gs://", "https://", "http://")):
        raise invalid(f"`{at}` must be a `data:`, `gs://` or http(s) URL", param=at)
    media_type, _ = mimetypes.guess_type(url.partition("?")[0], strict=False)
    if media_type is None:
        raise invalid(
            f"`{at}`: the file's type cannot be told from its name; send it as a `data:` URL",
            param=at,
        )
    return {"fileData": {"mimeType": media_type, "fileUri": url}}


def _model_parts(message: AssistantMessage, at: str, names: dict[str, str]) -> list[dict[str, Any]]:
    _no_name(message.name, at)
    for name in ("audio", "function_call"):
        if getattr(message, name) is not None:
            raise refused(f"{at}.{name}", GEMINI)
    parts: list[dict[str, Any]] = []
    content = message.content
    if isinstance(content, str):
        parts.extend(_texts(content))
    elif content is not None:
        for part in content:
            parts.extend(_texts(part.text if isinstance(part, TextPart) else part.refusal))
    if message.refusal is not None:
        parts.extend(_texts(message.refusal))
    for j, call in enumerate(message.tool_calls or ()):
        here = f"{at}.tool_calls[{j}]"
        if call.type != "function":
            raise refused(f"{here}.type", GEMINI, ": only function tool calls can be")
        names[call.id] = call.function.name
        parts.append(
            function_call(
                call.id,
                call.function.name,
                _args(call.function.arguments, f"{here}.function.arguments"),
            )
        )
    if not parts:
        raise invalid(f"`{at}` has neither content nor tool_calls", param=f"{at}.content")
    return parts


def function_call(call_id: str, name: str, args: msgspec.Raw) -> dict[str, Any]:
    """A `functionCall` part, with the thought signature its id carries back (`_gemini`)."""
    part: dict[str, Any] = {"functionCall": {"name": name, "args": args}}
    signature = signature_of(call_id)
    if signature is not None:
        part["thoughtSignature"] = signature
    return part


def _args(arguments: str, param: str) -> msgspec.Raw:
    text = arguments.strip()
    if not text:
        return _EMPTY_ARGS
    try:
        _object.decode(text)
    except msgspec.ValidationError:
        raise invalid(f"`{param}` must be a JSON object", param=param) from None
    except msgspec.DecodeError:
        raise invalid(f"`{param}` is not valid JSON", param=param) from None
    return msgspec.Raw(text.encode())


def _function_response(message: ToolMessage, at: str, names: dict[str, str]) -> dict[str, Any]:
    name = names.get(message.tool_call_id)
    if name is None:
        raise invalid(
            f"`{at}.tool_call_id` answers no tool call of an earlier assistant message "
            "(Gemini needs the function's name)",
            param=f"{at}.tool_call_id",
        )
    text = (
        message.content
        if isinstance(message.content, str)
        else "".join(part.text for part in message.content)
    )
    return {"functionResponse": {"name": name, "response": response_object(text)}}


def response_object(text: str) -> msgspec.Raw | dict[str, str]:
    """A tool's result as the object `functionResponse.response` must be."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            _object.decode(stripped)
        except msgspec.DecodeError:
            pass
        else:
            return msgspec.Raw(stripped.encode())
    return {"content": text}


def _declaration(function: Any) -> dict[str, Any]:
    declaration: dict[str, Any] = {"name": function.name}
    if function.description is not None:
        declaration["description"] = function.description
    declaration["parametersJsonSchema"] = (
        _EMPTY_SCHEMA if absent(function.parameters) else function.parameters
    )
    return declaration


def _tool_config(fields: Request) -> dict[str, Any] | None:
    if fields.parallel_tool_calls is False and fields.tools:
        raise refused("parallel_tool_calls", GEMINI, ": it cannot forbid parallel calls")
    choice = fields.tool_choice
    if choice is None:
        return None
    if not fields.tools and choice != "none":
        raise invalid("`tool_choice` needs `tools`", param="tool_choice")
    if choice == "auto":
        mode: dict[str, Any] = {"mode": "AUTO"}
    elif choice == "none":
        mode = {"mode": "NONE"}
    elif choice == "required":
        mode = {"mode": "ANY"}
    elif choice.type == "function" and choice.function is not None:
        mode = {"mode": "ANY", "allowedFunctionNames": [choice.function.name]}
    else:
        raise refused("tool_choice", GEMINI, ": only a named function can be forced")
    return {"functionCallingConfig": mode}


# -- answers --------------------------------------------------------------------------------------

ID_PREFIX = "chatcmpl-"


def response(data: bytes, created: int, answer_id: str, model: str) -> bytes:
    """A Gemini answer as an OpenAI `chat.completion`."""
    return openai_completion(_gemini.answer(data, answer_id, model, ID_PREFIX), created)


def error(status: int, data: bytes) -> bytes:
    """A Google error body as OpenAI's, keeping Google's message."""
    return openai_error(
        _gemini.error_message(status, data), openai_error_type(status), "provider_error"
    )


def stream(created: int, include_usage: bool, answer_id: str, model: str) -> _gemini.StreamReader:
    """Gemini's SSE events as OpenAI `chat.completion.chunk` events."""
    return _gemini.StreamReader(OpenAIChunks(created, include_usage), answer_id, model, ID_PREFIX)
