"""The auth cache on its own: a fake control plane, a manual clock, and no network or sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import SimpleNamespace

import msgspec
import pytest

from proxy.auth import (
    REFRESH_CONCURRENCY,
    RESOLVE_AHEAD_S,
    SPEND_REFRESH_INTERVAL_S,
    AuthCache,
    Entry,
    _Entries,
)
from proxy.control import Config, Refused, Unreachable
from proxy.errors import ProxyError
from proxy.providers.mock import MockProvider
from tests.support.clock import ManualClock
from vkgate.clock import rfc3339
from vkgate.errors import ErrorCode
from vkgate.keys import key_sha256
from vkgate.wire import (
    SPEND_MOVED,
    BudgetState,
    ChainTarget,
    ChangeEvent,
    ChangesResponse,
    ConfigBundle,
    EventKind,
    Limits,
    ResolveKeyResponse,
)

JWT_LIFETIME = timedelta(minutes=15)
SOFT_BUMP_S = 300.0
HARD_GRACE_S = 21_600.0
CONFIG_TTL_S = 60.0


def digest(key: str) -> str:
    return key_sha256(key)


def target(provider_id: str, model: str) -> ChainTarget:
    return ChainTarget(
        provider_id=provider_id, provider_name=provider_id, kind="mock", base_url=None, model=model
    )


def budget(budget_id: str) -> BudgetState:
    return BudgetState(
        budget_id=budget_id,
        name=None,
        scope_kind="project",
        scope_id="proj",
        window="month",
        limit_usd="10",
        on_breach="block",
    )


@dataclass
class Key:
    vk_id: str
    org: str
    expires_at: datetime | None = None
    """The virtual key's own expiry."""
    valid_until: datetime | None = None
    """The end of a rotation grace, for a rotated-out key."""
    refused: ErrorCode | None = None
    aliases: dict[str, list[ChainTarget]] = field(
        default_factory=lambda: {"chat": [target("prov-a", "mock-small")]}
    )
    budgets: list[BudgetState] = field(default_factory=list)
    revision: int = 1
    garbled: bool = False
    """Send a bundle the proxy cannot compile (an unreadable expiry)."""


class FakeControlPlane:
    """The control plane's resolve-key and config answers, from keys the test registers.

    `down` makes every call fail as unreachable. While `resolve_gate` (or `config_gate`) is set
    and not yet open, that call's answer, worked out when it was asked, is held until it opens.
    """

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.keys: dict[str, Key] = {}
        self.down = False
        self.resolve_gate: asyncio.Event | None = None
        self.config_gate: asyncio.Event | None = None
        self.resolves: list[str] = []
        self.configs: list[tuple[str, str | None]] = []
        self.bundled = False
        """Resolutions bring the key's bundle along, as a control plane of this version does."""

    def issue(self, presented: str, vk_id: str, org: str = "org-1", **fields: object) -> Key:
        key = next((k for k in self.keys.values() if k.vk_id == vk_id), None)
        if key is None:
            key = Key(vk_id, org, **fields)  # type: ignore[arg-type]
        self.keys[digest(presented)] = key
        return key

    def key(self, vk_id: str) -> Key:
        return next(k for k in self.keys.values() if k.vk_id == vk_id)

    def calls(self) -> tuple[int, int]:
        return len(self.resolves), len(self.configs)

    async def resolve_key(self, key_sha256: str) -> ResolveKeyResponse:
        self.resolves.append(key_sha256)
        try:
            answer: ResolveKeyResponse | Exception = self._resolution(key_sha256)
        except (Refused, Unreachable) as exc:
            answer = exc
        if self.resolve_gate is not None:
            await self.resolve_gate.wait()
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def config(self, vk_id: str, etag: str | None = None) -> Config:
        self.configs.append((vk_id, etag))
        try:
            answer: Config | Exception = self._config(vk_id, etag)
        except (Refused, Unreachable) as exc:
            answer = exc
        if self.config_gate is not None:
            await self.config_gate.wait()
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _resolution(self, key_sha256: str) -> ResolveKeyResponse:
        if self.down:
            raise Unreachable("ConnectError: connection refused")
        key = self.keys.get(key_sha256)
        if key is None:
            raise Refused(ErrorCode.INVALID_API_KEY, "invalid virtual key")
        if key.refused is not None:
            raise Refused(key.refused, "virtual key refused")
        now = self.clock.now()
        stops = [t for t in (key.expires_at, key.valid_until) if t is not None]
        key_expires_at = min(stops) if stops else None
        expires_at = min([now + JWT_LIFETIME, *stops])
        bundled = self._config(key.vk_id, None) if self.bundled else Config(None, None)
        return ResolveKeyResponse(
            jwt="header.payload.signature",
            vk_id=key.vk_id,
            organization_id=key.org,
            revision=key.revision,
            expires_at=rfc3339(expires_at),
            key_expires_at=rfc3339(key_expires_at) if key_expires_at else None,
            bundle=bundled.bundle,
            etag=bundled.etag,
        )

    def _config(self, vk_id: str, etag: str | None) -> Config:
        if self.down:
            raise Unreachable("control plane answered 503")
        key = self.key(vk_id)
        if key.refused is not None:
            raise Refused(key.refused, "virtual key refused")
        tag = f'"{vk_id}-{key.revision}"'
        if etag == tag:
            return Config(None, tag)
        bundle = ConfigBundle(
            vk_id=vk_id,
            organization_id=key.org,
            project_id="proj",
            team_id=None,
            status="active",
            revision=key.revision,
            limits=Limits(),
            allowed_models=None,
            aliases=dict(key.aliases),
            budgets=list(key.budgets),
            expires_at=rfc3339(key.expires_at) if key.expires_at else None,
        )
        if key.garbled:
            bundle.expires_at = "next tuesday"
        return Config(bundle, tag)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def control(clock: ManualClock) -> FakeControlPlane:
    return FakeControlPlane(clock)


def make_cache(
    control: FakeControlPlane,
    clock: ManualClock,
    maxsize: int = 100,
    config_ttl_s: float = CONFIG_TTL_S,
) -> AuthCache:
    async def sleep(seconds: float) -> None:
        """A wait for paced spend refreshes: the time passes at once."""
        clock.elapse(seconds)
        await asyncio.sleep(0)

    return AuthCache(
        control,
        {"mock": MockProvider(clock)},
        clock,
        maxsize=maxsize,
        soft_bump_s=SOFT_BUMP_S,
        hard_grace_s=HARD_GRACE_S,
        config_ttl_s=config_ttl_s,
        sleep=sleep,
    )


@pytest.fixture
async def cache(control: FakeControlPlane, clock: ManualClock) -> AsyncIterator[AuthCache]:
    auth = make_cache(control, clock)
    yield auth
    await auth.close()


async def refused(cache: AuthCache, key: str) -> ErrorCode:
    with pytest.raises(ProxyError) as raised:
        await cache.authenticate(key)
    return raised.value.code


def event(
    kind: EventKind,
    entity_id: str,
    org: str = "org-1",
    vk_id: str | None = None,
    entity_kind: str | None = None,
) -> ChangeEvent:
    return ChangeEvent(
        revision=1,
        kind=kind,
        organization_id=org,
        entity_kind=entity_kind or ("virtual_key" if kind.startswith("VK_") else "other"),
        entity_id=entity_id,
        at="2026-03-10T12:00:00Z",
        vk_id=vk_id,
    )


# -- misses and hits ------------------------------------------------------------------------


async def test_a_miss_resolves_the_hash_and_compiles_the_bundle(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    control.issue("vk-one", "vk_1")
    runtime = await cache.authenticate("vk-one")
    assert runtime.vk_id == "vk_1"
    assert [u.model for u in runtime.chains["chat"]] == ["mock-small"]
    assert control.resolves == [digest("vk-one")]
    assert control.configs == [("vk_1", None)]


async def test_a_hit_asks_the_control_plane_nothing(
    cache: AuthCache, control: FakeControlPlane, clock: ManualClock
) -> None:
    control.issue("vk-one", "vk_1")
    first = await cache.authenticate("vk-one")
    clock.advance(CONFIG_TTL_S - 1)
    for _ in range(5):
        assert await cache.authenticate("vk-one") is first
    await cache.settle()
    assert control.calls() == (1, 1)


async def test_concurrent_misses_of_one_key_share_one_resolution(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    control.issue("vk-one", "vk_1")
    runtimes = await asyncio.gather(*(cache.authenticate("vk-one") for _ in range(20)))
    assert len({id(r) for r in runtimes}) == 1
    assert control.calls() == (1, 1)


async def test_a_waiter_that_goes_away_does_not_fail_the_others(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    control.issue("vk-one", "vk_1")
    control.resolve_gate = asyncio.Event()
    first = asyncio.ensure_future(cache.authenticate("vk-one"))
    second = asyncio.ensure_future(cache.authenticate("vk-one"))
    while not control.resolves:
        await asyncio.sleep(0)
    first.cancel()
    control.resolve_gate.set()
    assert (await second).vk_id == "vk_1"
    assert first.cancelled()
    assert len(cache) == 1
    assert control.calls() == (1, 1)


@pytest.mark.parametrize(
    ("refusal", "status"),
    [
        (ErrorCode.VIRTUAL_KEY_REVOKED, 403),
        (ErrorCode.VIRTUAL_KEY_DISABLED, 403),
        (ErrorCode.VIRTUAL_KEY_EXPIRED, 401),
    ],
)
async def test_a_refused_key_is_refused_with_the_control_planes_code_and_not_cached(
    cache: AuthCache, control: FakeControlPlane, refusal: ErrorCode, status: int
) -> None:
    control.issue("vk-one", "vk_1", refused=refusal)
    with pytest.raises(ProxyError) as raised:
        await cache.authenticate("vk-one")
    assert raised.value.code is refusal
    assert raised.value.status == status
    assert await refused(cache, "vk-one") is refusal
    assert control.calls() == (2, 0)
    assert len(cache) == 0


async def test_an_unknown_key_is_an_invalid_api_key(cache: AuthCache) -> None:
    assert await refused(cache, "vk-never-issued") is ErrorCode.INVALID_API_KEY


async def test_a_miss_while_the_control_plane_is_down_is_503(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    control.issue("vk-one", "vk_1")
    control.down = True
    with pytest.raises(ProxyError) as raised:
        await cache.authenticate("vk-one")
    assert raised.value.code is ErrorCode.AUTH_UPSTREAM_UNAVAILABLE
    assert raised.value.status == 503
    control.down = False
    assert (await cache.authenticate("vk-one")).vk_id == "vk_1"


# -- expiry, refused locally ----------------------------------------------------------------


async def test_a_key_past_its_own_expiry_is_refused_locally_as_expired(
    cache: AuthCache, control: FakeControlPlane, clock: ManualClock
) -> None:
    control.issue("vk-one", "vk_1", expires_at=clock.now() + timedelta(minutes=5))
    await cache.authenticate("vk-one")
    clock.advance(5 * 60)
    control.down = True  # the refusal needs no control plane, and no stale grace saves it
    assert await refused(cache, "vk-one") is ErrorCode.VIRTUAL_KEY_EXPIRED
    assert control.calls() == (1, 1)
    assert len(cache) == 0


async def test_a_rotated_out_key_past_its_grace_is_an_invalid_api_key(
    cache: AuthCache, control: FakeControlPlane, clock: ManualClock
) -> None:
    control.issue("vk-old", "vk_1", valid_until=clock.now() + timedelta(minutes=10))
    await cache.authenticate("vk-old")
    clock.advance(10 * 60 - 1)
    assert (await cache.authenticate("vk-old")).vk_id == "vk_1"
    clock.advance(1)
    assert await refused(cache, "vk-old") is ErrorCode.INVALID_API_KEY
    assert control.calls() == (1, 1)


async def test_an_expired_resolution_is_asked_again(
    cache: AuthCache, control: FakeControlPlane, clock: ManualClock
) -> None:
    control.issue("vk-one", "vk_1")
    await cache.authenticate("vk-one")
    clock.advance(JWT_LIFETIME.total_seconds())
    assert (await cache.authenticate("vk-one")).vk_id == "vk_1"
    assert len(control.resolves) == 2


# -- stale serving while the control plane is unreachable -----------------------------------


async def test_a_cached_key_is_served_stale_a_soft_bump_at_a_time(
    control: FakeControlPlane, clock: ManualClock
) -> None:
    # No background refresh falls due here: only the requests' own asking is counted.
    cache = make_cache(control, clock, config_ttl_s=HARD_GRACE_S * 2)
    try:
        control.issue("vk-one", "vk_1")
        runtime = await cache.authenticate("vk-one")
        control.down = True
        clock.advance(JWT_LIFETIME.total_seconds())

        assert await cache.authenticate("vk-one") is runtime  # asks, fails, serves stale
        assert len(control.resolves) == 2
        clock.advance(SOFT_BUMP_S - 1)
        assert await cache.authenticate("vk-one") is runtime  # within the bump: does not ask
        assert len(control.resolves) == 2
        clock.advance(1)
        assert await cache.authenticate("vk-one") is runtime  # the bump ran out: asks again
        assert len(control.resolves) == 3
    finally:
        await cache.close()


async def test_a_stale_key_is_served_without_waiting_on_background_attempts(
    cache: AuthCache, control: FakeControlPlane, clock: ManualClock
) -> None:
    control.issue("vk-one", "vk_1")
    runtime = await cache.authenticate("vk-one")
    control.down = True
    clock.advance(JWT_LIFETIME.total_seconds())
    assert await cache.authenticate("vk-one") is runtime
    control.resolve_gate = asyncio.Event()  # a call to the control plane now hangs until opened
    clock.advance(SOFT_BUMP_S - 1)  # config is due: a refresh starts behind the request
    assert await cache.authenticate("vk-one") is runtime
    control.resolve_gate.set()
    await cache.settle()
    assert await cache.authenticate("vk-one") is runtime


async def test_stale_serving_ends_at_the_hard_grace(
    cache: AuthCache, control: FakeControlPlane, clock: ManualClock
) -> None:
    control.issue("vk-one", "vk_1")
    await cache.authenticate("vk-one")
    control.down = True
    clock.advance(JWT_LIFETIME.total_seconds())
    served = 0
    while True:
        try:
            await cache.authenticate("vk-one")
        except ProxyError as exc:
            assert exc.code is ErrorCode.AUTH_UPSTREAM_UNAVAILABLE
            break
        served += 1
        clock.advance(SOFT_BUMP_S)
    assert served == HARD_GRACE_S // SOFT_BUMP_S
    assert len(cache) == 0
    control.down = False
    assert (await cache.authenticate("vk-one")).vk_id == "vk_1"


@pytest.mark.parametrize(
    "refusal",
    [ErrorCode.INVALID_API_KEY, ErrorCode.VIRTUAL_KEY_REVOKED, ErrorCode.VIRTUAL_KEY_DISABLED],
)
async def test_a_refusal_on_revalidation_evicts_at_once(
    cache: AuthCache, control: FakeControlPlane, clock: ManualClock, refusal: ErrorCode
) -> None:
    key = control.issue("vk-one", "vk_1")
    await cache.authenticate("vk-one")
    clock.advance(JWT_LIFETIME.total_seconds())
    key.refused = refusal
    assert await refused(cache, "vk-one") is refusal
    assert len(cache) == 0


# -- background config refresh --------------------------------------------------------------


async def test_config_is_refreshed_in_the_background_after_its_ttl(
    cache: AuthCache, control: FakeControlPlane, clock: ManualClock
) -> None:
    key = control.issue("vk-one", "vk_1")
    old = await cache.authenticate("vk-one")
    key.aliases = {**key.aliases, "smart": [target("prov-a", "mock-large")]}
    key.revision = 2
    clock.advance(CONFIG_TTL_S)

    assert await cache.authenticate("vk-one") is old  # served at once, refreshed behind
    await cache.settle()
    new = await cache.authenticate("vk-one")
    assert set(new.chains) == {"chat", "smart"}
    assert control.configs == [("vk_1", None), ("vk_1", '"vk_1-1"')]
    assert len(control.resolves) == 1


async def test_an_unchanged_config_keeps_the_compiled_runtime(
    cache: AuthCache, control: FakeControlPlane, clock: ManualClock
) -> None:
    control.issue("vk-one", "vk_1")
    runtime = await cache.authenticate("vk-one")
    clock.advance(CONFIG_TTL_S)
    await cache.authenticate("vk-one")
    await cache.settle()
    assert await cache.authenticate("vk-one") is runtime
    assert control.configs[-1] == ("vk_1", '"vk_1-1"')


async def test_a_refresh_near_the_resolutions_end_resolves_again(
    cache: AuthCache, control: FakeControlPlane, clock: ManualClock
) -> None:
    control.issue("vk-one", "vk_1")
    await cache.authenticate("vk-one")
    clock.advance(JWT_LIFETIME.total_seconds() - 60)  # config due, resolution nearly over
    await cache.authenticate("vk-one")
    await cache.settle()
    assert control.calls() == (2, 2)
    clock.advance(CONFIG_TTL_S)  # config due again; the fresh resolution has long to run
    await cache.authenticate("vk-one")
    await cache.settle()
    assert control.calls() == (2, 3)


async def test_a_failed_refresh_keeps_serving_and_waits_a_ttl_before_trying_again(
    cache: AuthCache, control: FakeControlPlane, clock: ManualClock
) -> None:
    control.issue("vk-one", "vk_1")
    runtime = await cache.authenticate("vk-one")
    control.down = True
    clock.advance(CONFIG_TTL_S)
    assert await cache.authenticate("vk-one") is runtime
    await cache.settle()
    attempts = len(control.configs)
    clock.advance(CONFIG_TTL_S - 1)
    assert await cache.authenticate("vk-one") is runtime
    await cache.settle()
    assert len(control.configs) == attempts
    clock.advance(1)
    await cache.authenticate("vk-one")
    await cache.settle()
    assert len(control.configs) == attempts + 1


async def test_a_refresh_the_control_plane_refuses_evicts(
    cache: AuthCache, control: FakeControlPlane, clock: ManualClock
) -> None:
    key = control.issue("vk-one", "vk_1")
    await cache.authenticate("vk-one")
    key.refused = ErrorCode.VIRTUAL_KEY_DISABLED
    clock.advance(CONFIG_TTL_S)
    await cache.authenticate("vk-one")
    await cache.settle()
    assert len(cache) == 0
    assert await refused(cache, "vk-one") is ErrorCode.VIRTUAL_KEY_DISABLED


async def test_an_unexpected_refresh_failure_keeps_the_entry_and_waits_a_ttl(
    cache: AuthCache,
    control: FakeControlPlane,
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = control.issue("vk-one", "vk_1")
    runtime = await cache.authenticate("vk-one")
    key.revision = 2
    key.garbled = True
    clock.advance(CONFIG_TTL_S)
    await cache.authenticate("vk-one")
    await cache.settle()
    assert "config refresh of key vk_1 failed" in caplog.text
    clock.advance(CONFIG_TTL_S - 1)
    for _ in range(3):
        assert await cache.authenticate("vk-one") is runtime
    await cache.settle()
    assert len(control.configs) == 2  # no refresh storm while it keeps failing
    key.garbled = False
    clock.advance(1)
    await cache.authenticate("vk-one")
    await cache.settle()
    assert (await cache.authenticate("vk-one")) is not runtime


# -- change events --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind", [EventKind.VK_REVOKED, EventKind.VK_DISABLED, EventKind.VK_ROTATED]
)
async def test_key_events_evict_every_cached_key_of_that_virtual_key(
    cache: AuthCache, control: FakeControlPlane, kind: EventKind
) -> None:
    control.issue("vk-old", "vk_1")
    control.issue("vk-new", "vk_1")
    control.issue("vk-other", "vk_2")
    for presented in ("vk-old", "vk-new", "vk-other"):
        await cache.authenticate(presented)
    cache.apply(event(kind, "vk_1", vk_id="vk_1"))
    assert len(cache) == 1
    control.key("vk_1").refused = ErrorCode.VIRTUAL_KEY_REVOKED
    assert await refused(cache, "vk-old") is ErrorCode.VIRTUAL_KEY_REVOKED
    assert (await cache.authenticate("vk-other")).vk_id == "vk_2"


@pytest.mark.parametrize("kind", [EventKind.VK_CONFIG_UPDATED, EventKind.VK_ENABLED])
async def test_key_updates_refresh_the_key_and_its_resolution(
    cache: AuthCache, control: FakeControlPlane, kind: EventKind
) -> None:
    key = control.issue("vk-one", "vk_1")
    control.issue("vk-two", "vk_2")
    await cache.authenticate("vk-one")
    await cache.authenticate("vk-two")
    key.aliases = {"smart": [target("prov-a", "mock-large")]}
    key.revision = 2
    cache.apply(event(kind, "vk_1", vk_id="vk_1"))
    await cache.settle()
    assert set((await cache.authenticate("vk-one")).chains) == {"smart"}
    assert control.resolves == [digest("vk-one"), digest("vk-two"), digest("vk-one")]
    assert [vk for vk, _ in control.configs] == ["vk_1", "vk_2", "vk_1"]


async def test_a_key_update_that_sets_an_expiry_is_enforced_after_the_event(
    cache: AuthCache, control: FakeControlPlane, clock: ManualClock
) -> None:
    key = control.issue("vk-one", "vk_1")
    await cache.authenticate("vk-one")
    key.expires_at = clock.now() + timedelta(seconds=30)
    key.revision = 2
    cache.apply(event(EventKind.VK_CONFIG_UPDATED, "vk_1", vk_id="vk_1"))
    await cache.settle()
    clock.advance(30)
    assert await refused(cache, "vk-one") is ErrorCode.VIRTUAL_KEY_EXPIRED


async def test_a_provider_update_refreshes_only_keys_that_use_it(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    control.issue("vk-a", "vk_a")
    control.issue("vk-b", "vk_b", aliases={"chat": [target("prov-b", "m")]})
    control.issue("vk-c", "vk_c", org="org-2", aliases={"chat": [target("prov-a", "m")]})
    for presented in ("vk-a", "vk-b", "vk-c"):
        await cache.authenticate(presented)
    cache.apply(event(EventKind.MODEL_PROVIDER_UPDATED, "prov-a"))
    await cache.settle()
    assert [vk for vk, _ in control.configs[3:]] == ["vk_a"]


async def test_a_budget_update_refreshes_only_keys_it_applies_to(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    control.issue("vk-a", "vk_a", budgets=[budget("bud-1")])
    control.issue("vk-b", "vk_b", budgets=[budget("bud-2")])
    for presented in ("vk-a", "vk-b"):
        await cache.authenticate(presented)
    for kind in (EventKind.BUDGET_UPDATED, EventKind.BUDGET_DELETED):
        cache.apply(event(kind, "bud-1"))
        await cache.settle()
    assert [vk for vk, _ in control.configs[2:]] == ["vk_a", "vk_a"]
    assert len(control.resolves) == 2  # the bundle changed, not the key


async def test_a_budgets_spend_moving_refreshes_one_key_under_it_once_a_second(
    cache: AuthCache, control: FakeControlPlane, clock: ManualClock
) -> None:
    for name in ("a", "b", "c"):
        control.issue(f"vk-{name}", f"vk_{name}", budgets=[budget("bud-1")])
    control.issue("vk-d", "vk_d", budgets=[budget("bud-2")])
    clock.freeze()
    learnt: list[tuple[str, float]] = []
    cache.on_compiled = lambda runtime: learnt.append((runtime.vk_id, clock.monotonic()))
    for presented in ("vk-a", "vk-b", "vk-c", "vk-d"):
        await cache.authenticate(presented)
    spent = event(EventKind.BUDGET_UPDATED, "bud-1", entity_kind=SPEND_MOVED)
    for name in ("a", "b", "c"):
        control.key(f"vk_{name}").revision = 2  # their bundles now carry the new spend

    began = clock.monotonic()
    cache.apply(spent)
    await cache.settle()
    [(refreshed, _)] = control.configs[4:]
    assert refreshed in {"vk_a", "vk_b", "vk_c"}
    assert learnt[4:] == [(refreshed, began)]  # the budgets learn the figure its bundle brought

    # Moves announced within the second (every worker of every replica ships a segment a
    # second) wait for its end, and are then fetched together: one key, one fetch.
    for name in ("a", "b", "c"):
        control.key(f"vk_{name}").revision = 3  # whichever is asked brings a new bundle
    clock.elapse(0.25)
    for _ in range(5):
        cache.apply(spent)
    await cache.settle()  # the pacer's wait passes at once (the clock moves on)
    assert len(control.configs) == 6
    [(_, fetched_at)] = learnt[5:]
    assert fetched_at - began == pytest.approx(SPEND_REFRESH_INTERVAL_S)

    # A second later a move is fetched at once, and one announced while that fetch runs
    # (a second after it) sends the same key round once more: no other key is asked.
    control.config_gate = asyncio.Event()
    clock.elapse(SPEND_REFRESH_INTERVAL_S)
    cache.apply(spent)
    while len(control.configs) < 7:
        await asyncio.sleep(0)
    clock.elapse(SPEND_REFRESH_INTERVAL_S)
    cache.apply(spent)
    control.config_gate.set()
    await cache.settle()
    assert len(control.configs) == 8
    assert len({vk for vk, _ in control.configs[6:]}) == 1

    # Every key but one is refused now (revoked meanwhile): events go on until one answers.
    kept = min({"vk_a", "vk_b", "vk_c"} - {refreshed})
    for vk in {"vk_a", "vk_b", "vk_c"} - {kept}:
        control.key(vk).refused = ErrorCode.VIRTUAL_KEY_REVOKED
    for _ in range(3):  # each refused key is asked at most once: its refusal evicts it
        cache.apply(spent)
        await cache.settle()
        if control.configs[-1][0] == kept:
            break
    assert control.configs[-1][0] == kept


async def test_keys_falling_due_together_wait_in_a_queue_not_in_a_task_each(
    control: FakeControlPlane, clock: ManualClock
) -> None:
    """After a restart every cached key falls due at once; the control plane is asked at most
    `REFRESH_CONCURRENCY` at a time, and the keys waiting cost no task each."""
    cache = make_cache(control, clock)
    names = [f"k{n}" for n in range(40)]
    try:
        for name in names:
            control.issue(f"vk-{name}", f"vk_{name}")
            await cache.authenticate(f"vk-{name}")
        clock.advance(CONFIG_TTL_S + 1)
        control.config_gate = asyncio.Event()
        asked = len(control.configs)
        for name in names:
            await cache.authenticate(f"vk-{name}")  # served from the cache; its refresh is due
        for _ in range(10):
            await asyncio.sleep(0)
        assert len(control.configs) - asked == REFRESH_CONCURRENCY
        assert len(cache._tasks) == REFRESH_CONCURRENCY
        control.config_gate.set()
        await cache.settle()
        assert sorted(vk for vk, _ in control.configs[asked:]) == sorted(f"vk_{n}" for n in names)
        assert not cache._tasks
        # Due again a TTL later: the queue starts over.
        clock.advance(CONFIG_TTL_S + 1)
        await cache.authenticate("vk-k0")
        await cache.settle()
        assert control.configs[-1][0] == "vk_k0"
    finally:
        await cache.close()


async def test_events_looking_through_the_cache_leave_its_eviction_order_alone(
    control: FakeControlPlane, clock: ManualClock
) -> None:
    cache = make_cache(control, clock, maxsize=2)
    for name in ("a", "b", "c"):
        control.issue(f"vk-{name}", f"vk_{name}", budgets=[budget("bud-1")])
    await cache.authenticate("vk-a")
    await cache.authenticate("vk-b")
    await cache.authenticate("vk-a")  # b is now the least recently used
    cache.apply(event(EventKind.BUDGET_DELETED, "bud-2"))  # looks at every entry, needs none
    await cache.authenticate("vk-c")
    control.configs.clear()
    await cache.authenticate("vk-a")
    assert control.configs == [], "a was used last: b made room for c"
    await cache.close()


@pytest.mark.parametrize(
    "kind",
    [
        EventKind.BUDGET_CREATED,
        EventKind.ROUTING_POLICY_UPDATED,
        EventKind.ROUTING_POLICY_DELETED,
    ],
)
async def test_organization_wide_events_refresh_that_organizations_keys(
    cache: AuthCache, control: FakeControlPlane, kind: EventKind
) -> None:
    control.issue("vk-a", "vk_a")
    control.issue("vk-b", "vk_b")
    control.issue("vk-c", "vk_c", org="org-2")
    for presented in ("vk-a", "vk-b", "vk-c"):
        await cache.authenticate(presented)
    cache.apply(event(kind, "entity-1"))
    await cache.settle()
    assert sorted(vk for vk, _ in control.configs[3:]) == ["vk_a", "vk_b"]


async def test_a_new_key_event_touches_nothing(cache: AuthCache, control: FakeControlPlane) -> None:
    control.issue("vk-a", "vk_a")
    await cache.authenticate("vk-a")
    cache.apply(event(EventKind.VK_CREATED, "vk_new", vk_id="vk_new"))
    await cache.settle()
    assert control.calls() == (1, 1)
    assert len(cache) == 1


async def test_events_arriving_during_a_refresh_send_it_round_once_more(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    key = control.issue("vk-one", "vk_1")
    await cache.authenticate("vk-one")
    control.config_gate = asyncio.Event()
    cache.apply(event(EventKind.VK_CONFIG_UPDATED, "vk_1", vk_id="vk_1"))
    while len(control.configs) < 2:
        await asyncio.sleep(0)
    # The refresh holds an answer from before this change, which it is now told about.
    key.aliases = {"late": [target("prov-a", "m")]}
    key.revision = 2
    for _ in range(3):
        cache.apply(event(EventKind.VK_CONFIG_UPDATED, "vk_1", vk_id="vk_1"))
    control.config_gate.set()
    await cache.settle()
    assert set((await cache.authenticate("vk-one")).chains) == {"late"}
    assert len(control.configs) == 3  # the first refresh, and one more round for the rest


async def test_a_revocation_during_a_resolution_is_not_undone_by_it(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    key = control.issue("vk-one", "vk_1")
    control.resolve_gate = asyncio.Event()
    asked = asyncio.ensure_future(cache.authenticate("vk-one"))
    while not control.resolves:
        await asyncio.sleep(0)
    cache.apply(event(EventKind.VK_REVOKED, "vk_1", vk_id="vk_1"))
    control.resolve_gate.set()
    assert (await asked).vk_id == "vk_1"  # asked before the revocation arrived
    key.refused = ErrorCode.VIRTUAL_KEY_REVOKED
    assert len(cache) == 0
    assert await refused(cache, "vk-one") is ErrorCode.VIRTUAL_KEY_REVOKED


async def test_a_change_during_a_resolution_is_fetched_right_after_it(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    key = control.issue("vk-one", "vk_1")
    control.config_gate = asyncio.Event()
    asked = asyncio.ensure_future(cache.authenticate("vk-one"))
    while not control.configs:
        await asyncio.sleep(0)
    # The bundle on its way is the old one; the policy changes, and its event arrives.
    key.aliases = {"renamed": [target("prov-a", "m")]}
    key.revision = 2
    cache.apply(event(EventKind.ROUTING_POLICY_UPDATED, "pol-1"))
    control.config_gate.set()
    await asked
    await cache.settle()
    assert set((await cache.authenticate("vk-one")).chains) == {"renamed"}


async def test_a_key_revoked_while_its_revalidation_fails_is_not_served_stale(
    cache: AuthCache, control: FakeControlPlane, clock: ManualClock
) -> None:
    control.issue("vk-one", "vk_1")
    await cache.authenticate("vk-one")
    clock.advance(JWT_LIFETIME.total_seconds())
    control.down = True
    control.resolve_gate = asyncio.Event()
    asked = asyncio.ensure_future(cache.authenticate("vk-one"))
    while len(control.resolves) < 2:
        await asyncio.sleep(0)
    cache.apply(event(EventKind.VK_REVOKED, "vk_1", vk_id="vk_1"))
    control.resolve_gate.set()
    with pytest.raises(ProxyError) as raised:
        await asked
    assert raised.value.code is ErrorCode.AUTH_UPSTREAM_UNAVAILABLE
    assert len(cache) == 0


async def test_clear_forgets_every_key(cache: AuthCache, control: FakeControlPlane) -> None:
    control.issue("vk-a", "vk_a")
    control.issue("vk-b", "vk_b")
    await cache.authenticate("vk-a")
    await cache.authenticate("vk-b")
    cache.clear()
    assert len(cache) == 0
    await cache.authenticate("vk-a")
    assert len(control.resolves) == 3


# -- the LRU and its index by virtual key ---------------------------------------------------


async def test_the_least_recently_used_key_is_dropped_and_leaves_no_trace_in_the_index(
    control: FakeControlPlane, clock: ManualClock
) -> None:
    cache = make_cache(control, clock, maxsize=2)
    try:
        for name in ("a", "b", "c"):
            control.issue(f"vk-{name}", f"vk_{name}")
        await cache.authenticate("vk-a")
        await cache.authenticate("vk-b")
        await cache.authenticate("vk-a")  # b is now the least recently used
        await cache.authenticate("vk-c")
        assert len(cache) == 2
        index = cache._entries.by_vk
        assert set(index) == {"vk_a", "vk_c"}
        assert index["vk_a"] == (digest("vk-a"),)

        cache.apply(event(EventKind.VK_REVOKED, "vk_b", vk_id="vk_b"))  # gone already: no error
        cache.apply(event(EventKind.VK_REVOKED, "vk_a", vk_id="vk_a"))
        assert set(index) == {"vk_c"}
        assert len(cache) == 1
        resolves = len(control.resolves)
        await cache.authenticate("vk-c")
        assert len(control.resolves) == resolves
    finally:
        await cache.close()


async def test_keys_of_one_policy_share_their_chains_until_one_changes(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    control.issue("vk-a", "vk_a")
    control.issue("vk-b", "vk_b")
    a = await cache.authenticate("vk-a")
    b = await cache.authenticate("vk-b")
    assert (a.vk_id, b.vk_id) == ("vk_a", "vk_b")
    assert a.chains is b.chains

    key = control.key("vk_b")
    key.aliases = {"chat": [target("prov-a", "mock-large")]}
    key.revision += 1
    cache.apply(event(EventKind.VK_CONFIG_UPDATED, "vk_b", vk_id="vk_b"))
    await cache.settle()
    b = await cache.authenticate("vk-b")
    assert b.chains["chat"][0].model == "mock-large"
    assert (await cache.authenticate("vk-a")).chains["chat"][0].model == "mock-small"


async def test_a_resolution_that_brings_the_bundle_saves_the_config_call(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    control.bundled = True
    control.issue("vk-a", "vk_a")
    runtime = await cache.authenticate("vk-a")
    assert runtime.vk_id == "vk_a"
    assert list(runtime.chains) == ["chat"]
    assert control.calls() == (1, 0)


async def test_a_renewed_resolution_recompiles_only_a_bundle_that_changed(
    control: FakeControlPlane, clock: ManualClock
) -> None:
    control.bundled = True
    cache = make_cache(control, clock)
    compiled: list[int] = []
    cache.on_compiled = lambda runtime: compiled.append(runtime.revision)
    try:
        control.issue("vk-a", "vk_a")
        await cache.authenticate("vk-a")
        assert compiled == [1]

        # The resolution falls due with the config: one call renews both, and the bundle it
        # brings is the one cached (its ETag says so), so nothing is compiled again.
        clock.advance(JWT_LIFETIME.total_seconds() - RESOLVE_AHEAD_S + 1)
        await cache.authenticate("vk-a")
        await cache.settle()
        assert control.calls() == (2, 0)
        assert compiled == [1]

        key = control.key("vk_a")
        key.aliases = {"chat": [target("prov-a", "mock-large")]}
        key.revision = 2
        cache.apply(event(EventKind.VK_CONFIG_UPDATED, "vk_a", vk_id="vk_a"))
        await cache.settle()
        assert control.calls() == (3, 0)
        assert compiled == [1, 2]
        assert (await cache.authenticate("vk-a")).chains["chat"][0].model == "mock-large"
    finally:
        await cache.close()


async def test_the_index_holds_every_cached_key_of_a_virtual_key(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    control.issue("vk-old", "vk_1")
    control.issue("vk-new", "vk_1")
    await cache.authenticate("vk-old")
    await cache.authenticate("vk-new")
    assert cache._entries.by_vk == {"vk_1": (digest("vk-old"), digest("vk-new"))}
    cache.clear()
    assert cache._entries.by_vk == {}


async def test_events_for_keys_cleared_from_the_cache_are_no_ops(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    control.issue("vk-one", "vk_1")
    await cache.authenticate("vk-one")
    cache.clear()
    cache.apply(event(EventKind.VK_CONFIG_UPDATED, "vk_1", vk_id="vk_1"))
    cache.apply(event(EventKind.VK_REVOKED, "vk_1", vk_id="vk_1"))
    await cache.settle()
    assert control.calls() == (1, 1)
    assert len(cache) == 0


async def test_close_stops_refreshes_under_way(
    control: FakeControlPlane, clock: ManualClock
) -> None:
    cache = make_cache(control, clock)
    control.issue("vk-one", "vk_1")
    await cache.authenticate("vk-one")
    control.resolve_gate = asyncio.Event()
    cache.apply(event(EventKind.VK_CONFIG_UPDATED, "vk_1", vk_id="vk_1"))
    while len(control.resolves) < 2:
        await asyncio.sleep(0)
    await cache.close()
    await cache.settle()  # nothing left to wait for
    assert control.calls() == (2, 1)


async def test_a_request_after_a_revocation_does_not_join_a_lookup_from_before_it(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    key = control.issue("vk-one", "vk_1")
    control.config_gate = asyncio.Event()
    before = asyncio.ensure_future(cache.authenticate("vk-one"))
    while not control.configs:
        await asyncio.sleep(0)
    cache.apply(event(EventKind.VK_REVOKED, "vk_1", vk_id="vk_1"))
    key.refused = ErrorCode.VIRTUAL_KEY_REVOKED
    after = asyncio.ensure_future(cache.authenticate("vk-one"))
    control.config_gate.set()
    assert (await before).vk_id == "vk_1"  # asked before the revocation arrived
    with pytest.raises(ProxyError) as raised:
        await after
    assert raised.value.code is ErrorCode.VIRTUAL_KEY_REVOKED


async def test_an_event_kind_newer_than_the_proxy_refreshes_its_organization(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    key = control.issue("vk-one", "vk_1")
    await cache.authenticate("vk-one")
    key.aliases = {"renamed": [target("prov-a", "m")]}
    key.revision = 2
    newer = msgspec.structs.replace(event(EventKind.BUDGET_CREATED, "b-1"), kind="GUARDRAIL_ADDED")
    cache.apply(newer)
    await cache.settle()
    assert set((await cache.authenticate("vk-one")).chains) == {"renamed"}


async def test_a_batch_holding_an_unknown_event_kind_still_decodes() -> None:
    body = (
        b'{"events":[{"revision":3,"kind":"GUARDRAIL_ADDED","organization_id":"o","entity_kind":'
        b'"guardrail","entity_id":"g","at":"2026-03-10T12:00:00Z"}],"current_revision":3}'
    )
    answer = msgspec.json.decode(body, type=ChangesResponse)
    assert [e.kind for e in answer.events] == ["GUARDRAIL_ADDED"]


def test_the_entries_keep_use_order_and_their_index_through_every_change() -> None:
    """The cache's own LRU: a hit or an overwrite makes an entry the most recently used, a full
    cache drops the least recently used, a look through every entry reorders nothing, and the
    index by key id follows each change."""

    def entry(name: str, vk_id: str) -> Entry:
        runtime = SimpleNamespace(vk_id=vk_id)  # all the entries look at
        return Entry(name, runtime, None, 0.0, 0.0, None, 0.0)  # type: ignore[arg-type]

    entries = _Entries(2)
    entries["a"] = entry("a", "vk_1")
    entries["b"] = entry("b", "vk_2")
    assert entries.get("a") is not None  # b is now the least recently used
    assert list(entries.unordered) == ["b", "a"]
    entries["c"] = entry("c", "vk_1")  # rotation grace: two digests, one key
    assert list(entries.unordered) == ["a", "c"] and entries.get("b") is None
    assert entries.by_vk == {"vk_1": ("a", "c")}
    entries["a"] = entry("a", "vk_1")  # overwritten: the most recently used again
    assert [e.digest for e in entries.values()] == ["c", "a"]
    entries["d"] = entry("d", "vk_3")
    assert list(entries.unordered) == ["a", "d"] and entries.by_vk == {
        "vk_1": ("a",),
        "vk_3": ("d",),
    }
    assert entries.pop("a") is not None and entries.pop("a") is None
    assert entries.by_vk == {"vk_3": ("d",)} and len(entries) == 1
    entries.clear()
    assert len(entries) == 0 and entries.by_vk == {}
    with pytest.raises(ValueError, match="at least one key"):
        _Entries(0)
