"""The chart's values: malformed ones are refused before anything renders, by a message that
names the offending value (and never repeats a secret), and every value is documented."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.deploy.chart import CHART_DIR, STORES, merge, render, render_error
from vkgate import env as E

HA_EVERYTHING: dict[str, Any] = merge(
    STORES,
    {
        "redis": {"url": "redis://redis:6379/0"},
        "metrics": {"tokenSecret": {"name": "metrics"}},
        "proxy": {"autoscaling": {"enabled": True}},
    },
)
SECRET_SETTINGS = {"VKGATE_TELEMETRY_KEY"}
"""Settings that hold a secret: only through extraEnv, from a Secret."""
PER_REPLICA_SETTINGS = {"VKGATE_REPLICA_ID"}
"""Settings one value of which for every replica would be wrong."""


def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CHART_DIR / "values.schema.json").read_text())
    return loaded


@pytest.mark.parametrize(
    ("values", "names"),
    [
        pytest.param({"replica": 3}, ["additional properties 'replica' not allowed"], id="unknown"),
        pytest.param(
            {"proxy": {"replica": 3}},
            ["'/proxy'", "additional properties 'replica' not allowed"],
            id="unknown-nested",
        ),
        pytest.param(
            {"proxy": {"replicas": "three"}},
            ["'/proxy/replicas'", "want integer"],
            id="wrong-type",
        ),
        pytest.param(
            {"controlplane": {"replicas": -1}},
            ["'/controlplane/replicas'", "minimum"],
            id="negative-replicas",
        ),
        pytest.param({"logLevel": "verbose"}, ["'/logLevel'", "'DEBUG'"], id="bad-enum"),
        pytest.param(
            {"proxy": {"service": {"type": "Ingress"}}},
            ["'/proxy/service/type'", "'LoadBalancer'"],
            id="bad-service-type",
        ),
        pytest.param(
            {"proxy": {"metrics": {"port": 70000}}},
            ["'/proxy/metrics/port'", "maximum"],
            id="port-out-of-range",
        ),
        pytest.param(
            {"proxy": {"spool": {"emptyDir": {"sizeLimit": "2 gigs"}}}},
            ["'/proxy/spool/emptyDir/sizeLimit'"],
            id="bad-quantity",
        ),
        pytest.param(
            {"proxy": {"env": {"VKGATE_MAX_INFLIGHT": "10"}}},
            ["'/proxy/env'", "VKGATE_MAX_INFLIGHT"],
            id="unknown-setting",
        ),
        pytest.param(
            {"proxy": {"env": {"VKGATE_CONTROLPLANE_URL": "http://elsewhere:5560"}}},
            ["'/proxy/env'", "VKGATE_CONTROLPLANE_URL"],
            id="setting-the-chart-owns",
        ),
        pytest.param(
            {"proxy": {"env": {"VKGATE_MAX_IN_FLIGHT": 4096}}},
            ["'/proxy/env/VKGATE_MAX_IN_FLIGHT'", "want string"],
            id="unquoted-setting",
        ),
        pytest.param(
            {"proxy": {"autoscaling": {"inFlight": {"averageValue": 0}}}},
            ["'/proxy/autoscaling/inFlight/averageValue'", "minimum"],
            id="zero-in-flight-target",
        ),
        pytest.param(
            {"networkPolicy": {"proxy": {"providers": {"ports": []}}}},
            ["'/networkPolicy/proxy/providers/ports'"],
            id="no-provider-ports",
        ),
    ],
)
def test_malformed_values_are_refused_naming_the_value(
    chart: helm.Chart, values: dict[str, Any], names: list[str]
) -> None:
    message = render_error(chart, merge(STORES, values))
    assert "values don't meet the specifications of the schema" in message
    for name in names:
        assert name in message, message


def test_a_short_secret_is_refused_without_being_repeated(chart: helm.Chart) -> None:
    message = render_error(chart, merge(STORES, {"secrets": {"keyPepper": "hunter2-hunter2"}}))
    assert "'/secrets/keyPepper'" in message
    assert "minLength" in message
    assert "hunter2" not in message


def test_a_malformed_encryption_key_is_refused_without_being_repeated(chart: helm.Chart) -> None:
    bad = "!" * 43
    message = render_error(chart, merge(STORES, {"secrets": {"encryptionKey": bad}}))
    assert "secrets.encryptionKey must be 32 random bytes in URL-safe base64" in message
    assert bad not in message


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"database": {"url": "mysql://vkgate:hunter2@db/vkgate"}}, "database.url must be"),
        ({"ledger": {"url": "chdb:///var/lib/vkgate/hunter2"}}, "ledger.url must be"),
        ({"redis": {"url": "memcached://:hunter2@cache"}}, "redis.url must be"),
    ],
)
def test_a_store_url_of_the_wrong_kind_is_refused_without_being_repeated(
    chart: helm.Chart, values: dict[str, Any], named: str
) -> None:
    message = render_error(chart, merge(STORES, values))
    assert named in message
    assert "hunter2" not in message


def test_a_store_given_twice_is_refused(chart: helm.Chart) -> None:
    values = merge(STORES, {"database": {"existingSecret": {"name": "pg"}}})
    assert "database: set url or existingSecret.name, not both" in render_error(chart, values)


def test_every_object_in_the_schema_refuses_unknown_keys() -> None:
    def objects(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
        if isinstance(node, dict):
            if "properties" in node:
                yield path, node
            for key, child in node.items():
                yield from objects(child, f"{path}/{key}")
        elif isinstance(node, list):
            for index, child in enumerate(node):
                yield from objects(child, f"{path}/{index}")

    found = list(objects(schema(), ""))
    assert len(found) > 20
    for path, node in found:
        assert node.get("additionalProperties") is False, path


def test_the_settings_the_env_maps_take_are_the_services_own_minus_the_charts(
    chart: helm.Chart,
) -> None:
    manifests = render(chart, HA_EVERYTHING)
    set_by_chart = {
        entry["name"]
        for workload in manifests.workloads()
        for entry in workload["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    allowed = set(schema()["definitions"]["envMap"]["properties"])
    assert allowed == E.KNOWN - set_by_chart - SECRET_SETTINGS - PER_REPLICA_SETTINGS


def value_paths(node: Any, prefix: str = "") -> Iterator[str]:
    """Every documented value: leaves, and maps or lists the user fills in whole."""
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and not path.endswith(("resources", "behavior")):
            yield from value_paths(value, f"{path}.")
        else:
            yield path


def test_every_value_is_in_the_readme_table_and_the_schema() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    readme = (CHART_DIR / "README.md").read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \|", readme, re.MULTILINE))
    paths = set(value_paths(values))
    assert paths - documented == set(), "values missing from README.md"
    assert documented - paths == set(), "README.md documents values that do not exist"
    for path in paths:
        node = schema()
        for part in path.split("."):
            node = node["properties"][part] if "properties" in node else node
            if "$ref" in node:
                node = schema()["definitions"][node["$ref"].rpartition("/")[2]]
        assert node, path


def test_every_value_has_a_comment_in_values_yaml() -> None:
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()

    def indent(line: str) -> int:
        return len(line) - len(line.lstrip())

    def commented(number: int) -> bool:
        """A comment right above this key, or above a block holding it."""
        if number > 0 and lines[number - 1].strip().startswith("#"):
            return True
        parents = [
            k
            for k in range(number - 1, -1, -1)
            if lines[k].strip()
            and not lines[k].lstrip().startswith("#")
            and indent(lines[k]) < indent(lines[number])
        ]
        return bool(parents) and commented(parents[0])

    for number, line in enumerate(lines):
        key = re.match(r"^\s*[A-Za-z][A-Za-z0-9]*:(.*)$", line)
        if not key:
            continue  # comments, blanks, and list entries (examples of a documented list)
        following = next((n for n in lines[number + 1 :] if n.strip()), "")
        if not key.group(1).strip() and not following.lstrip().startswith("- "):
            continue  # a block: its values carry the comments
        above = [lines[k] for k in range(number) if lines[k].strip()]
        in_list = any(
            entry.lstrip().startswith("- ") and indent(entry) < indent(line) for entry in above[-3:]
        )
        if not in_list:
            assert commented(number), f"values.yaml:{number + 1}: {line.strip()} has no comment"


def test_helm_lint_finds_nothing_to_fix() -> None:
    report = helm.lint(CHART_DIR, STORES, strict=True)
    assert report["errors"] == []
    worse_than_info = [m for m in report["messages"] if m["severity"] > 1]
    assert worse_than_info == []
