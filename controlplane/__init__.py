"""The vkgate control plane: keys, providers, routing, budgets, the change feed and audit log."""
