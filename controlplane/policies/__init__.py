"""Routing policies: model aliases, each an ordered fallback chain of provider and model."""
