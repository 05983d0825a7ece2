"""Wire types of the budget routes."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import msgspec

from controlplane.schemas import Ident, Name

# At most 9 integer digits: the limit is stored as int64 nano-USD, which ends near 9.2e9 USD.
Usd = Annotated[str, msgspec.Meta(pattern=r"^\d{1,9}(\.\d{1,9})?$", description="USD, decimal")]


class ScopeKind(StrEnum):
    ORGANIZATION = "organization"
    TEAM = "team"
    PROJECT = "project"
    VIRTUAL_KEY = "virtual_key"
    END_USER = "end_user"


class Window(StrEnum):
    DAY = "day"
    WEEK = "week"
    MONTH = "month"
    TOTAL = "total"


class OnBreach(StrEnum):
    BLOCK = "block"
    WARN = "warn"


class BudgetScope(msgspec.Struct, forbid_unknown_fields=True):
    """`id` names the team, project or key; for `end_user` it is optional: without it the
    budget applies to each end user of the organization separately."""

    kind: ScopeKind
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None = None


class BudgetCreate(msgspec.Struct, forbid_unknown_fields=True):
    organization_id: Ident
    scope: BudgetScope
    window: Window
    limit_usd: Usd
    name: Name | None = None
    provider_id: Ident | None = None
    on_breach: OnBreach = OnBreach.BLOCK


class BudgetUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """The scope and organization of a budget never change; delete and create instead."""

    name: Name | msgspec.UnsetType | None = msgspec.UNSET
    window: Window | msgspec.UnsetType = msgspec.UNSET
    limit_usd: Usd | msgspec.UnsetType = msgspec.UNSET
    provider_id: Ident | msgspec.UnsetType | None = msgspec.UNSET
    on_breach: OnBreach | msgspec.UnsetType = msgspec.UNSET


class BudgetRead(msgspec.Struct):
    id: str
    organization_id: str
    name: str | None
    scope: BudgetScope
    window: str
    limit_usd: str
    provider_id: str | None
    on_breach: str
    created_at: str
    updated_at: str
