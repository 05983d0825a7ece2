"""Guardrail rules: a scope and a moderation provider of the guardrail's own organization, a
config its kind can run, and a webhook's secret sealed like a provider credential."""

from __future__ import annotations

from typing import Any

import msgspec
from sqlalchemy import select

from controlplane.errors import conflict, invalid
from controlplane.guardrails.schemas import (
    Action,
    GuardrailCreate,
    GuardrailScope,
    GuardrailUpdate,
    Kind,
    ScopeKind,
)
from controlplane.models import Guardrail, Organization, Project, Provider, Team, VirtualKey
from controlplane.schemas import nothing_given
from controlplane.security import Cipher, new_id
from controlplane.state import Tx
from vkgate.guardrails import REDACTS, ConfigError, ModerationConfig, parse_config
from vkgate.wire import EventKind

_SCOPE_MODELS: dict[ScopeKind, tuple[type[Team] | type[Project] | type[VirtualKey], str]] = {
    ScopeKind.TEAM: (Team, "team"),
    ScopeKind.PROJECT: (Project, "project"),
    ScopeKind.VIRTUAL_KEY: (VirtualKey, "virtual key"),
}
MODERATION_KINDS = frozenset({"openai", "openai_compatible", "azure_openai"})
"""Provider kinds that serve `/v1/moderations`."""


def secret_context(guardrail_id: str) -> str:
    return f"{guardrail_id}:secret"


def open_secret(cipher: Cipher, row: Guardrail) -> str | None:
    if row.secret_encrypted is None:
        return None
    return cipher.decrypt(row.secret_encrypted, context=secret_context(row.id))


async def _scope_id(tx: Tx, organization_id: str, scope: GuardrailScope) -> str:
    if scope.kind is ScopeKind.ORGANIZATION:
        if scope.id not in (None, organization_id):
            raise invalid(
                "an organization guardrail's scope.id is its organization_id", param="scope.id"
            )
        return organization_id
    if scope.id is None:
        raise invalid(f"a {scope.kind} guardrail needs scope.id", param="scope.id")
    model, label = _SCOPE_MODELS[scope.kind]
    row = await tx.get(model, scope.id, label, param="scope.id")
    if row.organization_id != organization_id:
        raise invalid(f"scope.id names a {label} of another organization", param="scope.id")
    return scope.id


async def _checked_config(
    tx: Tx, organization_id: str, kind: str, action: str, config: dict[str, Any]
) -> dict[str, Any]:
    try:
        parsed = parse_config(kind, config)
    except ConfigError as exc:
        raise invalid(str(exc), param=exc.path) from None
    if action == Action.REDACT and kind not in REDACTS:
        raise invalid(
            f"a {kind} guardrail cannot redact (it judges a text whole): use block or warn",
            param="action",
        )
    if isinstance(parsed, ModerationConfig):
        provider = await tx.get(
            Provider, parsed.provider_id, "provider", param="config.provider_id"
        )
        if provider.organization_id != organization_id:
            raise invalid(
                "config.provider_id names a provider of another organization",
                param="config.provider_id",
            )
        if provider.kind not in MODERATION_KINDS:
            raise invalid(
                f"a {provider.kind} provider has no /v1/moderations; use an OpenAI-format one",
                param="config.provider_id",
            )
    result: dict[str, Any] = msgspec.to_builtins(parsed)
    return result


async def _check_name_free(tx: Tx, organization_id: str, name: str, other_than: str = "") -> None:
    taken = await tx.session.scalar(
        select(Guardrail.id).where(
            Guardrail.organization_id == organization_id,
            Guardrail.name == name,
            Guardrail.id != other_than,
        )
    )
    if taken:
        raise conflict(
            f"a guardrail named {name!r} already exists in this organization", param="name"
        )


def _check_secret(kind: str, has_secret: bool) -> None:
    if kind == Kind.WEBHOOK and not has_secret:
        raise invalid("a webhook guardrail needs a secret to sign its calls with", param="secret")
    if kind != Kind.WEBHOOK and has_secret:
        raise invalid("only a webhook guardrail takes a secret", param="secret")


async def create(tx: Tx, cipher: Cipher, data: GuardrailCreate) -> Guardrail:
    await tx.get(Organization, data.organization_id, "organization", param="organization_id")
    scope_id = await _scope_id(tx, data.organization_id, data.scope)
    config = await _checked_config(
        tx, data.organization_id, data.kind.value, data.action.value, data.config
    )
    _check_secret(data.kind.value, data.secret is not None)
    await _check_name_free(tx, data.organization_id, data.name)
    now = tx.clock.now()
    row = Guardrail(
        id=new_id("gr"),
        organization_id=data.organization_id,
        name=data.name,
        scope_kind=data.scope.kind.value,
        scope_id=scope_id,
        stage=data.stage.value,
        kind=data.kind.value,
        config=config,
        action=data.action.value,
        on_error=data.on_error.value,
        timeout_ms=data.timeout_ms,
        enabled=data.enabled,
        created_at=now,
        updated_at=now,
    )
    if data.secret is not None:
        row.secret_encrypted = cipher.encrypt(data.secret, context=secret_context(row.id))
    tx.session.add(row)
    await _record(tx, row, EventKind.GUARDRAIL_CREATED, "guardrail.create")
    return row


async def update(tx: Tx, cipher: Cipher, guardrail_id: str, data: GuardrailUpdate) -> Guardrail:
    row = await tx.get(Guardrail, guardrail_id, "guardrail")
    if nothing_given(data):
        return row
    if data.name is not msgspec.UNSET and data.name != row.name:
        await _check_name_free(tx, row.organization_id, data.name, other_than=row.id)
        row.name = data.name
    action = row.action if data.action is msgspec.UNSET else data.action.value
    config = row.config if data.config is msgspec.UNSET else data.config
    if data.action is not msgspec.UNSET or data.config is not msgspec.UNSET:
        row.config = await _checked_config(tx, row.organization_id, row.kind, action, config)
        row.action = action
    if data.secret is not msgspec.UNSET:
        _check_secret(row.kind, True)
        row.secret_encrypted = cipher.encrypt(data.secret, context=secret_context(row.id))
    if data.stage is not msgspec.UNSET:
        row.stage = data.stage.value
    if data.on_error is not msgspec.UNSET:
        row.on_error = data.on_error.value
    if data.timeout_ms is not msgspec.UNSET:
        row.timeout_ms = data.timeout_ms
    if data.enabled is not msgspec.UNSET:
        row.enabled = data.enabled
    row.updated_at = tx.clock.now()
    await _record(tx, row, EventKind.GUARDRAIL_UPDATED, "guardrail.update")
    return row


async def delete(tx: Tx, guardrail_id: str) -> None:
    row = await tx.get(Guardrail, guardrail_id, "guardrail")
    await _record(tx, row, EventKind.GUARDRAIL_DELETED, "guardrail.delete")
    await tx.session.delete(row)


async def _record(tx: Tx, row: Guardrail, kind: EventKind, action: str) -> None:
    await tx.audit(
        action,
        "guardrail",
        row.id,
        row.organization_id,
        {"name": row.name, "kind": row.kind, "scope_kind": row.scope_kind},
    )
    await tx.event(
        kind, organization_id=row.organization_id, entity_kind="guardrail", entity_id=row.id
    )
