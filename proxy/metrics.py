"""Prometheus metrics of the proxy, on prometheus_client's default registry (one proxy a process)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

LIMITS_REDIS_FALLBACK = Gauge(
    "vkgate_limits_redis_fallback",
    "1 while Redis is unreachable and rate limits and budgets are kept per replica",
)
# Not `vkgate_limits_redis_fallback_total`: a counter by that name would be exposed as
# `vkgate_limits_redis_fallback` too, the gauge's name, which the registry refuses.
LIMITS_REDIS_FALLBACK_CALLS = Counter(
    "vkgate_limits_redis_fallback_calls",
    "Rate-limit and budget calls served by this replica's own counters instead of Redis",
)
