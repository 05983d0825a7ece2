"""routing policy rules and guardrails

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ALTER: the policies of before rules get none.
    op.add_column(
        "routing_policies",
        sa.Column("rules", sa.JSON(), server_default=sa.text("'[]'"), nullable=False),
    )
    op.create_table(
        "guardrails",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column(
            "organization_id",
            sa.String(40),
            sa.ForeignKey("organizations.id", name="fk_guardrails_organization_id_organizations"),
            nullable=False,
        ),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("scope_kind", sa.String(16), nullable=False),
        sa.Column("scope_id", sa.String(64), nullable=True),
        sa.Column("stage", sa.String(16), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("secret_encrypted", sa.LargeBinary(), nullable=True),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("on_error", sa.String(16), nullable=False),
        sa.Column("timeout_ms", sa.Integer(), nullable=False),
        sa.Column("enabled", sa.Boolean(), server_default=sa.true(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_guardrails"),
        sa.UniqueConstraint("organization_id", "name", name="uq_guardrails_organization_id"),
    )
    op.create_index("ix_guardrails_organization_id", "guardrails", ["organization_id"])


def downgrade() -> None:
    op.drop_index("ix_guardrails_organization_id", table_name="guardrails")
    op.drop_table("guardrails")
    op.drop_column("routing_policies", "rules")
