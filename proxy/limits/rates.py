"""Rate limits of a key and its team, as the counters see them and as clients are told.

Requests per minute and per day take one from their buckets; tokens per minute take the
request's estimate and are settled to the actual count afterwards (a bucket may then go below
zero: the next requests wait for the refill). Concurrency is a slot held for the whole request.
Every response of a limited key carries OpenAI's `x-ratelimit-*` headers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.errors import ProxyError
from proxy.limits.store import Bucket, Levels, Slots
from vkgate.errors import ErrorCode
from vkgate.wire import Limits

MINUTE = 60.0
DAY = 86_400.0
SLOT_LEASE_S = 900.0
"""A concurrency slot its replica never released (it died) frees itself after this long."""

Headers = tuple[tuple[bytes, bytes], ...]
_LIMIT_REQUESTS = b"x-ratelimit-limit-requests"
_REMAINING_REQUESTS = b"x-ratelimit-remaining-requests"
_RESET_REQUESTS = b"x-ratelimit-reset-requests"
_LIMIT_TOKENS = b"x-ratelimit-limit-tokens"
_REMAINING_TOKENS = b"x-ratelimit-remaining-tokens"
_RESET_TOKENS = b"x-ratelimit-reset-tokens"


@dataclass(frozen=True, slots=True)
class _Limit:
    key: str
    capacity: float
    per_second: float
    label: str
    """For the refusal's message: `60 requests per minute for this key`."""
    kind: str
    """For the metrics: `key_rpm`, `team_tpm`, ..."""
    capacity_bytes: bytes = b""
    """The limit as its header value, written once."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "capacity_bytes", b"%d" % self.capacity)


@dataclass(frozen=True, slots=True)
class RatePlan:
    """A key's rate limits, compiled once per bundle."""

    requests: tuple[_Limit, ...]
    tokens: tuple[_Limit, ...]
    slots: tuple[Slots, ...]
    slot_labels: tuple[str, ...]
    slot_kinds: tuple[str, ...]
    request_buckets: tuple[Bucket, ...]
    """What every request takes from its request buckets (one each), built once."""
    request_limits: tuple[tuple[bytes, bytes], ...] = ()
    """Each request limit's `x-ratelimit-limit-requests` header, built once."""
    token_limits: tuple[tuple[bytes, bytes], ...] = ()
    """Each token limit's `x-ratelimit-limit-tokens` header, built once."""

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "request_limits",
            tuple((_LIMIT_REQUESTS, r.capacity_bytes) for r in self.requests),
        )
        object.__setattr__(
            self, "token_limits", tuple((_LIMIT_TOKENS, t.capacity_bytes) for t in self.tokens)
        )

    def buckets(self, estimate: int) -> Sequence[Bucket]:
        """What a request of `estimate` tokens takes: requests first, then tokens."""
        tokens = self.tokens
        if not tokens:
            return self.request_buckets
        cost = float(estimate)
        if len(tokens) == 1:
            lim = tokens[0]
            return (*self.request_buckets, Bucket(lim.key, lim.capacity, lim.per_second, cost))
        taken = list(self.request_buckets)
        for lim in tokens:
            taken.append(Bucket(lim.key, lim.capacity, lim.per_second, cost))
        return tuple(taken)

    def corrections(self, estimate: int, used: int) -> tuple[Bucket, ...]:
        """Token buckets corrected from the estimate to the tokens used (may give back)."""
        if not self.tokens or used == estimate:
            return ()
        delta = float(used - estimate)
        corrected: list[Bucket] = []
        for lim in self.tokens:
            corrected.append(Bucket(lim.key, lim.capacity, lim.per_second, delta))
        return tuple(corrected)

    def headers(self, levels: Levels | None) -> Headers:
        """OpenAI's `x-ratelimit-*`: of the tightest request and the tightest token bucket."""
        if levels is None:
            return ()
        remaining, reset = levels.remaining, levels.reset_s
        out: Headers = ()
        count = len(self.requests)
        if count:
            at = _tightest(remaining, 0, count)
            out = (
                self.request_limits[at],
                (_REMAINING_REQUESTS, _whole_tokens(remaining[at])),
                (_RESET_REQUESTS, _duration(reset[at])),
            )
        if self.tokens:
            at = _tightest(remaining, count, len(self.tokens))
            out += (
                self.token_limits[at - count],
                (_REMAINING_TOKENS, _whole_tokens(remaining[at])),
                (_RESET_TOKENS, _duration(reset[at])),
            )
        return out

    def refusal(self, levels: Levels, estimate: int, headers: Headers) -> ProxyError:
        """`429 rate_limited` naming the limit the take could not pass."""
        refused = (*self.requests, *self.tokens)[levels.refused or 0]
        if refused in self.tokens and estimate > refused.capacity:
            message = (
                f"this request's estimated {estimate} tokens exceed the limit of {refused.label}"
            )
        else:
            message = f"rate limit exceeded: {refused.label}"
        return ProxyError(
            ErrorCode.RATE_LIMITED,
            message,
            headers=((b"retry-after", _whole_seconds(levels.retry_after_s)), *headers),
            reason=refused.kind,
        )

    def slots_refusal(self, index: int, headers: Headers) -> ProxyError:
        return ProxyError(
            ErrorCode.RATE_LIMITED,
            f"too many requests in flight: {self.slot_labels[index]}",
            headers=((b"retry-after", b"1"), *headers),
            reason=self.slot_kinds[index],
        )


def plan_of(vk_id: str, team_id: str | None, key: Limits, team: Limits) -> RatePlan | None:
    """The buckets a key's requests take from; None for a key without any limit."""
    requests: list[_Limit] = []
    tokens: list[_Limit] = []
    slots: list[Slots] = []
    labels: list[str] = []
    kinds: list[str] = []
    owners = [(f"vk:{vk_id}", "this key", "key", key)]
    if team_id is not None:
        owners.append((f"team:{team_id}", "this key's team", "team", team))
    for owner, whose, who, limits in owners:
        if limits.rpm:
            requests.append(
                _Limit(
                    f"rl:{owner}:rpm",
                    limits.rpm,
                    limits.rpm / MINUTE,
                    f"{limits.rpm} requests per minute for {whose}",
                    f"{who}_rpm",
                )
            )
        if limits.rpd:
            requests.append(
                _Limit(
                    f"rl:{owner}:rpd",
                    limits.rpd,
                    limits.rpd / DAY,
                    f"{limits.rpd} requests per day for {whose}",
                    f"{who}_rpd",
                )
            )
        if limits.tpm:
            tokens.append(
                _Limit(
                    f"rl:{owner}:tpm",
                    limits.tpm,
                    limits.tpm / MINUTE,
                    f"{limits.tpm} tokens per minute for {whose}",
                    f"{who}_tpm",
                )
            )
        if limits.max_concurrency:
            slots.append(Slots(f"cc:{owner}", limits.max_concurrency, SLOT_LEASE_S))
            labels.append(f"{limits.max_concurrency} requests at once for {whose}")
            kinds.append(f"{who}_max_concurrency")
    if not (requests or tokens or slots):
        return None
    return RatePlan(
        tuple(requests),
        tuple(tokens),
        tuple(slots),
        tuple(labels),
        tuple(kinds),
        tuple(Bucket(lim.key, lim.capacity, lim.per_second, 1.0) for lim in requests),
    )


def _tightest(remaining: tuple[float, ...], offset: int, count: int) -> int:
    """The index of the lowest of `remaining[offset:offset + count]` (the first of equals)."""
    at, i, end = offset, offset + 1, offset + count
    while i < end:
        if remaining[i] < remaining[at]:
            at = i
        i += 1
    return at


def _whole_tokens(level: float) -> bytes:
    """A remaining level as its header value: whole, never below zero."""
    whole = math.floor(level)
    return b"%d" % (whole if whole > 0 else 0)


def _whole_seconds(seconds: float) -> bytes:
    return b"%d" % max(1, math.ceil(seconds))


def _duration(seconds: float) -> bytes:
    """OpenAI's reset format: `20ms`, `1s`, `6m0s`, `1h2m3s`."""
    if seconds <= 0:
        return b"0s"
    if seconds < 1:
        millis = math.ceil(seconds * 1000)
        return _MILLISECONDS[millis] if millis > 1 else b"1ms"
    whole = math.ceil(seconds)
    if whole < 60:
        return _SECONDS[whole]
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return b"%dh%dm%ds" % (hours, minutes, secs)
    return b"%dm%ds" % (minutes, secs)


# The resets under a minute, formatted once: every answer to a limited key carries two.
_MILLISECONDS = [b"%dms" % millis for millis in range(1001)]
_SECONDS = [b"%ds" % secs for secs in range(60)]
