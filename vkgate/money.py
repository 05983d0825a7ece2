"""Money on the wire is a decimal string of USD; inside vkgate it is integer nano-USD."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

NANOS_PER_USD = 1_000_000_000


def usd_to_nanos(text: str) -> int:
    """Exact: "0.000000001" is 1. Raises ValueError for anything finer or not a number."""
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise ValueError(f"not a decimal number: {text!r}") from None
    nanos = value * NANOS_PER_USD
    if not value.is_finite() or nanos != nanos.to_integral_value():
        raise ValueError(f"not a whole number of nano-dollars: {text!r}")
    return int(nanos)


def nanos_to_usd(nanos: int) -> str:
    """The shortest exact decimal string: 1_500_000_000 is "1.5", 0 is "0"."""
    sign = "-" if nanos < 0 else ""
    whole, frac = divmod(abs(nanos), NANOS_PER_USD)
    if not frac:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{frac:09d}".rstrip("0")
