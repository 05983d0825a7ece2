"""The control plane's relational schema (SQLAlchemy 2 declarative); Alembic migrates it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    UniqueConstraint,
    text,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from controlplane.db import UTCDateTime

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

Id = String(40)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON(), list[str]: JSON()}


class Organization(Base):
    __tablename__ = "organizations"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime]


class Team(Base):
    __tablename__ = "teams"
    __table_args__ = (UniqueConstraint("organization_id", "name"),)
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    # Shared by every key of the team's projects; the server default fills the teams that
    # existed before teams had limits.
    limits: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'"))
    created_at: Mapped[datetime]


class Project(Base):
    __tablename__ = "projects"
    __table_args__ = (UniqueConstraint("organization_id", "name"),)
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"), index=True)
    team_id: Mapped[str | None] = mapped_column(ForeignKey("teams.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime]


class Provider(Base):
    __tablename__ = "providers"
    __table_args__ = (UniqueConstraint("organization_id", "name"),)
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(32))
    base_url: Mapped[str | None] = mapped_column(String(2000))
    api_version: Mapped[str | None] = mapped_column(String(64))
    # AES-GCM ciphertexts; the plaintext exists only in memory, on its way to a proxy.
    api_key_encrypted: Mapped[bytes | None] = mapped_column(LargeBinary)
    headers_encrypted: Mapped[bytes | None] = mapped_column(LargeBinary)
    header_names: Mapped[list[str]]
    price_overrides: Mapped[dict[str, Any]]
    # Whether an OpenAI-format provider serves the Responses API itself (else it is translated
    # to chat completions); always false for the other kinds.
    responses_api: Mapped[bool] = mapped_column(server_default=true())
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    # A cloud kind's own fields (region; project and location) and its stored credential (AWS
    # keys, a service account), sealed like the API key; the server default fills the rows of
    # before these kinds.
    settings: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'"))
    credentials_encrypted: Mapped[bytes | None] = mapped_column(LargeBinary)


class RoutingPolicy(Base):
    __tablename__ = "routing_policies"
    __table_args__ = (UniqueConstraint("organization_id", "name"),)
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    # What its keys' requests may contain (policies/schemas.py `Rule`); the server default
    # fills the policies of before rules.
    rules: Mapped[list[dict[str, Any]]] = mapped_column(JSON, server_default=text("'[]'"))


class RoutingTarget(Base):
    """One step of an alias's fallback chain; the foreign key keeps a used provider from vanishing."""

    __tablename__ = "routing_targets"
    __table_args__ = (UniqueConstraint("policy_id", "alias", "position"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    policy_id: Mapped[str] = mapped_column(
        ForeignKey("routing_policies.id", ondelete="CASCADE"), index=True
    )
    alias: Mapped[str] = mapped_column(String(200))
    position: Mapped[int]
    provider_id: Mapped[str] = mapped_column(
        ForeignKey("providers.id", ondelete="RESTRICT"), index=True
    )
    model: Mapped[str] = mapped_column(String(200))


class VirtualKey(Base):
    __tablename__ = "virtual_keys"
    __table_args__ = (UniqueConstraint("project_id", "name"),)
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"), index=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    # Null only for a revoked key whose policy was deleted afterwards.
    routing_policy_id: Mapped[str | None] = mapped_column(
        ForeignKey("routing_policies.id"), index=True
    )
    allowed_models: Mapped[list[str] | None]
    limits: Mapped[dict[str, Any]]
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata")
    status: Mapped[str] = mapped_column(String(16))
    expires_at: Mapped[datetime | None]
    revision: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class VirtualKeySecret(Base):
    """A key's secret, stored only as HMAC(pepper, sha256(key)); rotation adds one."""

    __tablename__ = "virtual_key_secrets"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    vk_id: Mapped[str] = mapped_column(
        ForeignKey("virtual_keys.id", ondelete="CASCADE"), index=True
    )
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    pepper_id: Mapped[str | None] = mapped_column(String(16))
    """Which pepper `key_hash` is under (`Hasher.pepper_id`); None: made by a release before
    this column, under whichever pepper was current then."""
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    valid_until: Mapped[datetime | None]
    """Set when rotated out: the end of the grace period."""


class Budget(Base):
    __tablename__ = "budgets"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"), index=True)
    name: Mapped[str | None] = mapped_column(String(200))
    scope_kind: Mapped[str] = mapped_column(String(16))
    scope_id: Mapped[str | None] = mapped_column(String(200))
    window: Mapped[str] = mapped_column(String(8))
    limit_nano_usd: Mapped[int] = mapped_column(BigInteger)
    provider_id: Mapped[str | None] = mapped_column(
        ForeignKey("providers.id", ondelete="RESTRICT"), index=True
    )
    on_breach: Mapped[str] = mapped_column(String(8))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class Guardrail(Base):
    """A check on the text of requests and answers of the keys in its scope."""

    __tablename__ = "guardrails"
    __table_args__ = (UniqueConstraint("organization_id", "name"),)
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    scope_kind: Mapped[str] = mapped_column(String(16))
    scope_id: Mapped[str | None] = mapped_column(String(64))
    stage: Mapped[str] = mapped_column(String(16))
    kind: Mapped[str] = mapped_column(String(16))
    config: Mapped[dict[str, Any]]
    # A webhook's signing secret, sealed like a provider credential; never returned.
    secret_encrypted: Mapped[bytes | None] = mapped_column(LargeBinary)
    action: Mapped[str] = mapped_column(String(16))
    on_error: Mapped[str] = mapped_column(String(16))
    timeout_ms: Mapped[int]
    enabled: Mapped[bool] = mapped_column(server_default=true())
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class CacheRule(Base):
    """A response-cache rule: requests in its scope for a model its globs match are cached."""

    __tablename__ = "cache_rules"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    organization_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    scope_kind: Mapped[str] = mapped_column(String(16))
    scope_id: Mapped[str] = mapped_column(String(200))
    models: Mapped[list[str]]
    ttl_seconds: Mapped[int] = mapped_column(Integer)
    enabled: Mapped[bool]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class AdminToken(Base):
    __tablename__ = "admin_tokens"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    organization_id: Mapped[str | None] = mapped_column(ForeignKey("organizations.id"))
    """Set, the token sees and changes only this organization's resources."""
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    pepper_id: Mapped[str | None] = mapped_column(String(16))
    """As `VirtualKeySecret.pepper_id`."""
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]


class AuditEntry(Base):
    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_org_id", "organization_id", "id"),)
    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    at: Mapped[datetime]
    actor: Mapped[str] = mapped_column(String(200))
    """The admin token's id (or `env` for VKGATE_ADMIN_TOKEN): never the token."""
    action: Mapped[str] = mapped_column(String(64))
    resource_kind: Mapped[str] = mapped_column(String(32))
    resource_id: Mapped[str] = mapped_column(String(64))
    organization_id: Mapped[str | None] = mapped_column(String(40))
    details: Mapped[dict[str, Any]]


class ChangeEvent(Base):
    __tablename__ = "change_feed"
    revision: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(String(40))
    organization_id: Mapped[str] = mapped_column(String(40), index=True)
    entity_kind: Mapped[str] = mapped_column(String(32))
    entity_id: Mapped[str] = mapped_column(String(40))
    vk_id: Mapped[str | None] = mapped_column(String(40))
    at: Mapped[datetime]


class FeedCounter(Base):
    """One row; `UPDATE … RETURNING` on it both numbers events and serialises their commits,
    so a poller that has seen revision N can never later miss an event numbered below N."""

    __tablename__ = "feed_counter"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    revision: Mapped[int] = mapped_column(BigInteger)


class BudgetSpendReading(Base):
    """The last spend the ledger gave for a budget's window: what a key's bundle carries, with
    its age, while the ledger cannot be read (controlplane/spend/readings.py)."""

    __tablename__ = "budget_spend_readings"
    budget_id: Mapped[str] = mapped_column(
        ForeignKey("budgets.id", ondelete="CASCADE"), primary_key=True
    )
    window_start: Mapped[datetime | None]
    """The window the reading is of (None: a `total` budget)."""
    spent_nano_usd: Mapped[int] = mapped_column(BigInteger)
    read_at: Mapped[datetime]
    """The reading's `as_of`: spend the ledger acknowledged before this is in it."""


class SchemaCompatibility(Base):
    """One row, written by every migration run (migrations/env.py): the schema's revision and
    the oldest revision whose code may run on it (controlplane/migrate.py)."""

    __tablename__ = "schema_compatibility"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    revision: Mapped[str] = mapped_column(String(32))
    compatible_from: Mapped[str] = mapped_column(String(32))


class ConsoleSession(Base):
    """A signed-in web console: the token it was opened with stands behind every request.

    Only the SHA-256 of the session id (the cookie) is stored, as only hashes of keys are: a
    copy of this table opens no console."""

    __tablename__ = "console_sessions"
    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_id: Mapped[str] = mapped_column(String(40))
    """The admin token's id, or `env` for VKGATE_ADMIN_TOKEN; its revocation ends the session."""
    token_hash: Mapped[str | None] = mapped_column(String(64))
    """For `env`: VKGATE_ADMIN_TOKEN's peppered hash when the session opened; another value of
    the variable ends the session. None for a stored token (its row says if it is revoked)."""
    role: Mapped[str] = mapped_column(String(16))
    organization_id: Mapped[str | None] = mapped_column(String(40))
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]
    last_seen_at: Mapped[datetime] = mapped_column(index=True)
