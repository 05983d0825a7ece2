"""Finding personal data, credentials and an admin's own patterns in text.

A regular expression tried at every position of a long prompt is costly on the hot path; so
the built-in kinds first look the text over in C (an `@`, a run of digits, a credential's
first letters, found by `str.find`) and run their patterns only near what they saw. Candidates
a pattern alone cannot tell (card numbers, IBANs, IP addresses) are checked (Luhn, ISO 7064
mod 97, `ipaddress`) before they count. An admin's patterns run under `regex` with a time
bound: one that backtracks without end stops there instead of stalling the event loop.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import regex

from vkgate.guardrails import PiiConfig, RegexConfig, SecretsConfig


@dataclass(frozen=True, slots=True)
class Finding:
    start: int
    end: int
    entity: str


class DetectorTimeout(Exception):
    """A pattern ran past its time bound."""


def _luhn(text: str) -> bool:
    digits = [int(c) for c in text if c.isdigit()]
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for i, digit in enumerate(reversed(digits)):
        if i % 2:
            digit *= 2
            if digit > 9:
                digit -= 9
        total += digit
    return total % 10 == 0


def _iban(text: str) -> bool:
    compact = text.replace(" ", "").upper()
    if not 15 <= len(compact) <= 34:
        return False
    moved = compact[4:] + compact[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


def _ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


_EMAIL = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,24}"
)
_NUMBERS: dict[str, str] = {
    "credit_card": r"(?<![\d-])\d{4}(?:[ -]?\d{2,4}){2,4}(?:[ -]?\d{1,4})?(?![\d-])",
    "iban": r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?\b",
    "us_ssn": r"(?<![\d-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\d-])",
    "ip_address": r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.])",
    "phone": (
        r"(?<![\w+])(?:\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]?\d{2,4}){2,4}"
        r"|\(\d{3}\)[ .-]?\d{3}[ .-]?\d{4}|\d{3}[.-]\d{3}[.-]\d{4})(?!\w)"
    ),
}
_IPV6 = re.compile(
    r"(?<![\w:])(?:(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}"
    r"|(?:[0-9A-Fa-f]{1,4}:){1,7}:(?:[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{1,4}){0,6})?"
    r"|::[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{1,4}){0,6})(?![\w:])"
)
_SECRETS: dict[str, tuple[tuple[str, ...], str]] = {
    # kind: (what it starts with, the whole pattern, matched from there)
    "private_key": (
        ("-----BEGIN ",),
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----"
        r"(?:[^-]|-(?!----END))*(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----)?",
    ),
    "aws_access_key": (("AKIA", "ASIA", "ABIA", "ACCA"), r"[A-Z]{4}[0-9A-Z]{16}(?![0-9A-Za-z])"),
    "gcp_api_key": (("AIza",), r"AIza[0-9A-Za-z_-]{35}"),
    "anthropic_key": (("sk-ant-",), r"sk-ant-[a-z]{3,8}\d{2}-[A-Za-z0-9_-]{20,}"),
    "openai_key": (("sk-",), r"sk-(?!ant-)(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}"),
    "github_token": (
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
        r"(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})",
    ),
    "slack_token": (("xox",), r"xox[abposr]-[A-Za-z0-9-]{10,}"),
    "stripe_key": (("sk_", "rk_"), r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"),
    "jwt": (("eyJ",), r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
}
_CHECKS: dict[str, Callable[[str], bool]] = {
    "credit_card": _luhn,
    "iban": _iban,
    "ip_address": _ip,
}
# Every digit, and a dot, becomes "0"; anything else is a space: a number worth a closer look
# shows as "000" (cards, IBANs, SSNs, phones, IPv4 addresses), found by one bytes.find.
_DIGITS = bytes(ord("0") if chr(b).isdigit() or b == ord(".") else ord(" ") for b in range(256))
_NUMBER_BEFORE = 48
"""How far before a run of digits a number may start (an IBAN's letters, a phone's prefix)."""
_NUMBER_AFTER = 64


class Detector:
    """Finds what one guardrail looks for in a text."""

    joins = True
    """Whether texts joined by `SEPARATOR` may be read in one call: none of the built-in kinds'
    patterns matches across it. An admin's may (`^`, `\\A`, `$` would mark only the joined text's
    ends), so each text is read on its own."""

    def find(self, text: str) -> list[Finding]:
        raise NotImplementedError


def _windows(starts: Iterable[int], before: int, after: int, size: int) -> list[tuple[int, int]]:
    """Merged spans around each position."""
    spans: list[tuple[int, int]] = []
    for position in sorted(starts):
        start, end = max(0, position - before), min(size, position + after)
        if spans and start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((start, end))
    return spans


def _occurrences(text: str, needle: str) -> Iterator[int]:
    position = text.find(needle)
    while position != -1:
        yield position
        position = text.find(needle, position + 1)


def _byte_occurrences(data: bytes, needle: bytes) -> Iterator[int]:
    position = data.find(needle)
    while position != -1:
        yield position
        # Past the run: one window covers every digit of it.
        position = data.find(needle, position + len(needle) + 8)


def _distinct(found: list[Finding]) -> list[Finding]:
    """In order of position, without a finding that overlaps an earlier one."""
    if len(found) < 2:
        return found
    found.sort(key=lambda f: (f.start, -f.end))
    kept: list[Finding] = []
    for finding in found:
        if not kept or finding.start >= kept[-1].end:
            kept.append(finding)
    return kept


_DIGITS_NEAR = 7
"""Digits (and dots) a number must have within twenty characters of a run of three before a
pattern looks at it: a phone has seven, an SSN nine, a card thirteen, an IPv4 address seven
with its dots; a year in prose, even with a few numbers around it, is passed over at once."""
# Letters, digits, `_` and `-` become "a", anything else a space: every credential here is a
# run of at least sixteen of those, which prose rarely has.
_WORDISH = bytes(
    ord("a") if (chr(b).isascii() and chr(b).isalnum()) or chr(b) in "_-" else ord(" ")
    for b in range(256)
)
_LONG_RUN = b"a" * 16


class PiiDetector(Detector):
    """Email addresses, phone numbers, card numbers, IBANs, US SSNs and IP addresses."""

    __slots__ = ("_email", "_ipv6", "_numbers")

    def __init__(self, config: PiiConfig) -> None:
        wanted = set(config.entities)
        self._email = "email" in wanted
        self._ipv6 = "ip_address" in wanted
        names = [n for n in _NUMBERS if n in wanted]
        self._numbers = (
            re.compile("|".join(f"(?P<{n}>{_NUMBERS[n]})" for n in names)) if names else None
        )

    def find(self, text: str) -> list[Finding]:
        found: list[Finding] = []
        size = len(text)
        if self._email and "@" in text:
            for start, end in _windows(_occurrences(text, "@"), 65, 260, size):
                found.extend(
                    Finding(m.start(), m.end(), "email") for m in _EMAIL.finditer(text, start, end)
                )
        numbers = self._numbers
        # One byte a character ("?" for those Latin-1 lacks): positions stay the text's.
        mapped = text.encode("latin-1", "replace").translate(_DIGITS) if numbers else b""
        if numbers is not None and b"000" in mapped:
            hits = [
                p
                for p in _byte_occurrences(mapped, b"000")
                if mapped.count(b"0", max(0, p - 4), p + 16) >= _DIGITS_NEAR
            ]
            for start, end in _windows(hits, _NUMBER_BEFORE, _NUMBER_AFTER, size):
                for match in numbers.finditer(text, start, end):
                    entity = match.lastgroup or ""
                    check = _CHECKS.get(entity)
                    if check is None or check(match.group()):
                        found.append(Finding(match.start(), match.end(), entity))
        if self._ipv6 and ":" in text:
            colons = [i for i in _occurrences(text, ":") if ":" in text[i + 1 : i + 6]]
            for start, end in _windows(colons, 40, 45, size):
                for match in _IPV6.finditer(text, start, end):
                    if _ip(match.group()):
                        found.append(Finding(match.start(), match.end(), "ip_address"))
        return _distinct(found)


class SecretsDetector(Detector):
    """Credentials: each a long run of letters, digits, `_` and `-` (found by `bytes.find`),
    looked into for the letters a kind starts with, then matched from there."""

    __slots__ = ("_kinds", "_private_key")

    def __init__(self, config: SecretsConfig) -> None:
        wanted = set(config.kinds)
        self._private_key = (
            re.compile(_SECRETS["private_key"][1]) if "private_key" in wanted else None
        )
        self._kinds = [
            (kind, starts, re.compile(pattern))
            for kind, (starts, pattern) in _SECRETS.items()
            if kind in wanted and kind != "private_key"
        ]

    def find(self, text: str) -> list[Finding]:
        mapped = text.encode("latin-1", "replace").translate(_WORDISH)
        run = mapped.find(_LONG_RUN)
        if run == -1:
            return []
        found: list[Finding] = []
        if self._private_key is not None:
            for position in _occurrences(text, "-----BEGIN "):
                match = self._private_key.match(text, position)
                if match is not None:
                    found.append(Finding(position, match.end(), "private_key"))
        while run != -1:
            end = mapped.find(b" ", run)
            end = len(mapped) if end == -1 else end
            for kind, starts, pattern in self._kinds:
                for literal in starts:
                    position = text.find(literal, run, end)
                    while position != -1:
                        before = text[position - 1] if position else " "
                        if not (before.isalnum() or before == "_"):
                            match = pattern.match(text, position)
                            if match is not None:
                                found.append(Finding(position, match.end(), kind))
                        position = text.find(literal, position + 1, end)
            run = mapped.find(_LONG_RUN, end)
        return _distinct(found)


SHORT_TEXT = 256
"""Texts shorter than this (most answers, most messages) are first searched for all of a
guardrail's patterns at once: each search has a fixed cost, which on a busy server's cold
caches is most of a short text's. A longer text is searched pattern by pattern, where each
keeps the literal scan an alternation would lose."""
_NOT_A_BRANCH = re.compile(r"\\(?:[1-9]|[gk])|\(\?(?![:=!>]|<[=!]|[ims]+:)")
"""What may change its meaning as one branch of an alternation (conservatively, escaped or
not): a reference to a group by number or name, a named group, and any `(?` but a plain,
scoped-flag, lookaround or atomic group; a pattern's leading global flags are scoped apart."""
_LEADING_FLAGS = re.compile(r"\(\?([ims]+)\)")


def _branch(pattern: str) -> str | None:
    """`pattern` as one branch of an alternation that means what it means alone, or None."""
    flags = _LEADING_FLAGS.match(pattern)
    if flags is not None:
        pattern = f"(?{flags.group(1)}:{pattern[flags.end() :]})"
    if _NOT_A_BRANCH.search(pattern):
        return None
    return f"(?:{pattern})"


def _alternation(patterns: Iterable[str], flags: int) -> regex.Pattern[str] | None:
    """One pattern matching wherever any of `patterns` does, when each can be a branch."""
    branches = [_branch(p) for p in patterns]
    if len(branches) < 2 or None in branches:
        return None
    try:
        return regex.compile("|".join(b for b in branches if b is not None), flags)
    except regex.error:
        return None


class RegexDetector(Detector):
    """An admin's patterns, each its own entity, each bounded in time. Each search keeps the
    GIL (`concurrent=False`): `regex` would let go of it for every call, and taking it back
    from the spool's disk thread cost more than the search."""

    __slots__ = ("_any", "_bound_s", "_patterns")
    joins = False

    def __init__(self, config: RegexConfig, bound_s: float) -> None:
        flags = regex.IGNORECASE if config.ignore_case else 0
        self._patterns = [(name, regex.compile(p, flags)) for name, p in config.patterns.items()]
        self._any = _alternation(config.patterns.values(), flags)
        """All the patterns in one, for a short text's first search; None for one pattern,
        or when one of them cannot be a branch."""
        self._bound_s = bound_s

    def find(self, text: str) -> list[Finding]:
        found: list[Finding] = []
        bound = self._bound_s
        try:
            if (
                self._any is not None
                and len(text) < SHORT_TEXT
                and self._any.search(text, timeout=bound, concurrent=False) is None
            ):
                return found
            for name, pattern in self._patterns:
                # Most texts hold no match: a search says so without an iterator's set-up.
                if pattern.search(text, timeout=bound, concurrent=False) is None:
                    continue
                for match in pattern.finditer(text, timeout=bound, concurrent=False):
                    if match.end() > match.start():
                        found.append(Finding(match.start(), match.end(), name))
        except TimeoutError:
            raise DetectorTimeout from None
        return _distinct(found)


def redacted(text: str, findings: Iterable[Finding]) -> str:
    """`text` with each finding replaced by `[REDACTED:<entity>]`; overlaps keep the first."""
    pieces = []
    position = 0
    for finding in sorted(findings, key=lambda f: (f.start, -f.end)):
        if finding.start < position:
            continue
        pieces.append(text[position : finding.start])
        pieces.append(f"[REDACTED:{finding.entity}]")
        position = finding.end
    pieces.append(text[position:])
    return "".join(pieces)
