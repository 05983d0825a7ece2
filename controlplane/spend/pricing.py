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
- `mock`: the built-in offline `mock` provider, which costs nothing;
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
    # A tuple, not a frozen dataclass: one is made per record priced, and a tuple is made in C.
    input: int
    output: int
    cache_read: int
    cache_write: int

    @classmethod
    def of(cls, record: SpendRecord) -> Tokens:
        return cls(
            record.input_tokens,
            record.output_tokens,
            record.cache_read_tokens,
            record.cache_write_tokens,
        )

    @property
    def uncached_input(self) -> int:
        return self.input - self.cache_read - self.cache_write

    def usage(self) -> Usage:
        return Usage(
            input_tokens=self.input,
            output_tokens=self.output,
            cache_read_tokens=self.cache_read,
            cache_write_tokens=self.cache_write,
        )


@dataclass(frozen=True, slots=True)
class Rates:
    """USD per token for each kind of token: a price linear in the counts."""

    uncached_input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write: Decimal
    _scaled: tuple[int, int, int, int, int] | None = field(
        init=False, compare=False, repr=False, default=None
    )
    """The four rates as integers over one power of ten, and that power: (i, o, r, w, places)
    with each rate = its integer / 10**places. None when a rate is not a finite number, or has
    more digits than `EXACT` keeps (then `usd` is used)."""

    def __post_init__(self) -> None:
        rates = (self.uncached_input, self.output, self.cache_read, self.cache_write)
        if not all(rate.is_finite() and len(rate.as_tuple().digits) < EXACT.prec for rate in rates):
            return
        places = max(0, *(-int(rate.as_tuple().exponent) for rate in rates))
        i, o, r, w = (int(rate.scaleb(places, EXACT)) for rate in rates)
        object.__setattr__(self, "_scaled", (i, o, r, w, places))

    def nanos(self, tokens: Tokens) -> int:
        """`to_nanos(self.usd(tokens))`, in integers: the same exact sum and the same one
        rounding, at a fraction of `Decimal`'s cost (a segment prices thousands of records)."""
        scaled = self._scaled
        if scaled is None:
            return to_nanos(self.usd(tokens))
        i, o, r, w, places = scaled
        total = (
            i * (tokens.input - tokens.cache_read - tokens.cache_write)
            + o * tokens.output
            + r * tokens.cache_read
            + w * tokens.cache_write
        )
        return _round_scaled(total, places - 9)

    def usd(self, tokens: Tokens) -> Decimal:
        parts = (
            EXACT.multiply(self.uncached_input, tokens.uncached_input),
            EXACT.multiply(self.output, tokens.output),
            EXACT.multiply(self.cache_read, tokens.cache_read),
            EXACT.multiply(self.cache_write, tokens.cache_write),
        )
        return sum(parts, Decimal(0))

    @classmethod
    def of_override(cls, override: Mapping[str, str]) -> Rates:
        per_token = {k: EXACT.divide(Decimal(v), PER_MTOK) for k, v in override.items() if v}
        uncached = per_token["input_per_mtok"]
        return cls(
            uncached_input=uncached,
            output=per_token["output_per_mtok"],
            cache_read=per_token.get("cache_read_per_mtok", uncached),
            cache_write=per_token.get("cache_write_per_mtok", uncached),
        )


@dataclass(frozen=True, slots=True)
class ListPrice:
    """genai-prices' rates for a model, in USD per million tokens, and its answer cap.

    A cache rate genai-prices does not list is None: those tokens cost the input rate, as in
    `Rates.of_override`.
    """

    input_per_mtok: Decimal
    output_per_mtok: Decimal
    cache_read_per_mtok: Decimal | None
    cache_write_per_mtok: Decimal | None
    max_output_tokens: int | None
    """genai-prices' context window: no answer can be longer, so a budget may reserve it."""


_PROBE = Tokens(input=1_234_567, output=76_543, cache_read=234_567, cache_write=12_345)


class Pricer:
    """Prices records; remembers what it looked up, since a segment repeats few models.

    genai-prices' own `calc_price` costs ~150 µs a call. Most of its price sheets are linear
    in the token counts, so for each sheet the per-token rates are derived once from it and
    checked against it on a probe; a sheet that is not linear (tiered prices) is asked per
    record. Either way the result is genai-prices' price to the last digit.
    """

    def __init__(self) -> None:
        self._models: dict[tuple[str | None, str], Any] = {}
        self._sheets: dict[int, tuple[Any, Rates | None]] = {}
        self._list_prices: dict[tuple[str | None, str], tuple[Any, ListPrice | None]] = {}

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
        kind = provider.kind if provider is not None else record.provider_kind
        if not (tokens.input or tokens.output):
            return Price(0, PriceSource.NONE, "")
        if kind == "mock":
            return Price(0, PriceSource.MOCK, "")
        if provider is not None:
            for model in _candidates(record.upstream_model, record.served_model):
                rates = provider.override_rates(model)
                if rates is not None:
                    return Price(rates.nanos(tokens), PriceSource.OVERRIDE, provider.version)
        genai_provider = GENAI_PROVIDER_IDS.get(kind or "")
        for model in _candidates(record.served_model, record.upstream_model):
            priced = self._genai_nanos(genai_provider, model, at, tokens)
            if priced is not None:
                return Price(priced, PriceSource.GENAI_PRICES, GENAI_PRICES_VERSION)
        return Price(0, PriceSource.UNPRICED, GENAI_PRICES_VERSION)

    def _genai_nanos(
        self, provider_id: str | None, model: str, at: datetime, tokens: Tokens
    ) -> int | None:
        info = self._model(provider_id, model, at)
        if info is None:
            return None
        sheet = info.get_prices(at)
        cached = self._sheets.get(id(sheet))
        if cached is None or cached[0] is not sheet:
            cached = (sheet, _linear_rates(sheet))
            self._sheets[id(sheet)] = cached
        rates = cached[1]
        if rates is not None:
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


def _list_price(sheet: Any, context_window: int | None) -> ListPrice | None:
    input_rate = _per_mtok(sheet, "input_mtok")
    output_rate = _per_mtok(sheet, "output_mtok")
    if input_rate is None and output_rate is None:
        # Priced per request, image or second only: per-token rates would claim it is free.
        return None
    return ListPrice(
        # An embedding model lists no output rate: it never answers with tokens.
        input_per_mtok=input_rate if input_rate is not None else Decimal(0),
        output_per_mtok=output_rate if output_rate is not None else Decimal(0),
        cache_read_per_mtok=_per_mtok(sheet, "cache_read_mtok"),
        cache_write_per_mtok=_per_mtok(sheet, "cache_write_mtok"),
        max_output_tokens=context_window if context_window and context_window > 0 else None,
    )


def _sheet_usd(sheet: Any, tokens: Tokens) -> Decimal:
    total: Decimal = sheet.calc_price(tokens.usage())["total_price"]
    return total


def _linear_rates(sheet: Any) -> Rates | None:
    """Per-token rates of a price sheet, if its price is linear in the counts."""
    try:
        uncached = _sheet_usd(sheet, Tokens(1, 0, 0, 0))
        rates = Rates(
            uncached_input=uncached,
            output=_sheet_usd(sheet, Tokens(0, 1, 0, 0)),
            cache_read=_sheet_usd(sheet, Tokens(1, 0, 1, 0)),
            cache_write=_sheet_usd(sheet, Tokens(1, 0, 0, 1)),
        )
        linear = rates.usd(_PROBE) == _sheet_usd(sheet, _PROBE)
    except (ValueError, ArithmeticError):
        return None
    return rates if linear else None
