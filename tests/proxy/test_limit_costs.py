"""What a request may cost before it is sent (prompt bound, worst case), what it did cost, and
when its spend is known to be in the ledger."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Sequence

import msgspec
import pytest

from proxy.limits.budgets import (
    LEDGERED_CHUNK,
    BudgetAsk,
    BudgetGuard,
    BudgetRule,
    Worst,
    rules_of,
)
from proxy.limits.cost import INLINE_DATA_TOKENS, Prompt, Rates, rates_of
from proxy.limits.counters import LocalCounters
from proxy.limits.store import BudgetBucket
from proxy.providers import Upstream
from proxy.spend.estimate import estimate_tokens
from tests.support.clock import ManualClock
from vkgate.clock import unix_seconds
from vkgate.spend import RecordKind, SpendRecord
from vkgate.wire import BudgetState, Price

SAMPLES = {
    "english": "Which river runs through Paris? Answer in one sentence, please. " * 20,
    "code": "def add(a: int, b: int) -> int:\n    return a + b  # sum\n" * 20,
    "digits": "3.14159265358979 2.71828182845904 1.41421356237309 " * 20,
    "chinese": "巴黎有哪条河流经过请用一句话回答" * 20,
    "japanese": "パリを流れる川はどれですか。一文で答えてください。" * 20,
    "russian": "Какая река протекает через Париж? Ответьте одним предложением. " * 20,
}


def chat_body(text: str) -> bytes:
    return json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": text}]}, ensure_ascii=False
    ).encode()


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_the_prompt_bound_is_at_least_what_a_tokenizer_counts(kind: str) -> None:
    body = chat_body(SAMPLES[kind])
    assert Prompt.of(body).at_most >= estimate_tokens(body.decode())


def test_the_typical_estimate_of_english_is_close_to_a_tokenizers_count() -> None:
    body = chat_body(SAMPLES["english"])
    counted = estimate_tokens(body.decode())
    assert counted * 0.8 <= Prompt.of(body).typical <= counted * 1.5


def test_an_inline_image_counts_as_an_image_not_as_its_base64() -> None:
    image = "data:image/png;base64," + base64.b64encode(bytes(300_000)).decode()
    content = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": image}},
    ]
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]}).encode()
    prompt = Prompt.of(body)
    assert prompt.inline == 1
    assert INLINE_DATA_TOKENS < prompt.at_most < INLINE_DATA_TOKENS + 100


def test_an_anthropic_base64_image_counts_as_an_image() -> None:
    data = base64.b64encode(bytes(300_000)).decode()
    source = {"type": "base64", "media_type": "image/png", "data": data}
    content = [{"type": "image", "source": source}, {"type": "text", "text": "what is this?"}]
    body = json.dumps(
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": content}]}
    ).encode()
    prompt = Prompt.of(body)
    assert prompt.inline == 1
    assert INLINE_DATA_TOKENS < prompt.typical < prompt.at_most < INLINE_DATA_TOKENS + 200


def test_costs_round_up_to_the_nano_dollar() -> None:
    rates = rates_of(Price(input_per_mtok="0.15", output_per_mtok="0.6"))
    assert rates == Rates(
        input=150_000_000, output=600_000_000, cache_read=150_000_000, cache_write=150_000_000
    )
    assert rates is not None
    assert rates.cost(1, 0) == 150  # 0.15 USD per million is 150 nano-USD a token
    assert rates.cost(1_000_000, 1_000_000) == 750_000_000
    tiny = rates_of(Price(input_per_mtok="0.0001", output_per_mtok="0"))
    assert tiny is not None
    # 0.1 nano-USD is charged as 1: a reservation never falls short by a rounding.
    assert tiny.cost(1, 0) == 1


def test_cached_input_is_charged_at_its_own_rate() -> None:
    rates = rates_of(
        Price(
            input_per_mtok="3",
            output_per_mtok="15",
            cache_read_per_mtok="0.3",
            cache_write_per_mtok="3.75",
        )
    )
    assert rates is not None
    # 1,000 input of which 600 read from cache and 100 written to it.
    assert (
        rates.cost(1_000, 0, cache_read=600, cache_write=100)
        == 300 * 3_000 + 600 * 300 + 100 * 3_750
    )


def test_a_price_that_is_not_a_number_gives_no_rates() -> None:
    assert rates_of(Price(input_per_mtok="free", output_per_mtok="1")) is None
    assert rates_of(None) is None


def state(budget_id: str) -> BudgetState:
    return BudgetState(budget_id, None, "organization", None, "total", "1", "block")


def test_without_the_filtered_providers_the_rest_is_reserved_at_its_own_worst_case() -> None:
    org = BudgetBucket("bg:org", 10**9, 0, 0.0, True, 0, None)
    filtered = BudgetBucket("bg:a", 10, 0, 0.0, True, 1, None)
    rules = list(rules_of([state("org"), state("a")]))
    ask = BudgetAsk(
        [org, filtered], [500, 500], rules, {"prov-a": 1}, {"prov-a": 500, "prov-b": 20}
    )
    rest = ask.without_groups()
    assert rest.buckets == [org]
    assert rest.rules == rules[:1]
    assert rest.amounts == [20]
    assert rest.costs("prov-b", 7) == [7]


class Counting(LocalCounters):
    def __init__(self) -> None:
        super().__init__()
        self.acknowledged: list[tuple[str, str]] = []
        self.calls: list[int] = []
        """How many entries each call handed over."""

    async def ledgered(self, entries: Sequence[tuple[str, str]], now: float) -> None:
        self.acknowledged.extend(entries)
        self.calls.append(len(entries))
        await super().ledgered(entries, now)


async def test_settled_spend_is_marked_acknowledged_whatever_order_requests_finished_in() -> None:
    counters = Counting()
    guard = BudgetGuard(counters, ManualClock(), spend_source=None, default_output_tokens=1)
    bucket = BudgetBucket("bg:k", 10**9, 0, 0.0, True, 0, None)
    ask = BudgetAsk([bucket], [5], list(rules_of([state("k")])), {}, {"p": 5})
    # Request 7's outcome was written after request 9's, but it finished first.
    guard.settled(9, ask, "h9", [3])
    guard.settled(7, ask, "h7", [3])
    guard.ledgered_through(8)
    await asyncio.sleep(0)  # the acknowledgement is handed to the counters in a task
    assert counters.acknowledged == [("bg:k", "h7")]


async def test_a_segments_many_settlements_reach_the_counters_a_chunk_at_a_time() -> None:
    counters = Counting()
    guard = BudgetGuard(counters, ManualClock(), spend_source=None, default_output_tokens=1)
    bucket = BudgetBucket("bg:k", 10**9, 0, 0.0, True, 0, None)
    ask = BudgetAsk([bucket], [5], list(rules_of([state("k")])), {}, {"p": 5})
    n = 2 * LEDGERED_CHUNK + 1
    for seq in range(1, n + 1):
        guard.settled(seq, ask, f"h{seq}", [3])
    guard.ledgered_through(n)
    await asyncio.sleep(0)
    # The event loop had a turn after the first chunk: the rest is still to come.
    assert counters.calls == [LEDGERED_CHUNK]
    for _ in range(5):
        await asyncio.sleep(0)
    assert counters.calls == [LEDGERED_CHUNK, LEDGERED_CHUNK, 1]
    assert counters.acknowledged == [("bg:k", f"h{seq}") for seq in range(1, n + 1)]


async def test_an_outcome_written_late_is_acknowledged_once_the_ledger_has_its_seq() -> None:
    counters = Counting()
    guard = BudgetGuard(counters, ManualClock(), spend_source=None, default_output_tokens=1)
    bucket = BudgetBucket("bg:k", 10**9, 0, 0.0, True, 0, None)
    ask = BudgetAsk([bucket], [5], list(rules_of([state("k")])), {}, {"p": 5})
    held = SpendRecord(
        id="r", kind=RecordKind.CONFIRM, replica_id="a", seq=0, request_id="q", at="", route=""
    )
    guard.settled_unwritten(held, ask, "held", [3])  # the spool's disk was full
    guard.ledgered_through(5)
    await asyncio.sleep(0)
    assert counters.acknowledged == [], "not written yet: the ledger cannot have it"

    held.seq = 6  # the spool wrote it once the disk had room
    guard.ledgered_through(5)
    await asyncio.sleep(0)
    assert counters.acknowledged == []
    guard.ledgered_through(6)
    await asyncio.sleep(0)
    assert counters.acknowledged == [("bg:k", "held")], "counted once: by the ledger alone"


async def test_a_budgets_newest_figure_counts_for_every_key_under_it() -> None:
    guard = BudgetGuard(LocalCounters(), ManualClock(), spend_source=None, default_output_tokens=1)
    chain = (Upstream("p", "p", "mock", "m", b'"m"', adapter=None),)  # type: ignore[arg-type]
    read = "2026-03-10T12:00:00Z"

    def rules(spent: str, as_of: str | None) -> tuple[BudgetRule, ...]:
        fields = {"spent_usd": spent, "spent_as_of": as_of}
        return rules_of([msgspec.structs.replace(state("org"), **fields)])

    async def figure(of: Sequence[BudgetRule]) -> tuple[int, float]:
        ask = await guard.ask(of, chain, None, Worst(10, 10))
        assert ask is not None
        return ask.buckets[0].ledger_nanos, ask.buckets[0].ledger_as_of

    # Key b's bundle was fetched before the budget's spend moved; key a's after.
    key_a = rules("0.5", "2026-03-10T12:00:05Z")
    key_b = rules("0.2", read)
    guard.learn(key_b)
    assert await figure(key_b) == (200_000_000, unix_seconds(read))
    guard.learn(key_a)
    assert await figure(key_b) == (500_000_000, unix_seconds("2026-03-10T12:00:05Z"))
    guard.learn(rules("0.1", "2026-03-10T11:59:00Z"))  # an older reading changes nothing
    assert (await figure(key_b))[0] == 500_000_000


# -- audio and images ---------------------------------------------------------------------------


def test_unit_prices_reserve_images_at_the_dearest_price_their_options_could_have() -> None:
    from proxy.limits.cost import Units, image_option, rates_of
    from vkgate.wire import UnitPrice

    rates = rates_of(
        None, UnitPrice(per_image={"1024x1024": "0.04", "1024x1024/hd": "0.08", "*/hd": "0.12"})
    )
    assert rates is not None and (rates.input, rates.output) == (0, 0)
    two_hd = Units(images=2, image_options=(image_option("1024x1024", "hd"),))
    assert rates.worst(0, 0, two_hd) == 160_000_000
    # Quality left to the provider: the dearest quality of that size.
    assert rates.worst(0, 0, Units(images=1, image_options=(image_option("1024x1024", None),)))
    assert rates.worst(0, 0, Units(images=1, image_options=(image_option("auto", "auto"),))) == (
        120_000_000
    )


def test_unit_prices_settle_characters_and_seconds_rounded_up() -> None:
    from proxy.limits.cost import Units, rates_of
    from vkgate.spend import SpendRecord
    from vkgate.wire import UnitPrice

    rates = rates_of(None, UnitPrice(per_character="0.000015", per_second="0.0001"))
    assert rates is not None
    assert rates.worst(0, 0, Units(characters=1000, audio_seconds=2.5)) == 15_000_000 + 250_000
    spoken = SpendRecord(
        id="x",
        kind="confirm",
        replica_id="r",
        seq=1,
        request_id="q",
        at="",
        route="/v1/x",
        input_characters=7,
        audio_seconds=0.0015,
    )
    assert rates.spent(spoken) == 105_000 + 200
