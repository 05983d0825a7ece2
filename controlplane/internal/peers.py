"""The releases of the proxies calling the internal API, as each signed call names its own."""

from __future__ import annotations

import logging

from prometheus_client import Counter

from vkgate import versions
from vkgate.logs import event

log = logging.getLogger("vkgate.controlplane.internal")

UNKNOWN = "unknown"
"""A proxy that names no release: one older than the header."""
MAX_VERSIONS = 32
"""Distinct releases counted apart; any more count as `other` (a label set stays bounded even
against a caller that names a new release on every call, which a signed caller would not)."""


class ProxyVersions:
    """Counts signed calls by the caller's release, and logs `proxy_version_mismatch` once per
    release too far from this control plane's."""

    def __init__(self, own: str, calls: Counter) -> None:
        self._own = own
        self._calls = calls
        self._seen: set[str] = set()

    def heard(self, version: str | None) -> None:
        label = version or UNKNOWN
        if label not in self._seen:
            if len(self._seen) >= MAX_VERSIONS:
                label = "other"
            else:
                self._seen.add(label)
                self._first(label)
        self._calls.labels(label).inc()

    def _first(self, version: str) -> None:
        mismatch = versions.mismatch(version, self._own) if version != UNKNOWN else None
        if mismatch is not None:
            event(
                log,
                "proxy_version_mismatch",
                level=logging.WARNING,
                peer_version=version,
                version=self._own,
                reason=mismatch,
            )
