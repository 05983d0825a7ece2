"""Provider rules: what each kind needs, credentials sealed before they touch the database."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import msgspec
from sqlalchemy import func, select

from controlplane.errors import conflict, invalid
from controlplane.models import Budget, Guardrail, Organization, Provider, RoutingTarget
from controlplane.providers import cloud
from controlplane.providers.schemas import (
    PriceOverride,
    ProviderCreate,
    ProviderKind,
    ProviderUpdate,
)
from controlplane.schemas import nothing_given
from controlplane.security import Cipher, new_id
from controlplane.state import Tx
from vkgate.wire import EventKind, header_safe

DEFAULT_BASE_URLS = {
    ProviderKind.OPENAI: "https://api.openai.com/v1",
    ProviderKind.ANTHROPIC: "https://api.anthropic.com",
    ProviderKind.GEMINI: "https://generativelanguage.googleapis.com",
}
"""`bedrock` and `vertex_ai` have none: theirs follows from the region or location."""
NEEDS_BASE_URL = {ProviderKind.AZURE_OPENAI, ProviderKind.OPENAI_COMPATIBLE}
NEEDS_API_KEY = {
    ProviderKind.OPENAI,
    ProviderKind.AZURE_OPENAI,
    ProviderKind.ANTHROPIC,
    ProviderKind.GEMINI,
}
OPENAI_FORMAT = {ProviderKind.OPENAI, ProviderKind.AZURE_OPENAI, ProviderKind.OPENAI_COMPATIBLE}
"""The kinds that may serve the Responses API themselves (`responses_api`)."""


def _responses_api(kind: ProviderKind, given: bool | None) -> bool:
    """What a provider of `kind` stores for `responses_api`; a 422 when the kind takes none."""
    if kind in OPENAI_FORMAT:
        return True if given is None else given
    if given is not None:
        raise invalid(
            f"responses_api applies to openai, azure_openai and openai_compatible providers; "
            f"the proxy translates the Responses API for a {kind} provider",
            param="responses_api",
        )
    return False


def _check_kind_rules(
    kind: ProviderKind, *, base_url: str | None, has_api_key: bool, api_version: str | None
) -> str | None:
    """The base URL to store, or a 422 naming what this kind of provider is missing."""
    if kind is ProviderKind.MOCK:
        if base_url is not None or has_api_key:
            raise invalid(
                "a mock provider takes no base_url and no api_key",
                param="base_url" if base_url is not None else "api_key",
            )
        return None
    if kind in NEEDS_BASE_URL and base_url is None:
        raise invalid(f"provider kind {kind} needs base_url", param="base_url")
    if kind in NEEDS_API_KEY and not has_api_key:
        raise invalid(f"provider kind {kind} needs api_key", param="api_key")
    if kind is ProviderKind.AZURE_OPENAI and api_version is None:
        raise invalid("provider kind azure_openai needs api_version", param="api_version")
    url = base_url or DEFAULT_BASE_URLS.get(kind)
    return url.rstrip("/") if url else None


def _check_sendable(api_key: object, headers: object) -> None:
    """Refuse a credential that cannot go in an HTTP header: a line break or NUL would end the
    header early, so every call with it would fail. Nothing of the value is echoed."""
    if isinstance(api_key, str) and not header_safe(api_key):
        raise invalid(
            "api_key must not contain a line break (CR, LF) or NUL: was it pasted with its "
            "trailing newline?",
            param="api_key",
        )
    if isinstance(headers, dict):
        for name, value in headers.items():
            if not header_safe(value):
                raise invalid(
                    f"the value of header {name!r} must not contain a line break (CR, LF) or NUL",
                    param=f"headers.{name}",
                )


def _check_no_userinfo(base_url: str | None) -> None:
    """Refuse `https://user:secret@host`: base_url is shown in every read, a credential in it
    would be too. (The URL is not repeated in the message, for the same reason.)"""
    if base_url is None:
        return
    try:
        netloc = urlsplit(base_url).netloc
    except ValueError:  # `http://[abc/v1`: a bracket left open
        raise invalid("base_url is not a URL that can be read", param="base_url") from None
    if "@" in netloc:
        raise invalid(
            "base_url must not carry credentials (user:password@host); give them as api_key "
            "or headers, which are encrypted and never shown",
            param="base_url",
        )


def _seal_headers(cipher: Cipher, provider_id: str, headers: dict[str, str] | None) -> bytes | None:
    if not headers:
        return None
    return cipher.encrypt(json.dumps(headers, sort_keys=True), context=f"{provider_id}:headers")


def open_headers(cipher: Cipher, row: Provider) -> dict[str, str]:
    if row.headers_encrypted is None:
        return {}
    headers: dict[str, str] = json.loads(
        cipher.decrypt(row.headers_encrypted, context=f"{row.id}:headers")
    )
    return headers


def open_api_key(cipher: Cipher, row: Provider) -> str | None:
    if row.api_key_encrypted is None:
        return None
    return cipher.decrypt(row.api_key_encrypted, context=f"{row.id}:api_key")


def _prices(overrides: dict[str, PriceOverride] | None) -> dict[str, Any]:
    for model, override in (overrides or {}).items():
        problem = override.problem()
        if problem is not None:
            raise invalid(
                f"price_overrides[{model!r}]: {problem}", param=f"price_overrides.{model}"
            )
    return msgspec.to_builtins(overrides or {})  # type: ignore[no-any-return]


async def _check_name_free(
    tx: Tx, organization_id: str, name: str, *, other_than: str = ""
) -> None:
    taken = await tx.session.scalar(
        select(Provider.id).where(
            Provider.organization_id == organization_id,
            Provider.name == name,
            Provider.id != other_than,
        )
    )
    if taken:
        raise conflict(
            f"a provider named {name!r} already exists in this organization", param="name"
        )


async def create(tx: Tx, cipher: Cipher, data: ProviderCreate) -> Provider:
    await tx.get(Organization, data.organization_id, "organization", param="organization_id")
    _check_no_userinfo(data.base_url)
    _check_sendable(data.api_key, data.headers)
    checked = cloud.check_create(data)
    base_url = _check_kind_rules(
        data.kind,
        base_url=data.base_url,
        has_api_key=data.api_key is not None,
        api_version=data.api_version,
    )
    await _check_name_free(tx, data.organization_id, data.name)
    now = tx.clock.now()
    provider_id = new_id("prov")
    row = Provider(
        id=provider_id,
        organization_id=data.organization_id,
        name=data.name,
        kind=data.kind.value,
        base_url=base_url,
        api_version=data.api_version,
        api_key_encrypted=(
            cipher.encrypt(data.api_key, context=f"{provider_id}:api_key") if data.api_key else None
        ),
        headers_encrypted=_seal_headers(cipher, provider_id, data.headers),
        header_names=sorted(data.headers or {}),
        price_overrides=_prices(data.price_overrides),
        responses_api=_responses_api(data.kind, data.responses_api),
        created_at=now,
        updated_at=now,
        settings=checked.settings,
        credentials_encrypted=cloud.seal(cipher, provider_id, checked.credentials),
    )
    tx.session.add(row)
    await _record(tx, row, "provider.create", {"name": row.name, "kind": row.kind})
    return row


async def update(tx: Tx, cipher: Cipher, provider_id: str, data: ProviderUpdate) -> Provider:
    row = await tx.get(Provider, provider_id, "provider")
    if nothing_given(data):
        return row
    _check_sendable(data.api_key, data.headers)
    kind = ProviderKind(row.kind)
    changed: list[str] = []
    if data.name is not msgspec.UNSET and data.name != row.name:
        await _check_name_free(tx, row.organization_id, data.name, other_than=row.id)
        row.name = data.name
        changed.append("name")
    # `null` clears base_url, so the kind's default applies again.
    base_url = row.base_url if data.base_url is msgspec.UNSET else data.base_url
    if data.base_url is not msgspec.UNSET:
        _check_no_userinfo(data.base_url)
    api_version = row.api_version if data.api_version is msgspec.UNSET else data.api_version
    has_api_key = (
        row.api_key_encrypted is not None
        if data.api_key is msgspec.UNSET
        else data.api_key is not None
    )
    checked, cloud_changed = cloud.check_update(kind, row, data)
    row.base_url = _check_kind_rules(
        kind, base_url=base_url, has_api_key=has_api_key, api_version=api_version
    )
    if cloud_changed:
        row.settings = checked.settings
        if "credentials" in cloud_changed:
            row.credentials_encrypted = cloud.seal(cipher, row.id, checked.credentials)
        changed.extend(cloud_changed)
    row.api_version = api_version
    for field in ("base_url", "api_version"):
        if getattr(data, field) is not msgspec.UNSET:
            changed.append(field)
    if data.api_key is not msgspec.UNSET:
        row.api_key_encrypted = (
            cipher.encrypt(data.api_key, context=f"{row.id}:api_key") if data.api_key else None
        )
        changed.append("api_key")
    if data.headers is not msgspec.UNSET:
        row.headers_encrypted = _seal_headers(cipher, row.id, data.headers)
        row.header_names = sorted(data.headers or {})
        changed.append("headers")
    if data.price_overrides is not msgspec.UNSET:
        row.price_overrides = _prices(data.price_overrides)
        changed.append("price_overrides")
    if data.responses_api is not msgspec.UNSET:
        row.responses_api = _responses_api(kind, data.responses_api)
        changed.append("responses_api")
    row.updated_at = tx.clock.now()
    await _record(tx, row, "provider.update", {"fields": changed})
    return row


async def delete(tx: Tx, provider_id: str) -> None:
    row = await tx.get(Provider, provider_id, "provider")
    policies = await tx.session.scalar(
        select(func.count(func.distinct(RoutingTarget.policy_id))).where(
            RoutingTarget.provider_id == provider_id
        )
    )
    if policies:
        raise conflict(f"provider {provider_id!r} is used by {policies} routing policy(ies)")
    budgets = await tx.session.scalar(
        select(func.count(Budget.id)).where(Budget.provider_id == provider_id)
    )
    if budgets:
        raise conflict(f"provider {provider_id!r} is the filter of {budgets} budget(s)")
    moderations = await tx.session.scalars(
        select(Guardrail.config).where(
            Guardrail.organization_id == row.organization_id, Guardrail.kind == "moderation"
        )
    )
    checking = sum(1 for config in moderations if config.get("provider_id") == provider_id)
    if checking:
        # Deleting it would leave those guardrails failing on every request.
        raise conflict(f"provider {provider_id!r} moderates for {checking} guardrail(s)")
    await _record(tx, row, "provider.delete", {"name": row.name})
    await tx.session.delete(row)


async def _record(tx: Tx, row: Provider, action: str, details: dict[str, Any]) -> None:
    await tx.audit(action, "provider", row.id, row.organization_id, details)
    await tx.event(
        EventKind.MODEL_PROVIDER_UPDATED,
        organization_id=row.organization_id,
        entity_kind="provider",
        entity_id=row.id,
    )
