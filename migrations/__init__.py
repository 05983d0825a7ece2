"""Schema migrations: Alembic for the control plane's relational store."""
