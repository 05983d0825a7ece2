"""What every `vkgate doctor` check returns: a `Result` and its `Status`, and helpers for both."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from urllib.parse import urlsplit, urlunsplit

from vkgate.probe import scrub_credentials


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Result:
    check: str
    status: Status
    detail: str
    fix: str | None = None

    def as_json(self) -> dict[str, str | None]:
        return {"check": self.check, "status": self.status, "detail": self.detail, "fix": self.fix}


def skipped(check: str, why: str) -> Result:
    return Result(check, Status.SKIP, f"skipped: {why}")


def incomplete(check: str, exc: Exception) -> Result:
    """The FAIL of a check that raised where nothing expected it to."""
    return Result(
        check,
        Status.FAIL,
        f"doctor could not complete this check: {type(exc).__name__}: {exc}",
        "the other checks still ran; if the message does not say what to change here, report "
        "it as a vkgate doctor bug",
    )


def guarded(check: str, run: Callable[[], Result]) -> Result:
    """`run()`, or its exception as this check's FAIL: one broken check must not cost the
    report every check after it."""
    try:
        return run()
    except Exception as exc:
        return incomplete(check, exc)


def redacted(result: Result, secrets: Iterable[str]) -> Result:
    """`result` with every one of `secrets` in its text replaced by `***`, and the user part
    (password included) of any URL it quotes cut out."""
    detail = scrub_credentials(result.detail)
    fix = result.fix and scrub_credentials(result.fix)
    for secret in secrets:
        detail = detail.replace(secret, "***")
        fix = fix and fix.replace(secret, "***")
    return replace(result, detail=detail, fix=fix)


def shown_url(url: str) -> str:
    """`url` without any user name or password in it."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
