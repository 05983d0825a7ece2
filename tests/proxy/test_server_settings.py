"""How the proxy is served: on uvicorn only, under its own protocol's head-size and slow-client
bounds; `VKGATE_PROXY_SERVER=granian` is refused, saying why, rather than served unbounded."""

from __future__ import annotations

import pytest

from proxy.app import create_app
from proxy.settings import ClientLimits, ProxySettings
from tests.support.env import INTERNAL_SECRET
from vkgate.env import SettingError


def settings(**values: str) -> ProxySettings:
    return ProxySettings.from_env({"VKGATE_INTERNAL_SECRET": INTERNAL_SECRET, **values})


def test_granian_is_refused_at_start_up_naming_the_bound_it_cannot_keep() -> None:
    with pytest.raises(SettingError) as refused:
        settings(VKGATE_PROXY_SERVER="granian")
    message = str(refused.value)
    assert message.startswith("VKGATE_PROXY_SERVER=granian is no longer offered")
    assert "VKGATE_CLIENT_READ_TIMEOUT_SECONDS" in message
    assert "unset VKGATE_PROXY_SERVER" in message


@pytest.mark.parametrize("value", ["", "uvicorn", "UVICORN"])
def test_uvicorn_named_or_not_is_served_with_the_client_bounds(value: str) -> None:
    read = settings(
        VKGATE_PROXY_SERVER=value,
        VKGATE_MAX_HEADER_BYTES="2048",
        VKGATE_CLIENT_READ_TIMEOUT_SECONDS="7",
    )
    # The app hands its protocol (proxy/http1/) the bounds it enforces on every request.
    assert create_app(read).client_limits == ClientLimits(2048, 7.0)  # type: ignore[attr-defined]


def test_another_server_name_is_refused() -> None:
    with pytest.raises(
        SettingError, match=r"VKGATE_PROXY_SERVER can only be uvicorn .*'hypercorn'"
    ):
        settings(VKGATE_PROXY_SERVER="hypercorn")
