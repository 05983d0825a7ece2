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
_REQUEST_HEADERS = (
    b"x-ratelimit-limit-requests",
    b"x-ratelimit-remaining-requests",
    b"x-ratelimit-reset-requests",
)
_TOKEN_HEADERS = (
    b"x-ratelimit-limit-tokens",
    b"x-ratelimit-remaining-tokens",
    b"x-ratelimit-reset-tokens",
)


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

    def buckets(self, estimate: int) -> Sequence[Bucket]:
        """What a request of `estimate` tokens takes: requests first, then tokens."""
        if not self.tokens:
            return self.request_buckets
        cost = float(estimate)
        return (
            *self.request_buckets,
            *(Bucket(lim.key, lim.capacity, lim.per_second, cost) for lim in self.tokens),
        )

    def corrections(self, estimate: int, used: int) -> tuple[Bucket, ...]:
        """Token buckets corrected from the estimate to the tokens used (may give back)."""
        if not self.tokens or used == estimate:
            return ()
        delta = float(used - estimate)
        return tuple(Bucket(lim.key, lim.capacity, lim.per_second, delta) for lim in self.tokens)

    def headers(self, levels: Levels | None) -> Headers:
        """OpenAI's `x-ratelimit-*`: of the tightest request and the tightest token bucket."""
        if levels is None:
            return ()
        out: list[tuple[bytes, bytes]] = []
        remaining, reset = levels.remaining, levels.reset_s
        offset = 0
        for names, limits in ((_REQUEST_HEADERS, self.requests), (_TOKEN_HEADERS, self.tokens)):
            count = len(limits)
            if count:
                at = offset
                if count > 1:
                    at = min(range(offset, offset + count), key=remaining.__getitem__)
                out.append((names[0], limits[at - offset].capacity_bytes))
                out.append((names[1], b"%d" % max(0, math.floor(remaining[at]))))
                out.append((names[2], _duration(reset[at])))
            offset += count
        return tuple(out)

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


def _whole_seconds(seconds: float) -> bytes:
    return b"%d" % max(1, math.ceil(seconds))


def _duration(seconds: float) -> bytes:
    """OpenAI's reset format: `20ms`, `1s`, `6m0s`, `1h2m3s`."""
    if seconds <= 0:
        return b"0s"
    if seconds < 1:
        return b"%dms" % max(1, math.ceil(seconds * 1000))
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return b"%dh%dm%ds" % (hours, minutes, secs)
    if minutes:
        return b"%dm%ds" % (minutes, secs)
    return b"%ds" % secs
