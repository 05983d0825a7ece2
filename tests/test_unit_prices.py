"""Pricing audio and image records: genai-prices' per-character, per-second and modality rates
to its own last digit, per-image overrides by size and quality, and `unpriced` wherever no price
covers what a record used (never a silent $0)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from genai_prices import Usage, calc_price
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.spend.pricing import Pricer, PriceSource, ProviderPricing, to_nanos
from vkgate.spend import SpendRecord

AT = datetime(2026, 3, 10, 12, tzinfo=UTC)
DALLE = {"1024x1024": "0.04", "1024x1024/hd": "0.08", "*/hd": "0.12", "1792x1024": "0.08"}


def record(model: str, **fields: Any) -> SpendRecord:
    return SpendRecord(
        id="r1",
        kind="confirm",
        replica_id="a",
        seq=1,
        request_id="q",
        at="",
        route="/v1/audio/speech",
        provider_kind="openai",
        upstream_model=model,
        **fields,
    )


def genai(model: str, **usage: Any) -> int:
    return to_nanos(calc_price(Usage(**usage), model_ref=model, provider_id="openai").total_price)


COUNT = st.integers(min_value=0, max_value=10**7)


@settings(max_examples=60, deadline=None)
@given(characters=COUNT, millis=COUNT, audio=COUNT, text=COUNT, output=COUNT)
def test_audio_records_cost_what_genai_prices_says_to_the_nano_dollar(
    characters: int, millis: int, audio: int, text: int, output: int
) -> None:
    pricer = Pricer()
    seconds = Decimal(millis) / 1000
    speech = pricer.price(record("tts-1", input_characters=characters), AT, None)
    assert speech.cost_nano_usd == genai("tts-1", input_characters=characters)
    whisper = pricer.price(record("whisper-1", audio_seconds=float(seconds)), AT, None)
    assert whisper.cost_nano_usd == genai(
        "whisper-1", audio_seconds=seconds, input_audio_seconds=seconds
    )
    tokens = record(
        "gpt-4o-transcribe",
        input_tokens=audio + text,
        input_audio_tokens=audio,
        output_tokens=output,
    )
    assert pricer.price(tokens, AT, None).cost_nano_usd == genai(
        "gpt-4o-transcribe",
        input_tokens=audio + text,
        input_audio_tokens=audio,
        output_tokens=output,
    )


@pytest.mark.parametrize(
    ("model", "fields"),
    [
        ("gpt-4o-transcribe", {"audio_seconds": 12.5}),  # priced by tokens, told seconds
        ("gpt-4o-mini-tts", {"input_characters": 300}),  # priced by tokens, told characters
        ("whisper-1", {"input_tokens": 40}),  # priced by the second, told tokens
        ("dall-e-3", {"images": 1, "image_size": "1024x1024"}),  # unknown to genai-prices
    ],
)
def test_a_record_no_price_covers_is_unpriced_never_a_silent_zero(
    model: str, fields: dict[str, Any]
) -> None:
    price = Pricer().price(record(model, **fields), AT, None)
    assert (price.cost_nano_usd, price.source) == (0, PriceSource.UNPRICED)


@pytest.mark.parametrize(
    ("size", "quality", "usd"),
    [
        ("1024x1024", "hd", "0.08"),  # size and quality
        ("1024x1024", "standard", "0.04"),  # the size's own price
        ("1792x1024", "hd", "0.08"),  # the size's own price before any size's of that quality
        ("512x512", "hd", "0.12"),  # any size of that quality
        ("1792x1024", None, "0.08"),
    ],
)
def test_a_per_image_override_takes_the_most_specific_price(
    size: str, quality: str | None, usd: str
) -> None:
    provider = ProviderPricing("openai", {"dall-e-3": {"per_image": DALLE}}, "v1")
    images = record("dall-e-3", images=3, image_size=size, image_quality=quality)
    price = Pricer().price(images, AT, provider)
    assert price.source == PriceSource.OVERRIDE
    assert price.cost_nano_usd == 3 * to_nanos(Decimal(usd))


def test_an_image_no_per_image_price_matches_is_unpriced() -> None:
    provider = ProviderPricing("openai", {"dall-e-3": {"per_image": {"1024x1024": "0.04"}}}, "v1")
    images = record("dall-e-3", images=1, image_size="512x512")
    assert Pricer().price(images, AT, provider).source == PriceSource.UNPRICED


def test_an_override_that_does_not_cover_the_record_leaves_it_to_genai_prices() -> None:
    provider = ProviderPricing("openai", {"whisper-1": {"per_character": "1"}}, "v1")
    price = Pricer().price(record("whisper-1", audio_seconds=60.0), AT, provider)
    assert (price.source, price.cost_nano_usd) == (PriceSource.GENAI_PRICES, 6_000_000)


def test_per_second_and_per_character_overrides_price_to_the_millisecond() -> None:
    provider = ProviderPricing(
        "openai_compatible",
        {"my-whisper": {"per_second": "0.0001"}, "my-tts": {"per_character": "0.000015"}},
        "v1",
    )
    pricer = Pricer()
    seconds = pricer.price(record("my-whisper", audio_seconds=2.501), AT, provider)
    characters = pricer.price(record("my-tts", input_characters=7), AT, provider)
    assert seconds.cost_nano_usd == 250_100
    assert characters.cost_nano_usd == 105_000


def test_list_prices_say_what_a_second_or_a_character_costs_for_budgets() -> None:
    pricer = Pricer()
    whisper = pricer.list_price("openai", "whisper-1", AT)
    tts = pricer.list_price("openai", "tts-1", AT)
    assert whisper is not None and whisper.per_second == Decimal("0.0001")
    assert whisper.input_per_mtok is None
    assert tts is not None and tts.per_character == Decimal("0.000015")
    transcribe = pricer.list_price("openai", "gpt-4o-transcribe", AT)
    assert transcribe is not None and transcribe.input_audio_per_mtok == Decimal(6)
    assert pricer.list_price("openai", "dall-e-3", AT) is None
