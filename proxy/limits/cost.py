"""What a request may cost (its worst case, reserved) and what it did cost (settled), in nano-USD.

The proxy's figures are for holding budgets; the ledger prices every record again, exactly, and
its figure replaces the proxy's once the record is in. Rates are integers (nano-USD per million
tokens) so a cost is one integer division, rounded up: a reservation never falls short by a
rounding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from vkgate.wire import Price

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


@dataclass(frozen=True, slots=True)
class Rates:
    """Nano-USD per million tokens of each kind."""

    input: int
    output: int
    cache_read: int
    cache_write: int

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


def _nanos(usd: str | None) -> int | None:
    if usd is None:
        return None
    try:
        value = Decimal(usd) * _NANOS_PER_USD
    except InvalidOperation:
        return None
    # Rounded up: a price finer than a nano-dollar per million tokens never under-reserves.
    return int(value.to_integral_value(rounding="ROUND_CEILING")) if value.is_finite() else None


def rates_of(price: Price | None) -> Rates | None:
    """A bundle's price as integer rates; None when the model has no known price."""
    if price is None:
        return None
    input_rate = _nanos(price.input_per_mtok)
    output_rate = _nanos(price.output_per_mtok)
    if input_rate is None or output_rate is None:
        return None
    cache_read = _nanos(price.cache_read_per_mtok)
    cache_write = _nanos(price.cache_write_per_mtok)
    return Rates(
        input=input_rate,
        output=output_rate,
        cache_read=input_rate if cache_read is None else cache_read,
        cache_write=input_rate if cache_write is None else cache_write,
    )
