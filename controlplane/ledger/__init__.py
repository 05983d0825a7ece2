"""The spend ledger: priced spend records in ClickHouse (or embedded chDB), and its migrations."""
