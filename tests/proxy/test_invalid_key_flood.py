"""Invalid-key floods are refused cheaply: the client's address (trusting forwarding headers only
from trusted proxies), a throttle of invalid keys per address, and the auth cache's memory of
keys the control plane did not know."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from litestar import Litestar

from proxy.asgi import Scope
from proxy.auth import AuthCache
from proxy.clients import InvalidKeyThrottle, KeyGuard
from proxy.errors import ProxyError
from proxy.providers.mock import MockProvider
from tests.proxy.conftest import (
    RunningProxy,
    TappedTransport,
    Tenant,
    proxy_settings,
    serve_proxy,
)
from tests.proxy.test_auth_cache_unit import FakeControlPlane, event
from tests.support.clock import ManualClock
from vkgate.addresses import IPNetwork, client_address, format_ip, parse_ip, throttle_key
from vkgate.errors import ErrorCode
from vkgate.keys import key_sha256
from vkgate.wire import EventKind

NEGATIVE_TTL_S = 30.0
PER_MINUTE = 60


def nets(*cidrs: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)


def scope(peer: str | None, *headers: tuple[str, str]) -> Scope:
    return {
        "type": "http",
        "client": (peer, 40_000) if peer is not None else None,
        "headers": [(name.encode(), value.encode("latin-1")) for name, value in headers],
    }


class NoHeaders(dict[str, Any]):
    """A scope that fails the test if anything reads its headers."""

    def __getitem__(self, name: str) -> Any:
        assert name != "headers", "headers were read"
        return super().__getitem__(name)


def unread_scope(peer: str) -> Scope:
    return NoHeaders(type="http", client=(peer, 40_000))


# -- the client's address -----------------------------------------------------------------


def test_without_trusted_proxies_the_peer_is_the_client_and_no_header_is_read() -> None:
    assert client_address(unread_scope("203.0.113.9"), ()) == "203.0.113.9"


def test_without_trusted_proxies_forwarding_headers_are_ignored() -> None:
    spoofed = scope("203.0.113.9", ("x-forwarded-for", "1.1.1.1"), ("x-real-ip", "2.2.2.2"))
    assert client_address(spoofed, ()) == "203.0.113.9"


def test_an_untrusted_peer_cannot_spoof_its_address() -> None:
    spoofed = scope("203.0.113.9", ("x-forwarded-for", "10.0.0.1"), ("x-real-ip", "10.0.0.2"))
    assert client_address(spoofed, nets("10.0.0.0/8")) == "203.0.113.9"


def test_a_trusted_proxy_names_the_client_in_x_forwarded_for() -> None:
    request = scope("10.0.0.7", ("x-forwarded-for", "198.51.100.7"))
    assert client_address(request, nets("10.0.0.0/8")) == "198.51.100.7"


def test_the_right_most_untrusted_hop_is_the_client_behind_a_chain_of_proxies() -> None:
    # The client wrote "1.1.1.1" itself; the edge proxy appended the address it saw.
    chain = "1.1.1.1, 198.51.100.7, 10.0.0.5, 10.0.0.6"
    request = scope("10.0.0.7", ("x-forwarded-for", chain))
    assert client_address(request, nets("10.0.0.0/8")) == "198.51.100.7"


def test_several_x_forwarded_for_headers_are_one_list_in_order() -> None:
    request = scope(
        "10.0.0.7",
        ("x-forwarded-for", "1.1.1.1, 198.51.100.7"),
        ("x-forwarded-for", "10.0.0.5"),
    )
    assert client_address(request, nets("10.0.0.0/8")) == "198.51.100.7"


def test_a_chain_of_trusted_hops_only_names_its_left_most_one() -> None:
    request = scope("10.0.0.7", ("x-forwarded-for", "10.1.2.3, 10.0.0.5"))
    assert client_address(request, nets("10.0.0.0/8")) == "10.1.2.3"


def test_x_real_ip_names_the_client_when_there_is_no_x_forwarded_for() -> None:
    request = scope("10.0.0.7", ("x-real-ip", "198.51.100.7"))
    assert client_address(request, nets("10.0.0.0/8")) == "198.51.100.7"


def test_x_forwarded_for_wins_over_x_real_ip() -> None:
    request = scope("10.0.0.7", ("x-real-ip", "192.0.2.1"), ("x-forwarded-for", "198.51.100.7"))
    assert client_address(request, nets("10.0.0.0/8")) == "198.51.100.7"


def test_a_trusted_proxy_without_forwarding_headers_is_the_client() -> None:
    assert client_address(scope("10.0.0.7"), nets("10.0.0.0/8")) == "10.0.0.7"


def test_ipv6_peers_and_hops() -> None:
    request = scope("::1", ("x-forwarded-for", "2001:DB8::1, fd00::2"))
    assert client_address(request, nets("::1/128", "fd00::/8")) == "2001:db8::1"


def test_an_ipv4_network_does_not_trust_ipv6_peers() -> None:
    request = scope("2001:db8::5", ("x-forwarded-for", "198.51.100.7"))
    assert client_address(request, nets("10.0.0.0/8")) == "2001:db8::5"


def test_a_dual_stack_peer_is_trusted_by_its_ipv4_address() -> None:
    request = scope("::ffff:10.0.0.7", ("x-forwarded-for", "198.51.100.7"))
    assert client_address(request, nets("10.0.0.0/8")) == "198.51.100.7"


@pytest.mark.parametrize(
    ("forwarded", "client"),
    [
        ("198.51.100.7:4711", "198.51.100.7"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ("[2001:db8::1]", "2001:db8::1"),
        ("::ffff:198.51.100.7", "198.51.100.7"),
    ],
)
def test_hops_written_with_ports_or_brackets_are_read(forwarded: str, client: str) -> None:
    request = scope("10.0.0.7", ("x-forwarded-for", forwarded))
    assert client_address(request, nets("10.0.0.0/8")) == client


@pytest.mark.parametrize(
    "headers",
    [
        [("x-forwarded-for", "not-an-ip")],
        [("x-forwarded-for", "198.51.100.7, unknown")],
        [("x-forwarded-for", "198.51.100.7,,10.0.0.5")],
        [("x-forwarded-for", "")],
        [("x-forwarded-for", "198.51.100.7:http")],
        [("x-forwarded-for", "[2001:db8::1")],
        [("x-forwarded-for", "garbage"), ("x-real-ip", "198.51.100.9")],
        [("x-real-ip", "999.1.1.1")],
        [("x-real-ip", "198.51.100.7; drop table")],
    ],
)
def test_malformed_forwarding_headers_fall_back_to_the_peer(headers: list[tuple[str, str]]) -> None:
    assert client_address(scope("10.0.0.7", *headers), nets("10.0.0.0/8")) == "10.0.0.7"


def test_a_request_without_a_peer_has_an_unknown_address() -> None:
    assert client_address(scope(None), ()) == "unknown"
    assert client_address(scope(None, ("x-forwarded-for", "1.1.1.1")), nets("0.0.0.0/0")) == (
        "unknown"
    )


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("198.51.100.7", "198.51.100.7"),
        ("2001:DB8::0001", "2001:db8::1"),
        ("fe80::1%eth0", "fe80::1"),
        ("::ffff:198.51.100.7", "198.51.100.7"),
        ("[::1]:8080", "::1"),
    ],
)
def test_addresses_are_named_canonically(text: str, canonical: str) -> None:
    address = parse_ip(text)
    assert address is not None
    assert format_ip(address) == canonical


@pytest.mark.parametrize(
    "text",
    ["1.2.3.4:", "1.2.3", "01.2.3.4", "256.1.1.1", "example.com", "1.2.3.4\x00", "\uff11.2.3.4"],
)
def test_anything_else_is_no_address(text: str) -> None:
    assert parse_ip(text) is None


def test_the_throttle_counts_an_ipv6_client_by_its_slash_64() -> None:
    assert throttle_key("2001:db8:1:2:aaaa::1") == "2001:db8:1:2::/64"
    assert throttle_key("198.51.100.7") == "198.51.100.7"
    assert throttle_key("::ffff:198.51.100.7") == "198.51.100.7"
    assert throttle_key("unknown") == "unknown"


# -- the throttle -------------------------------------------------------------------------


def exhaust(throttle: InvalidKeyThrottle, address: str, times: int) -> list[float | None]:
    return [throttle.failed(address) for _ in range(times)]


def test_an_address_may_fail_its_per_minute_at_once_then_is_throttled(
    clock: ManualClock,
) -> None:
    throttle = InvalidKeyThrottle(PER_MINUTE, clock)
    assert not throttle.watching
    waits = exhaust(throttle, "198.51.100.7", PER_MINUTE)
    assert waits[:-1] == [None] * (PER_MINUTE - 1)
    assert waits[-1] == pytest.approx(60 / PER_MINUTE, abs=0.05)
    assert throttle.watching
    assert throttle.retry_after("198.51.100.7") == pytest.approx(1.0, abs=0.05)
    assert throttle.retry_after("198.51.100.8") is None  # another address is not affected


def test_a_throttled_address_refills_at_the_per_minute_rate(clock: ManualClock) -> None:
    throttle = InvalidKeyThrottle(6, clock)  # one key every 10 s once the burst is spent
    exhaust(throttle, "a", 6)
    assert throttle.retry_after("a") is not None
    clock.elapse(9.5)
    assert throttle.retry_after("a") is not None
    clock.elapse(0.6)
    assert throttle.retry_after("a") is None
    # The refill lets one more key through, then it is throttled again.
    assert throttle.failed("a") == pytest.approx(10.0, abs=0.2)
    assert throttle.retry_after("a") is not None
    clock.elapse(60)
    assert exhaust(throttle, "a", 6)[:5] == [None] * 5  # full again: the whole burst


def test_failures_while_throttled_keep_it_throttled_without_digging_deeper(
    clock: ManualClock,
) -> None:
    throttle = InvalidKeyThrottle(PER_MINUTE, clock)
    exhaust(throttle, "a", PER_MINUTE + 50)
    # However many more failures, one refill's wait from the latest one.
    assert throttle.retry_after("a") == pytest.approx(1.0, abs=0.05)
    clock.elapse(1.01)
    assert throttle.retry_after("a") is None


def test_a_throttle_episode_is_logged_once_with_the_address_only(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="vkgate.proxy.clients")
    throttle = InvalidKeyThrottle(PER_MINUTE, clock)
    exhaust(throttle, "198.51.100.7", PER_MINUTE)
    for _ in range(20):  # a trickle at the refill rate is the same episode
        clock.elapse(1.0)
        throttle.failed("198.51.100.7")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["invalid_key_throttled address=198.51.100.7"]
    clock.elapse(60)  # quiet until the bucket is full: the next flood is a new episode
    exhaust(throttle, "198.51.100.7", PER_MINUTE)
    assert len(caplog.records) == 2


def test_the_throttle_remembers_a_bounded_number_of_addresses(clock: ManualClock) -> None:
    throttle = InvalidKeyThrottle(1, clock, max_addresses=3)
    for n in range(10):
        throttle.failed(f"192.0.2.{n}")
    assert len(throttle._buckets) <= 3
    assert len(throttle._blocked) <= 3
    assert throttle.retry_after("192.0.2.9") is not None


def test_a_bucket_left_alone_until_full_is_forgotten(clock: ManualClock) -> None:
    throttle = InvalidKeyThrottle(PER_MINUTE, clock)
    throttle.failed("a")
    clock.elapse(61)
    throttle.failed("b")  # a write expires what has lapsed
    assert list(throttle._buckets) == ["b"]


def test_blocks_are_forgotten_with_the_last_bucket(clock: ManualClock) -> None:
    throttle = InvalidKeyThrottle(PER_MINUTE, clock)
    exhaust(throttle, "a", PER_MINUTE + 5)
    assert throttle.watching and throttle.retry_after("a") is not None
    clock.elapse(61)  # refilled: the bucket is forgotten, and so is the block
    assert not throttle.watching
    assert throttle._blocked == {}


def test_per_minute_must_be_positive(clock: ManualClock) -> None:
    with pytest.raises(ValueError, match="per_minute"):
        InvalidKeyThrottle(0, clock)


def test_a_lookup_takes_its_token_before_it_is_made_once_an_address_has_failed(
    clock: ManualClock,
) -> None:
    throttle = InvalidKeyThrottle(PER_MINUTE, clock)
    address = "198.51.100.7"
    assert not throttle.take(address)  # no invalid key yet: nothing to take, nothing refused
    for _ in range(PER_MINUTE - 3):
        throttle.failed(address)
    # Three tokens left: three lookups may run at once, the fourth waits for a refill.
    assert [throttle.take(address) for _ in range(4)] == [True, True, True, False]
    wait = throttle.retry_after(address)
    assert wait is not None and wait > 0
    # Two of the three lookups found invalid keys: counted by the tokens they took, not again.
    assert throttle.failed(address, taken=True) is not None
    assert throttle.failed(address, taken=True) is not None
    assert not throttle.take(address)
    # The third key was valid: its token is the address's again.
    throttle.give_back(address)
    assert throttle.take(address)


def test_concurrent_lookups_from_a_failing_client_are_bounded_by_its_tokens(
    clock: ManualClock,
) -> None:
    guard = KeyGuard(InvalidKeyThrottle(PER_MINUTE, clock))
    flooder = scope("198.51.100.7")
    for _ in range(PER_MINUTE - 2):
        guard.failed(flooder)
    passes = [guard.admission(flooder) for _ in range(16)]
    admitted, refused = [], []
    for admission in passes:
        assert admission is not None
        try:
            admission()  # all 16 reach this point before any lookup has answered
            admitted.append(admission)
        except ProxyError as exc:
            assert exc.code is ErrorCode.RATE_LIMITED
            refused.append(admission)
    assert len(admitted) == 2 and len(refused) == 14
    # Both were invalid: counted once each (their tokens), and the client waits a refill.
    assert [guard.failed(flooder, a) for a in admitted][-1] is not None


def test_a_valid_key_gives_its_lookups_token_back(clock: ManualClock) -> None:
    guard = KeyGuard(InvalidKeyThrottle(PER_MINUTE, clock))
    client = scope("198.51.100.7")
    for _ in range(PER_MINUTE - 1):
        guard.failed(client)
    for _ in range(5):  # one token, taken and given back by each valid key in turn
        admission = guard.admission(client)
        assert admission is not None
        admission()
        guard.release(admission)
    guard.release(admission)  # releasing twice gives back nothing more
    admission = guard.admission(client)
    assert admission is not None
    admission()
    with pytest.raises(ProxyError):
        second = guard.admission(client)
        assert second is not None
        second()


# -- the gateway's guard ------------------------------------------------------------------


def look_up(guard: KeyGuard, client: Scope) -> None:
    """What the gateway runs before a lookup of this client's key reaches the control plane
    (a valid key's: a token taken is given back); raises the throttle's 429."""
    admission = guard.admission(client)
    if admission is not None:
        admission()
        guard.release(admission)


def test_the_guard_names_no_client_while_nothing_is_throttled(clock: ManualClock) -> None:
    guard = KeyGuard(InvalidKeyThrottle(PER_MINUTE, clock), nets("10.0.0.0/8"))
    empty: Scope = {}  # naming the client would fail: there is nothing to name it from
    look_up(guard, empty)
    assert guard.admission(empty) is None


def test_the_guard_refuses_a_throttled_client_with_429_and_retry_after(
    clock: ManualClock,
) -> None:
    guard = KeyGuard(InvalidKeyThrottle(PER_MINUTE, clock))
    flooder = scope("198.51.100.7")
    waits = [guard.failed(flooder) for _ in range(PER_MINUTE)]
    assert waits[-1] is not None and all(w is None for w in waits[:-1])
    with pytest.raises(ProxyError) as raised:
        look_up(guard, flooder)
    error = raised.value
    assert error.code is ErrorCode.RATE_LIMITED
    assert error.status == 429
    assert error.headers == ((b"retry-after", b"1"),)
    look_up(guard, scope("198.51.100.8"))  # another client is served
    clock.elapse(1.01)
    look_up(guard, flooder)


def test_retry_after_is_whole_seconds_rounded_up(clock: ManualClock) -> None:
    guard = KeyGuard(InvalidKeyThrottle(7, clock))  # a refill every 8.57 s
    flooder = scope("198.51.100.7")
    for _ in range(7):
        guard.failed(flooder)
    with pytest.raises(ProxyError) as raised:
        look_up(guard, flooder)
    assert raised.value.headers == ((b"retry-after", b"9"),)


def test_the_guard_throttles_the_client_behind_a_trusted_proxy(clock: ManualClock) -> None:
    guard = KeyGuard(InvalidKeyThrottle(PER_MINUTE, clock), nets("10.0.0.0/8"))
    flooder = scope("10.0.0.7", ("x-forwarded-for", "198.51.100.7"))
    neighbour = scope("10.0.0.7", ("x-forwarded-for", "198.51.100.8"))
    for _ in range(PER_MINUTE):
        guard.failed(flooder)
    admit = guard.admission(neighbour)
    assert admit is not None  # something is throttled: this client is named and checked
    admit()
    refuse = guard.admission(flooder)
    assert refuse is not None
    with pytest.raises(ProxyError):
        refuse()


def test_an_ipv6_flood_cannot_escape_by_changing_address_within_its_slash_64(
    clock: ManualClock,
) -> None:
    guard = KeyGuard(InvalidKeyThrottle(PER_MINUTE, clock))
    for n in range(PER_MINUTE):
        guard.failed(scope(f"2001:db8:1:2::{n + 1:x}"))
    with pytest.raises(ProxyError):
        look_up(guard, scope("2001:db8:1:2:ffff::1"))
    look_up(guard, scope("2001:db8:1:3::1"))


# -- the auth cache's memory of unknown keys ----------------------------------------------


@pytest.fixture
def control(clock: ManualClock) -> FakeControlPlane:
    return FakeControlPlane(clock)


def negative_cache(control: FakeControlPlane, clock: ManualClock, **options: Any) -> AuthCache:
    return AuthCache(
        control,
        {"mock": MockProvider(clock)},
        clock,
        invalid_key_cache_s=options.pop("invalid_key_cache_s", NEGATIVE_TTL_S),
        **options,
    )


@pytest.fixture
async def cache(control: FakeControlPlane, clock: ManualClock) -> AsyncIterator[AuthCache]:
    auth = negative_cache(control, clock)
    yield auth
    await auth.close()


async def refusal(cache: AuthCache, key: str, admit: Any = None) -> ProxyError:
    with pytest.raises(ProxyError) as raised:
        await cache.authenticate(key, admit)
    return raised.value


async def test_an_unknown_key_presented_again_is_refused_without_asking(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    first = await refusal(cache, "vk-never-issued")
    for _ in range(5):
        again = await refusal(cache, "vk-never-issued")
        assert (again.code, again.status, again.message) == (
            first.code,
            first.status,
            first.message,
        )
    assert first.code is ErrorCode.INVALID_API_KEY
    assert control.resolves == [key_sha256("vk-never-issued")]
    assert len(cache) == 0  # nothing positive was cached


async def test_an_unknown_key_is_asked_about_again_after_the_negative_ttl(
    cache: AuthCache, control: FakeControlPlane, clock: ManualClock
) -> None:
    await refusal(cache, "vk-never-issued")
    clock.elapse(NEGATIVE_TTL_S - 1)
    await refusal(cache, "vk-never-issued")
    assert len(control.resolves) == 1
    clock.elapse(1)
    await refusal(cache, "vk-never-issued")
    assert len(control.resolves) == 2


@pytest.mark.parametrize("kind", [EventKind.VK_CREATED, EventKind.VK_ROTATED])
async def test_a_new_or_rotated_key_forgets_the_unknown_keys(
    cache: AuthCache, control: FakeControlPlane, kind: EventKind
) -> None:
    await refusal(cache, "vk-brand-new")
    control.issue("vk-brand-new", "vk_new")
    cache.apply(event(kind, "vk_new", vk_id="vk_new"))
    assert (await cache.authenticate("vk-brand-new")).vk_id == "vk_new"
    assert len(control.resolves) == 2


async def test_clearing_the_cache_forgets_the_unknown_keys(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    await refusal(cache, "vk-brand-new")
    control.issue("vk-brand-new", "vk_new")
    cache.clear()  # the change feed (re)started: events may have been missed
    assert (await cache.authenticate("vk-brand-new")).vk_id == "vk_new"


async def test_an_unknown_answer_overtaken_by_a_new_key_is_not_remembered(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    control.resolve_gate = asyncio.Event()
    asked = asyncio.ensure_future(refusal(cache, "vk-brand-new"))
    while not control.resolves:
        await asyncio.sleep(0)
    # The "unknown" answer is on its way when the key is created.
    control.issue("vk-brand-new", "vk_new")
    cache.apply(event(EventKind.VK_CREATED, "vk_new", vk_id="vk_new"))
    later = asyncio.ensure_future(cache.authenticate("vk-brand-new"))
    control.resolve_gate.set()
    assert (await asked).code is ErrorCode.INVALID_API_KEY  # it asked before the key existed
    assert (await later).vk_id == "vk_new"  # it did not join the lookup from before


@pytest.mark.parametrize(
    "code",
    [ErrorCode.VIRTUAL_KEY_REVOKED, ErrorCode.VIRTUAL_KEY_DISABLED, ErrorCode.VIRTUAL_KEY_EXPIRED],
)
async def test_revoked_disabled_and_expired_keys_are_not_remembered_as_unknown(
    cache: AuthCache, control: FakeControlPlane, code: ErrorCode
) -> None:
    control.issue("vk-one", "vk_1", refused=code)
    assert (await refusal(cache, "vk-one")).code is code
    assert (await refusal(cache, "vk-one")).code is code
    assert len(control.resolves) == 2
    assert len(cache._unknown) == 0


async def test_the_control_plane_being_down_is_not_remembered(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    control.down = True
    assert (await refusal(cache, "vk-one")).code is ErrorCode.AUTH_UPSTREAM_UNAVAILABLE
    control.down = False
    control.issue("vk-one", "vk_1")
    assert (await cache.authenticate("vk-one")).vk_id == "vk_1"


async def test_admit_runs_only_before_a_control_plane_lookup(
    cache: AuthCache, control: FakeControlPlane
) -> None:
    admitted: list[str] = []
    control.issue("vk-one", "vk_1")
    await cache.authenticate("vk-one", lambda: admitted.append("vk-one"))
    await cache.authenticate("vk-one", lambda: admitted.append("cached"))
    await refusal(cache, "vk-unknown", lambda: admitted.append("vk-unknown"))
    await refusal(cache, "vk-unknown", lambda: admitted.append("remembered"))
    assert admitted == ["vk-one", "vk-unknown"]


async def test_admit_can_refuse_a_lookup_before_it_is_made(
    cache: AuthCache, control: FakeControlPlane, clock: ManualClock
) -> None:
    guard = KeyGuard(InvalidKeyThrottle(1, clock))
    flooder = scope("198.51.100.7")
    guard.failed(flooder)
    error = await refusal(cache, "vk-random-1", guard.admission(flooder))
    assert error.code is ErrorCode.RATE_LIMITED
    assert control.resolves == []


async def test_a_cached_key_is_served_to_a_throttled_client(
    cache: AuthCache, control: FakeControlPlane, clock: ManualClock
) -> None:
    control.issue("vk-one", "vk_1")
    await cache.authenticate("vk-one")
    guard = KeyGuard(InvalidKeyThrottle(1, clock))
    flooder = scope("198.51.100.7")
    guard.failed(flooder)
    assert (await cache.authenticate("vk-one", guard.admission(flooder))).vk_id == "vk_1"


async def test_the_memory_of_unknown_keys_is_bounded(
    control: FakeControlPlane, clock: ManualClock
) -> None:
    cache = negative_cache(control, clock, invalid_key_cache_size=2)
    for n in range(5):
        await refusal(cache, f"vk-random-{n}")
    assert len(cache._unknown) == 2
    await cache.close()


async def test_a_zero_ttl_remembers_nothing(control: FakeControlPlane, clock: ManualClock) -> None:
    cache = negative_cache(control, clock, invalid_key_cache_s=0.0)
    await refusal(cache, "vk-never-issued")
    await refusal(cache, "vk-never-issued")
    assert len(control.resolves) == 2
    await cache.close()


def test_no_key_or_hash_is_logged(clock: ManualClock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    guard = KeyGuard(InvalidKeyThrottle(1, clock))
    guard.failed(scope("198.51.100.7"))
    assert caplog.text.count("invalid_key_throttled address=198.51.100.7") == 1
    assert "vk-" not in caplog.text


# -- end to end, through the real proxy and control plane ---------------------------------
#
# Fixtures: `app`, `client` and `clock` (tests/conftest.py: the control plane on each database
# backend, started in this loop), `tenant` (tests/proxy/conftest.py), and the proxy under
# uvicorn via `serve_proxy` with a `TappedTransport` counting its calls to the control plane.

FLOOD = 500
FLOOD_PER_MINUTE = 20


@pytest.fixture
def tap(app: Litestar) -> TappedTransport:
    return TappedTransport(httpx.ASGITransport(app=app))


@pytest.fixture
async def flood_proxy(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock, tap: TappedTransport
) -> AsyncIterator[RunningProxy]:
    settings = proxy_settings(
        invalid_keys_per_minute=FLOOD_PER_MINUTE,
        trusted_proxy_cidrs=nets("127.0.0.1/32"),
    )
    async with serve_proxy(app, clock, settings, control_transport=tap) as running:
        # The feed's first connection clears the cache: let it happen before the test starts.
        await running.following_changes()
        yield running


def resolve_calls(tap: TappedTransport) -> int:
    return sum(1 for path in tap.paths if path.endswith("/resolve-key"))


def random_keys(n: int) -> Iterator[str]:
    return (f"vk-{secrets.token_hex(16)}" for _ in range(n))


def bearer(key: str, client_ip: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}"}
    if client_ip is not None:
        headers["X-Forwarded-For"] = client_ip
    return headers


async def test_the_same_unknown_key_reaches_the_control_plane_once(
    flood_proxy: RunningProxy, tap: TappedTransport
) -> None:
    async with flood_proxy.http() as http:
        for _ in range(10):
            response = await http.get("/v1/models", headers=bearer("vk-never-issued"))
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "invalid_api_key"
    assert resolve_calls(tap) == 1


async def test_a_flood_of_invalid_keys_reaches_the_control_plane_at_the_throttles_rate(
    flood_proxy: RunningProxy, tap: TappedTransport
) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    statuses: list[int] = []
    async with flood_proxy.http() as http:
        for key in random_keys(FLOOD):
            response = await http.get("/v1/models", headers=bearer(key))
            statuses.append(response.status_code)
            if response.status_code == 429:
                assert response.json()["error"]["code"] == "rate_limited"
                assert int(response.headers["retry-after"]) >= 1
    elapsed = loop.time() - started
    # The burst, and what the bucket refilled while the flood went on; nothing more.
    assert resolve_calls(tap) <= FLOOD_PER_MINUTE + elapsed * FLOOD_PER_MINUTE / 60
    assert statuses[:FLOOD_PER_MINUTE] == [401] * FLOOD_PER_MINUTE
    assert statuses.count(429) >= FLOOD - FLOOD_PER_MINUTE - elapsed * FLOOD_PER_MINUTE / 60


async def test_a_concurrent_flood_reaches_the_control_plane_no_faster(
    flood_proxy: RunningProxy, tap: TappedTransport, clock: ManualClock
) -> None:
    # Sixteen connections at once: when the address's block ends, its requests all miss the
    # cache together, yet only as many lookups run as it has tokens.
    clock.freeze()  # tokens come from `elapse` only, however long the floods take here

    async def flood(n: int) -> list[int]:
        keys = iter(random_keys(n))

        async def client(http: httpx.AsyncClient) -> list[int]:
            return [(await http.get("/v1/models", headers=bearer(k))).status_code for k in keys]

        async with flood_proxy.http() as http:
            batches = await asyncio.gather(*(client(http) for _ in range(16)))
        return [status for batch in batches for status in batch]

    statuses = await flood(FLOOD)
    assert set(statuses) == {401, 429}
    # The burst: its allowance, and at most the requests already on their way to the control
    # plane when the first answers came back (before then nothing marked the address).
    burst = resolve_calls(tap)
    assert FLOOD_PER_MINUTE <= burst <= FLOOD_PER_MINUTE + 15
    for _ in range(3):
        clock.elapse(60 / FLOOD_PER_MINUTE)  # one token's refill
        assert set(await flood(100)) == {401, 429}
    assert resolve_calls(tap) == burst + 3


async def test_requests_that_join_a_lookup_take_no_token(
    tenant: Tenant, flood_proxy: RunningProxy, tap: TappedTransport
) -> None:
    # One mistyped key from a shared address, then a burst of a valid key nobody has used
    # yet: one lookup serves the whole burst, and only that lookup may cost a token.
    async with flood_proxy.http() as http:
        typo = await http.get("/v1/models", headers=bearer("vk-mistyped", "198.51.100.7"))
        assert typo.status_code == 401
        burst = await asyncio.gather(
            *(
                http.get("/v1/models", headers=bearer(tenant.key, "198.51.100.7"))
                for _ in range(5 * FLOOD_PER_MINUTE)
            )
        )
    assert [answer.status_code for answer in burst] == [200] * (5 * FLOOD_PER_MINUTE)
    assert resolve_calls(tap) == 2


async def test_behind_a_trusted_proxy_only_the_flooding_client_is_throttled(
    tenant: Tenant, flood_proxy: RunningProxy, tap: TappedTransport
) -> None:
    async with flood_proxy.http() as http:
        # A valid key is cached before the flood, from the flooder's own address.
        ok = await http.get("/v1/models", headers=bearer(tenant.key, "198.51.100.7"))
        assert ok.status_code == 200, ok.text
        for key in random_keys(FLOOD_PER_MINUTE):
            await http.get("/v1/models", headers=bearer(key, "198.51.100.7"))
        flooded = await http.get("/v1/models", headers=bearer("vk-one-more", "198.51.100.7"))
        assert flooded.status_code == 429, flooded.text
        # Another client behind the same proxy still gets its answer.
        other = await http.get("/v1/models", headers=bearer("vk-one-more", "198.51.100.8"))
        assert other.status_code == 401, other.text
        # A key the proxy holds is still served to the throttled address: it asks nothing.
        cached = await http.get("/v1/models", headers=bearer(tenant.key, "198.51.100.7"))
        assert cached.status_code == 200, cached.text
