"""`Pricer.list_price`: genai-prices' per-million-token rates and answer cap of one model."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import genai_prices
import pytest

from controlplane.spend import pricing
from controlplane.spend.pricing import ListPrice, Pricer

AT = datetime(2026, 3, 10, 12, tzinfo=UTC)


def test_a_known_model_has_its_rates_per_million_tokens_and_its_context_window() -> None:
    price = Pricer().list_price("openai", "gpt-4o-mini", AT)
    assert price is not None
    found = genai_prices.calc_price(
        genai_prices.Usage(input_tokens=1_000_000, output_tokens=1_000_000),
        model_ref="gpt-4o-mini",
        provider_id="openai",
        genai_request_timestamp=AT,
    )
    assert price.input_per_mtok + price.output_per_mtok == found.total_price
    assert price.cache_read_per_mtok is not None
    assert price.cache_read_per_mtok < price.input_per_mtok
    assert price.max_output_tokens == found.model.context_window


def test_an_embedding_model_answers_with_no_tokens_so_its_output_rate_is_zero() -> None:
    price = Pricer().list_price("openai", "text-embedding-3-small", AT)
    assert price is not None
    assert price.input_per_mtok > 0
    assert price.output_per_mtok == Decimal(0)


@pytest.mark.parametrize(
    ("kind", "model"),
    [("mock", "gpt-4o-mini"), ("openai", "acme-unreleased-9"), ("openai_compatible", "my-llm")],
    ids=["mock-costs-nothing", "unknown-model", "unknown-self-hosted-model"],
)
def test_no_price_for_the_mock_provider_or_a_model_genai_prices_does_not_know(
    kind: str, model: str
) -> None:
    assert Pricer().list_price(kind, model, AT) is None


def test_a_self_hosted_provider_is_priced_by_the_model_name_alone() -> None:
    assert Pricer().list_price("openai_compatible", "gpt-4o-mini", AT) == Pricer().list_price(
        "openai", "gpt-4o-mini", AT
    )


def test_each_model_is_looked_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    lookup = genai_prices.calc_price

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["model_ref"])
        return lookup(*args, **kwargs)

    monkeypatch.setattr(pricing.genai_prices, "calc_price", counted)
    pricer = Pricer()
    answers = [pricer.list_price("openai", "gpt-4o-mini", AT) for _ in range(3)]
    answers += [pricer.list_price("openai", "nobody-knows", AT) for _ in range(3)]
    assert calls == ["gpt-4o-mini", "nobody-knows"]
    assert answers[0] is answers[1] is answers[2]
    assert isinstance(answers[0], ListPrice)
    assert answers[3:] == [None, None, None]
