"""cloud provider fields: settings and a sealed credential

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTERs: the providers that existed before get no settings and no cloud credential.
    op.add_column(
        "providers",
        sa.Column("settings", sa.JSON(), server_default=sa.text("'{}'"), nullable=False),
    )
    op.add_column("providers", sa.Column("credentials_encrypted", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    # A plain ALTER (SQLite 3.35+ has DROP COLUMN): recreating `providers` in batch mode would
    # have to drop a table its routing targets reference.
    op.drop_column("providers", "credentials_encrypted")
    op.drop_column("providers", "settings")
