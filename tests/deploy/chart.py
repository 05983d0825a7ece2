"""Rendering charts/vkgate with Helm's own engine (helm-python-sdk, offline) and reading the result.

Every rendered manifest is checked against the Kubernetes API schemas (kubernetes-validate,
strict: unknown fields are errors) before a test looks at it.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import yaml

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "vkgate"
RELEASE = "shop"
NAMESPACE = "llm"
KUBERNETES_VERSION = "1.35"
"""Validated against; the oldest version the chart supports (Chart.yaml) is checked once too."""
OLDEST_KUBERNETES_VERSION = "1.25"

DATABASE_URL = "postgresql+psycopg://vkgate:db-password@postgres.data.svc:5432/vkgate"
LEDGER_URL = "http://vkgate:ch-password@clickhouse.data.svc:8123/vkgate"
REDIS_URL = "redis://:redis-password@redis.data.svc:6379/0"

STORES: dict[str, Any] = {"database": {"url": DATABASE_URL}, "ledger": {"url": LEDGER_URL}}
"""The least a release needs: the chart has no embedded stores to fall back on."""

CRDS_WITHOUT_SCHEMA = {"ServiceMonitor"}
"""Custom resources kubernetes-validate has no schema for; tests check them by hand."""

# libyaml's parser where PyYAML has it: the pure-Python one takes most of a render's time.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# kubernetes-validate reads its schema files (1.5 MB of definitions) again for every object;
# once per process is enough, and makes validation ten times faster.
kubernetes_validate.utils.schema_contents = functools.cache(
    kubernetes_validate.utils.schema_contents
)


def merge(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge value layers, later ones winning (as Helm merges -f files)."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
                merged[key] = merge(merged[key], value)
            else:
                merged[key] = value
    return merged


@dataclass(frozen=True)
class Manifests:
    """The objects one render produced (NOTES.txt aside)."""

    objects: list[dict[str, Any]]
    notes: str

    def kinds(self) -> list[str]:
        return sorted(o["kind"] for o in self.objects)

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [o for o in self.all(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered; have {self.names()}"
        return found[0]

    def has(self, kind: str, name: str) -> bool:
        return any(o["metadata"]["name"] == name for o in self.all(kind))

    def names(self) -> list[str]:
        return sorted(f"{o['kind']}/{o['metadata']['name']}" for o in self.objects)

    def container(self, kind: str, name: str) -> dict[str, Any]:
        pod = pod_spec(self.get(kind, name))
        containers: list[dict[str, Any]] = pod["containers"]
        assert len(containers) == 1
        return containers[0]

    def env(self, kind: str, name: str) -> dict[str, dict[str, Any]]:
        """The container's env by variable name (names are unique: checked)."""
        entries = self.container(kind, name).get("env", [])
        names = [e["name"] for e in entries]
        assert len(names) == len(set(names)), f"duplicate env in {kind}/{name}: {names}"
        return {e["name"]: e for e in entries}

    def secret_data(self, name: str) -> dict[str, str]:
        """A rendered Secret's values, decoded."""
        secret = self.get("Secret", name)
        values = dict(secret.get("stringData", {}))
        for key, encoded in secret.get("data", {}).items():
            values[key] = base64.b64decode(encoded).decode()
        return values

    def workloads(self) -> Iterator[dict[str, Any]]:
        yield from (o for o in self.objects if o["kind"] in ("Deployment", "Job"))


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def load() -> helm.Chart:
    return helm.Chart.load(CHART_DIR)


def render(
    chart: helm.Chart,
    values: Mapping[str, Any],
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    upgrade: bool = False,
    kubernetes_version: str = KUBERNETES_VERSION,
) -> Manifests:
    """Render as `helm install` (or `helm upgrade`) would, and validate every object."""
    rendered = chart.render(
        dict(values),
        name=release,
        namespace=namespace,
        is_install=not upgrade,
        is_upgrade=upgrade,
    )
    objects: list[dict[str, Any]] = []
    notes = ""
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        objects.extend(o for o in yaml.load_all(text, Loader=YAML_LOADER) if o)
    for manifest in objects:
        validate(manifest, kubernetes_version)
    return Manifests(objects, notes)


def validate(manifest: dict[str, Any], version: str) -> None:
    if manifest["kind"] in CRDS_WITHOUT_SCHEMA:
        return
    try:
        kubernetes_validate.validate(manifest, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(part) for part in exc.path)
        raise AssertionError(
            f"{manifest['kind']}/{manifest['metadata']['name']} is not valid for Kubernetes "
            f"{version}: {where}: {exc.message}"
        ) from None


def render_error(chart: helm.Chart, values: Mapping[str, Any], **options: Any) -> str:
    """The message a render that must fail failed with."""
    try:
        chart.render(dict(values), name=RELEASE, namespace=NAMESPACE, **options)
    except helm.HelmError as exc:
        return str(exc)
    raise AssertionError("the render succeeded")
