"""admin tokens bound to an organization

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Batch mode so SQLite gets the foreign key too (it recreates the table; nothing
    # references admin_tokens). The tokens that existed before stay unbound: they see everything.
    with op.batch_alter_table("admin_tokens") as batch:
        batch.add_column(sa.Column("organization_id", sa.String(length=40), nullable=True))
        batch.create_foreign_key(
            "fk_admin_tokens_organization_id_organizations",
            "organizations",
            ["organization_id"],
            ["id"],
        )


def downgrade() -> None:
    with op.batch_alter_table("admin_tokens") as batch:
        batch.drop_constraint("fk_admin_tokens_organization_id_organizations", type_="foreignkey")
        batch.drop_column("organization_id")
