"""Wire types of the routing-policy routes."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from controlplane.schemas import Ident, Name

Alias = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:/@+-]+$")]
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
MAX_CHAIN = 16


class Target(msgspec.Struct, forbid_unknown_fields=True):
    provider_id: Ident
    model: ModelName


Chain = Annotated[list[Target], msgspec.Meta(min_length=1, max_length=MAX_CHAIN)]
Aliases = Annotated[dict[Alias, Chain], msgspec.Meta(min_length=1, max_length=1000)]


RuleKind = Literal[
    "deny_models",
    "allow_tools",
    "deny_tools",
    "allow_url_domains",
    "deny_url_domains",
    "deny_params",
    "max_output_tokens",
]
Pattern = Annotated[str, msgspec.Meta(min_length=1, max_length=500)]
MAX_RULES = 100


class OutputCap(msgspec.Struct, forbid_unknown_fields=True):
    """`max_output_tokens`: the most output a request may ask for; one asking more, or naming
    no limit, is lowered to `limit` (`cap`) or refused (`refuse`)."""

    limit: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]
    action: Literal["cap", "refuse"] = "refuse"


class Rule(msgspec.Struct, forbid_unknown_fields=True):
    """A rule on what requests of the policy's keys may contain."""

    name: Name
    kind: RuleKind
    values: Annotated[list[Pattern], msgspec.Meta(max_length=1000)] | OutputCap


Rules = Annotated[list[Rule], msgspec.Meta(max_length=MAX_RULES)]


class PolicyCreate(msgspec.Struct, forbid_unknown_fields=True):
    organization_id: Ident
    name: Name
    aliases: Aliases
    rules: Rules = []


class PolicyUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """`aliases` (and `rules`), when given, replaces every alias (rule) of the policy."""

    name: Name | msgspec.UnsetType = msgspec.UNSET
    aliases: Aliases | msgspec.UnsetType = msgspec.UNSET
    rules: Rules | msgspec.UnsetType = msgspec.UNSET
    """When given, replaces every rule of the policy."""


class PolicyRead(msgspec.Struct):
    id: str
    organization_id: str
    name: str
    aliases: dict[str, list[Target]]
    rules: list[Rule]
    created_at: str
    updated_at: str
