"""What both translators share: refusals, ids, usage shapes and error types of both formats."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from proxy.errors import ProxyError, invalid
from proxy.usage import TokenUsage
from vkgate.errors import ErrorCode

T = TypeVar("T")

ANTHROPIC = "Anthropic's Messages API"
OPENAI = "OpenAI's chat completions API"

_AT = re.compile(r" - at `\$\.?(.*)`$")
_UNKNOWN = re.compile(r"^Object contains unknown field `([^`]+)`")
_MISSING = re.compile(r"^Object missing required field `([^`]+)`")
_INVALID_VALUE = re.compile(r"^Invalid (?:enum )?value (.+)$")
_NAME = re.compile(r"'[A-Za-z0-9_.-]{1,64}'")


def request_fields(
    decoder: msgspec.json.Decoder[T], body: bytes | msgspec.Raw, target: str, at: str = ""
) -> T:
    """`body` decoded, or a 400 naming the field that is malformed or cannot be translated.

    `at` is where `body` stands in the request, when it is a part of it.
    """
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise refusal(str(exc), target, at) from None
    except msgspec.DecodeError as exc:
        # msgspec names the byte offset, never the text around it.
        raise invalid(f"request body is not valid JSON: {exc}") from None


def refusal(text: str, target: str, prefix: str = "") -> ProxyError:
    """A 400 from a msgspec validation message: its path becomes `param`."""
    at = _AT.search(text)
    path = at.group(1) if at else ""
    detail = text[: at.start()] if at else text
    if prefix:
        path = prefix + path if path.startswith("[") or not path else f"{prefix}.{path}"
    if unknown := _UNKNOWN.match(detail):
        param = _join(path, unknown.group(1))
        return invalid(f"`{param}` cannot be translated to {target}", param=param)
    if missing := _MISSING.match(detail):
        param = _join(path, missing.group(1))
        return invalid(f"`{param}` is required", param=param)
    if value := _INVALID_VALUE.match(detail):
        # The value is echoed only when it is a name: a client may put anything there.
        shown = value.group(1) if _NAME.fullmatch(value.group(1)) else "this value"
        return invalid(
            f"`{path}` {shown} is not supported when translating to {target}",
            param=path or None,
        )
    return invalid(f"`{path}`: {detail}" if path else f"request body: {detail}", param=path or None)


def refused(param: str, target: str, why: str = "") -> ProxyError:
    """A 400 for a field whose value has no equivalent on the other side."""
    return invalid(f"`{param}` cannot be translated to {target}{why}", param=param)


def join_turn(
    turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]], key: str = "content"
) -> None:
    """Anthropic's, Converse's and Gemini's roles alternate: blocks of the same role as the last
    turn join it (under `key`, Gemini's `parts`), else they make a turn of their own."""
    if turns and turns[-1]["role"] == role:
        turns[-1][key].extend(blocks)
    else:
        turns.append({"role": role, key: blocks})


def _join(path: str, field: str) -> str:
    return f"{path}.{field}" if path else field


def provider_error(what: str) -> ProxyError:
    """The provider's answer could not be read: its fault, not the client's."""
    return ProxyError(ErrorCode.PROVIDER_ERROR, f"the provider's answer could not be read: {what}")


_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})


def anthropic_image(url: str, param: str) -> dict[str, Any]:
    """Anthropic's image block for an image URL (`param` names it): a base64 `data:` URL of a
    type Anthropic takes, or an http(s) URL it fetches itself."""
    if url.startswith("data:"):
        header, comma, data = url[5:].partition(",")
        media_type, *params = header.split(";")
        if not comma or not params or params[-1] != "base64":
            raise invalid(f"`{param}` must be a base64 `data:` URL", param=param)
        media_type = media_type.lower()
        if media_type not in _IMAGE_TYPES:
            raise invalid(
                f"`{param}` holds an image type Anthropic does not take "
                "(it takes image/jpeg, image/png, image/gif and image/webp)",
                param=param,
            )
        source = {"type": "base64", "media_type": media_type, "data": data}
    elif url.startswith(("https://", "http://")):
        source = {"type": "url", "url": url}
    else:
        raise invalid(f"`{param}` must be an http(s) or `data:` URL", param=param)
    return {"type": "image", "source": source}


# -- ids ---------------------------------------------------------------------------------------

_CHATCMPL = "chatcmpl-"
_MSG = "msg_"


def openai_id(message_id: str) -> str:
    """`msg_X` becomes `chatcmpl-X`, and `anthropic_id` turns it back."""
    return _CHATCMPL + message_id.removeprefix(_MSG)


def anthropic_id(completion_id: str) -> str:
    return _MSG + completion_id.removeprefix(_CHATCMPL)


# -- usage, as each format reports it ----------------------------------------------------------


class OpenAIPromptDetails(msgspec.Struct):
    cached_tokens: int = 0
    cache_write_tokens: int | msgspec.UnsetType = msgspec.UNSET


class OpenAICompletionDetails(msgspec.Struct):
    reasoning_tokens: int = 0


class OpenAIUsageOut(msgspec.Struct, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: OpenAIPromptDetails
    completion_tokens_details: OpenAICompletionDetails | msgspec.UnsetType = msgspec.UNSET


def openai_usage(usage: TokenUsage) -> OpenAIUsageOut:
    """OpenAI's `usage` object; cache writes and reasoning appear only when there were any."""
    return OpenAIUsageOut(
        prompt_tokens=usage.input_tokens,
        completion_tokens=usage.output_tokens,
        total_tokens=usage.input_tokens + usage.output_tokens,
        prompt_tokens_details=OpenAIPromptDetails(
            cached_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens or msgspec.UNSET,
        ),
        completion_tokens_details=(
            OpenAICompletionDetails(usage.reasoning_tokens)
            if usage.reasoning_tokens
            else msgspec.UNSET
        ),
    )


class AnthropicOutputDetails(msgspec.Struct):
    thinking_tokens: int


class AnthropicUsageOut(msgspec.Struct, omit_defaults=True):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    output_tokens_details: AnthropicOutputDetails | msgspec.UnsetType = msgspec.UNSET


def anthropic_usage(usage: TokenUsage) -> AnthropicUsageOut:
    """Anthropic's `usage` object: cached input counted apart from `input_tokens`."""
    return AnthropicUsageOut(
        input_tokens=max(
            usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens, 0
        ),
        output_tokens=usage.output_tokens,
        cache_creation_input_tokens=usage.cache_write_tokens,
        cache_read_input_tokens=usage.cache_read_tokens,
        output_tokens_details=(
            AnthropicOutputDetails(usage.reasoning_tokens)
            if usage.reasoning_tokens
            else msgspec.UNSET
        ),
    )


# -- why a message ended -------------------------------------------------------------------------

FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
"""Anthropic's `stop_reason` → OpenAI's `finish_reason`; anything new counts as `stop`."""

STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
"""OpenAI's `finish_reason` → Anthropic's `stop_reason`; anything new counts as `end_turn`."""


# -- error types --------------------------------------------------------------------------------

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    """Anthropic's error `type` for an HTTP status; a 4xx it has no name for is the client's."""
    if status in _ANTHROPIC_TYPES:
        return _ANTHROPIC_TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


OPENAI_TYPES = {
    "invalid_request_error": "invalid_request_error",
    "request_too_large": "invalid_request_error",
    "authentication_error": "authentication_error",
    "permission_error": "permission_error",
    "not_found_error": "not_found_error",
    "rate_limit_error": "rate_limit_error",
    "billing_error": "insufficient_quota",
    "timeout_error": "timeout",
    "api_error": "api_error",
    "overloaded_error": "api_error",
}
"""Anthropic's error `type` → the OpenAI `type` vkgate uses for the same failure."""

_OPENAI_TYPES_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def openai_error_type(status: int) -> str:
    if status in _OPENAI_TYPES_BY_STATUS:
        return _OPENAI_TYPES_BY_STATUS[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


ANTHROPIC_TYPES_BY_OPENAI = {
    "invalid_request_error": "invalid_request_error",
    "authentication_error": "authentication_error",
    "permission_error": "permission_error",
    "not_found_error": "not_found_error",
    "rate_limit_error": "rate_limit_error",
    "insufficient_quota": "rate_limit_error",
    "server_error": "api_error",
    "api_error": "api_error",
}
"""OpenAI's error `type` → Anthropic's, for an error reported in a stream (no status there)."""


# -- inline media ------------------------------------------------------------------------------


def data_url(url: str, at: str) -> tuple[str, str]:
    """A base64 `data:` URL's media type (lower-cased) and data; a 400 naming `at` otherwise."""
    header, comma, data = url[5:].partition(",") if url.startswith("data:") else ("", "", "")
    media_type, *params = header.split(";")
    if not comma or not params or params[-1] != "base64":
        raise invalid(f"`{at}` must be a base64 `data:` URL", param=at)
    return media_type.lower(), data
