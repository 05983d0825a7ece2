"""Wire types of the guardrail routes."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import msgspec

from controlplane.schemas import Ident, Name


class ScopeKind(StrEnum):
    ORGANIZATION = "organization"
    TEAM = "team"
    PROJECT = "project"
    VIRTUAL_KEY = "virtual_key"


class Stage(StrEnum):
    REQUEST = "request"
    RESPONSE = "response"
    BOTH = "both"


class Kind(StrEnum):
    REGEX = "regex"
    PII = "pii"
    SECRETS = "secrets"
    WEBHOOK = "webhook"
    MODERATION = "moderation"


class Action(StrEnum):
    BLOCK = "block"
    REDACT = "redact"
    WARN = "warn"


class OnError(StrEnum):
    ALLOW = "allow"
    BLOCK = "block"


TimeoutMs = Annotated[int, msgspec.Meta(ge=1, le=60_000)]
Secret = Annotated[str, msgspec.Meta(min_length=16, max_length=1000)]


class GuardrailScope(msgspec.Struct, forbid_unknown_fields=True):
    """`id` names the team, project or key; an organization guardrail needs none."""

    kind: ScopeKind
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None


class GuardrailCreate(msgspec.Struct, forbid_unknown_fields=True):
    organization_id: Ident
    name: Name
    kind: Kind
    scope: GuardrailScope = msgspec.field(
        default_factory=lambda: GuardrailScope(ScopeKind.ORGANIZATION)
    )
    stage: Stage = Stage.BOTH
    config: dict[str, Any] = {}
    action: Action = Action.BLOCK
    on_error: OnError = OnError.ALLOW
    timeout_ms: TimeoutMs = 1000
    enabled: bool = True
    secret: Secret | None = None
    """A webhook's signing secret: stored encrypted, never returned."""


class GuardrailUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """The organization, scope and kind of a guardrail never change; delete and create."""

    name: Name | msgspec.UnsetType = msgspec.UNSET
    stage: Stage | msgspec.UnsetType = msgspec.UNSET
    config: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    action: Action | msgspec.UnsetType = msgspec.UNSET
    on_error: OnError | msgspec.UnsetType = msgspec.UNSET
    timeout_ms: TimeoutMs | msgspec.UnsetType = msgspec.UNSET
    enabled: bool | msgspec.UnsetType = msgspec.UNSET
    secret: Secret | msgspec.UnsetType = msgspec.UNSET


class GuardrailRead(msgspec.Struct):
    id: str
    organization_id: str
    name: str
    scope: GuardrailScope
    stage: str
    kind: str
    config: dict[str, Any]
    action: str
    on_error: str
    timeout_ms: int
    enabled: bool
    has_secret: bool
    created_at: str
    updated_at: str
