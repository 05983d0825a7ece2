"""A guardrail's `config`, kind by kind: the control plane checks it with these types, and the
proxy compiles what it checked. Unknown fields are refused, so a typo is a 422, not a check
that silently does nothing."""

from __future__ import annotations

import contextlib
import ipaddress
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

import msgspec
import regex

PiiEntity = Literal["email", "phone", "credit_card", "iban", "us_ssn", "ip_address"]
SecretKind = Literal[
    "aws_access_key",
    "gcp_api_key",
    "openai_key",
    "anthropic_key",
    "github_token",
    "slack_token",
    "stripe_key",
    "private_key",
    "jwt",
]
PII_ENTITIES: tuple[PiiEntity, ...] = get_args(PiiEntity)
SECRET_KINDS: tuple[SecretKind, ...] = get_args(SecretKind)
EntityName = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
PatternText = Annotated[str, msgspec.Meta(min_length=1, max_length=2000)]
MAX_PATTERNS = 50


class RegexConfig(msgspec.Struct, forbid_unknown_fields=True):
    """`patterns`: entity name → pattern (Python `regex` syntax); a redaction says the name."""

    patterns: Annotated[dict[EntityName, PatternText], msgspec.Meta(min_length=1)]
    ignore_case: bool = False


class PiiConfig(msgspec.Struct, forbid_unknown_fields=True):
    entities: Annotated[list[PiiEntity], msgspec.Meta(min_length=1)] = msgspec.field(
        default_factory=lambda: list(PII_ENTITIES)
    )


class SecretsConfig(msgspec.Struct, forbid_unknown_fields=True):
    kinds: Annotated[list[SecretKind], msgspec.Meta(min_length=1)] = msgspec.field(
        default_factory=lambda: list(SECRET_KINDS)
    )


class WebhookConfig(msgspec.Struct, forbid_unknown_fields=True):
    """The customer's endpoint: HTTPS, or plain HTTP on a loopback address only."""

    url: Annotated[str, msgspec.Meta(min_length=1, max_length=2000)]


class ModerationConfig(msgspec.Struct, forbid_unknown_fields=True):
    """A provider credential's `/v1/moderations`: a category at or over its threshold flags
    the text; with no thresholds, the provider's own `flagged` does."""

    provider_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    model: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] = "omni-moderation-latest"
    thresholds: dict[
        Annotated[str, msgspec.Meta(min_length=1, max_length=100)],
        Annotated[float, msgspec.Meta(ge=0.0, le=1.0)],
    ] = {}


Config = RegexConfig | PiiConfig | SecretsConfig | WebhookConfig | ModerationConfig
CONFIGS: dict[str, type[Config]] = {
    "regex": RegexConfig,
    "pii": PiiConfig,
    "secrets": SecretsConfig,
    "webhook": WebhookConfig,
    "moderation": ModerationConfig,
}
REDACTS = frozenset({"regex", "pii", "secrets", "webhook"})
"""Kinds that can say what to take out of a text (moderation only judges it whole)."""


class ConfigError(ValueError):
    """What is wrong with a config, and where (`config.…`)."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


def parse_config(kind: str, config: dict[str, Any]) -> Config:
    """The config as its kind's type, or `ConfigError` naming the field."""
    try:
        parsed = msgspec.convert(config, CONFIGS[kind])
    except msgspec.ValidationError as exc:
        text = str(exc)
        path = text.rpartition("at `$")[2].rstrip("`") if "at `$" in text else ""
        raise ConfigError(text, "config" + path) from None
    if isinstance(parsed, RegexConfig):
        for name, pattern in parsed.patterns.items():
            try:
                regex.compile(pattern)
            except (regex.error, ValueError, OverflowError, RecursionError) as exc:
                raise ConfigError(
                    f"pattern {name!r} is not a valid regular expression: {exc}",
                    f"config.patterns.{name}",
                ) from None
    elif isinstance(parsed, WebhookConfig):
        problem = webhook_url_problem(parsed.url)
        if problem is not None:
            raise ConfigError(problem, "config.url")
    return parsed


def webhook_url_problem(url: str) -> str | None:
    """Why `url` may not receive a webhook, or None: HTTPS anywhere, plain HTTP only on a
    loopback address (development and tests), never credentials in the URL."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return "url is not a URL"
    if parts.scheme not in ("https", "http") or not host:
        return "url must be an https:// URL"
    if parts.username or parts.password:
        return "url must not carry credentials; the webhook is signed with its secret"
    if parts.scheme == "http":
        loopback = host == "localhost"
        with contextlib.suppress(ValueError):
            loopback = loopback or ipaddress.ip_address(host).is_loopback
        if not loopback:
            return "url must be https:// (plain http:// only on a loopback address)"
    return None
