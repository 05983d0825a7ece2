"""The console in a real headless browser: Debian's chromium driven by Playwright, against
`vkgate up --demo` started as a user starts it."""

from __future__ import annotations

import dataclasses
import re
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.processes import (
    Service,
    banner_value,
    clean_env,
    free_port,
    kill_group,
    start,
    stop,
    wait_until_healthy,
)

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(__file__).parent / "screenshots"
"""Every page the browser tests visit is saved here (ignored by git) for a reviewer to look at."""
VIEWPORT = {"width": 1280, "height": 800}
START_TIMEOUT_S = 60.0
"""`vkgate up` migrates, seeds and starts two processes: generous on a loaded machine."""
WAIT_MS = 30_000


@dataclasses.dataclass
class Stack:
    up: Service
    console: str
    """The console's URL as the banner prints it."""
    controlplane: str
    proxy: str
    admin_token: str
    demo_key: str
    home: Path
    """VKGATE_HOME: the control plane's SQLite database is there."""


@contextmanager
def demo_stack(home: Path) -> Iterator[Stack]:
    controlplane_port, proxy_port = free_port(), free_port()
    env = clean_env(
        VKGATE_HOME=str(home),
        VKGATE_CONTROLPLANE_ADDR=f"127.0.0.1:{controlplane_port}",
        VKGATE_PROXY_ADDR=f"127.0.0.1:{proxy_port}",
        VKGATE_LOG_LEVEL="WARNING",
    )
    up = start(
        ["up", "--demo"],
        env=env,
        port=controlplane_port,
        log=home.parent / "up.log",
        cwd=home.parent,
        own_group=True,
    )
    try:
        wait_until_healthy(up, timeout=START_TIMEOUT_S)
        output = up.output()
        proxy = banner_value(output, "proxy")
        wait_until_healthy(
            dataclasses.replace(up, url=proxy.removesuffix("/v1")), timeout=START_TIMEOUT_S
        )
        yield Stack(
            up=up,
            console=banner_value(output, "console").rstrip("/"),
            controlplane=up.url,
            proxy=proxy,
            admin_token=banner_value(output, "admin token"),
            demo_key=banner_value(output, "demo key"),
            home=home,
        )
    finally:
        up.process.send_signal(signal.SIGINT)
        stop(up.process)
        kill_group(up.process)


def require_chromium() -> None:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run installs it)")


def shot(page: object, name: str) -> None:
    """Save what the browser shows, as a reviewer would see it at 1280x800."""
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))  # type: ignore[attr-defined]


def heading(text: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(text)}$")
