"""Guardrails: checks on the text of the requests and answers of the keys in their scope."""
