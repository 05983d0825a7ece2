"""The spend records of one request: an admit when it enters, exactly one outcome when it ends.

The outcome is a `confirm` when a provider's 2xx reached the client (a stream that broke off or
that the client left is still confirmed, with the usage seen until then and a flag), and a
`fail` otherwise; a `fail` made before any provider was called is a refusal.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from proxy.spend.estimate import estimate_tokens
from proxy.spend.spool import SpoolError
from proxy.usage import TokenUsage
from vkgate.spend import RecordKind, SpendRecord, UsageSource

if TYPE_CHECKING:
    from proxy.dispatch import Outcome
    from proxy.prepared import Prepared
    from proxy.runtime import KeyRuntime
    from proxy.spend.spool import SpendSpool

log = logging.getLogger("vkgate.proxy")
CLIENT_CLOSED = 499
"""The status recorded when the client left before any answer (nginx's convention)."""


class Ticket:
    """One request's place in the spool: its admit is written on creation, and exactly one
    outcome record follows, whichever of `settle`'s callers comes first."""

    __slots__ = (
        "_route",
        "_spool",
        "_started",
        "record",
        "request",
        "request_id",
        "runtime",
        "settled",
    )

    def __init__(self, spool: SpendSpool, route: str, request_id: bytes, started: float) -> None:
        self._spool = spool
        self._route = route
        self._started = started
        self.request_id = request_id.decode("latin-1")
        self.runtime: KeyRuntime | None = None
        """The key, once authenticated: the record's attribution."""
        self.request: Prepared | None = None
        """The request, once read and resolved."""
        self.settled = False
        self.record: SpendRecord | None = None
        """The outcome record once made: its tokens settle budgets, its seq (0 when the spool
        could not take it) says when the ledger has it."""
        # Raises SpoolError when nothing can be written: the caller refuses the request.
        spool.append(
            SpendRecord(
                id="",
                kind=RecordKind.ADMIT,
                replica_id="",
                seq=0,
                request_id=self.request_id,
                at="",
                route=route,
            )
        )

    def settle(self, outcome: Outcome, status: int, error_code: str | None, now: float) -> None:
        if self.settled:
            return
        self.settled = True
        record = self.record = self._outcome_record(outcome, status, error_code, now)
        try:
            self._spool.append(record)
        except SpoolError:
            # The answer is (being) given: the record waits in memory for the disk.
            self._spool.hold(record)

    def _outcome_record(
        self, outcome: Outcome, status: int, error_code: str | None, now: float
    ) -> SpendRecord:
        served = 200 <= status < 300
        record = SpendRecord(
            id="",
            kind=RecordKind.CONFIRM if served else RecordKind.FAIL,
            replica_id="",
            seq=0,
            request_id=self.request_id,
            at="",
            route=self._route,
            status=status,
            error_code=error_code,
            refused=not served and outcome.calls == 0,
            cancelled=outcome.cancelled,
            attempts=outcome.calls,
            latency_ms=_micros(now - self._started),
        )
        if outcome.first_byte_at is not None:
            record.ttfb_ms = _micros(outcome.first_byte_at - self._started)
        runtime, request = self.runtime, self.request
        if runtime is not None:
            record.organization_id = runtime.organization_id
            record.team_id = runtime.team_id
            record.project_id = runtime.project_id
            record.virtual_key_id = runtime.vk_id
        if request is not None:
            record.model = request.model
            record.end_user = request.end_user
            record.stream = request.exchange.stream
        upstream = outcome.upstream
        if upstream is None and outcome.causes:
            # Not served: the ledger attributes the failure to the last credential tried.
            record.provider_id = outcome.causes[-1].provider_id
        elif upstream is not None:
            record.provider_id = upstream.provider_id
            record.provider_kind = upstream.kind
            record.upstream_model = upstream.model
            record.served_model = outcome.served_model or upstream.model
        cached = outcome.cached
        if cached is not None:
            # Served from the response cache: nothing was used, and what it spared is said.
            record.cache_hit = True
            record.saved_nano_usd = cached.saved_nano_usd
            record.provider_id = cached.provider_id
            record.provider_kind = cached.provider_kind
            record.upstream_model = cached.upstream_model
            record.served_model = cached.served_model or cached.upstream_model
            return record
        usage = outcome.usage
        if request is not None and request.meter is not None:
            # Audio and images: the route knows its units, and an upload is no prompt to count.
            request.meter.measure(record, outcome)
        elif usage is not None:
            _count(record, usage)
            record.usage_source = UsageSource.PROVIDER
        elif served and request is not None:
            # The provider said nothing of usage: estimated, and the record says so.
            record.input_tokens = estimate_tokens(_prompt_text(request.body))
            record.output_tokens = outcome.estimated_output_tokens
            record.usage_source = UsageSource.ESTIMATED
        return record


_INLINE_DATA = re.compile(rb'"data:[^"]{64,}"')
_INLINE_DATA_TOKENS = b'"(inline data)"'


def _prompt_text(body: bytes) -> str:
    """The request for a token estimate: inline images and files (base64 `data:` URLs) stand in
    as a few tokens instead of hundreds of thousands."""
    return _INLINE_DATA.sub(_INLINE_DATA_TOKENS, body).decode("utf-8", "replace")


def _count(record: SpendRecord, usage: TokenUsage) -> None:
    record.cache_read_tokens = max(usage.cache_read_tokens, 0)
    record.cache_write_tokens = max(usage.cache_write_tokens, 0)
    record.reasoning_tokens = max(usage.reasoning_tokens, 0)
    # The record's convention, held even when a provider's numbers are not self-consistent:
    # input counts cache reads and writes, output counts reasoning.
    record.input_tokens = max(
        usage.input_tokens, record.cache_read_tokens + record.cache_write_tokens
    )
    record.output_tokens = max(usage.output_tokens, record.reasoning_tokens)


def _micros(seconds: float) -> float:
    """`seconds` in milliseconds, to the microsecond (half up): a third of `round(ms, 3)`'s
    cost, which formats the number to round it; the float is the one nearest the decimal."""
    return int(seconds * 1_000_000 + 0.5) / 1000
