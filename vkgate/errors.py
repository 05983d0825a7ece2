"""Error codes of every vkgate API, each mapped once to its HTTP status and wire `type`s.

Both services raise errors by code; the renderers read status and types from this table.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class ErrorCode(StrEnum):
    # Public proxy codes, as the contract names them.
    INVALID_REQUEST = "invalid_request"
    INVALID_API_KEY = "invalid_api_key"
    VIRTUAL_KEY_EXPIRED = "virtual_key_expired"
    VIRTUAL_KEY_REVOKED = "virtual_key_revoked"
    VIRTUAL_KEY_DISABLED = "virtual_key_disabled"
    MODEL_NOT_ALLOWED = "model_not_allowed"
    MODEL_NOT_FOUND = "model_not_found"
    BUDGET_EXCEEDED = "budget_exceeded"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    RATE_LIMITED = "rate_limited"
    GATEWAY_BUSY = "gateway_busy"
    CIRCUIT_OPEN = "circuit_open"
    AUTH_UPSTREAM_UNAVAILABLE = "auth_upstream_unavailable"
    SPEND_SPOOL_FULL = "spend_spool_full"
    END_USER_REQUIRED = "end_user_required"
    PROVIDER_ERROR = "provider_error"
    CHAIN_EXHAUSTED = "chain_exhausted"
    PROVIDER_TIMEOUT = "provider_timeout"
    PROVIDER_RATE_LIMITED = "provider_rate_limited"
    """Every provider of the chain answered (or had just answered) 429."""
    UNSUPPORTED_OPERATION = "unsupported_operation"
    """A credential of the chain cannot serve the route (an Anthropic one asked to embed)."""
    POLICY_VIOLATION = "policy_violation"
    """A rule of the key's routing policy refuses the request (the error names rule and param)."""
    GUARDRAIL_BLOCKED = "guardrail_blocked"
    """A guardrail blocked the request or its answer (the error names guardrail and stage)."""
    # Control plane codes (admin, finance and internal APIs).
    VALIDATION_ERROR = "validation_error"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    CONFLICT = "conflict"
    BAD_SIGNATURE = "bad_signature"
    STORE_UNAVAILABLE = "store_unavailable"
    INTERNAL_ERROR = "internal_error"


class ErrorKind(NamedTuple):
    status: int
    openai_type: str
    anthropic_type: str


_INVALID = ErrorKind(400, "invalid_request_error", "invalid_request_error")

ERRORS: dict[ErrorCode, ErrorKind] = {
    ErrorCode.INVALID_REQUEST: _INVALID,
    ErrorCode.END_USER_REQUIRED: _INVALID,
    ErrorCode.INVALID_API_KEY: ErrorKind(401, "authentication_error", "authentication_error"),
    ErrorCode.VIRTUAL_KEY_EXPIRED: ErrorKind(401, "authentication_error", "authentication_error"),
    ErrorCode.VIRTUAL_KEY_REVOKED: ErrorKind(403, "permission_error", "permission_error"),
    ErrorCode.VIRTUAL_KEY_DISABLED: ErrorKind(403, "permission_error", "permission_error"),
    ErrorCode.MODEL_NOT_ALLOWED: ErrorKind(403, "permission_error", "permission_error"),
    ErrorCode.MODEL_NOT_FOUND: ErrorKind(404, "not_found_error", "not_found_error"),
    ErrorCode.BUDGET_EXCEEDED: ErrorKind(402, "budget_exceeded", "rate_limit_error"),
    ErrorCode.PAYLOAD_TOO_LARGE: ErrorKind(413, "invalid_request_error", "request_too_large"),
    ErrorCode.RATE_LIMITED: ErrorKind(429, "rate_limit_error", "rate_limit_error"),
    ErrorCode.GATEWAY_BUSY: ErrorKind(503, "api_error", "overloaded_error"),
    ErrorCode.CIRCUIT_OPEN: ErrorKind(503, "api_error", "overloaded_error"),
    ErrorCode.AUTH_UPSTREAM_UNAVAILABLE: ErrorKind(503, "api_error", "api_error"),
    ErrorCode.SPEND_SPOOL_FULL: ErrorKind(503, "api_error", "overloaded_error"),
    ErrorCode.PROVIDER_ERROR: ErrorKind(502, "api_error", "api_error"),
    ErrorCode.CHAIN_EXHAUSTED: ErrorKind(502, "api_error", "api_error"),
    ErrorCode.PROVIDER_TIMEOUT: ErrorKind(504, "api_error", "api_error"),
    ErrorCode.PROVIDER_RATE_LIMITED: ErrorKind(429, "rate_limit_error", "rate_limit_error"),
    ErrorCode.UNSUPPORTED_OPERATION: _INVALID,
    ErrorCode.POLICY_VIOLATION: ErrorKind(403, "permission_error", "permission_error"),
    ErrorCode.GUARDRAIL_BLOCKED: _INVALID,
    ErrorCode.VALIDATION_ERROR: ErrorKind(422, "invalid_request_error", "invalid_request_error"),
    ErrorCode.UNAUTHORIZED: ErrorKind(401, "authentication_error", "authentication_error"),
    ErrorCode.FORBIDDEN: ErrorKind(403, "permission_error", "permission_error"),
    ErrorCode.NOT_FOUND: ErrorKind(404, "not_found_error", "not_found_error"),
    ErrorCode.METHOD_NOT_ALLOWED: ErrorKind(405, "invalid_request_error", "invalid_request_error"),
    ErrorCode.CONFLICT: ErrorKind(409, "conflict_error", "invalid_request_error"),
    ErrorCode.BAD_SIGNATURE: ErrorKind(401, "authentication_error", "authentication_error"),
    ErrorCode.STORE_UNAVAILABLE: ErrorKind(503, "api_error", "overloaded_error"),
    ErrorCode.INTERNAL_ERROR: ErrorKind(500, "api_error", "api_error"),
}
