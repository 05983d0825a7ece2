"""Budgets: spend limits by scope and window (the rows; enforcement lives in the proxy)."""
