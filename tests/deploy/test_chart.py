"""The Helm chart, rendered with several value sets: what each release would actually run."""

from __future__ import annotations

import base64
import ipaddress
import math
from typing import Any

import helm_python as helm
import pytest
from prometheus_client import generate_latest

from controlplane.settings import ControlPlaneSettings, database_url, ledger_location
from proxy.settings import ProxySettings
from proxy.telemetry.metrics import ProxyMetrics
from tests.deploy.chart import (
    DATABASE_URL,
    LEDGER_URL,
    NAMESPACE,
    OLDEST_KUBERNETES_VERSION,
    REDIS_URL,
    RELEASE,
    STORES,
    Manifests,
    merge,
    pod_spec,
    render,
    render_error,
)
from vkgate import env as E
from vkgate.cli import main as cli

FULLNAME = f"{RELEASE}-vkgate"
CONTROLPLANE = f"{FULLNAME}-controlplane"
PROXY = f"{FULLNAME}-proxy"

HA: dict[str, Any] = merge(
    STORES,
    {
        "redis": {"url": REDIS_URL},
        "metrics": {"tokenSecret": {"name": "vkgate-metrics", "key": "token"}},
        "controlplane": {"replicas": 3, "pdb": {"maxUnavailable": "34%"}},
        "proxy": {
            "autoscaling": {
                "enabled": True,
                "minReplicas": 3,
                "maxReplicas": 30,
                "inFlight": {"enabled": True, "averageValue": 300},
            },
        },
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    },
)

EXISTING_SECRETS: dict[str, Any] = {
    "secrets": {"existingSecret": "vkgate-shared"},
    "database": {"existingSecret": {"name": "pg-app", "key": "uri"}},
    "ledger": {"existingSecret": {"name": "clickhouse-app", "key": "http-uri"}},
    "redis": {"existingSecret": {"name": "redis-app", "key": "url"}},
}
EXISTING_VALUES = {
    ("vkgate-shared", "VKGATE_INTERNAL_SECRET"): "i" * 40,
    ("vkgate-shared", "VKGATE_JWT_SECRET"): "j" * 40,
    ("vkgate-shared", "VKGATE_KEY_PEPPER"): "p" * 40,
    ("vkgate-shared", "VKGATE_ENCRYPTION_KEY"): base64.urlsafe_b64encode(bytes(32)).decode(),
    ("pg-app", "uri"): DATABASE_URL,
    ("clickhouse-app", "http-uri"): LEDGER_URL,
    ("redis-app", "url"): REDIS_URL,
}

INGRESS: dict[str, Any] = merge(
    STORES,
    {
        "ingress": {
            "enabled": True,
            "className": "nginx",
            "annotations": {"nginx.ingress.kubernetes.io/proxy-buffering": "off"},
            "hosts": [{"host": "llm.example.com", "paths": [{"path": "/", "pathType": "Prefix"}]}],
            "tls": [{"secretName": "llm-example-tls", "hosts": ["llm.example.com"]}],
        }
    },
)

PVC_SPOOL: dict[str, Any] = merge(
    STORES,
    {
        "proxy": {
            "replicas": 3,
            "spool": {
                "persistence": {"enabled": True, "storageClassName": "nfs", "size": "20Gi"},
            },
        }
    },
)


def resolved_env(
    manifests: Manifests, kind: str, name: str, existing: dict[tuple[str, str], str] | None = None
) -> dict[str, str]:
    """The environment the container would start with: Secret references resolved from the
    rendered Secrets, or from `existing` for Secrets the release does not own."""
    env: dict[str, str] = {}
    for variable, entry in manifests.env(kind, name).items():
        if "value" in entry:
            env[variable] = entry["value"]
            continue
        ref = entry["valueFrom"]["secretKeyRef"]
        rendered = (
            manifests.secret_data(ref["name"]) if manifests.has("Secret", ref["name"]) else {}
        )
        if ref["key"] in rendered:
            env[variable] = rendered[ref["key"]]
        elif existing is not None and (ref["name"], ref["key"]) in existing:
            env[variable] = existing[ref["name"], ref["key"]]
        else:
            assert ref.get("optional"), f"{variable}: {ref} is neither rendered nor given"
    return env


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def pod_labels(manifests: Manifests, name: str) -> dict[str, str]:
    labels: dict[str, str] = manifests.get("Deployment", name)["spec"]["template"]["metadata"][
        "labels"
    ]
    return labels


@pytest.fixture(scope="module")
def defaults(chart: helm.Chart) -> Manifests:
    return render(chart, STORES)


# --- defaults ------------------------------------------------------------------------------


def test_defaults_render_one_deployment_per_service_and_nothing_optional(
    defaults: Manifests,
) -> None:
    assert defaults.names() == sorted(
        [
            f"Deployment/{CONTROLPLANE}",
            f"Deployment/{PROXY}",
            f"Service/{CONTROLPLANE}",
            f"Service/{PROXY}",
            f"Service/{PROXY}-metrics",
            f"PodDisruptionBudget/{CONTROLPLANE}",
            f"PodDisruptionBudget/{PROXY}",
            f"NetworkPolicy/{CONTROLPLANE}",
            f"NetworkPolicy/{PROXY}",
            f"NetworkPolicy/{FULLNAME}-migrate",
            f"Secret/{FULLNAME}-secrets",
            f"Secret/{FULLNAME}-stores",
            f"Secret/{FULLNAME}-migrate-stores",
            f"Job/{FULLNAME}-migrate",
            f"ServiceAccount/{FULLNAME}",
        ]
    )
    assert defaults.get("Deployment", PROXY)["spec"]["replicas"] == 2


def test_the_proxy_calls_the_control_plane_service_of_its_own_release(
    defaults: Manifests,
) -> None:
    url = defaults.env("Deployment", PROXY)["VKGATE_CONTROLPLANE_URL"]["value"]
    service = defaults.get("Service", CONTROLPLANE)
    port = service["spec"]["ports"][0]
    assert url == f"http://{CONTROLPLANE}.{NAMESPACE}.svc:{port['port']}"
    assert labels_match(service["spec"]["selector"], pod_labels(defaults, CONTROLPLANE))
    assert not labels_match(service["spec"]["selector"], pod_labels(defaults, PROXY))
    container_ports = defaults.container("Deployment", CONTROLPLANE)["ports"]
    assert port["targetPort"] in [p["name"] for p in container_ports]


def test_another_release_in_the_same_namespace_gets_its_own_control_plane(
    chart: helm.Chart,
) -> None:
    other = render(chart, STORES, release="canary")
    url = other.env("Deployment", "canary-vkgate-proxy")["VKGATE_CONTROLPLANE_URL"]["value"]
    assert url == f"http://canary-vkgate-controlplane.{NAMESPACE}.svc:5560"


@pytest.mark.parametrize("name", ["Deployment/controlplane", "Deployment/proxy", "Job/migrate"])
def test_every_setting_the_chart_passes_is_one_the_services_know(
    defaults: Manifests, name: str
) -> None:
    kind, suffix = name.split("/")
    names = defaults.env(kind, f"{FULLNAME}-{suffix}")
    # Both services refuse unknown VKGATE_* names at start-up.
    assert set(names) <= E.KNOWN


def test_the_services_accept_the_rendered_settings_and_generated_secrets(
    defaults: Manifests,
) -> None:
    controlplane = ControlPlaneSettings.from_env(resolved_env(defaults, "Deployment", CONTROLPLANE))
    assert controlplane.database_url == DATABASE_URL
    assert (controlplane.ledger.kind, controlplane.ledger.host) == ("http", "clickhouse.data.svc")
    assert controlplane.admin_token is not None
    assert (controlplane.host, controlplane.port) == ("0.0.0.0", 5560)
    proxy = ProxySettings.from_env(resolved_env(defaults, "Deployment", PROXY))
    assert proxy.internal_secret == controlplane.internal_secret
    assert (proxy.host, proxy.port, proxy.metrics_port) == ("0.0.0.0", 5563, 9464)
    assert proxy.redis_url is None
    job = resolved_env(defaults, "Job", f"{FULLNAME}-migrate")
    E.check_unknown(job)
    assert database_url(job, E.home(job)) == DATABASE_URL
    assert ledger_location(job, E.home(job)).kind == "http"


def test_the_proxy_holds_only_the_secret_it_uses(defaults: Manifests) -> None:
    env = defaults.env("Deployment", PROXY)
    from_secrets = {name for name, entry in env.items() if "valueFrom" in entry}
    assert from_secrets == {"VKGATE_INTERNAL_SECRET", "VKGATE_INTERNAL_SECRET_PREVIOUS"}


def test_generated_secrets_are_kept_and_have_the_forms_the_services_need(
    defaults: Manifests,
) -> None:
    secret = defaults.get("Secret", f"{FULLNAME}-secrets")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    values = defaults.secret_data(f"{FULLNAME}-secrets")
    assert sorted(values) == sorted(
        [
            "VKGATE_ADMIN_TOKEN",
            "VKGATE_ENCRYPTION_KEY",
            "VKGATE_INTERNAL_SECRET",
            "VKGATE_JWT_SECRET",
            "VKGATE_KEY_PEPPER",
        ]
    )
    assert E.encryption_key(values, "VKGATE_ENCRYPTION_KEY")
    assert len({values["VKGATE_INTERNAL_SECRET"], values["VKGATE_JWT_SECRET"]}) == 2


def test_store_passwords_appear_only_in_secrets(defaults: Manifests) -> None:
    for manifest in defaults.objects:
        if manifest["kind"] != "Secret":
            assert "db-password" not in str(manifest), manifest["metadata"]["name"]
            assert "ch-password" not in str(manifest), manifest["metadata"]["name"]


def test_pods_run_non_root_on_a_read_only_root_with_no_capabilities(
    defaults: Manifests,
) -> None:
    for workload in defaults.workloads():
        pod = pod_spec(workload)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        # Kubernetes would inject VKGATE_CONTROLPLANE_PORT & co. for the release's Services.
        assert pod["enableServiceLinks"] is False
        assert pod["automountServiceAccountToken"] is False
        container = pod["containers"][0]
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        # Every path the process writes is a volume.
        env = {e["name"]: e.get("value") for e in container["env"]}
        mounted = {m["mountPath"] for m in container["volumeMounts"]}
        written = {"/tmp", env["VKGATE_HOME"]} | (
            {env["VKGATE_SPOOL_DIR"]} if "VKGATE_SPOOL_DIR" in env else set()
        )
        assert written <= mounted, workload["metadata"]["name"]


@pytest.mark.parametrize("name", [CONTROLPLANE, PROXY])
def test_probes_are_healthz_for_liveness_and_readyz_for_readiness(
    defaults: Manifests, name: str
) -> None:
    container = defaults.container("Deployment", name)
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}


def test_the_proxy_serves_metrics_where_its_metrics_service_points(defaults: Manifests) -> None:
    container = defaults.container("Deployment", PROXY)
    address = container["env"][[e["name"] for e in container["env"]].index("VKGATE_METRICS_ADDR")]
    port = int(address["value"].rpartition(":")[2])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == port
    service = defaults.get("Service", f"{PROXY}-metrics")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}
    ]
    # The API Service (possibly a LoadBalancer) never publishes metrics.
    assert [p["name"] for p in defaults.get("Service", PROXY)["spec"]["ports"]] == ["http"]


@pytest.mark.parametrize(("grace", "pre_stop"), [(None, None), (30, 10), (7.5, 0)])
def test_pods_may_finish_requests_and_ship_the_spool_before_they_are_killed(
    chart: helm.Chart, grace: float | None, pre_stop: int | None
) -> None:
    values = dict(STORES)
    if grace is not None:
        values |= {"shutdownGraceSeconds": grace, "preStopSleepSeconds": pre_stop}
    manifests = render(chart, values)
    proxy = manifests.env("Deployment", PROXY)
    seconds = float(proxy["VKGATE_SHUTDOWN_GRACE_SECONDS"]["value"])
    hook = manifests.container("Deployment", PROXY).get("lifecycle", {}).get("preStop")
    sleep = int(hook["exec"]["command"][1]) if hook else 0
    assert sleep == (5 if pre_stop is None else pre_stop)
    proxy_grace = pod_spec(manifests.get("Deployment", PROXY))["terminationGracePeriodSeconds"]
    # Requests for the grace, then the spool for the grace again, then the last spans.
    assert proxy_grace >= sleep + 2 * math.ceil(seconds) + 3
    controlplane = pod_spec(manifests.get("Deployment", CONTROLPLANE))
    assert controlplane["terminationGracePeriodSeconds"] >= sleep + math.ceil(seconds)


def test_the_migration_job_may_reach_the_stores_before_it_starts(defaults: Manifests) -> None:
    # Neither service's policy selects the Job's pods; under a default-deny policy they need one.
    job = defaults.get("Job", f"{FULLNAME}-migrate")
    policy = defaults.get("NetworkPolicy", f"{FULLNAME}-migrate")
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    annotations = policy["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert int(annotations["helm.sh/hook-weight"]) < int(
        job["metadata"]["annotations"]["helm.sh/hook-weight"]
    )
    controlplane = defaults.get("NetworkPolicy", CONTROLPLANE)["spec"]["egress"]
    assert policy["spec"]["egress"] == controlplane
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in policy["spec"]


def test_migrations_run_as_a_hook_before_install_and_upgrade(defaults: Manifests) -> None:
    job = defaults.get("Job", f"{FULLNAME}-migrate")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    container = pod_spec(job)["containers"][0]
    assert container["args"] == ["migrate"]
    # The release's own Secrets do not exist yet when a pre-install hook runs.
    hook_secret = defaults.get("Secret", f"{FULLNAME}-migrate-stores")
    assert hook_secret["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    weight = int(hook_secret["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert weight < int(annotations["helm.sh/hook-weight"])
    refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "valueFrom" in e}
    assert refs == {f"{FULLNAME}-migrate-stores"}
    assert "serviceAccountName" not in pod_spec(job)


@pytest.mark.parametrize(
    "name", [f"Deployment/{CONTROLPLANE}", f"Deployment/{PROXY}", f"Job/{FULLNAME}-migrate"]
)
def test_each_container_runs_a_vkgate_command_that_exists(defaults: Manifests, name: str) -> None:
    kind, workload = name.split("/")
    args = defaults.container(kind, workload)["args"]
    assert args[0] in cli.commands


def test_the_proxy_reaches_only_the_control_plane_dns_and_public_providers(
    defaults: Manifests,
) -> None:
    policy = defaults.get("NetworkPolicy", PROXY)["spec"]
    assert labels_match(policy["podSelector"]["matchLabels"], pod_labels(defaults, PROXY))
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    controlplane, dns, providers = policy["egress"]
    (peer,) = controlplane["to"]
    assert labels_match(peer["podSelector"]["matchLabels"], pod_labels(defaults, CONTROLPLANE))
    assert controlplane["ports"] == [{"port": 5560, "protocol": "TCP"}]
    assert "to" not in dns
    assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {(53, "UDP"), (53, "TCP")}
    assert providers["ports"] == [{"port": 443, "protocol": "TCP"}]
    blocks = {b["ipBlock"]["cidr"]: b["ipBlock"]["except"] for b in providers["to"]}
    assert set(blocks) == {"0.0.0.0/0", "::/0"}
    # Cluster-internal and cloud metadata addresses are not "providers".
    for address in ("10.1.2.3", "172.20.0.1", "192.168.1.1", "169.254.169.254", "fd00::1"):
        ip = ipaddress.ip_address(address)
        assert any(
            ip in ipaddress.ip_network(cidr)
            for cidrs in blocks.values()
            for cidr in cidrs
            if ipaddress.ip_network(cidr).version == ip.version
        ), address
    ingress = policy["ingress"]
    assert [rule["ports"][0]["port"] for rule in ingress] == [5563, 9464]


def test_only_the_proxy_calls_the_control_plane_by_default(defaults: Manifests) -> None:
    policy = defaults.get("NetworkPolicy", CONTROLPLANE)["spec"]
    (rule,) = policy["ingress"]
    (peer,) = rule["from"]
    assert labels_match(peer["podSelector"]["matchLabels"], pod_labels(defaults, PROXY))
    ports = {p["port"] for e in policy["egress"] for p in e["ports"] if p["protocol"] == "TCP"}
    assert ports == {53, 5432, 8123, 8443}


def test_without_stores_the_chart_says_which_values_to_set(chart: helm.Chart) -> None:
    message = render_error(chart, {"ledger": {"url": LEDGER_URL}})
    assert "database.url or database.existingSecret.name is required" in message
    message = render_error(chart, {"database": {"url": DATABASE_URL}})
    assert "ledger.url or ledger.existingSecret.name is required" in message


# --- HA --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ha(chart: helm.Chart) -> Manifests:
    return render(chart, HA)


def test_ha_scales_the_proxy_on_cpu_and_requests_in_flight(ha: Manifests) -> None:
    assert "replicas" not in ha.get("Deployment", PROXY)["spec"]
    hpa = ha.get("HorizontalPodAutoscaler", PROXY)["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": PROXY}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (3, 30)
    cpu, in_flight = hpa["metrics"]
    assert cpu["resource"]["name"] == "cpu"
    assert in_flight["type"] == "Pods"
    assert in_flight["pods"]["target"] == {"type": "AverageValue", "averageValue": "300"}
    # The gauge the proxy really serves.
    metrics = ProxyMetrics()
    metrics.sources.in_flight = lambda: 7
    scraped = generate_latest(metrics.registry).decode()
    assert f"\n{in_flight['pods']['metric']['name']} 7.0\n" in scraped


def test_ha_shares_limits_through_redis_and_lets_the_proxy_reach_it(ha: Manifests) -> None:
    env = resolved_env(ha, "Deployment", PROXY, {("vkgate-metrics", "token"): "m" * 40})
    assert ProxySettings.from_env(env).redis_url == REDIS_URL
    egress = ha.get("NetworkPolicy", PROXY)["spec"]["egress"]
    assert {"port": 6379, "protocol": "TCP"} in [p for rule in egress for p in rule["ports"]]
    assert "No Redis" not in ha.notes


def test_ha_leases_limits_for_the_default_time_to_live_on_a_single_redis(ha: Manifests) -> None:
    env = resolved_env(ha, "Deployment", PROXY, {("vkgate-metrics", "token"): "m" * 40})
    settings = ProxySettings.from_env(env)
    assert (settings.redis_cluster, settings.limits_lease_s) == (False, 2.0)


def test_a_redis_cluster_and_the_lease_time_reach_the_proxy(chart: helm.Chart) -> None:
    manifests = render(
        chart, merge(STORES, {"redis": {"url": REDIS_URL, "cluster": True, "leaseSeconds": 1.5}})
    )
    settings = ProxySettings.from_env(resolved_env(manifests, "Deployment", PROXY, {}))
    assert (settings.redis_cluster, settings.limits_lease_s) == (True, 1.5)
    without_redis = render(chart, STORES).env("Deployment", PROXY)
    assert "VKGATE_REDIS_CLUSTER" not in without_redis, "nothing to say without Redis"
    refused = render_error(chart, merge(STORES, {"redis": {"url": REDIS_URL, "leaseSeconds": 0.1}}))
    assert "leaseSeconds" in refused, refused


def test_ha_disruption_budgets_cover_each_service(ha: Manifests) -> None:
    assert ha.get("Deployment", CONTROLPLANE)["spec"]["replicas"] == 3
    for name in (CONTROLPLANE, PROXY):
        budget = ha.get("PodDisruptionBudget", name)["spec"]
        assert labels_match(budget["selector"]["matchLabels"], pod_labels(ha, name))
    assert ha.get("PodDisruptionBudget", CONTROLPLANE)["spec"]["maxUnavailable"] == "34%"


def test_ha_service_monitors_scrape_each_service_with_the_metrics_token(ha: Manifests) -> None:
    monitors = {m["metadata"]["name"]: m for m in ha.all("ServiceMonitor")}
    assert sorted(monitors) == [CONTROLPLANE, PROXY]
    services = ha.all("Service")
    for name, monitor in monitors.items():
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
        selector = monitor["spec"]["selector"]["matchLabels"]
        (service,) = [s for s in services if labels_match(selector, s["metadata"]["labels"])]
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]
        assert endpoint["path"] == "/metrics"
        assert endpoint["bearerTokenSecret"] == {"name": "vkgate-metrics", "key": "token"}
        expected = f"{PROXY}-metrics" if name == PROXY else CONTROLPLANE
        assert service["metadata"]["name"] == expected
    for name in (CONTROLPLANE, PROXY):
        token = ha.env("Deployment", name)["VKGATE_METRICS_TOKEN"]["valueFrom"]
        assert token["secretKeyRef"] == {"name": "vkgate-metrics", "key": "token"}


def test_ha_renders_for_the_oldest_kubernetes_the_chart_supports(chart: helm.Chart) -> None:
    render(chart, merge(HA, INGRESS, PVC_SPOOL), kubernetes_version=OLDEST_KUBERNETES_VERSION)


# --- external stores and existing secrets ----------------------------------------------------


def test_inline_store_urls_are_kept_in_the_releases_secret(chart: helm.Chart) -> None:
    manifests = render(chart, merge(STORES, {"redis": {"url": REDIS_URL}}))
    assert manifests.secret_data(f"{FULLNAME}-stores") == {
        "VKGATE_DATABASE_URL": DATABASE_URL,
        "VKGATE_LEDGER_URL": LEDGER_URL,
        "VKGATE_REDIS_URL": REDIS_URL,
    }
    # The hook copy is only what `vkgate migrate` reads.
    assert sorted(manifests.secret_data(f"{FULLNAME}-migrate-stores")) == [
        "VKGATE_DATABASE_URL",
        "VKGATE_LEDGER_URL",
    ]
    for manifest in manifests.objects:
        if manifest["kind"] != "Secret":
            assert "redis-password" not in str(manifest)


def test_existing_secrets_are_referenced_and_none_is_rendered(chart: helm.Chart) -> None:
    manifests = render(chart, EXISTING_SECRETS)
    assert manifests.all("Secret") == []
    controlplane = manifests.env("Deployment", CONTROLPLANE)
    assert controlplane["VKGATE_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "pg-app",
        "key": "uri",
    }
    assert controlplane["VKGATE_LEDGER_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "clickhouse-app",
        "key": "http-uri",
    }
    for name in ("VKGATE_INTERNAL_SECRET", "VKGATE_KEY_PEPPER", "VKGATE_ENCRYPTION_KEY"):
        assert controlplane[name]["valueFrom"]["secretKeyRef"]["name"] == "vkgate-shared"
    # An existing Secret need not hold an admin token (tokens can be made through the API).
    assert controlplane["VKGATE_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
    proxy = manifests.env("Deployment", PROXY)
    assert proxy["VKGATE_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "redis-app",
        "key": "url",
    }
    job = manifests.env("Job", f"{FULLNAME}-migrate")
    assert job["VKGATE_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "pg-app"
    settings = ControlPlaneSettings.from_env(
        resolved_env(manifests, "Deployment", CONTROLPLANE, EXISTING_VALUES)
    )
    assert settings.admin_token is None
    assert ProxySettings.from_env(
        resolved_env(manifests, "Deployment", PROXY, EXISTING_VALUES)
    ).redis_url == (REDIS_URL)


def test_secrets_given_as_values_are_used_as_given(chart: helm.Chart) -> None:
    given = {
        "internalSecret": "internal-" + "x" * 32,
        "jwtSecret": "jwt-" + "x" * 32,
        "keyPepper": "pepper-" + "x" * 32,
        "encryptionKey": base64.urlsafe_b64encode(bytes(range(32))).decode(),
        "adminToken": "vka-" + "x" * 32,
    }
    manifests = render(chart, merge(STORES, {"secrets": given}))
    values = manifests.secret_data(f"{FULLNAME}-secrets")
    assert values["VKGATE_INTERNAL_SECRET"] == given["internalSecret"]
    assert values["VKGATE_ENCRYPTION_KEY"] == given["encryptionKey"]
    assert values["VKGATE_ADMIN_TOKEN"] == given["adminToken"]


def test_a_rotations_previous_values_reach_the_services_that_accept_them(
    chart: helm.Chart,
) -> None:
    old_key = base64.urlsafe_b64encode(bytes(range(32))).decode()
    rotation = {
        "internalSecret": "internal-new-" + "x" * 32,
        "keyPepper": "pepper-new-" + "x" * 32,
        "encryptionKey": base64.urlsafe_b64encode(bytes(range(32, 64))).decode(),
        "previous": {
            "internalSecret": "internal-old-" + "x" * 32,
            "jwtSecret": "jwt-old-" + "x" * 32,
            "keyPeppers": ["pepper-old-" + "x" * 32, "pepper-older-" + "x" * 32],
            "encryptionKeys": [old_key],
        },
    }
    manifests = render(chart, merge(STORES, {"secrets": rotation}))
    controlplane = ControlPlaneSettings.from_env(
        resolved_env(manifests, "Deployment", CONTROLPLANE)
    )
    assert controlplane.internal_secrets == (rotation["internalSecret"], "internal-old-" + "x" * 32)
    assert controlplane.jwt_secret_previous == "jwt-old-" + "x" * 32
    assert controlplane.key_peppers_previous == tuple(rotation["previous"]["keyPeppers"])
    assert controlplane.encryption_keys_previous == (bytes(range(32)),)
    proxy = ProxySettings.from_env(resolved_env(manifests, "Deployment", PROXY))
    assert proxy.internal_secrets == controlplane.internal_secrets
    # Without a rotation under way, none is set: the services run with the current values.
    plain = ControlPlaneSettings.from_env(
        resolved_env(render(chart, STORES), "Deployment", CONTROLPLANE)
    )
    assert plain.internal_secret_previous is None and plain.key_peppers_previous == ()


def test_an_upgrade_never_generates_new_secrets_it_could_not_read_back(
    chart: helm.Chart,
) -> None:
    # Offline, `lookup` finds nothing: as for an upgrade rendered without the cluster.
    message = render_error(chart, STORES, is_install=False, is_upgrade=True)
    assert "cannot read VKGATE_" in message
    assert "secrets.existingSecret" in message
    render(chart, EXISTING_SECRETS, upgrade=True)


def test_without_generation_every_secret_must_be_given(chart: helm.Chart) -> None:
    message = render_error(chart, merge(STORES, {"secrets": {"generate": False}}))
    assert "VKGATE_INTERNAL_SECRET has no value" in message


# --- ingress -----------------------------------------------------------------------------------


def test_the_ingress_routes_its_hosts_to_the_proxy_api(chart: helm.Chart) -> None:
    manifests = render(chart, INGRESS)
    ingress = manifests.get("Ingress", PROXY)
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [
        {"secretName": "llm-example-tls", "hosts": ["llm.example.com"]}
    ]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "llm.example.com"
    (path,) = rule["http"]["paths"]
    backend = path["backend"]["service"]
    assert backend["name"] == PROXY
    assert backend["port"]["name"] in [
        p["name"] for p in manifests.get("Service", PROXY)["spec"]["ports"]
    ]
    assert "https://llm.example.com/v1" in manifests.notes


# --- spool volume ----------------------------------------------------------------------------


def test_the_spool_is_an_empty_dir_of_bounded_size_by_default(defaults: Manifests) -> None:
    assert defaults.all("PersistentVolumeClaim") == []
    volumes = {v["name"]: v for v in pod_spec(defaults.get("Deployment", PROXY))["volumes"]}
    assert volumes["spool"]["emptyDir"] == {"sizeLimit": "2Gi"}
    env = defaults.env("Deployment", PROXY)
    assert int(env["VKGATE_SPEND_SPOOL_MAX_BYTES"]["value"]) < 2 * 1024**3


def test_a_persistent_spool_is_one_claim_every_replica_shares(chart: helm.Chart) -> None:
    manifests = render(chart, PVC_SPOOL)
    claim = manifests.get("PersistentVolumeClaim", f"{PROXY}-spool")
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["storageClassName"] == "nfs"
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    volumes = {v["name"]: v for v in pod_spec(manifests.get("Deployment", PROXY))["volumes"]}
    assert volumes["spool"] == {
        "name": "spool",
        "persistentVolumeClaim": {"claimName": f"{PROXY}-spool"},
    }
    # The pods' group owns the claim's files.
    assert pod_spec(manifests.get("Deployment", PROXY))["securityContext"]["fsGroup"] == 10001


def test_an_existing_claim_is_mounted_and_none_is_created(chart: helm.Chart) -> None:
    values = merge(PVC_SPOOL, {"proxy": {"spool": {"persistence": {"existingClaim": "spool"}}}})
    manifests = render(chart, values)
    assert manifests.all("PersistentVolumeClaim") == []
    volumes = {v["name"]: v for v in pod_spec(manifests.get("Deployment", PROXY))["volumes"]}
    assert volumes["spool"]["persistentVolumeClaim"] == {"claimName": "spool"}


def test_a_single_node_claim_is_refused_for_several_replicas(chart: helm.Chart) -> None:
    values = merge(
        PVC_SPOOL, {"proxy": {"spool": {"persistence": {"accessModes": ["ReadWriteOnce"]}}}}
    )
    assert "must include ReadWriteMany" in render_error(chart, values)
    render(chart, merge(values, {"proxy": {"replicas": 1}}))


@pytest.mark.parametrize("mode", ["ReadWriteOnce", "ReadWriteOncePod"])
def test_a_single_node_claim_is_updated_by_recreate(chart: helm.Chart, mode: str) -> None:
    # A surge pod could never mount the claim the old pod holds: the rollout would wait for ever.
    values = merge(
        PVC_SPOOL, {"proxy": {"replicas": 1, "spool": {"persistence": {"accessModes": [mode]}}}}
    )
    strategy = render(chart, values).get("Deployment", PROXY)["spec"]["strategy"]
    assert strategy == {"type": "Recreate"}


def test_a_shared_claim_or_none_rolls_pods_over_without_losing_capacity(
    chart: helm.Chart, defaults: Manifests
) -> None:
    for manifests in (defaults, render(chart, PVC_SPOOL)):
        strategy = manifests.get("Deployment", PROXY)["spec"]["strategy"]
        assert strategy["type"] == "RollingUpdate"
        assert strategy["rollingUpdate"]["maxUnavailable"] == 0


# --- other shapes ----------------------------------------------------------------------------


def test_group_zero_is_kept_not_taken_for_unset(chart: helm.Chart) -> None:
    values = merge(STORES, {"podSecurity": {"runAsGroup": 0, "fsGroup": 0}})
    security = pod_spec(render(chart, values).get("Deployment", PROXY))["securityContext"]
    assert (security["runAsUser"], security["runAsGroup"], security["fsGroup"]) == (10001, 0, 0)
    unset = merge(STORES, {"podSecurity": {"runAsUser": None, "fsGroup": None}})
    security = pod_spec(render(chart, unset).get("Deployment", PROXY))["securityContext"]
    assert "runAsUser" not in security and "fsGroup" not in security
    assert security["runAsNonRoot"] is True


def test_an_ipv6_listen_address_is_bracketed_as_the_services_parse_it(chart: helm.Chart) -> None:
    manifests = render(chart, merge(STORES, {"listenHost": "::"}))
    proxy = ProxySettings.from_env(resolved_env(manifests, "Deployment", PROXY))
    assert (proxy.host, proxy.port, proxy.metrics_host) == ("::", 5563, "::")
    settings = ControlPlaneSettings.from_env(resolved_env(manifests, "Deployment", CONTROLPLANE))
    assert (settings.host, settings.port) == ("::", 5560)


def test_several_workers_per_pod_need_the_metrics_listener_off(chart: helm.Chart) -> None:
    message = render_error(chart, merge(STORES, {"proxy": {"workers": 4}}))
    assert "proxy.workers above 1 needs proxy.metrics.enabled=false" in message
    values = merge(STORES, {"proxy": {"workers": 4, "metrics": {"enabled": False}}})
    manifests = render(chart, values)
    proxy = ProxySettings.from_env(resolved_env(manifests, "Deployment", PROXY))
    assert (proxy.workers, proxy.metrics_port) == (4, None)
    assert not manifests.has("Service", f"{PROXY}-metrics")


def test_extra_settings_reach_the_container(chart: helm.Chart) -> None:
    values = merge(
        STORES,
        {
            "proxy": {
                "env": {"VKGATE_MAX_IN_FLIGHT": "4096", "VKGATE_INVALID_KEYS_PER_MINUTE": "5"},
                "extraEnv": [
                    {
                        "name": "VKGATE_TELEMETRY_KEY",
                        "valueFrom": {"secretKeyRef": {"name": "telemetry", "key": "key"}},
                    }
                ],
            }
        },
    )
    manifests = render(chart, values)
    env = manifests.env("Deployment", PROXY)
    assert env["VKGATE_MAX_IN_FLIGHT"]["value"] == "4096"
    assert env["VKGATE_TELEMETRY_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "telemetry"
    settings = ProxySettings.from_env(
        resolved_env(manifests, "Deployment", PROXY, {("telemetry", "key"): "t" * 40})
    )
    assert (settings.max_in_flight, settings.invalid_keys_per_minute) == (4096, 5)
