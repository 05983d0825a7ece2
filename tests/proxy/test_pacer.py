"""The pacer on its own: a frozen clock that only its injected sleep moves on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest

from proxy import pacer as pacer_module
from proxy.pacer import Pacer
from tests.support.clock import ManualClock

INTERVAL_S = 1.0


class Harness:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.driven = False
        """Set when the test moves the clock itself: a sleep then only yields."""
        self.clock.freeze()
        self.calls: list[tuple[str, float]] = []
        self.slept: list[float] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.fail: set[str] = set()
        self.pacer = Pacer(self.call, INTERVAL_S, self.clock.monotonic, self.spawn, self.sleep)

    def call(self, name: str) -> None:
        self.calls.append((name, self.clock.monotonic()))
        if name in self.fail:
            raise RuntimeError(f"{name} failed")

    def spawn(self, job: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(job))

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if not self.driven:
            self.clock.elapse(seconds)
        await asyncio.sleep(0)

    async def settle(self) -> None:
        await asyncio.gather(*self.tasks)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    h = Harness()
    yield h
    for task in h.tasks:
        task.cancel()


async def test_the_first_call_is_made_at_once(harness: Harness) -> None:
    harness.pacer.ask("bud-1")
    assert harness.names() == ["bud-1"]
    assert not harness.tasks  # nothing waits, so nothing runs in the background


async def test_calls_within_the_interval_become_one_at_its_end(harness: Harness) -> None:
    start = harness.clock.monotonic()
    harness.pacer.ask("bud-1")
    harness.clock.elapse(0.25)
    for _ in range(5):
        harness.pacer.ask("bud-1")
    assert harness.names() == ["bud-1"]
    assert len(harness.pacer) == 1
    await harness.settle()
    assert harness.calls == [("bud-1", start), ("bud-1", start + INTERVAL_S)]
    assert harness.slept == [pytest.approx(0.75)]
    assert len(harness.pacer) == 0


async def test_a_call_an_interval_after_the_last_is_made_at_once(harness: Harness) -> None:
    harness.pacer.ask("bud-1")
    harness.clock.elapse(INTERVAL_S)
    harness.pacer.ask("bud-1")
    assert harness.names() == ["bud-1", "bud-1"]
    assert not harness.tasks


async def test_names_are_paced_apart(harness: Harness) -> None:
    start = harness.clock.monotonic()
    harness.pacer.ask("bud-1")
    harness.clock.elapse(0.5)
    harness.pacer.ask("bud-2")  # never called: at once, whatever bud-1 did
    harness.pacer.ask("bud-1")
    harness.pacer.ask("bud-2")
    assert harness.names() == ["bud-1", "bud-2"]
    await harness.settle()
    # Each at the end of its own interval, the earlier first.
    assert harness.calls[2:] == [("bud-1", start + 1.0), ("bud-2", start + 1.5)]
    assert len(harness.tasks) == 1  # one waiter for every name


async def test_a_steady_stream_of_asks_is_called_once_an_interval(harness: Harness) -> None:
    harness.driven = True
    start = harness.clock.monotonic()
    for _ in range(32):  # eight a second for four seconds
        harness.pacer.ask("bud-1")
        harness.clock.elapse(0.125)
        await asyncio.sleep(0)
    await harness.settle()
    assert [at - start for _, at in harness.calls] == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0])


async def test_a_failing_call_does_not_stop_the_calls_waiting_behind_it(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    harness.fail.add("bud-1")
    harness.pacer.ask("bud-1")  # fails at once: logged, not raised to the asker
    harness.pacer.ask("bud-2")
    harness.pacer.ask("bud-1")
    harness.pacer.ask("bud-2")
    await harness.settle()
    assert sorted(harness.names()[2:]) == ["bud-1", "bud-2"]
    assert [r.getMessage() for r in caplog.records].count("paced call failed") == 2


async def test_names_called_long_ago_are_forgotten(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pacer_module, "PRUNE_AT_LEAST", 4)
    pacer = Pacer(harness.call, INTERVAL_S, harness.clock.monotonic, harness.spawn)
    for n in range(3):
        pacer.ask(f"old-{n}")
    harness.clock.elapse(INTERVAL_S)
    pacer.ask("new-0")  # the fourth name: the old three are past their interval
    assert set(pacer._called) == {"new-0"}
    for n in range(1, 5):
        pacer.ask(f"new-{n}")
    # The sweep at four kept all four (each within the interval), so the next comes at eight.
    assert len(pacer._called) == 5
    assert pacer._sweep_at == 8


def test_a_negative_interval_is_refused() -> None:
    clock = ManualClock()
    with pytest.raises(ValueError, match="cannot be negative"):
        Pacer(lambda name: None, -1.0, clock.monotonic, lambda job: None)
