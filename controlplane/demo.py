"""`vkgate up --demo`: an organization wired to the offline `mock` provider, and a key for it.

Idempotent: a second run finds what the first made and reuses the saved key while it still
works, so a new user can restart at will.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from sqlalchemy import select

from controlplane import audit
from controlplane.db import Database, create_engine
from controlplane.keys import service as keys
from controlplane.keys.schemas import KeyCreate
from controlplane.keys.service import KeyStatus
from controlplane.models import (
    Base,
    Organization,
    Project,
    Provider,
    RoutingPolicy,
    VirtualKey,
    VirtualKeySecret,
)
from controlplane.orgs.service import create_organization, create_project
from controlplane.policies import service as policies
from controlplane.policies.schemas import PolicyCreate, Target
from controlplane.providers import service as providers
from controlplane.providers.schemas import (
    PriceOverride,
    ProviderCreate,
    ProviderKind,
    ProviderUpdate,
)
from controlplane.security import Cipher, Hasher, new_id
from controlplane.settings import ControlPlaneSettings
from controlplane.state import Tx
from vkgate.clock import Clock, SystemClock
from vkgate.keys import key_sha256

NAME = "demo"
CHAT_ALIAS = "gpt-4o-mini"
EMBEDDING_ALIAS = "text-embedding-3-small"
KEY_FILE = "demo-key"
PRICES = {
    # What gpt-4o-mini and text-embedding-3-small are listed at, so the demo's spend, charts
    # and budgets show amounts of a real size (the mock's models have no list price).
    "mock-chat": PriceOverride(input_per_mtok="0.15", output_per_mtok="0.6"),
    "mock-embedding": PriceOverride(input_per_mtok="0.02", output_per_mtok="0"),
}

M = TypeVar("M", bound=Base)


@dataclass(frozen=True)
class Demo:
    organization_id: str
    key: str
    chat_model: str = CHAT_ALIAS
    embedding_model: str = EMBEDDING_ALIAS


async def _named(tx: Tx, model: type[M], organization_id: str | None = None) -> M | None:
    query = select(model).where(model.name == NAME)  # type: ignore[attr-defined]
    if organization_id is not None:
        query = query.where(model.organization_id == organization_id)  # type: ignore[attr-defined]
    found: M | None = await tx.session.scalar(query)
    return found


async def seed(settings: ControlPlaneSettings, home: Path, clock: Clock | None = None) -> Demo:
    database = Database(create_engine(settings.database_url))
    hasher = Hasher(settings.key_pepper, previous=settings.key_peppers_previous)
    saved = _read_saved(home / KEY_FILE)
    try:
        async with database.transaction() as session:
            tx = Tx(session, clock or SystemClock(), "demo")
            org = await _named(tx, Organization) or await create_organization(tx, name=NAME)
            await session.flush()
            project = await _named(tx, Project, org.id) or await create_project(
                tx, organization_id=org.id, name=NAME, team_id=None
            )
            cipher = Cipher(settings.encryption_key)
            provider = await _named(tx, Provider, org.id) or await providers.create(
                tx,
                cipher,
                ProviderCreate(
                    organization_id=org.id,
                    name=NAME,
                    kind=ProviderKind.MOCK,
                    price_overrides=PRICES,
                ),
            )
            if not provider.price_overrides:  # seeded by a release whose demo had no prices
                await providers.update(
                    tx, cipher, provider.id, ProviderUpdate(price_overrides=PRICES)
                )
            policy = await _named(tx, RoutingPolicy, org.id) or await policies.create(
                tx,
                PolicyCreate(
                    organization_id=org.id,
                    name=NAME,
                    aliases={
                        CHAT_ALIAS: [Target(provider_id=provider.id, model="mock-chat")],
                        EMBEDDING_ALIAS: [Target(provider_id=provider.id, model="mock-embedding")],
                    },
                ),
            )
            await session.flush()
            key = await _saved_key(tx, hasher, saved)
            if key is None:
                _, key = await keys.create(
                    tx,
                    hasher,
                    KeyCreate(
                        project_id=project.id,
                        name=f"demo-{new_id('k')[-8:]}",
                        routing_policy_id=policy.id,
                    ),
                )
                _save(home / KEY_FILE, key)
            demo = Demo(organization_id=org.id, key=key)
        audit.committed(tx.mutations)
        return demo
    finally:
        await database.close()


def _read_saved(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


async def _saved_key(tx: Tx, hasher: Hasher, key: str | None) -> str | None:
    """The key a previous run saved, if it is still active."""
    if not key:
        return None
    secret = await tx.session.scalar(
        select(VirtualKeySecret).where(
            VirtualKeySecret.key_hash.in_(hasher.candidates(key_sha256(key)))
        )
    )
    if secret is None or secret.valid_until is not None:
        return None
    row = await tx.session.get(VirtualKey, secret.vk_id)
    return (
        key
        if row is not None and row.status == KeyStatus.ACTIVE and row.expires_at is None
        else None
    )


def _save(path: Path, key: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(key + "\n")
