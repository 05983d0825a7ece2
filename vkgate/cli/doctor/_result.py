"""What every `vkgate doctor` check returns: a `Result` and its `Status`, and helpers for both."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit, urlunsplit


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


def shown_url(url: str) -> str:
    """`url` without any user name or password in it."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
