"""The auth cache: a presented `vk-` key to its compiled runtime, with no network call on a hit.

Keyed by the key's SHA-256 (the raw key is never stored). On a miss the control plane resolves
the hash and sends the key's bundle. While the control plane is unreachable, a cached key keeps
working past its resolution's expiry, `soft_bump_s` at a time, up to `hard_grace_s`; an answer
of 401/403/404 evicts at once, and a key past its own expiry is refused locally.

A key the control plane does not know (`invalid_api_key`) is remembered for
`invalid_key_cache_s` and refused locally meanwhile, so presenting it again asks nothing; a new
or rotated key forgets them all, so a key just created works at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine, Mapping, ValuesView
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from cachetools import TTLCache

from proxy.control import Config, Refused, Unreachable
from proxy.errors import ProxyError
from proxy.pacer import Pacer
from proxy.providers import Provider
from proxy.runtime import KeyRuntime, RouteCache
from vkgate.clock import Clock, Sleep, unix_seconds
from vkgate.errors import ErrorCode
from vkgate.keys import key_sha256
from vkgate.logs import event
from vkgate.wire import SPEND_MOVED, ChangeEvent, ConfigBundle, EventKind, ResolveKeyResponse

log = logging.getLogger("vkgate.proxy.auth")

# Re-resolve this long before a resolution expires, in the background, so a busy key never
# waits on the control plane.
RESOLVE_AHEAD_S = 120.0
REFRESH_CONCURRENCY = 8
SPEND_REFRESH_INTERVAL_S = 1.0
"""A budget's new spend is fetched at most this often (see `apply`)."""
UNKNOWN_KEYS_MAX = 100_000
"""Unknown keys remembered at most: a flood of random keys costs bounded memory."""
# Events after which a key the control plane did not know a moment ago may exist.
_NEW_KEY_EVENTS = (EventKind.VK_CREATED, EventKind.VK_ROTATED)
T = TypeVar("T")


class ControlPlane(Protocol):
    """What the cache asks the control plane (`ControlPlaneClient` in production).

    Both raise `Refused` when the key cannot be used, and `Unreachable` when no answer came.
    """

    async def resolve_key(self, key_sha256: str) -> ResolveKeyResponse: ...

    async def config(self, vk_id: str, etag: str | None = None) -> Config: ...


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
    evicted: bool = False
    """Set when a refusal or a change event evicted it: it must not come back from the dead."""


def _config_of(resolution: ResolveKeyResponse) -> Config | None:
    """The bundle a resolution brought, if it brought one (see `ResolveKeyResponse.bundle`)."""
    if resolution.bundle is None:
        return None
    return Config(resolution.bundle, resolution.etag)


class _Entries:
    """The cached keys, least recently used first, with an index by virtual key id so change
    events find entries quickly; `unordered` lets them look through every entry without
    marking any as just used (which `get` does).

    An `OrderedDict` holds both the entries and their order: a hit is a lookup and a
    `move_to_end`, both in C, where cachetools' LRU made four Python calls of it on every
    request. The index holds tuples: a key id has one digest but during a rotation's grace,
    and a one-item tuple costs a fifth of a set."""

    __slots__ = ("_items", "by_vk", "maxsize")

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"the auth cache must hold at least one key, not {maxsize}")
        self.maxsize = maxsize
        self._items: OrderedDict[str, Entry] = OrderedDict()
        self.by_vk: dict[str, tuple[str, ...]] = {}

    @property
    def unordered(self) -> Mapping[str, Entry]:
        return self._items

    def __len__(self) -> int:
        return len(self._items)

    def get(self, digest: str) -> Entry | None:
        """The entry, now the most recently used; None when the key is not cached."""
        items = self._items
        entry = items.get(digest)
        if entry is not None:
            items.move_to_end(digest)
        return entry

    def __setitem__(self, digest: str, entry: Entry) -> None:
        """Cache `entry` as the most recently used, dropping the least recently used one when
        the cache is full."""
        items = self._items
        if digest in items:
            items.move_to_end(digest)
        elif len(items) >= self.maxsize:
            dropped, evicted = items.popitem(last=False)
            self._unindex(dropped, evicted)
        items[digest] = entry
        vk_id = entry.runtime.vk_id
        digests = self.by_vk.get(vk_id, ())
        if digest not in digests:
            self.by_vk[vk_id] = (*digests, digest)

    def pop(self, digest: str) -> Entry | None:
        entry = self._items.pop(digest, None)
        if entry is not None:
            self._unindex(digest, entry)
        return entry

    def values(self) -> ValuesView[Entry]:
        return self._items.values()

    def clear(self) -> None:
        self._items.clear()
        self.by_vk.clear()

    def _unindex(self, digest: str, entry: Entry) -> None:
        vk_id = entry.runtime.vk_id
        digests = tuple(d for d in self.by_vk.get(vk_id, ()) if d != digest)
        if digests:
            self.by_vk[vk_id] = digests
        else:
            self.by_vk.pop(vk_id, None)


class AuthCache:
    def __init__(
        self,
        control: ControlPlane,
        providers: Mapping[str, Provider],
        clock: Clock,
        *,
        maxsize: int = 10_000,
        soft_bump_s: float = 300.0,
        hard_grace_s: float = 21_600.0,
        config_ttl_s: float = 60.0,
        invalid_key_cache_s: float = 30.0,
        invalid_key_cache_size: int = UNKNOWN_KEYS_MAX,
        spend_refresh_interval_s: float = SPEND_REFRESH_INTERVAL_S,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._control = control
        self._routes = RouteCache(providers)
        self._clock = clock
        self._entries = _Entries(maxsize)
        self._soft_bump_s = soft_bump_s
        self._hard_grace_s = hard_grace_s
        self._config_ttl_s = config_ttl_s
        self._loading: dict[str, asyncio.Task[Entry]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        # Bumped when change events evict keys (or the cache is cleared), and by every change
        # event: a resolution under way meanwhile may predate what changed.
        self._evictions = 0
        self._changes = 0
        self._changed_at: dict[str, int] = {}
        """Per organization, the value of `_changes` at its latest change event."""
        self._due: deque[Entry] = deque()
        """Entries waiting for a background refresh, oldest first."""
        self._refreshers = 0
        self._spend_refreshes = Pacer(
            self._refresh_spend, spend_refresh_interval_s, clock.monotonic, self._spawn, sleep
        )
        # Digest -> the control plane's message. Monotonic time: a wall clock set back must
        # not keep a key refused for longer.
        self._unknown: TTLCache[str, str] = TTLCache(
            invalid_key_cache_size, ttl=invalid_key_cache_s, timer=clock.monotonic
        )
        self._remember_unknown = invalid_key_cache_s > 0
        self._unknown_epoch = 0
        """Bumped whenever `_unknown` is forgotten: an answer asked for before it is stale."""
        # Lookups by result, for the metrics (plain ints: the event loop owns them).
        self.hits = 0
        self.misses = 0
        self.stale_serves = 0
        self.negative_hits = 0
        self.on_compiled: Callable[[KeyRuntime], None] | None = None
        """Called with every runtime compiled from a bundle the control plane sent."""

    def __len__(self) -> int:
        return len(self._entries)

    def lookups(self) -> dict[str, int]:
        """Entries held and lookups by result, for the metrics."""
        return {
            "entries": len(self._entries),
            "hit": self.hits,
            "miss": self.misses,
            "stale": self.stale_serves,
            "negative": self.negative_hits,
        }

    async def authenticate(
        self, presented_key: str, admit: Callable[[], object] | None = None
    ) -> KeyRuntime:
        """The key's runtime, or a `ProxyError` saying why it cannot be used.

        `admit` runs just before a key this cache does not hold is looked up on the control
        plane, and may raise to refuse the request instead (the gateway's invalid-key
        throttle). A cached key never waits on it, nor does a request that joins a lookup of
        its key already on its way: that costs the control plane nothing more.
        """
        digest = key_sha256(presented_key)
        entry = self._entries.get(digest)
        if entry is None:
            message = self._unknown.get(digest)
            if message is not None:
                self.negative_hits += 1
                raise ProxyError(ErrorCode.INVALID_API_KEY, message)
            if admit is not None:
                running = self._loading.get(digest)
                if running is None or running.done():
                    admit()
            self.misses += 1
            entry = await self._load(digest)
            return entry.runtime
        self.hits += 1
        now = self._clock.time()
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
        """One control-plane round trip per key however many requests miss at once.

        The round trip runs in a task of its own, so a client that goes away while waiting for
        it neither cancels it nor fails the requests waiting beside it.
        """
        task = self._loading.get(digest)
        if task is None or task.done():
            task = self._spawn(self._resolve(digest))
            self._loading[digest] = task
            task.add_done_callback(lambda done: self._loaded(digest, done))
        try:
            return await asyncio.shield(task)
        finally:
            # A failed lookup's error holds this frame in its traceback, and the task holds the
            # error: without this, the request's objects would wait for the garbage collector.
            del task

    def _loaded(self, digest: str, task: asyncio.Task[Entry]) -> None:
        if self._loading.get(digest) is task:
            del self._loading[digest]
        if not task.cancelled():
            task.exception()  # retrieved: no "never retrieved" warning when every waiter left

    async def _resolve(self, digest: str) -> Entry:
        evictions, changes = self._evictions, self._changes
        entry = await self._fetch(digest)
        if self._evictions != evictions:
            # A key was revoked, disabled or rotated while this answer was on its way, and it
            # may be this one: serve the requests that asked before, but keep nothing.
            return entry
        self._entries[digest] = entry
        if self._changed_at.get(entry.runtime.organization_id, 0) > changes:
            self._schedule_refresh(entry, resolve=True)
        return entry

    async def _fetch(self, digest: str, etag: str | None = None) -> Entry:
        epoch = self._unknown_epoch
        resolution: ResolveKeyResponse | None = None
        try:
            resolution = await self._control.resolve_key(digest)
            config = _config_of(resolution) or await self._control.config(resolution.vk_id)
        except Refused as exc:
            # Only resolve-key's "unknown": revoked, disabled and expired keys have codes of
            # their own, and a config refused after a resolution is a key that just changed.
            if resolution is None and exc.code == ErrorCode.INVALID_API_KEY:
                self._unknown_key(digest, exc.message, epoch)
            raise ProxyError(exc.code, exc.message) from None
        except Unreachable as exc:
            log.warning("control plane unreachable while resolving a key: %s", exc)
            raise ProxyError(
                ErrorCode.AUTH_UPSTREAM_UNAVAILABLE,
                "the key could not be checked: the control plane is unreachable",
            ) from None
        assert config.bundle is not None
        return self._entry(digest, resolution, self._compile(config.bundle), config.etag)

    def _unknown_key(self, digest: str, message: str, epoch: int) -> None:
        if self._remember_unknown and self._unknown_epoch == epoch:
            # Interned: a flood stores one copy of the message, not one per key.
            self._unknown[digest] = sys.intern(message)

    def _entry(
        self, digest: str, resolution: ResolveKeyResponse, runtime: KeyRuntime, etag: str | None
    ) -> Entry:
        now = self._clock.time()
        resolved_until = unix_seconds(resolution.expires_at) or now
        return Entry(
            digest=digest,
            runtime=runtime,
            etag=etag,
            resolved_until=resolved_until,
            hard_until=resolved_until + self._hard_grace_s,
            key_expires_at=unix_seconds(resolution.key_expires_at),
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
            if entry.evicted:
                raise  # a change event evicted it meanwhile: never bring it back
            if now >= entry.hard_until:
                self._evict(entry.digest)
                raise
            entry.resolved_until = min(now + self._soft_bump_s, entry.hard_until)
            self._entries[entry.digest] = entry
            self.stale_serves += 1
            log.warning("serving key %s from a stale cache entry", entry.runtime.vk_id)
            return entry.runtime
        return fresh.runtime

    def _expired(self, runtime: KeyRuntime, now: float) -> ProxyError:
        if runtime.expires_at is not None and now >= runtime.expires_at:
            return ProxyError(ErrorCode.VIRTUAL_KEY_EXPIRED, "virtual key has expired")
        # The key was rotated out and its grace has ended.
        return ProxyError(ErrorCode.INVALID_API_KEY, "invalid virtual key")

    # -- background refresh --------------------------------------------------------------------

    def _spawn(self, job: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _schedule_refresh(self, entry: Entry, *, resolve: bool = False) -> None:
        """Refresh `entry` in the background; a refresh already running goes round once more.

        Due entries wait in a queue that at most `REFRESH_CONCURRENCY` tasks work through: a
        waiting entry costs a slot in the queue, not a task of its own (some 1.5 KiB). Every
        cached key falls due together after a restart, and the control plane answers at its
        own pace.
        """
        entry.dirty = True
        entry.must_resolve = entry.must_resolve or resolve
        if not entry.refreshing:
            entry.refreshing = True
            self._due.append(entry)
            if self._refreshers < REFRESH_CONCURRENCY:
                self._refreshers += 1
                self._spawn(self._refresh_due())

    async def _refresh_due(self) -> None:
        try:
            while self._due:
                await self._refresh(self._due.popleft())
        finally:
            self._refreshers -= 1

    async def _refresh(self, entry: Entry) -> None:
        try:
            while entry.dirty and not entry.evicted:
                entry.dirty = False
                await self._refresh_once(entry)
        except Refused:
            self._evict(entry.digest)
        except Unreachable as exc:
            log.warning("config refresh of key %s failed: %s", entry.runtime.vk_id, exc)
            entry.config_due = self._clock.time() + self._config_ttl_s
        except Exception:
            # The entry keeps serving what it has; the next refresh is due after the usual TTL.
            log.exception("config refresh of key %s failed", entry.runtime.vk_id)
            entry.config_due = self._clock.time() + self._config_ttl_s
        finally:
            entry.refreshing = False

    async def _refresh_once(self, entry: Entry) -> None:
        """Re-fetch the bundle (with its ETag) and, when due or asked, the resolution."""
        now = self._clock.time()
        config: Config | None = None
        if entry.must_resolve or now >= entry.resolved_until - RESOLVE_AHEAD_S:
            resolution = await self._control.resolve_key(entry.digest)
            entry.must_resolve = False
            entry.resolved_until = unix_seconds(resolution.expires_at) or now
            entry.hard_until = entry.resolved_until + self._hard_grace_s
            entry.key_expires_at = unix_seconds(resolution.key_expires_at)
            config = _config_of(resolution)
        if config is None:
            config = await self._control.config(entry.runtime.vk_id, entry.etag)
        if config.bundle is not None and (config.etag is None or config.etag != entry.etag):
            entry.runtime = self._compile(config.bundle)
            event(
                log, "config_refreshed", vk_id=entry.runtime.vk_id, revision=entry.runtime.revision
            )
            entry.etag = config.etag
        entry.config_due = self._clock.time() + self._config_ttl_s

    def _compile(self, bundle: ConfigBundle) -> KeyRuntime:
        runtime = self._routes.compile(bundle)
        if self.on_compiled is not None:
            self.on_compiled(runtime)
        return runtime

    # -- change events -------------------------------------------------------------------------

    def apply(self, event: ChangeEvent) -> None:
        """Evict or refresh the entries an event from the change feed affects."""
        self._changes += 1
        kind = event.kind
        spend_moved = kind == EventKind.BUDGET_UPDATED and event.entity_kind == SPEND_MOVED
        if not spend_moved:
            # A key loading meanwhile is fetched again (spend alone does not need it: the
            # budgets count from the newest figure any key brought).
            self._changed_at[event.organization_id] = self._changes
        vk_id = event.vk_id or event.entity_id
        if kind in _NEW_KEY_EVENTS:
            self._forget_unknown()
        if kind in (EventKind.VK_REVOKED, EventKind.VK_DISABLED, EventKind.VK_ROTATED):
            self.evict_key(vk_id)
        elif kind in (EventKind.VK_CONFIG_UPDATED, EventKind.VK_ENABLED):
            # Its expiry may have changed too: resolve again, not just re-fetch the bundle.
            for digest in list(self._entries.by_vk.get(vk_id, ())):
                entry = self._entries.get(digest)
                if entry is not None:
                    self._schedule_refresh(entry, resolve=True)
        elif kind == EventKind.MODEL_PROVIDER_UPDATED:
            self._refresh_where(
                lambda r: (
                    r.organization_id == event.organization_id and event.entity_id in r.provider_ids
                )
            )
        elif spend_moved:
            # Only the budget's spend moved: every segment a worker of any replica ships moves
            # it, so a busy budget moves several times a second. One bundle brings the new
            # figure, and every key under the budget counts from it (see `on_compiled`):
            # refreshing each of them would keep the control plane busy with nothing else once
            # thousands of keys share an organization's budget. And one a second is enough:
            # the moves announced meanwhile are fetched together at the second's end.
            self._spend_refreshes.ask(event.entity_id)
        elif kind in (EventKind.BUDGET_UPDATED, EventKind.BUDGET_DELETED):
            # A budget's scope never changes: only the keys it already applies to are affected.
            # (Spend debits one every few seconds, so this must not refresh a whole organization.)
            self._refresh_where(lambda r: any(b.budget_id == event.entity_id for b in r.budgets))
        elif kind != EventKind.VK_CREATED:
            # A new budget, routing policies, and kinds newer than this proxy (a rolling upgrade):
            # every cached key of the organization.
            self._refresh_where(lambda r: r.organization_id == event.organization_id)

    def evict_key(self, vk_id: str) -> None:
        self._forget_lookups()
        for digest in list(self._entries.by_vk.get(vk_id, ())):
            self._evict(digest)

    def clear(self) -> None:
        self._forget_lookups()
        self._forget_unknown()
        for entry in self._entries.values():
            entry.evicted = True
        self._entries.clear()

    def _forget_lookups(self) -> None:
        """Lookups under way may predate an eviction: later requests must not join them."""
        self._evictions += 1
        self._loading.clear()

    def _forget_unknown(self) -> None:
        """A key unknown a moment ago may exist now: ask about every key again."""
        self._unknown_epoch += 1
        self._unknown.clear()
        # A lookup under way may have been asked before the key existed: later requests must
        # not join it. (Its answer is still given to the requests that asked before.)
        self._loading.clear()

    def _evict(self, digest: str) -> None:
        entry = self._entries.pop(digest)
        if entry is not None:
            entry.evicted = True

    def _refresh_where(self, affected: Callable[[KeyRuntime], bool]) -> None:
        for entry in list(self._entries.unordered.values()):
            if affected(entry.runtime):
                self._schedule_refresh(entry)

    def _refresh_spend(self, budget_id: str) -> None:
        self._refresh_one(lambda r: any(b.budget_id == budget_id for b in r.budgets))

    def _refresh_one(self, affected: Callable[[KeyRuntime], bool]) -> None:
        """Refresh one entry of those `affected` names: one already refreshing, if any (it goes
        round once more), so a burst of events costs one refresh at a time; else one picked at
        random, so a key whose refreshes fail (or that is evicted) is not the only one asked."""
        candidates: list[Entry] = []
        for entry in self._entries.unordered.values():
            if affected(entry.runtime):
                if entry.refreshing:
                    self._schedule_refresh(entry)
                    return
                candidates.append(entry)
        if candidates:
            self._schedule_refresh(random.choice(candidates))

    async def settle(self) -> None:
        """Wait until the background work under way (refreshes, shared resolutions) is done."""
        while pending := [task for task in self._tasks if not task.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
