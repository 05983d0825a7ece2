"""A key's cache rules compiled, per alias, into the scope its answers are cached under."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

from vkgate.wire import CacheRuleState

_SPECIFICITY = {"virtual_key": 0, "project": 1, "team": 2, "organization": 3}
"""The narrowest rule that matches an alias wins: its scope and its TTL."""


@dataclass(frozen=True, slots=True)
class CacheScope:
    """Where an alias's answers are cached for a key, and for how long."""

    namespace: bytes
    """`organization:<id>`, `team:<id>`, `project:<id>` or `virtual_key:<id>`: part of every
    entry's key, so an entry is never seen outside the scope that stored it."""
    ttl_s: int
    rule_id: str


def compile_rules(
    rules: Iterable[CacheRuleState],
    aliases: Iterable[str],
    variants: Mapping[str, bytes] | None = None,
) -> Mapping[str, CacheScope]:
    """Each alias of the key that a rule covers, with the narrowest such rule's scope.
    `variants` (by alias) joins the namespace: what else decides an answer for this key, so
    keys of one scope that differ in it never share an entry."""
    ordered = sorted(rules, key=lambda r: (_SPECIFICITY.get(r.scope_kind, 9), r.rule_id))
    if not ordered:
        return {}
    scopes: dict[str, CacheScope] = {}
    for alias in aliases:
        for rule in ordered:
            if rule.scope_kind not in _SPECIFICITY:
                continue  # a scope kind newer than this proxy: never guessed at
            if any(fnmatchcase(alias, glob) for glob in rule.models):
                namespace = f"{rule.scope_kind}:{rule.scope_id}".encode()
                if variants is not None and alias in variants:
                    namespace += b"/" + variants[alias]
                scopes[alias] = CacheScope(namespace, rule.ttl_seconds, rule.rule_id)
                break
    return scopes
