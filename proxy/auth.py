"""The auth cache: a presented `vk-` key to its compiled runtime, with no network call on a hit.

Keyed by the key's SHA-256 (the raw key is never stored). On a miss the control plane resolves
the hash and sends the key's bundle. While the control plane is unreachable, a cached key keeps
working past its resolution's expiry, `soft_bump_s` at a time, up to `hard_grace_s`; an answer
of 401/403/404 evicts at once, and a key past its own expiry is refused locally.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

from proxy.control import ControlPlaneClient, Refused, Unreachable
from proxy.errors import ProxyError
from proxy.providers import Provider
from proxy.runtime import KeyRuntime, compile_bundle, parse_time
from vkgate.clock import Clock
from vkgate.errors import ErrorCode
from vkgate.wire import ChangeEvent, EventKind, ResolveKeyResponse

log = logging.getLogger("vkgate.proxy.auth")

# Re-resolve this long before a resolution expires, in the background, so a busy key never
# waits on the control plane.
RESOLVE_AHEAD_S = 120.0
REFRESH_CONCURRENCY = 8


@dataclass(slots=True)
class Entry:
    digest: str
    runtime: KeyRuntime
    etag: str | None
    resolved_until: float
    """When this resolution stops being trusted without asking again (unix seconds)."""
    hard_until: float
    """The last moment stale serving may reach while the control plane is unreachable."""
    key_expires_at: float | None
    """When the presented key itself stops working: its expiry or the end of a rotation grace."""
    config_due: float
    refreshing: bool = False
    dirty: bool = False
    """Set when a refresh is wanted; a running refresh checks it again before it stops."""
    must_resolve: bool = False


class _Entries(LRUCache[str, Entry]):
    """An LRU that keeps an index by virtual key id, so change events find entries quickly."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.by_vk: dict[str, set[str]] = {}

    def __setitem__(self, digest: str, entry: Entry) -> None:
        super().__setitem__(digest, entry)
        self.by_vk.setdefault(entry.runtime.vk_id, set()).add(digest)

    def __delitem__(self, digest: str) -> None:
        entry = self[digest]
        super().__delitem__(digest)
        digests = self.by_vk.get(entry.runtime.vk_id)
        if digests is not None:
            digests.discard(digest)
            if not digests:
                del self.by_vk[entry.runtime.vk_id]


class AuthCache:
    def __init__(
        self,
        control: ControlPlaneClient,
        providers: Mapping[str, Provider],
        clock: Clock,
        *,
        maxsize: int = 10_000,
        soft_bump_s: float = 300.0,
        hard_grace_s: float = 21_600.0,
        config_ttl_s: float = 60.0,
    ) -> None:
        self._control = control
        self._providers = providers
        self._clock = clock
        self._entries = _Entries(maxsize)
        self._soft_bump_s = soft_bump_s
        self._hard_grace_s = hard_grace_s
        self._config_ttl_s = config_ttl_s
        self._loading: dict[str, asyncio.Future[Entry]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._refresh_slots = asyncio.Semaphore(REFRESH_CONCURRENCY)

    def __len__(self) -> int:
        return len(self._entries)

    async def authenticate(self, presented_key: str) -> KeyRuntime:
        digest = hashlib.sha256(presented_key.encode()).hexdigest()
        entry = self._entries.get(digest)
        if entry is None:
            entry = await self._load(digest)
            return entry.runtime
        now = self._clock.now().timestamp()
        if entry.key_expires_at is not None and now >= entry.key_expires_at:
            self._evict(digest)
            raise self._expired(entry.runtime, now)
        if now >= entry.resolved_until:
            return await self._revalidate(entry, now)
        if now >= entry.config_due and not entry.refreshing:
            self._schedule_refresh(entry)
        return entry.runtime

    # -- misses and expired resolutions -------------------------------------------------------

    async def _load(self, digest: str) -> Entry:
        """One control-plane round trip per key however many requests miss at once."""
        pending = self._loading.get(digest)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Entry] = asyncio.get_running_loop().create_future()
        self._loading[digest] = future
        try:
            entry = await self._fetch(digest)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waited
            raise
        else:
            future.set_result(entry)
            self._entries[digest] = entry
            return entry
        finally:
            del self._loading[digest]

    async def _fetch(self, digest: str, etag: str | None = None) -> Entry:
        try:
            resolution = await self._control.resolve_key(digest)
            config = await self._control.config(resolution.vk_id)
        except Refused as exc:
            raise ProxyError(exc.code, exc.message) from None
        except Unreachable as exc:
            log.warning("control plane unreachable while resolving a key: %s", exc)
            raise ProxyError(
                ErrorCode.AUTH_UPSTREAM_UNAVAILABLE,
                "the key could not be checked: the control plane is unreachable",
            ) from None
        assert config.bundle is not None
        return self._entry(
            digest, resolution, compile_bundle(config.bundle, self._providers), config.etag
        )

    def _entry(
        self, digest: str, resolution: ResolveKeyResponse, runtime: KeyRuntime, etag: str | None
    ) -> Entry:
        now = self._clock.now().timestamp()
        resolved_until = parse_time(resolution.expires_at) or now
        return Entry(
            digest=digest,
            runtime=runtime,
            etag=etag,
            resolved_until=resolved_until,
            hard_until=resolved_until + self._hard_grace_s,
            key_expires_at=parse_time(resolution.key_expires_at),
            config_due=now + self._config_ttl_s,
        )

    async def _revalidate(self, entry: Entry, now: float) -> KeyRuntime:
        """The resolution expired: ask again, or serve stale within the grace if we cannot."""
        try:
            fresh = await self._load(entry.digest)
        except ProxyError as exc:
            if exc.code is not ErrorCode.AUTH_UPSTREAM_UNAVAILABLE:
                self._evict(entry.digest)  # the control plane said no: believe it now
                raise
            if now >= entry.hard_until:
                self._evict(entry.digest)
                raise
            entry.resolved_until = min(now + self._soft_bump_s, entry.hard_until)
            self._entries[entry.digest] = entry
            log.warning("serving key %s from a stale cache entry", entry.runtime.vk_id)
            return entry.runtime
        return fresh.runtime

    def _expired(self, runtime: KeyRuntime, now: float) -> ProxyError:
        if runtime.expires_at is not None and now >= runtime.expires_at:
            return ProxyError(ErrorCode.VIRTUAL_KEY_EXPIRED, "virtual key has expired")
        # The key was rotated out and its grace has ended.
        return ProxyError(ErrorCode.INVALID_API_KEY, "invalid virtual key")

    # -- background refresh --------------------------------------------------------------------

    def _spawn(self, job: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _schedule_refresh(self, entry: Entry, *, resolve: bool = False) -> None:
        """Refresh `entry` in the background; a refresh already running goes round once more."""
        entry.dirty = True
        entry.must_resolve = entry.must_resolve or resolve
        if not entry.refreshing:
            entry.refreshing = True
            self._spawn(self._refresh(entry))

    async def _refresh(self, entry: Entry) -> None:
        try:
            async with self._refresh_slots:
                while entry.dirty:
                    entry.dirty = False
                    await self._refresh_once(entry)
        except Refused:
            self._evict(entry.digest)
        except Unreachable as exc:
            log.warning("config refresh of key %s failed: %s", entry.runtime.vk_id, exc)
            entry.config_due = self._clock.now().timestamp() + self._config_ttl_s
        finally:
            entry.refreshing = False

    async def _refresh_once(self, entry: Entry) -> None:
        """Re-fetch the bundle (with its ETag) and, when due or asked, the resolution."""
        now = self._clock.now().timestamp()
        if entry.must_resolve or now >= entry.resolved_until - RESOLVE_AHEAD_S:
            resolution = await self._control.resolve_key(entry.digest)
            entry.must_resolve = False
            entry.resolved_until = parse_time(resolution.expires_at) or now
            entry.hard_until = entry.resolved_until + self._hard_grace_s
            entry.key_expires_at = parse_time(resolution.key_expires_at)
        config = await self._control.config(entry.runtime.vk_id, entry.etag)
        if config.bundle is not None:
            entry.runtime = compile_bundle(config.bundle, self._providers)
            entry.etag = config.etag
        entry.config_due = self._clock.now().timestamp() + self._config_ttl_s

    # -- change events -------------------------------------------------------------------------

    def apply(self, event: ChangeEvent) -> None:
        """Evict or refresh the entries an event from the change feed affects."""
        kind = event.kind
        if kind in (EventKind.VK_REVOKED, EventKind.VK_DISABLED, EventKind.VK_ROTATED):
            self.evict_key(event.vk_id or event.entity_id)
        elif kind in (EventKind.VK_CONFIG_UPDATED, EventKind.VK_ENABLED):
            self._refresh_where(lambda r: r.vk_id == (event.vk_id or event.entity_id))
        elif kind is EventKind.MODEL_PROVIDER_UPDATED:
            self._refresh_where(
                lambda r: (
                    r.organization_id == event.organization_id and event.entity_id in r.provider_ids
                )
            )
        elif kind is not EventKind.VK_CREATED:
            # Budgets and routing policies: every cached key of the organization.
            self._refresh_where(lambda r: r.organization_id == event.organization_id)

    def evict_key(self, vk_id: str) -> None:
        for digest in list(self._entries.by_vk.get(vk_id, ())):
            self._evict(digest)

    def clear(self) -> None:
        self._entries.clear()

    def _evict(self, digest: str) -> None:
        if digest in self._entries:
            del self._entries[digest]

    def _refresh_where(self, affected: Callable[[KeyRuntime], bool]) -> None:
        for entry in list(self._entries.values()):
            if affected(entry.runtime):
                self._schedule_refresh(entry, resolve=True)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
