"""Which releases of the proxy and the control plane work together: the same major version and
at most one minor version apart, so either side can be upgraded (or rolled back) first."""

from __future__ import annotations

import re

MAX_MINOR_SKEW = 1
_RELEASE = re.compile(r"(\d+)\.(\d+)")


def release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string, or None when it is not one."""
    match = _RELEASE.match(version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def mismatch(proxy: str, controlplane: str) -> str | None:
    """None when a proxy of `proxy` and a control plane of `controlplane` work together (or a
    version cannot be read: nothing is claimed then), else a sentence naming the mismatch."""
    ours, theirs = release(proxy), release(controlplane)
    if ours is None or theirs is None:
        return None
    if ours[0] == theirs[0] and abs(ours[1] - theirs[1]) <= MAX_MINOR_SKEW:
        return None
    return (
        f"proxy {proxy} and control plane {controlplane} are more than {MAX_MINOR_SKEW} minor "
        "version apart: releases work together only within one minor version"
    )


FIX = (
    "upgrade the older side one minor version at a time (control planes first, then proxies), "
    "so that no proxy is more than one minor version from its control plane"
)
