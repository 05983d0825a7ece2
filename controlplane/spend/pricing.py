"""Pricing spend records in integer nano-USD: provider overrides first, then genai-prices.

Rounding rule: a record's exact price in USD (a `Decimal`: each token count times its rate,
summed, nothing rounded on the way) is multiplied by 10^9 and rounded once, to the nearest
nano-dollar, halves away from zero (ROUND_HALF_UP; prices are never negative). So every ledger
row is within half a nano-dollar of its exact price, and every sum of rows is exact.

Where a price comes from is kept on the row (`price_source`):
- `override`: the provider's `price_overrides` for the upstream model (USD per million tokens;
  a missing cache-read or cache-write rate is the input rate);
- `genai-prices`: the bundled genai-prices data as of the record's time (`price_version` is the
  package version);
- `mock`: the built-in offline `mock` provider, which costs nothing unless its own
  `price_overrides` name the model (`vkgate up --demo` gives it list-like prices);
- `unpriced`: tokens were spent on a model neither knows: written at cost 0, never refused;
- `none`: nothing to price (no tokens: a refusal, or a failure before any answer).

Token counts follow the records' convention: input includes cache reads and writes, so the
uncached input is input - cache read - cache write; reasoning tokens are part of output.

The same lookup also answers what a model costs per million tokens and how long its answers can
be (`Pricer.list_price`), which the config bundle hands to proxies for budget reservations.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_UP, Context, Decimal
from enum import StrEnum
from typing import Any, NamedTuple

import genai_prices
from genai_prices import Usage

from controlplane.ledger.rows import Price
from vkgate.logs import event
from vkgate.spend import SpendRecord

log = logging.getLogger("vkgate.controlplane.spend")

GENAI_PRICES_VERSION: str = genai_prices.__version__
NANOS = Decimal(1_000_000_000)
PER_MTOK = Decimal(1_000_000)
# Wide enough that no product or sum of a record's price is ever rounded before the last step.
EXACT = Context(prec=80)

GENAI_PROVIDER_IDS: dict[str, str] = {
    "openai": "openai",
    "azure_openai": "azure",
    "anthropic": "anthropic",
    "bedrock": "aws",
    "gemini": "google",
    # Vertex AI bills Gemini at Google's list prices.
    "vertex_ai": "google",
    # openai_compatible (vLLM, Ollama, …) is matched by its model name alone.
}


class PriceSource(StrEnum):
    OVERRIDE = "override"
    GENAI_PRICES = "genai-prices"
    MOCK = "mock"
    UNPRICED = "unpriced"
    NONE = "none"


def to_nanos(usd: Decimal) -> int:
    """The one rounding step: nearest nano-dollar, halves away from zero."""
    return int(EXACT.multiply(usd, NANOS).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def _round_scaled(total: int, places: int) -> int:
    """`total` / 10**places to the nearest integer, halves away from zero: `to_nanos`'s
    rounding, for an amount in units of 10**-(places + 9) USD."""
    if places <= 0:
        return total * int(10**-places)
    if total < 0:
        return -_round_scaled(-total, places)
    unit = int(10**places)
    whole, rest = divmod(total, unit)
    return whole + (2 * rest >= unit)


@dataclass(frozen=True, slots=True)
class ProviderPricing:
    """What pricing needs of a provider row."""

    kind: str
    overrides: Mapping[str, Mapping[str, str]]
    """`price_overrides` as stored: upstream model → {input_per_mtok, output_per_mtok, …}."""
    version: str
    """When the provider row last changed (RFC 3339): which overrides were in force."""
    _rates: dict[str, Rates] = field(default_factory=dict, compare=False, repr=False)
    """Each override's rates, worked out once: a segment prices thousands of records of a
    handful of models."""

    def override_rates(self, model: str) -> Rates | None:
        rates = self._rates.get(model)
        if rates is None:
            override = self.overrides.get(model)
            if not override:
                return None
            rates = self._rates[model] = Rates.of_override(override)
        return rates


class Tokens(NamedTuple):
    """What a record used, in every unit it can be priced in.

    A tuple, not a frozen dataclass: one is made per record priced, and a tuple is made in C.
    Token counts by modality are parts of `input` and `output`, as cache reads are.
    """

    input: int
    output: int
    cache_read: int
    cache_write: int
    input_audio: int = 0
    output_audio: int = 0
    input_image: int = 0
    output_image: int = 0
    characters: int = 0
    audio_ms: int = 0
    """Audio seconds, in milliseconds: records carry them to the millisecond."""

    @classmethod
    def of(cls, record: SpendRecord) -> Tokens:
        if not (
            record.input_audio_tokens
            or record.output_audio_tokens
            or record.input_image_tokens
            or record.output_image_tokens
            or record.input_characters
            or record.audio_seconds
        ):
            return cls(
                record.input_tokens,
                record.output_tokens,
                record.cache_read_tokens,
                record.cache_write_tokens,
            )
        return cls(
            record.input_tokens,
            record.output_tokens,
            record.cache_read_tokens,
            record.cache_write_tokens,
            record.input_audio_tokens,
            record.output_audio_tokens,
            record.input_image_tokens,
            record.output_image_tokens,
            record.input_characters,
            round(record.audio_seconds * 1000),
        )

    @property
    def uncached_input(self) -> int:
        """The text input that is no cache read or write: what the plain input rate prices."""
        return max(
            self.input - self.cache_read - self.cache_write - self.input_audio - self.input_image,
            0,
        )

    @property
    def text_output(self) -> int:
        return max(self.output - self.output_audio - self.output_image, 0)

    def leaves(self) -> tuple[int, ...]:
        """Each count once, in `Rates.per_unit`'s order (a part of another counted apart)."""
        return (
            self.uncached_input,
            self.text_output,
            self.cache_read,
            self.cache_write,
            self.input_audio,
            self.output_audio,
            self.input_image,
            self.output_image,
            self.characters,
            self.audio_ms,
        )

    def usage(self) -> Usage:
        values: dict[str, Any] = {
            "input_tokens": self.input,
            "output_tokens": self.output,
            "cache_read_tokens": self.cache_read,
            "cache_write_tokens": self.cache_write,
        }
        # Only what the record has: a sheet that prices a unit the record lacks must not be
        # told a part of its tokens is of that unit.
        for name, value in (
            ("input_audio_tokens", self.input_audio),
            ("output_audio_tokens", self.output_audio),
            ("input_image_tokens", self.input_image),
            ("output_image_tokens", self.output_image),
            ("input_characters", self.characters),
        ):
            if value:
                values[name] = value
        if self.audio_ms:
            # Transcribed audio is input audio: a sheet may price either.
            seconds = Decimal(self.audio_ms) / 1000
            values["audio_seconds"] = values["input_audio_seconds"] = seconds
        return Usage(**values)


_UNITS = len(Tokens._fields)
_ZERO = Decimal(0)


@dataclass(frozen=True, slots=True)
class Rates:
    """USD per unit for each kind of unit (tokens, characters, milliseconds of audio): a price
    linear in the counts, and which units the price covers at all.

    A unit it does not cover costs nothing in it; a record none of whose units it covers is
    not priced by it (`covers`), so a model priced by the second is never a silent $0 for a
    record that says only tokens, nor the other way round."""

    uncached_input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write: Decimal
    input_audio: Decimal = _ZERO
    output_audio: Decimal = _ZERO
    input_image: Decimal = _ZERO
    output_image: Decimal = _ZERO
    per_character: Decimal = _ZERO
    per_ms: Decimal = _ZERO
    """Per millisecond of audio."""
    priced: tuple[bool, ...] = (True, True, True, True, True, True, True, True, False, False)
    """For each unit of `Tokens.leaves`, whether the price covers it."""
    per_image: Mapping[str, Decimal] = field(default_factory=dict, compare=False)
    """USD per image by `size/quality`, `size`, `*/quality` or `*` (overrides only)."""
    _scaled: tuple[tuple[int, ...], int] | None = field(
        init=False, compare=False, repr=False, default=None
    )
    """The rates as integers over one power of ten, and that power: each rate = its integer /
    10**places. None when a rate is not a finite number, or has more digits than `EXACT`
    keeps (then `usd` is used)."""

    def __post_init__(self) -> None:
        rates = self.per_unit
        if not all(rate.is_finite() and len(rate.as_tuple().digits) < EXACT.prec for rate in rates):
            return
        places = max(0, *(-int(rate.as_tuple().exponent) for rate in rates))
        scaled = tuple(int(rate.scaleb(places, EXACT)) for rate in rates)
        object.__setattr__(self, "_scaled", (scaled, places))

    @property
    def per_unit(self) -> tuple[Decimal, ...]:
        return (
            self.uncached_input,
            self.output,
            self.cache_read,
            self.cache_write,
            self.input_audio,
            self.output_audio,
            self.input_image,
            self.output_image,
            self.per_character,
            self.per_ms,
        )

    def covers(self, tokens: Tokens, images: int = 0, option: str = "") -> bool:
        """Whether the price says what any of the record's units cost."""
        if images and image_price(self.per_image, option) is not None:
            return True
        return any(
            count and priced for count, priced in zip(tokens.leaves(), self.priced, strict=True)
        )

    def nanos(self, tokens: Tokens, images: int = 0, option: str = "") -> int:
        """`to_nanos(self.usd(tokens))`, in integers: the same exact sum and the same one
        rounding, at a fraction of `Decimal`'s cost (a segment prices thousands of records)."""
        scaled = self._scaled
        if scaled is None or images:
            return to_nanos(self.usd(tokens, images, option))
        rates, places = scaled
        input, output, cache_read, cache_write, *others = tokens
        if not any(others):
            # Text tokens only (nearly every record): four products, as before other units.
            i, o, r, w = rates[:4]
            total = (
                i * (input - cache_read - cache_write)
                + o * output
                + r * cache_read
                + w * cache_write
            )
        else:
            total = sum(rate * count for rate, count in zip(rates, tokens.leaves(), strict=True))
        return _round_scaled(total, places - 9)

    def usd(self, tokens: Tokens, images: int = 0, option: str = "") -> Decimal:
        parts = [
            EXACT.multiply(rate, count)
            for rate, count in zip(self.per_unit, tokens.leaves(), strict=True)
        ]
        if images:
            parts.append(EXACT.multiply(image_price(self.per_image, option) or _ZERO, images))
        return sum(parts, _ZERO)

    @classmethod
    def of_override(cls, override: Mapping[str, Any]) -> Rates:
        def rate(name: str, per: Decimal = PER_MTOK) -> Decimal | None:
            value = override.get(name)
            return None if value is None else EXACT.divide(Decimal(value), per)

        def either(name: str, default: Decimal | None) -> Decimal | None:
            own = rate(name)
            return default if own is None else own

        text_in, text_out = rate("input_per_mtok"), rate("output_per_mtok")
        rates = (
            text_in,
            text_out,
            either("cache_read_per_mtok", text_in),
            either("cache_write_per_mtok", text_in),
            either("input_audio_per_mtok", text_in),
            either("output_audio_per_mtok", text_out),
            either("input_image_per_mtok", text_in),
            either("output_image_per_mtok", text_out),
            rate("per_character", Decimal(1)),
            rate("per_second", Decimal(1000)),
        )
        u = [_ZERO if r is None else r for r in rates]
        return cls(
            u[0],
            u[1],
            u[2],
            u[3],
            u[4],
            u[5],
            u[6],
            u[7],
            u[8],
            u[9],
            priced=tuple(r is not None for r in rates),
            per_image={key: Decimal(usd) for key, usd in (override.get("per_image") or {}).items()},
        )


def image_option(size: str | None, quality: str | None) -> str:
    return f"{size or '*'}/{quality or '*'}"


def image_price(table: Mapping[str, Decimal], option: str) -> Decimal | None:
    """The price of one image of `option` (`size/quality`): the most specific key of `table`
    that matches it, or None."""
    if not table:
        return None
    size, _, quality = option.partition("/")
    for key in (f"{size}/{quality}", size, f"*/{quality}", "*"):
        if key in table:
            return table[key]
    return None


@dataclass(frozen=True, slots=True)
class ListPrice:
    """genai-prices' rates for a model, in USD per million tokens (and per character and
    second where it prices those), and its answer cap.

    A cache, audio or image rate genai-prices does not list is None: those tokens cost the
    text rate of their direction, as in `Rates.of_override`. A model priced only per
    character or second has no token rates (`input_per_mtok` None).
    """

    input_per_mtok: Decimal | None
    output_per_mtok: Decimal | None
    cache_read_per_mtok: Decimal | None
    cache_write_per_mtok: Decimal | None
    max_output_tokens: int | None
    """genai-prices' context window: no answer can be longer, so a budget may reserve it."""
    input_audio_per_mtok: Decimal | None = None
    output_audio_per_mtok: Decimal | None = None
    input_image_per_mtok: Decimal | None = None
    output_image_per_mtok: Decimal | None = None
    per_character: Decimal | None = None
    per_second: Decimal | None = None


_PROBES = (
    # Tokens with cache reads and writes (every chat record) …
    Tokens(input=1_234_567, output=76_543, cache_read=234_567, cache_write=12_345),
    # … and every other unit; a sheet may price audio and cache reads of audio apart, and a
    # record with both is priced by the sheet itself.
    Tokens(1_234_567, 76_543, 0, 0, 45_678, 5_432, 23_456, 3_210, 9_876, 123_456),
)
_UNIT_PROBES = (
    Tokens(1, 0, 0, 0),
    Tokens(0, 1, 0, 0),
    Tokens(1, 0, 1, 0),
    Tokens(1, 0, 0, 1),
    Tokens(1, 0, 0, 0, input_audio=1),
    Tokens(0, 1, 0, 0, output_audio=1),
    Tokens(1, 0, 0, 0, input_image=1),
    Tokens(0, 1, 0, 0, output_image=1),
    Tokens(0, 0, 0, 0, characters=1),
    Tokens(0, 0, 0, 0, audio_ms=1),
)
_SHEET_KEYS: tuple[tuple[str, ...], ...] = (
    # The price keys of a sheet that cover each unit of `Tokens.leaves` (a part of a count is
    # priced at the whole's rate when the sheet has none of its own).
    ("input_mtok",),
    ("output_mtok",),
    ("cache_read_mtok", "input_mtok"),
    ("cache_write_mtok", "input_mtok"),
    ("input_audio_mtok", "input_mtok"),
    ("output_audio_mtok", "output_mtok"),
    ("input_image_mtok", "input_mtok"),
    ("output_image_mtok", "output_mtok"),
    ("input_mchars",),
    ("audio_hours", "input_audio_hours"),
)


class Pricer:
    """Prices records; remembers what it looked up, since a segment repeats few models.

    genai-prices' own `calc_price` costs ~150 µs a call. Most of its price sheets are linear
    in the counts, so for each sheet the per-unit rates are derived once from it and checked
    against it on probes; a sheet that is not linear (tiered prices) is asked per record.
    Either way the result is genai-prices' price to the last digit.
    """

    def __init__(self) -> None:
        self._models: dict[tuple[str | None, str], Any] = {}
        self._sheets: dict[int, tuple[Any, Rates | None, tuple[bool, ...]]] = {}
        self._list_prices: dict[tuple[str | None, str], tuple[Any, ListPrice | None]] = {}

    @staticmethod
    def load() -> None:
        """Load genai-prices' price data, which it reads on first use: blocking work, for a
        thread at start-up rather than the event loop at the first bundle or segment."""
        genai_prices.calc_price(
            Usage(input_tokens=0, output_tokens=0), model_ref="gpt-4o-mini", provider_id="openai"
        )

    def list_price(self, kind: str, model: str, at: datetime) -> ListPrice | None:
        """genai-prices' price of `model` through a provider of `kind` as of `at`, or None for
        a model it does not know and for the `mock` kind (which costs nothing).

        The provider's own `price_overrides` come first wherever a price is used; this is the
        price when there is none. Memoised per model and price sheet, so a config bundle built
        per request repeats no lookup; the answer changes only with the sheet in force.
        """
        if kind == "mock":
            return None
        provider_id = GENAI_PROVIDER_IDS.get(kind)
        info = self._model(provider_id, model, at)
        if info is None:
            return None
        sheet = info.get_prices(at)
        cached = self._list_prices.get((provider_id, model))
        if cached is None or cached[0] is not sheet:
            cached = (sheet, _list_price(sheet, info.context_window))
            self._list_prices[provider_id, model] = cached
        return cached[1]

    def price(self, record: SpendRecord, at: datetime, provider: ProviderPricing | None) -> Price:
        tokens = Tokens.of(record)
        images = record.images
        kind = provider.kind if provider is not None else record.provider_kind
        if not (tokens.input or tokens.output or tokens.characters or tokens.audio_ms or images):
            return Price(0, PriceSource.NONE, "")
        option = image_option(record.image_size, record.image_quality) if images else ""
        if provider is not None:
            for model in _candidates(record.upstream_model, record.served_model):
                rates = provider.override_rates(model)
                if rates is not None and rates.covers(tokens, images, option):
                    nanos = rates.nanos(tokens, images, option)
                    return Price(nanos, PriceSource.OVERRIDE, provider.version)
        if kind == "mock":  # free unless its overrides give it a price (the demo's do)
            return Price(0, PriceSource.MOCK, "")
        genai_provider = GENAI_PROVIDER_IDS.get(kind or "")
        for model in _candidates(record.served_model, record.upstream_model):
            priced = self._genai_nanos(genai_provider, model, at, tokens)
            if priced is not None:
                return Price(priced, PriceSource.GENAI_PRICES, GENAI_PRICES_VERSION)
        # Spent on something no price covers: written at 0 and said so, never refused.
        return Price(0, PriceSource.UNPRICED, GENAI_PRICES_VERSION)

    def _genai_nanos(
        self, provider_id: str | None, model: str, at: datetime, tokens: Tokens
    ) -> int | None:
        """genai-prices' price of the record, or None when it does not know the model or does
        not price any of the record's units (a per-second model asked about tokens)."""
        info = self._model(provider_id, model, at)
        if info is None:
            return None
        sheet = info.get_prices(at)
        cached = self._sheets.get(id(sheet))
        if cached is None or cached[0] is not sheet:
            cached = (sheet, _linear_rates(sheet), _covered(sheet))
            self._sheets[id(sheet)] = cached
        _, rates, covered = cached
        others = any(tokens[4:])
        if others or not (covered[0] and covered[1]):
            # Units beyond text tokens, or a sheet that does not price text tokens: priced
            # only if the sheet covers one of the units used.
            leaves = tokens.leaves()
            if not any(count and priced for count, priced in zip(leaves, covered, strict=True)):
                return None
        elif not (tokens.input or tokens.output):
            return None
        mixed = others and (tokens.cache_read or tokens.cache_write)
        if rates is not None and not mixed:
            return rates.nanos(tokens)
        try:
            usd = _sheet_usd(sheet, tokens)
        except (ValueError, ArithmeticError) as exc:
            event(
                log,
                "price_failed",
                level=logging.WARNING,
                model=model,
                provider=provider_id,
                input_tokens=tokens.input,
                output_tokens=tokens.output,
                cause=type(exc).__name__,
            )
            return None
        return to_nanos(usd)

    def _model(self, provider_id: str | None, model: str, at: datetime) -> Any:
        key = (provider_id, model)
        if key not in self._models:
            try:
                found = genai_prices.calc_price(
                    Usage(input_tokens=0, output_tokens=0),
                    model_ref=model,
                    provider_id=provider_id,
                    genai_request_timestamp=at,
                )
                self._models[key] = found.model
            except LookupError:
                self._models[key] = None
        return self._models[key]


def _candidates(*models: str | None) -> list[str]:
    seen: list[str] = []
    for model in models:
        if model and model not in seen:
            seen.append(model)
    return seen


def _per_mtok(sheet: Any, name: str) -> Decimal | None:
    """One rate of a sheet; a tiered rate is its base, the price below the first tier (what
    any request short of that tier's input size pays)."""
    value = getattr(sheet, name, None)
    value = getattr(value, "base", value)
    return value if isinstance(value, Decimal) else None


def _covered(sheet: Any) -> tuple[bool, ...]:
    """For each unit of `Tokens.leaves`, whether the sheet prices it."""
    return tuple(any(getattr(sheet, key, None) is not None for key in keys) for keys in _SHEET_KEYS)


def _list_price(sheet: Any, context_window: int | None) -> ListPrice | None:
    input_rate = _per_mtok(sheet, "input_mtok")
    output_rate = _per_mtok(sheet, "output_mtok")
    characters = _per_mtok(sheet, "input_mchars")
    hourly = _per_mtok(sheet, "input_audio_hours") or _per_mtok(sheet, "audio_hours")
    if input_rate is None and output_rate is None and characters is None and hourly is None:
        # Priced per request or image only: per-token rates would claim it is free.
        return None
    tokens = input_rate is not None or output_rate is not None
    return ListPrice(
        # An embedding model lists no output rate: it never answers with tokens.
        input_per_mtok=(input_rate or Decimal(0)) if tokens else None,
        output_per_mtok=(output_rate or Decimal(0)) if tokens else None,
        cache_read_per_mtok=_per_mtok(sheet, "cache_read_mtok"),
        cache_write_per_mtok=_per_mtok(sheet, "cache_write_mtok"),
        max_output_tokens=context_window if context_window and context_window > 0 else None,
        input_audio_per_mtok=_per_mtok(sheet, "input_audio_mtok"),
        output_audio_per_mtok=_per_mtok(sheet, "output_audio_mtok"),
        input_image_per_mtok=_per_mtok(sheet, "input_image_mtok"),
        output_image_per_mtok=_per_mtok(sheet, "output_image_mtok"),
        per_character=None if characters is None else EXACT.divide(characters, PER_MTOK),
        per_second=None if hourly is None else EXACT.divide(hourly, Decimal(3600)),
    )


def _sheet_usd(sheet: Any, tokens: Tokens) -> Decimal:
    total: Decimal = sheet.calc_price(tokens.usage())["total_price"]
    return total


def _linear_rates(sheet: Any) -> Rates | None:
    """Per-unit rates of a price sheet, if its price is linear in the counts."""
    try:
        # A part of a count (a cache read, an audio token) is probed with its whole, all of
        # which it is: the price is the part's own rate.
        u = [_sheet_usd(sheet, probe) for probe in _UNIT_PROBES]
        rates = Rates(
            u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], priced=_covered(sheet)
        )
        linear = all(rates.usd(probe) == _sheet_usd(sheet, probe) for probe in _PROBES)
    except (ValueError, ArithmeticError):
        return None
    return rates if linear else None
