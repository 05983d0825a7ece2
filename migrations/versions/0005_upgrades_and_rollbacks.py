"""the schema's compatibility marker, the last spend read for each budget, and which pepper each hash is under

Revision ID: 0005
Revises: 0003

Expand only: the code of the releases before it runs on this schema unchanged (it never reads
the two new tables, and the two new columns may be null), so a rollback needs no downgrade.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # migrations/env.py fills in its one row at the end of every migration run.
    op.create_table(
        "schema_compatibility",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("revision", sa.String(length=32), nullable=False),
        sa.Column("compatible_from", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schema_compatibility")),
    )
    op.create_table(
        "budget_spend_readings",
        sa.Column("budget_id", sa.String(length=40), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=True),
        sa.Column("spent_nano_usd", sa.BigInteger(), nullable=False),
        sa.Column("read_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["budget_id"],
            ["budgets.id"],
            name=op.f("fk_budget_spend_readings_budget_id_budgets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("budget_id", name=op.f("pk_budget_spend_readings")),
    )

    # Null for the hashes made before: under whichever pepper was current then.
    for table in ("virtual_key_secrets", "admin_tokens"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("pepper_id", sa.String(length=16), nullable=True))


def downgrade() -> None:
    for table in ("admin_tokens", "virtual_key_secrets"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("pepper_id")
    op.drop_table("budget_spend_readings")
    op.drop_table("schema_compatibility")
