"""Rate limits and budgets: reserved before a provider is paid, settled on actual usage."""
