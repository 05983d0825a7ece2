"""What a request may cost (its worst case, reserved) and what it did cost (settled), in nano-USD.

The proxy's figures are for holding budgets; the ledger prices every record again, exactly, and
its figure replaces the proxy's once the record is in. Rates are integers (nano-USD per million
tokens) so a cost is one integer division, rounded up: a reservation never falls short by a
rounding.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

from vkgate.wire import Price, UnitPrice

if TYPE_CHECKING:
    from vkgate.spend import SpendRecord

_NANOS_PER_USD = Decimal(1_000_000_000)
PER_MTOK = 1_000_000
BYTES_PER_TOKEN_AT_MOST = 2
"""No tokenizer in use makes more than a token of every 2 bytes of a JSON body of real text:
measured with cl100k_base, English makes one of about 4.8 bytes, code 2.5, digits 2.2, Chinese
2.4 (emoji and rare scripts can do worse). So half the body's bytes bounds its prompt's tokens:
what a budget reserves."""
BYTES_PER_TOKEN_TYPICAL = 4
"""OpenAI's own rule of thumb: what a rate limit's token bucket takes before the actual count."""
INLINE_DATA_TOKENS = 1_600
"""An inline image or file (a base64 `data:` URL, or a base64 `data` field) counts as this many
tokens: above what one
image costs at OpenAI (at most about 1,100 at high detail) and Anthropic (about 1,600)."""
_INLINE_DATA = re.compile(
    # An OpenAI data URL (images, files), or the base64 `data` of an Anthropic image or
    # document source and of OpenAI's input audio.
    rb'"data:[^"]{64,}"|"data"[ \t\r\n]*:[ \t\r\n]*"[A-Za-z0-9+/=\\]{64,}"'
)


@dataclass(slots=True)
class Prompt:
    """A request body's prompt, sized in microseconds where a tokenizer takes tens (built per
    request: not frozen, see `proxy.limits.store`)."""

    size: int
    """Bytes of the body, inline data left out."""
    inline: int
    """Inline images and files."""

    @classmethod
    def of(cls, body: bytes) -> Prompt:
        if b'"data' not in body:
            return cls(len(body), 0)
        rest, inline = _INLINE_DATA.subn(b'""', body)
        return cls(len(rest), inline)

    @property
    def at_most(self) -> int:
        """More tokens than the prompt makes, in nearly every case."""
        return self.size // BYTES_PER_TOKEN_AT_MOST + 1 + self.inline * INLINE_DATA_TOKENS

    @property
    def typical(self) -> int:
        """About as many tokens as the prompt makes in English."""
        return self.size // BYTES_PER_TOKEN_TYPICAL + 1 + self.inline * INLINE_DATA_TOKENS


@dataclass(slots=True)
class Units:
    """The most an audio or image request may use, in the units it is priced in (built per
    request: not frozen, see `proxy.limits.store`)."""

    characters: int = 0
    audio_seconds: float = 0.0
    images: int = 0
    image_options: tuple[str, ...] = ()
    """The `size/quality` of the images asked for; empty when the request names neither, so
    any of the model's per-image prices may apply."""


@dataclass(frozen=True, slots=True)
class Rates:
    """Nano-USD per million tokens of each kind, and per million of the other units."""

    input: int
    output: int
    cache_read: int
    cache_write: int
    input_audio: int | None = None
    """Per million input audio tokens; None: the input rate."""
    output_audio: int | None = None
    input_image: int | None = None
    output_image: int | None = None
    per_mchar: int | None = None
    """Per million characters of text made into speech; None: not priced so."""
    per_msecond: int | None = None
    """Per million seconds of audio transcribed; None: not priced so."""
    per_image: Mapping[str, int] = field(default_factory=dict)
    """Nano-USD per image by `size/quality`, `size`, `*/quality` or `*`."""

    def cost(self, input: int, output: int, cache_read: int = 0, cache_write: int = 0) -> int:
        """Nano-USD for these counts; `input` includes cache reads and writes (the records'
        convention), so only the rest is charged at the input rate."""
        uncached = input - cache_read - cache_write
        if uncached < 0:
            uncached = 0
        micro = (
            uncached * self.input
            + output * self.output
            + cache_read * self.cache_read
            + cache_write * self.cache_write
        )
        return -(-micro // PER_MTOK)

    def spent(self, record: SpendRecord) -> int:
        """Nano-USD for what an outcome record says was used, units and all (rounded up; the
        ledger's exact price replaces it once the record is in)."""
        if not (
            record.input_audio_tokens
            or record.input_image_tokens
            or record.output_audio_tokens
            or record.output_image_tokens
            or record.input_characters
            or record.audio_seconds
            or record.images
        ):
            # Text tokens only (every chat request): as cheap as it was before units.
            return self.cost(
                record.input_tokens,
                record.output_tokens,
                record.cache_read_tokens,
                record.cache_write_tokens,
            )
        audio_in, image_in = record.input_audio_tokens, record.input_image_tokens
        audio_out, image_out = record.output_audio_tokens, record.output_image_tokens
        text_in = max(
            record.input_tokens
            - record.cache_read_tokens
            - record.cache_write_tokens
            - audio_in
            - image_in,
            0,
        )
        micro = (
            text_in * self.input
            + max(record.output_tokens - audio_out - image_out, 0) * self.output
            + record.cache_read_tokens * self.cache_read
            + record.cache_write_tokens * self.cache_write
            + audio_in * _or(self.input_audio, self.input)
            + image_in * _or(self.input_image, self.input)
            + audio_out * _or(self.output_audio, self.output)
            + image_out * _or(self.output_image, self.output)
        )
        cost = -(-micro // PER_MTOK) + self._units_cost(
            record.input_characters, record.audio_seconds
        )
        if record.images:
            cost += record.images * self.image_price(
                (_option(record.image_size, record.image_quality),)
            )
        return cost

    def worst(self, input: int, output: int, units: Units | None) -> int:
        """The most a request may cost: its tokens at the dearest rates they could be charged
        (an input token may be an audio or image one), and its units."""
        if units is None:
            return self.cost(input, output)
        dearest_in = max(self.input, self.input_audio or 0, self.input_image or 0)
        dearest_out = max(self.output, self.output_audio or 0, self.output_image or 0)
        cost = -(-(input * dearest_in + output * dearest_out) // PER_MTOK)
        cost += self._units_cost(units.characters, units.audio_seconds)
        if units.images:
            cost += units.images * self.image_price(units.image_options)
        return cost

    def _units_cost(self, characters: int, seconds: float) -> int:
        micro = 0
        if characters and self.per_mchar is not None:
            micro += characters * self.per_mchar
        if seconds and self.per_msecond is not None:
            # To the millisecond, as records carry it; rounded up, as every estimate here is.
            micro += -(-round(seconds * 1000) * self.per_msecond // 1000)
        return -(-micro // PER_MTOK)

    def image_price(self, options: tuple[str, ...]) -> int:
        """The dearest per-image price among `options` (`size/quality` each; any of the
        model's prices when there are none); 0 when none is known."""
        table = self.per_image
        if not table:
            return 0
        if not options:
            return max(table.values())
        return max(_image_price(table, option) for option in options)


def _or(rate: int | None, default: int) -> int:
    return default if rate is None else rate


def _option(size: str | None, quality: str | None) -> str:
    return f"{size or '*'}/{quality or '*'}"


def image_option(size: str | None, quality: str | None) -> str:
    """The `size/quality` of images asked for (`*` for what is not said, or left to the
    provider as `auto`): the key their worst-case price is looked up by."""
    return _option(None if size == "auto" else size, None if quality == "auto" else quality)


def _image_price(table: Mapping[str, int], option: str) -> int:
    """The most specific price for `option`; when a part is `*` (not said), the dearest
    price it could turn out to be."""
    size, _, quality = option.partition("/")
    if size == "*" or quality == "*":
        matching = [nanos for key, nanos in table.items() if _matches(key, size, quality)]
        return max(matching, default=0)
    for key in (f"{size}/{quality}", size, f"*/{quality}", "*"):
        if key in table:
            return table[key]
    return 0


def _matches(key: str, size: str, quality: str) -> bool:
    key_size, _, key_quality = key.partition("/")
    return (size == "*" or key_size in (size, "*")) and (
        quality == "*" or key_quality in (quality, "*", "")
    )


def _nanos(usd: str | None, per: int = 1) -> int | None:
    """`usd` in nano-USD (times `per`: a price per unit as nano-USD per million units)."""
    if usd is None:
        return None
    try:
        value = Decimal(usd) * _NANOS_PER_USD * per
    except InvalidOperation:
        return None
    # Rounded up: a price finer than a nano-dollar per million tokens never under-reserves.
    return int(value.to_integral_value(rounding="ROUND_CEILING")) if value.is_finite() else None


def rates_of(price: Price | None, units: UnitPrice | None = None) -> Rates | None:
    """A bundle's prices as integer rates; None when the model has no known price."""
    input_rate = output_rate = None
    cache_read = cache_write = None
    if price is not None:
        input_rate = _nanos(price.input_per_mtok)
        output_rate = _nanos(price.output_per_mtok)
        if input_rate is None or output_rate is None:
            input_rate = output_rate = None
        cache_read = _nanos(price.cache_read_per_mtok)
        cache_write = _nanos(price.cache_write_per_mtok)
    if input_rate is None or output_rate is None:
        if units is None:
            return None
        # Priced by the unit only (characters, seconds, images): tokens cost nothing here.
        input_rate = output_rate = 0
    rates = Rates(
        input=input_rate,
        output=output_rate,
        cache_read=input_rate if cache_read is None else cache_read,
        cache_write=input_rate if cache_write is None else cache_write,
    )
    if units is None:
        return rates
    per_image: dict[str, int] = {}
    for key, usd in units.per_image.items():
        nanos = _nanos(usd)
        if nanos is not None:
            per_image[key] = nanos
    return Rates(
        input=rates.input,
        output=rates.output,
        cache_read=rates.cache_read,
        cache_write=rates.cache_write,
        input_audio=_nanos(units.input_audio_per_mtok),
        output_audio=_nanos(units.output_audio_per_mtok),
        input_image=_nanos(units.input_image_per_mtok),
        output_image=_nanos(units.output_image_per_mtok),
        per_mchar=_nanos(units.per_character, PER_MTOK),
        per_msecond=_nanos(units.per_second, PER_MTOK),
        per_image=per_image,
    )
