"""The spool's settings: defaults, and refusals that name the variable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy.settings import ProxySettings
from proxy.spend.spool import FullPolicy
from tests.support.env import INTERNAL_SECRET
from vkgate import env as E


def settings(**values: str) -> ProxySettings:
    return ProxySettings.from_env({"VKGATE_INTERNAL_SECRET": INTERNAL_SECRET, **values})


def test_defaults() -> None:
    s = settings()
    assert s.spool_dir == Path(".vkgate/spool")
    assert s.spend_flush_interval_s == 1.0
    assert s.spend_spool_max_bytes == 1024**3
    assert s.spend_spool_full_policy is FullPolicy.REFUSE
    assert s.shutdown_grace_s == 10.0
    assert s.replica_id is None


def test_the_spool_lives_under_vkgate_home_unless_placed_elsewhere() -> None:
    assert settings(VKGATE_HOME="/srv/vkgate").spool_dir == Path("/srv/vkgate/spool")
    placed = settings(VKGATE_HOME="/srv/vkgate", VKGATE_SPOOL_DIR="/var/spool/vkgate")
    assert placed.spool_dir == Path("/var/spool/vkgate")


def test_values_are_read() -> None:
    s = settings(
        VKGATE_SPEND_FLUSH_INTERVAL_SECONDS="0.25",
        VKGATE_SPEND_SPOOL_MAX_BYTES="10485760",
        VKGATE_SPEND_SPOOL_FULL_POLICY="DROP_OLDEST",
        VKGATE_SHUTDOWN_GRACE_SECONDS="0",
        VKGATE_REPLICA_ID="proxy-7.eu_west",
    )
    assert s.spend_flush_interval_s == 0.25
    assert s.spend_spool_max_bytes == 10 * 1024 * 1024
    assert s.spend_spool_full_policy is FullPolicy.DROP_OLDEST
    assert s.shutdown_grace_s == 0.0
    assert s.replica_id == "proxy-7.eu_west"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("VKGATE_SPEND_FLUSH_INTERVAL_SECONDS", "0", "must be more than 0"),
        ("VKGATE_SPEND_FLUSH_INTERVAL_SECONDS", "soon", "must be a number, got 'soon'"),
        ("VKGATE_SPEND_SPOOL_MAX_BYTES", "1GiB", "must be a whole number, got '1GiB'"),
        ("VKGATE_SPEND_SPOOL_MAX_BYTES", "1000", "must be at least 1048576, got 1000"),
        ("VKGATE_SPEND_SPOOL_FULL_POLICY", "block", "must be refuse or drop_oldest, got 'block'"),
        ("VKGATE_SHUTDOWN_GRACE_SECONDS", "-1", "must be at least 0.0, got -1.0"),
        ("VKGATE_REPLICA_ID", "../etc", "must be 1-64 characters"),
        ("VKGATE_REPLICA_ID", "a" * 65, "must be 1-64 characters"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(E.SettingError, match=re.escape(f"{name} {message}")):
        settings(**{name: value})
