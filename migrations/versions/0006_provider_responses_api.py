"""whether a provider serves the Responses API itself

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Providers created before this migration keep being called as they were: an OpenAI-format
    # one is taken to serve the Responses API (the server default), and the other kinds never
    # read the column. `anthropic` and `mock` rows say false, as new ones of those kinds do.
    op.add_column(
        "providers",
        sa.Column("responses_api", sa.Boolean(), server_default=sa.true(), nullable=False),
    )
    op.execute("UPDATE providers SET responses_api = false WHERE kind IN ('anthropic', 'mock')")


def downgrade() -> None:
    op.drop_column("providers", "responses_api")
