"""The per-credential circuit breaker, driven by a manual clock."""

from __future__ import annotations

from email.utils import format_datetime

import pytest

from proxy.breaker import Breakers, BreakerState, CircuitBreaker, parse_retry_after
from tests.support.clock import ManualClock


def breaker(clock: ManualClock, threshold: int = 3) -> CircuitBreaker:
    return CircuitBreaker(threshold=threshold, window_s=30.0, cooldown_s=60.0, clock=clock)


def test_opens_after_threshold_failures_within_the_window() -> None:
    clock = ManualClock()
    b = breaker(clock)
    assert not b.failed() and not b.failed()
    assert b.state is BreakerState.CLOSED and b.admit()
    assert b.failed(), "the third failure opens it"
    assert b.state is BreakerState.OPEN
    assert not b.admit()


def test_failures_older_than_the_window_do_not_count() -> None:
    clock = ManualClock()
    b = breaker(clock)
    b.failed()
    b.failed()
    clock.elapse(31)
    assert not b.failed(), "the first two fell out of the window"
    assert b.state is BreakerState.CLOSED


def test_a_success_clears_the_count() -> None:
    clock = ManualClock()
    b = breaker(clock)
    b.failed()
    b.failed()
    b.succeeded()
    assert not b.failed()
    assert b.state is BreakerState.CLOSED


def test_after_the_cooldown_one_probe_goes_through_and_its_success_closes() -> None:
    clock = ManualClock()
    b = breaker(clock, threshold=1)
    b.failed()
    clock.elapse(59)
    assert not b.admit() and b.state is BreakerState.OPEN
    assert b.retry_after_s() == pytest.approx(1, abs=0.01)
    clock.elapse(1)
    assert b.state is BreakerState.HALF_OPEN
    assert b.admit(), "one probe"
    assert not b.admit(), "only one probe at a time"
    b.succeeded()
    assert b.state is BreakerState.CLOSED
    assert b.admit() and b.admit()


def test_a_failed_probe_opens_it_for_another_cooldown() -> None:
    clock = ManualClock()
    b = breaker(clock, threshold=1)
    b.failed()
    clock.elapse(60)
    assert b.admit()
    b.failed()
    assert b.state is BreakerState.OPEN
    clock.elapse(59)
    assert not b.admit()
    clock.elapse(1)
    assert b.admit()


def test_a_probe_without_verdict_lets_the_next_probe_through() -> None:
    clock = ManualClock()
    b = breaker(clock, threshold=1)
    b.failed()
    clock.elapse(60)
    assert b.admit()
    b.released()
    assert b.admit()


def test_retry_after_rests_the_credential_without_opening_it() -> None:
    clock = ManualClock()
    b = breaker(clock)
    b.rate_limited(b"20")
    assert b.state is BreakerState.CLOSED
    assert b.resting()
    assert b.retry_after_s() == pytest.approx(20, abs=0.01)
    clock.elapse(20)
    assert not b.resting()


def test_a_429_without_retry_after_does_not_rest_the_credential() -> None:
    b = breaker(ManualClock())
    b.rate_limited(None)
    assert not b.resting()


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (b"7", 7.0),
        (b" 1.5 ", 1.5),
        (b"-3", 0.0),
        (b"soon", 0.0),
        (b"", 0.0),
        (b"nan", 0.0),
        (b"999999", 3600.0),
    ],
)
def test_retry_after_in_seconds(value: bytes, seconds: float) -> None:
    assert parse_retry_after(value, ManualClock()) == seconds


def test_retry_after_as_an_http_date() -> None:
    clock = ManualClock()
    moment = clock.now().replace(microsecond=0)
    from datetime import timedelta

    value = format_datetime(moment + timedelta(seconds=90), usegmt=True).encode()
    assert parse_retry_after(value, clock) == pytest.approx(90, abs=1)


def test_breakers_are_per_credential() -> None:
    clock = ManualClock()
    breakers = Breakers(threshold=1, window_s=30, cooldown_s=60, clock=clock)
    breakers["a"].failed()
    assert breakers["a"].state is BreakerState.OPEN
    assert breakers["b"].state is BreakerState.CLOSED
    assert breakers.states() == {"a": BreakerState.OPEN, "b": BreakerState.CLOSED}


def test_retry_after_as_an_http_date_without_a_zone_is_utc() -> None:
    clock = ManualClock()
    from datetime import timedelta

    moment = clock.now().replace(microsecond=0) + timedelta(seconds=90)
    value = moment.strftime("%a, %d %b %Y %H:%M:%S -0000").encode()
    assert parse_retry_after(value, clock) == pytest.approx(90, abs=1)


def test_retry_after_with_an_impossible_date_is_ignored() -> None:
    assert parse_retry_after(b"Mon, 01 Jan 0001 00:00:00 GMT", ManualClock()) == 0.0
