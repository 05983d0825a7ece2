"""web console sessions remember which VKGATE_ADMIN_TOKEN opened them

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A nullable column only: earlier releases write sessions without it. An env-token session
    # without it ends at its next request (which value opened it cannot be told).
    op.add_column("console_sessions", sa.Column("token_hash", sa.String(64), nullable=True))


def downgrade() -> None:
    op.drop_column("console_sessions", "token_hash")
