"""Wire types of the virtual-key routes; a raw key appears only in a create or rotate answer."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import msgspec

from controlplane.policies.schemas import Alias
from controlplane.schemas import Ident, Name, RateLimits

AwareTime = Annotated[datetime, msgspec.Meta(tz=True)]
Metadata = Annotated[
    dict[
        Annotated[str, msgspec.Meta(min_length=1, max_length=100)],
        Annotated[str, msgspec.Meta(max_length=1000)],
    ],
    msgspec.Meta(max_length=50),
]
AllowedModels = Annotated[list[Alias], msgspec.Meta(max_length=1000)]
MAX_GRACE_SECONDS = 90 * 86400
DEFAULT_GRACE_SECONDS = 86400


KeyLimits = RateLimits


class KeyCreate(msgspec.Struct, forbid_unknown_fields=True):
    project_id: Ident
    name: Name
    routing_policy_id: Ident
    allowed_models: AllowedModels | None = None
    limits: KeyLimits | None = None
    expires_at: AwareTime | None = None
    metadata: Metadata | None = None


class KeyUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """Fields left out are unchanged; `null` clears allowed_models, limits or expires_at."""

    name: Name | msgspec.UnsetType = msgspec.UNSET
    routing_policy_id: Ident | msgspec.UnsetType = msgspec.UNSET
    allowed_models: AllowedModels | msgspec.UnsetType | None = msgspec.UNSET
    limits: KeyLimits | msgspec.UnsetType | None = msgspec.UNSET
    expires_at: AwareTime | msgspec.UnsetType | None = msgspec.UNSET
    metadata: Metadata | msgspec.UnsetType | None = msgspec.UNSET


class KeyRotate(msgspec.Struct, forbid_unknown_fields=True):
    grace_seconds: Annotated[int, msgspec.Meta(ge=0, le=MAX_GRACE_SECONDS)] = DEFAULT_GRACE_SECONDS


class KeyRead(msgspec.Struct, kw_only=True):
    id: str
    name: str
    prefix: str
    organization_id: str
    team_id: str | None
    project_id: str
    routing_policy_id: str | None
    allowed_models: list[str] | None
    limits: KeyLimits
    metadata: dict[str, str]
    status: str
    expires_at: str | None
    revision: int
    created_at: str
    updated_at: str


class KeyWithSecret(KeyRead, kw_only=True):
    """The answer to create and rotate: the only time the key itself is shown."""

    key: str
    previous_key_valid_until: str | None = None
