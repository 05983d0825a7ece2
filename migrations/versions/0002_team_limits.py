"""team rate limits

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The server default gives the teams created before this migration no limits.
    op.add_column(
        "teams", sa.Column("limits", sa.JSON(), server_default=sa.text("'{}'"), nullable=False)
    )


def downgrade() -> None:
    # A plain ALTER (SQLite 3.35+ has DROP COLUMN): recreating `teams` in batch mode would have
    # to drop a table its projects reference, which SQLite's foreign keys refuse once it has rows.
    op.drop_column("teams", "limits")
