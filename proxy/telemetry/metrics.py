"""The proxy's Prometheus metrics: counted on the event loop, rendered when scraped.

A request costs a few dictionary updates here, not prometheus_client's locked counters and
label lookups: everything that counts runs on the one event loop thread, and the scrape (on the
same loop) turns the tallies into metric families. Gauges are read from the objects that own
the state (spool, auth cache, breakers, change feed) at scrape time, so they cost nothing per
request. Label values are route names, statuses, error codes, aliases and provider names from
configuration: never a key, a prompt, an end user or a request id.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

import vkgate
from proxy.breaker import BreakerState
from proxy.spend.spool import SpoolStats

if TYPE_CHECKING:
    from proxy.limits.leases import LeaseStats

LATENCY_BOUNDS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
"""Seconds: from a cached refusal (about a millisecond) to a long stream."""

_BREAKER_VALUES = {BreakerState.CLOSED: 0.0, BreakerState.HALF_OPEN: 1.0, BreakerState.OPEN: 2.0}

Key = tuple[object, ...]


class Tally:
    """A counter with labels, kept as a dict from label values to a count."""

    __slots__ = ("help", "labels", "name", "values")

    def __init__(self, name: str, help: str, labels: tuple[str, ...]) -> None:
        self.name, self.help, self.labels = name, help, labels
        self.values: dict[Key, float] = {}

    def add(self, key: Key, amount: float = 1.0) -> None:
        values = self.values
        values[key] = values.get(key, 0.0) + amount

    def family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(self.name, self.help, labels=self.labels)
        for key, value in self.values.items():
            family.add_metric([_text(part) for part in key], value)
        return family


class Outcomes(Tally):
    """Guardrail outcomes, labelled guardrail, stage and outcome.

    A request adds its whole set of verdicts as one count (a key's guardrails give the same few
    sets again and again), spread over the labels when the metrics are read: one dictionary
    update a request instead of one a guardrail and stage."""

    __slots__ = ("kept", "sets")

    def __init__(self, name: str, help: str, labels: tuple[str, ...], kept: int = 1024) -> None:
        super().__init__(name, help, labels)
        self.sets: dict[tuple[tuple[str, str], ...], float] = {}
        self.kept = kept
        """Distinct sets counted whole; past that, a new set's outcomes are added one by one."""

    def add_verdicts(self, verdicts: dict[str, str]) -> None:
        """`<stage>:<name>` -> outcome, for one request."""
        key = tuple(verdicts.items())
        sets = self.sets
        count = sets.get(key)
        if count is not None:
            sets[key] = count + 1.0
        elif len(sets) < self.kept:
            sets[key] = 1.0
        else:
            for verdict, outcome in key:
                stage, _, name = verdict.partition(":")
                self.add((name, stage, outcome))

    def counts(self) -> dict[Key, float]:
        """Each label set's count."""
        counts = dict(self.values)
        for key, count in self.sets.items():
            for verdict, outcome in key:
                stage, _, name = verdict.partition(":")
                labels = (name, stage, outcome)
                counts[labels] = counts.get(labels, 0.0) + count
        return counts

    def family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(self.name, self.help, labels=self.labels)
        for key, value in self.counts().items():
            family.add_metric([_text(part) for part in key], value)
        return family


class Timings:
    """A histogram with labels: per label values, a count per bucket and the sum."""

    __slots__ = ("bounds", "help", "labels", "name", "states")

    def __init__(
        self,
        name: str,
        help: str,
        labels: tuple[str, ...],
        bounds: tuple[float, ...] = LATENCY_BOUNDS,
    ) -> None:
        self.name, self.help, self.labels, self.bounds = name, help, labels, bounds
        self.states: dict[Key, list[float]] = {}
        """Per label values: one count per bound, one for +Inf, then the sum."""

    def observe(self, key: Key, seconds: float) -> None:
        state = self.states.get(key)
        if state is None:
            state = self.states[key] = [0.0] * (len(self.bounds) + 2)
        # Prometheus buckets are "less than or equal": bisect_left finds the first bound >= it.
        state[bisect_left(self.bounds, seconds)] += 1
        state[-1] += seconds

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.help, labels=self.labels)
        for key, state in self.states.items():
            buckets: list[tuple[str, float]] = []
            total = 0.0
            for bound, count in zip((*self.bounds, float("inf")), state, strict=False):
                total += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), total))
            family.add_metric([_text(part) for part in key], buckets, state[-1])
        return family


def _text(value: object) -> str:
    return "" if value is None else str(value)


@dataclass(slots=True)
class Sources:
    """What the scrape reads gauges from; each is None until start-up has built it."""

    in_flight: Callable[[], int] | None = None
    max_in_flight: int = 0
    breakers: Callable[[], Iterator[tuple[str, str, BreakerState]]] | None = None
    """(provider id, provider name, state) of every credential called so far."""
    auth_cache: Callable[[], dict[str, int]] | None = None
    """Entries, and lookups by result."""
    feed: Callable[[], tuple[bool, int | None, float | None]] | None = None
    """(connected, revision, seconds since it last answered)."""
    spool: Callable[[], SpoolStats] | None = None
    limits_fallback: Callable[[], tuple[bool, int]] | None = None
    """(serving from in-process counters now, calls served so) while Redis is configured."""
    limits_leases: Callable[[], LeaseStats] | None = None
    """What the leases of the shared counters did, while Redis is configured."""
    response_cache: Callable[[], tuple[int, int, int]] | None = None
    """The response cache's (entries, bytes) in process, and its calls Redis could not serve."""


class ProxyMetrics(Collector):
    """Every proxy metric, on a registry of its own (one per app)."""

    def __init__(self) -> None:
        self.requests = Tally(
            "vkgate_requests",
            "Requests answered, by route, HTTP status, error code (empty when served), model "
            "alias and the provider that answered",
            ("route", "status", "code", "model", "provider"),
        )
        self.duration = Timings(
            "vkgate_request_duration_seconds",
            "Time from a request's arrival to its last byte (streams: the whole stream)",
            ("route",),
        )
        self.first_byte = Timings(
            "vkgate_time_to_first_byte_seconds",
            "Time from a request's arrival to the first byte of a provider's answer reaching "
            "the client",
            ("route",),
        )
        self.upstream = Timings(
            "vkgate_upstream_duration_seconds",
            "Time from the first provider call to the answer being committed to (a plain "
            "answer read whole, a stream's first chunk), fallbacks included",
            ("provider",),
        )
        self.attempts = Tally(
            "vkgate_provider_attempts",
            "Credentials tried, by provider and result: ok, the provider's status class for an "
            "answer passed through, or why it was passed over",
            ("provider", "result"),
        )
        self.fallbacks = Tally(
            "vkgate_fallbacks",
            "Credentials passed over before a request was answered, by model alias",
            ("model",),
        )
        self.limit_refusals = Tally(
            "vkgate_rate_limit_refusals",
            "Requests refused 429 rate_limited, by the limit that refused them",
            ("limit",),
        )
        self.budget_refusals = Tally(
            "vkgate_budget_refusals",
            "Requests refused 402 budget_exceeded, by the refusing budget's scope",
            ("scope",),
        )
        self.policy_refusals = Tally(
            "vkgate_policy_refusals",
            "Requests refused 403 policy_violation, by the refusing rule's name",
            ("rule",),
        )
        self.guardrails = Outcomes(
            "vkgate_guardrail_outcomes",
            "Guardrail checks by guardrail name, stage and outcome: passed, blocked, redacted, "
            "warned, or skipped (did not run: timed out under on_error allow, or nothing on "
            "the route to read)",
            ("guardrail", "stage", "outcome"),
        )
        self.cache_lookups = Tally(
            "vkgate_response_cache_lookups",
            "Requests a cache rule covers, by what the cache did: hit, miss, refresh "
            "(Cache-Control: no-cache), bypass (no-store)",
            ("result",),
        )
        self.cache_stores = Tally(
            "vkgate_response_cache_stores",
            "Answers of misses and refreshes, by what became of them: stored, not_stored (not "
            "a whole 2xx answer, or one a guardrail cut short), too_large (over "
            "VKGATE_CACHE_MAX_ENTRY_BYTES), unreadable",
            ("result",),
        )
        self.sources = Sources()
        self.provider_names: dict[str, str] = {}
        """Provider id -> name, learnt from requests, for the breaker gauge's labels."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        info = GaugeMetricFamily(
            "vkgate_build_info", "The running vkgate version", labels=("version", "service")
        )
        info.add_metric([vkgate.__version__, "proxy"], 1.0)
        yield info
        for tally in (
            self.requests,
            self.attempts,
            self.fallbacks,
            self.limit_refusals,
            self.budget_refusals,
            self.policy_refusals,
            self.guardrails,
            self.cache_lookups,
            self.cache_stores,
        ):
            yield tally.family()
        for timings in (self.duration, self.first_byte, self.upstream):
            yield timings.family()
        yield from self._gauges()

    def _gauges(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        sources = self.sources
        if sources.in_flight is not None:
            yield GaugeMetricFamily(
                "vkgate_in_flight_requests",
                "Requests this process is serving now (admitted, not finished)",
                value=sources.in_flight(),
            )
            yield GaugeMetricFamily(
                "vkgate_max_in_flight_requests",
                "VKGATE_MAX_IN_FLIGHT: more requests than this are refused 503 gateway_busy",
                value=sources.max_in_flight,
            )
        if sources.breakers is not None:
            breakers = GaugeMetricFamily(
                "vkgate_breaker_state",
                "Each credential's circuit breaker: 0 closed, 1 half-open, 2 open",
                labels=("provider", "provider_id"),
            )
            for provider_id, name, state in sources.breakers():
                breakers.add_metric([name, provider_id], _BREAKER_VALUES[state])
            yield breakers
        if sources.auth_cache is not None:
            counts = sources.auth_cache()
            yield GaugeMetricFamily(
                "vkgate_auth_cache_entries", "Keys held by the auth cache", value=counts["entries"]
            )
            lookups = CounterMetricFamily(
                "vkgate_auth_cache_lookups",
                "Key lookups by result: hit, miss (asked the control plane), stale (served past "
                "its resolution while the control plane was unreachable), negative (a key the "
                "control plane did not know, refused from the cache)",
                labels=("result",),
            )
            for result in ("hit", "miss", "stale", "negative"):
                lookups.add_metric([result], counts[result])
            yield lookups
        if sources.feed is not None:
            connected, revision, silent_s = sources.feed()
            yield GaugeMetricFamily(
                "vkgate_change_feed_connected",
                "1 while the control plane's change feed answers",
                value=1.0 if connected else 0.0,
            )
            if revision is not None:
                yield GaugeMetricFamily(
                    "vkgate_change_feed_revision",
                    "The change-feed revision this process has applied",
                    value=revision,
                )
            if silent_s is not None:
                yield GaugeMetricFamily(
                    "vkgate_change_feed_lag_seconds",
                    "Seconds since the change feed last answered; a long-poll answers at least "
                    "every 20 s, so more means admin changes are not arriving",
                    value=silent_s,
                )
        if sources.spool is not None:
            yield from _spool_families(sources.spool())
        if sources.limits_fallback is not None:
            degraded, calls = sources.limits_fallback()
            yield GaugeMetricFamily(
                "vkgate_limits_redis_fallback",
                "1 while Redis is unreachable and rate limits and budgets are kept per replica",
                value=1.0 if degraded else 0.0,
            )
            yield CounterMetricFamily(
                "vkgate_limits_redis_fallback_calls",
                "Rate-limit and budget calls served by this replica's own counters instead of "
                "Redis",
                value=calls,
            )

        if sources.limits_leases is not None:
            yield from _lease_families(sources.limits_leases())
        if sources.response_cache is not None:
            yield from _cache_families(*sources.response_cache())

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _cache_families(
    entries: int, size: int, redis_errors: int
) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    yield GaugeMetricFamily(
        "vkgate_response_cache_entries",
        "Answers the in-process response cache holds (0 with Redis)",
        value=entries,
    )
    yield GaugeMetricFamily(
        "vkgate_response_cache_bytes",
        "Bytes the in-process response cache holds, of VKGATE_CACHE_MAX_BYTES (0 with Redis)",
        value=size,
    )
    yield CounterMetricFamily(
        "vkgate_response_cache_redis_errors",
        "Response-cache calls Redis could not serve, each a miss or an answer not kept",
        value=redis_errors,
    )


def _lease_families(stats: LeaseStats) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    leases = CounterMetricFamily(
        "vkgate_limits_leases",
        "Slices of shared rate limits, concurrency limits and budgets: taken (or grown) from "
        "Redis, returned unused, expired (Redis lapsed them before this replica synced), "
        "revoked (their limit or budget changed)",
        labels=("event",),
    )
    for name, value in (
        ("taken", stats.taken),
        ("returned", stats.returned),
        ("expired", stats.expired),
        ("revoked", stats.revoked),
    ):
        leases.add_metric([name], value)
    yield leases
    admissions = CounterMetricFamily(
        "vkgate_limits_admissions",
        "Requests admitted or refused by the shared limits: `lease` from this replica's "
        "slices alone, `redis` after a call to Redis",
        labels=("source",),
    )
    admissions.add_metric(["lease"], stats.local)
    admissions.add_metric(["redis"], stats.synced)
    yield admissions
    total = stats.local + stats.synced
    yield GaugeMetricFamily(
        "vkgate_limits_served_without_redis_ratio",
        "Share of the requests under shared limits since start that made no Redis call",
        value=stats.local / total if total else 0.0,
    )


def _spool_families(stats: SpoolStats) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    yield GaugeMetricFamily(
        "vkgate_spool_bytes", "Bytes of spend records not yet shipped", value=stats.bytes
    )
    yield GaugeMetricFamily(
        "vkgate_spool_segments",
        "Spool segments not yet shipped, the open one included",
        value=stats.segments,
    )
    yield GaugeMetricFamily(
        "vkgate_spool_oldest_record_age_seconds",
        "Age of the oldest spend record not yet shipped (0 when none waits)",
        value=stats.oldest_record_age_s or 0.0,
    )
    yield GaugeMetricFamily(
        "vkgate_spool_writable", "1 while the spool can be written", value=float(stats.writable)
    )
    for name, help, value in (
        (
            "vkgate_spool_shipped_segments",
            "Segments the ledger acknowledged",
            stats.shipped_segments,
        ),
        ("vkgate_spool_shipped_records", "Records the ledger acknowledged", stats.shipped_records),
        (
            "vkgate_spool_dropped_records",
            "Records dropped unshipped to keep the spool in bounds (drop_oldest policy)",
            stats.dropped_records,
        ),
        (
            "vkgate_spool_refused_requests",
            "Requests refused 503 spend_spool_full because spend could not be recorded",
            stats.refused_when_full,
        ),
        (
            "vkgate_spool_rejected_segments",
            "Segments the control plane refused as malformed, set aside in rejected/",
            stats.rejected_segments,
        ),
        (
            "vkgate_spool_corrupt_records",
            "Records skipped because they failed their checksum",
            stats.corrupt_records,
        ),
    ):
        yield CounterMetricFamily(name, help, value=value)
