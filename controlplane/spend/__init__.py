"""Spend: ingesting the proxies' spool segments into the ledger, budgets' spend, finance reports."""
