"""The proxy's one error tree and its renderers: OpenAI's format, Anthropic's and Google's."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from vkgate.errors import ERRORS, ErrorCode
from vkgate.wire import ErrorBody, ErrorDetail

_encode = msgspec.json.Encoder().encode


class AnthropicErrorDetail(msgspec.Struct, omit_defaults=False):
    type: str
    message: str
    code: str


class AnthropicErrorBody(msgspec.Struct, tag_field="type", tag="error"):
    error: AnthropicErrorDetail


class Cause(msgspec.Struct, frozen=True):
    """Why one credential of a chain gave no answer: the evidence an exhausted chain keeps."""

    provider: str
    provider_id: str
    status: int | None
    """The provider's HTTP status; null when it was not called or never answered."""
    code: ErrorCode


class _DetailWithAttempts(ErrorDetail, omit_defaults=False):
    attempts: list[Cause] = []


class _AnthropicDetailWithAttempts(AnthropicErrorDetail, omit_defaults=False):
    attempts: list[Cause] = []


GOOGLE_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    402: "RESOURCE_EXHAUSTED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
"""The canonical status Google's APIs name beside each HTTP status."""
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


class _ErrorInfo(msgspec.Struct):
    reason: str
    domain: str
    metadata: dict[str, str]


class _GoogleDetail(msgspec.Struct, omit_defaults=False):
    code: int
    message: str
    status: str
    details: list[dict[str, object]]


class _GoogleBody(msgspec.Struct):
    error: _GoogleDetail


class ProxyError(Exception):
    """A refusal or failure the client sees, with the code that decides its status and type."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        param: str | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
        causes: list[Cause] | None = None,
        details: Mapping[str, str] | None = None,
        reason: str = "",
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.headers = headers
        self.causes = causes
        self.details = details
        """More fields of the error object, e.g. a refusing budget's id, window and limit."""
        self.reason = reason
        """For the metrics: which of a code's causes, from a short fixed set (`key_rpm`)."""

    @property
    def status(self) -> int:
        return ERRORS[self.code].status

    def openai_body(self) -> bytes:
        kind = ERRORS[self.code]
        if self.details:
            detail = msgspec.structs.asdict(
                ErrorDetail(self.message, kind.openai_type, self.code, self.param)
            )
            return _encode({"error": {**detail, **self.details}})
        if self.causes:
            return _encode(
                ErrorBody(
                    _DetailWithAttempts(
                        self.message, kind.openai_type, self.code, self.param, self.causes
                    )
                )
            )
        return _encode(
            ErrorBody(ErrorDetail(self.message, kind.openai_type, self.code, self.param))
        )

    def anthropic_body(self) -> bytes:
        """`{"type": "error", "error": {"type", "message", "code"}}`, as `/v1/messages` answers."""
        kind = ERRORS[self.code]
        if self.details:
            base = msgspec.structs.asdict(
                AnthropicErrorDetail(kind.anthropic_type, self.message, self.code)
            )
            return _encode({"type": "error", "error": {**base, **self.details}})
        detail = (
            _AnthropicDetailWithAttempts(kind.anthropic_type, self.message, self.code, self.causes)
            if self.causes
            else AnthropicErrorDetail(kind.anthropic_type, self.message, self.code)
        )
        return _encode(AnthropicErrorBody(detail))

    def google_body(self) -> bytes:
        """`{"error": {"code", "message", "status", "details"}}`, as Google's APIs (and so the
        `/v1beta` Gemini API) answer: vkgate's own code is the `ErrorInfo` detail's reason."""
        metadata = {"code": str(self.code)}
        if self.param is not None:
            metadata["param"] = self.param
        if self.details:
            metadata.update(self.details)
        info = msgspec.structs.asdict(_ErrorInfo(self.code.upper(), "vkgate", metadata))
        status = self.status
        detail = _GoogleDetail(
            status,
            self.message,
            GOOGLE_STATUSES.get(status, "UNKNOWN"),
            [{"@type": ERROR_INFO, **info}],
        )
        return _encode(_GoogleBody(detail))


def invalid(message: str, *, param: str | None = None) -> ProxyError:
    return ProxyError(ErrorCode.INVALID_REQUEST, message, param=param)
