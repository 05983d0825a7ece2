"""Prometheus metrics of the control plane, on a registry of its own (one per app instance)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class Metrics:
    def __init__(self, waiting_polls: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        Gauge(
            "vkgate_controlplane_feed_waiting_polls",
            "Change-feed long-polls waiting for an event",
            registry=self.registry,
        ).set_function(waiting_polls)
        self.internal_auth_failures = Counter(
            "vkgate_controlplane_internal_auth_failures",
            "Internal API requests refused for their signature, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.admin_auth_failures = Counter(
            "vkgate_controlplane_admin_auth_failures",
            "Admin API requests refused for their token",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
