"""initial schema

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "admin_tokens",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_admin_tokens")),
        sa.UniqueConstraint("name", name=op.f("uq_admin_tokens_name")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_admin_tokens_token_hash")),
    )
    op.create_table(
        "audit_log",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("resource_kind", sa.String(length=32), nullable=False),
        sa.Column("resource_id", sa.String(length=64), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index("ix_audit_log_org_id", ["organization_id", "id"], unique=False)

    op.create_table(
        "change_feed",
        sa.Column("revision", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("entity_kind", sa.String(length=32), nullable=False),
        sa.Column("entity_id", sa.String(length=40), nullable=False),
        sa.Column("vk_id", sa.String(length=40), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("revision", name=op.f("pk_change_feed")),
    )
    with op.batch_alter_table("change_feed", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_change_feed_organization_id"), ["organization_id"], unique=False
        )

    op.create_table(
        "feed_counter",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_feed_counter")),
    )
    op.create_table(
        "organizations",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_organizations")),
        sa.UniqueConstraint("name", name=op.f("uq_organizations_name")),
    )
    op.create_table(
        "providers",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("base_url", sa.String(length=2000), nullable=True),
        sa.Column("api_version", sa.String(length=64), nullable=True),
        sa.Column("api_key_encrypted", sa.LargeBinary(), nullable=True),
        sa.Column("headers_encrypted", sa.LargeBinary(), nullable=True),
        sa.Column("header_names", sa.JSON(), nullable=False),
        sa.Column("price_overrides", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_providers_organization_id_organizations"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_providers")),
        sa.UniqueConstraint("organization_id", "name", name=op.f("uq_providers_organization_id")),
    )
    with op.batch_alter_table("providers", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_providers_organization_id"), ["organization_id"], unique=False
        )

    op.create_table(
        "routing_policies",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_routing_policies_organization_id_organizations"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_routing_policies")),
        sa.UniqueConstraint(
            "organization_id", "name", name=op.f("uq_routing_policies_organization_id")
        ),
    )
    with op.batch_alter_table("routing_policies", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_routing_policies_organization_id"), ["organization_id"], unique=False
        )

    op.create_table(
        "teams",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_teams_organization_id_organizations"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_teams")),
        sa.UniqueConstraint("organization_id", "name", name=op.f("uq_teams_organization_id")),
    )
    with op.batch_alter_table("teams", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_teams_organization_id"), ["organization_id"], unique=False
        )

    op.create_table(
        "budgets",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("scope_kind", sa.String(length=16), nullable=False),
        sa.Column("scope_id", sa.String(length=200), nullable=True),
        sa.Column("window", sa.String(length=8), nullable=False),
        sa.Column("limit_nano_usd", sa.BigInteger(), nullable=False),
        sa.Column("provider_id", sa.String(length=40), nullable=True),
        sa.Column("on_breach", sa.String(length=8), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_budgets_organization_id_organizations"),
        ),
        sa.ForeignKeyConstraint(
            ["provider_id"],
            ["providers.id"],
            name=op.f("fk_budgets_provider_id_providers"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_budgets")),
    )
    with op.batch_alter_table("budgets", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_budgets_organization_id"), ["organization_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_budgets_provider_id"), ["provider_id"], unique=False)

    op.create_table(
        "projects",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("team_id", sa.String(length=40), nullable=True),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_projects_organization_id_organizations"),
        ),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_projects_team_id_teams")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_projects")),
        sa.UniqueConstraint("organization_id", "name", name=op.f("uq_projects_organization_id")),
    )
    with op.batch_alter_table("projects", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_projects_organization_id"), ["organization_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_projects_team_id"), ["team_id"], unique=False)

    op.create_table(
        "routing_targets",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("policy_id", sa.String(length=40), nullable=False),
        sa.Column("alias", sa.String(length=200), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("provider_id", sa.String(length=40), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.ForeignKeyConstraint(
            ["policy_id"],
            ["routing_policies.id"],
            name=op.f("fk_routing_targets_policy_id_routing_policies"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["provider_id"],
            ["providers.id"],
            name=op.f("fk_routing_targets_provider_id_providers"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_routing_targets")),
        sa.UniqueConstraint(
            "policy_id", "alias", "position", name=op.f("uq_routing_targets_policy_id")
        ),
    )
    with op.batch_alter_table("routing_targets", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_routing_targets_policy_id"), ["policy_id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_routing_targets_provider_id"), ["provider_id"], unique=False
        )

    op.create_table(
        "virtual_keys",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("organization_id", sa.String(length=40), nullable=False),
        sa.Column("project_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("routing_policy_id", sa.String(length=40), nullable=True),
        sa.Column("allowed_models", sa.JSON(), nullable=True),
        sa.Column("limits", sa.JSON(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_virtual_keys_organization_id_organizations"),
        ),
        sa.ForeignKeyConstraint(
            ["project_id"], ["projects.id"], name=op.f("fk_virtual_keys_project_id_projects")
        ),
        sa.ForeignKeyConstraint(
            ["routing_policy_id"],
            ["routing_policies.id"],
            name=op.f("fk_virtual_keys_routing_policy_id_routing_policies"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_virtual_keys")),
        sa.UniqueConstraint("project_id", "name", name=op.f("uq_virtual_keys_project_id")),
    )
    with op.batch_alter_table("virtual_keys", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_virtual_keys_organization_id"), ["organization_id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_virtual_keys_project_id"), ["project_id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_virtual_keys_routing_policy_id"), ["routing_policy_id"], unique=False
        )

    op.create_table(
        "virtual_key_secrets",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("vk_id", sa.String(length=40), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("valid_until", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["vk_id"],
            ["virtual_keys.id"],
            name=op.f("fk_virtual_key_secrets_vk_id_virtual_keys"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_virtual_key_secrets")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_virtual_key_secrets_key_hash")),
    )
    with op.batch_alter_table("virtual_key_secrets", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_virtual_key_secrets_vk_id"), ["vk_id"], unique=False)

    op.bulk_insert(
        sa.table("feed_counter", sa.column("id", sa.Integer), sa.column("revision", sa.BigInteger)),
        [{"id": 1, "revision": 0}],
    )


def downgrade() -> None:
    with op.batch_alter_table("virtual_key_secrets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_virtual_key_secrets_vk_id"))

    op.drop_table("virtual_key_secrets")
    with op.batch_alter_table("virtual_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_virtual_keys_routing_policy_id"))
        batch_op.drop_index(batch_op.f("ix_virtual_keys_project_id"))
        batch_op.drop_index(batch_op.f("ix_virtual_keys_organization_id"))

    op.drop_table("virtual_keys")
    with op.batch_alter_table("routing_targets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_routing_targets_provider_id"))
        batch_op.drop_index(batch_op.f("ix_routing_targets_policy_id"))

    op.drop_table("routing_targets")
    with op.batch_alter_table("projects", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_projects_team_id"))
        batch_op.drop_index(batch_op.f("ix_projects_organization_id"))

    op.drop_table("projects")
    with op.batch_alter_table("budgets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_budgets_provider_id"))
        batch_op.drop_index(batch_op.f("ix_budgets_organization_id"))

    op.drop_table("budgets")
    with op.batch_alter_table("teams", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_teams_organization_id"))

    op.drop_table("teams")
    with op.batch_alter_table("routing_policies", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_routing_policies_organization_id"))

    op.drop_table("routing_policies")
    with op.batch_alter_table("providers", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_providers_organization_id"))

    op.drop_table("providers")
    op.drop_table("organizations")
    op.drop_table("feed_counter")
    with op.batch_alter_table("change_feed", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_change_feed_organization_id"))

    op.drop_table("change_feed")
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index("ix_audit_log_org_id")

    op.drop_table("audit_log")
    op.drop_table("admin_tokens")
