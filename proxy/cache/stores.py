"""Where cached answers are kept: in this process (bounded in bytes), or in Redis, shared by
every replica. A store never raises for its own trouble: a Redis that cannot answer is a miss,
and an answer it could not keep is only not kept."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger("vkgate.proxy.cache")

_ENTRY_OVERHEAD = 120
"""Bytes an in-process entry costs beyond its key and value (the dict slot, the tuple, the
objects' headers): counted so that many small entries cannot exceed the bound unseen."""
REDIS_PREFIX = b"vkgate:cache:"


class CacheStore(Protocol):
    async def get(self, key: bytes) -> bytes | None: ...

    async def put(self, key: bytes, value: bytes, ttl_s: int) -> None: ...

    async def close(self) -> None: ...

    def stats(self) -> tuple[int, int, int]:
        """(entries, bytes) held in process, and the calls Redis could not serve."""
        ...


class MemoryStore:
    """Least recently used entries go first once the bytes held would exceed `max_bytes`; an
    entry lapses `ttl_s` after it was stored (by the injected monotonic clock)."""

    def __init__(self, max_bytes: int, now: Callable[[], float]) -> None:
        self._max_bytes = max_bytes
        self._now = now
        self._entries: OrderedDict[bytes, tuple[float, bytes]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: bytes) -> bytes | None:
        found = self._entries.get(key)
        if found is None:
            return None
        expires_at, value = found
        if expires_at <= self._now():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return value

    async def put(self, key: bytes, value: bytes, ttl_s: int) -> None:
        size = _size(key, value)
        if size > self._max_bytes:
            return
        if key in self._entries:
            self._drop(key)
        while self._entries and self.bytes + size > self._max_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[key] = (self._now() + ttl_s, value)
        self.bytes += size

    def _drop(self, key: bytes) -> None:
        _, value = self._entries.pop(key)
        self.bytes -= _size(key, value)

    async def close(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def stats(self) -> tuple[int, int, int]:
        return len(self._entries), self.bytes, 0


def _size(key: bytes, value: bytes) -> int:
    return len(key) + len(value) + _ENTRY_OVERHEAD


class RedisStore:
    """Entries in Redis under `vkgate:cache:<key>`, each with its TTL (`SET … EX`), so every
    replica serves what any of them stored. One key per entry: it works the same on a Redis
    Cluster, where a key's slot picks its node."""

    def __init__(self, client: Any, unreachable: tuple[type[BaseException], ...]) -> None:
        self._client = client
        self._unreachable = unreachable
        self.failures = 0
        """Calls Redis could not serve: each was a miss, or an answer not kept."""
        self._warned = False

    async def get(self, key: bytes) -> bytes | None:
        try:
            value: bytes | None = await self._client.get(REDIS_PREFIX + key)
        except self._unreachable as exc:
            self._failed(exc)
            return None
        self._warned = False
        return value

    async def put(self, key: bytes, value: bytes, ttl_s: int) -> None:
        try:
            await self._client.set(REDIS_PREFIX + key, value, ex=ttl_s)
        except self._unreachable as exc:
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        if not self._warned:
            # Once per outage, not once per request: every cacheable request would log it.
            self._warned = True
            log.warning(
                "response cache: redis unreachable (%s); served as misses", type(exc).__name__
            )

    async def close(self) -> None:
        """The client is the process's: whoever made it closes it."""

    def stats(self) -> tuple[int, int, int]:
        return 0, 0, self.failures
