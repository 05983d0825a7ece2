"""What an operator sees of the proxy: the metrics listener, request logs, readiness, /health.

The metrics are checked against the README's tables (every documented metric is served, and
only bounded label values appear), and the logs and metrics against a request carrying a
distinctive prompt, key and end user, none of which may show up in either.
"""

from __future__ import annotations

import json
import logging
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar import Litestar
from prometheus_client.parser import text_string_to_metric_families

from proxy.settings import ProxySettings
from proxy.telemetry.observe import RequestObserver
from tests.proxy.conftest import (
    CHAT_ALIAS,
    Tenant,
    add_key,
    proxy_settings,
    serve_proxy,
)
from tests.support.clock import ManualClock
from tests.support.fake_openai import API_KEY
from tests.support.processes import free_port
from vkgate.env import SettingError
from vkgate.logs import JsonFormatter, TextFormatter, pseudonym
from vkgate.stopping import StopSignals

README = Path(__file__).resolve().parents[2] / "README.md"
METRICS_TOKEN = "metrics-token-for-the-telemetry-tests-0123"
TELEMETRY_KEY = "telemetry-key-for-the-telemetry-tests-0123"
PROMPT = "the-purple-octopus-recites-its-secret-prompt-7f3c"
END_USER = "alice.private@example.com"
UNKNOWN_MODEL = "a-model-this-key-does-not-know"
REDIS_URL = "redis://127.0.0.1:6379/0"
ROUTES = {"/v1/chat/completions", "/v1/messages", "/v1/embeddings", "/v1/models", "other"}


def documented(section: str) -> set[str]:
    """The metric names in the README table under the heading `section`."""
    text = README.read_text()
    start = text.index(section)
    end = text.find("\n#", start + len(section))
    table = text[start : end if end != -1 else None]
    return set(re.findall(r"^\| `(vkgate_[a-z_]+)`", table, re.MULTILINE))


async def scrape(port: int, token: str | None = METRICS_TOKEN) -> httpx.Response:
    """The metrics listener's answer (asynchronously: it runs on this test's event loop)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(timeout=5) as http:
        return await http.get(f"http://127.0.0.1:{port}/metrics", headers=headers)


def families(text: str) -> dict[str, Any]:
    """The scraped metric families by the name a query uses (a counter's ends in `_total`)."""
    return {
        f"{family.name}_total" if family.type == "counter" else family.name: family
        for family in text_string_to_metric_families(text)
    }


def value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


@contextmanager
def json_log_lines() -> Iterator[list[str]]:
    """Every line the `vkgate` loggers write meanwhile, formatted as deployed (JSON)."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect(level=logging.DEBUG)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("vkgate")
    previous = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": CHAT_ALIAS, "messages": [{"role": "user", "content": PROMPT}], **fields}


async def traffic(http: httpx.AsyncClient, tenant: Tenant, limited_key: str) -> None:
    """One of each thing the metrics count: served after a fallback, streamed, refused for an
    unknown model, for a bad key, and by a rate limit."""
    key = {"Authorization": f"Bearer {tenant.key}", "X-Vkgate-End-User": END_USER}
    assert (await http.post("/v1/chat/completions", json=chat(), headers=key)).status_code == 200
    streamed = await http.post("/v1/chat/completions", json=chat(stream=True), headers=key)
    assert streamed.status_code == 200
    unknown = await http.post(
        "/v1/chat/completions", json={**chat(), "model": UNKNOWN_MODEL}, headers=key
    )
    assert unknown.status_code == 404
    bad = {"Authorization": "Bearer vk-not-a-real-key-but-secret-0123456789"}
    assert (await http.post("/v1/chat/completions", json=chat(), headers=bad)).status_code == 401
    limited = {"Authorization": f"Bearer {limited_key}"}
    statuses = [
        (await http.post("/v1/chat/completions", json=chat(), headers=limited)).status_code
        for _ in range(2)
    ]
    assert statuses == [200, 429]
    assert (await http.get("/v1/models", headers=key)).status_code == 200
    assert (await http.get("/v1/nowhere/at/all", headers=key)).status_code == 404


async def test_every_documented_metric_is_served_with_bounded_labels(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock, failover: Tenant
) -> None:
    _, limited = await add_key(client, failover, limits={"rpm": 1})
    port = free_port()
    settings = proxy_settings(metrics_port=port, metrics_token=METRICS_TOKEN, redis_url=REDIS_URL)
    async with serve_proxy(app, clock, settings) as proxy, proxy.http() as http:
        await traffic(http, failover, limited)
        answer = await scrape(port)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    text = answer.text
    served = families(text)
    missing = documented("### Proxy metrics") - served.keys()
    assert not missing, f"documented but not served: {sorted(missing)}"
    undocumented = {name for name in served if name.startswith("vkgate_")} - documented(
        "### Proxy metrics"
    )
    assert not undocumented, f"served but not documented: {sorted(undocumented)}"

    assert value(text, "vkgate_requests_total", route="/v1/chat/completions", status="200") == 3
    assert (
        value(
            text,
            "vkgate_requests_total",
            route="/v1/chat/completions",
            code="model_not_found",
            model="",
        )
        == 1
    )
    assert value(text, "vkgate_requests_total", code="invalid_api_key") == 1
    assert value(text, "vkgate_requests_total", route="other", status="404") == 1
    assert value(text, "vkgate_requests_total", route="/v1/models", status="200") == 1
    assert value(text, "vkgate_rate_limit_refusals_total", limit="key_rpm") == 1
    assert value(text, "vkgate_provider_attempts_total", provider="live", result="ok") == 3
    assert value(text, "vkgate_provider_attempts_total", provider="dead") == 3
    assert value(text, "vkgate_fallbacks_total", model=CHAT_ALIAS) == 3
    assert value(text, "vkgate_request_duration_seconds_count", route="/v1/chat/completions") == 6
    assert value(text, "vkgate_time_to_first_byte_seconds_count") == 3
    assert value(text, "vkgate_upstream_duration_seconds_count", provider="live") == 3
    assert value(text, "vkgate_auth_cache_lookups_total", result="hit") >= 3
    assert value(text, "vkgate_auth_cache_lookups_total", result="miss") >= 2
    assert value(text, "vkgate_spool_segments") >= 0
    assert value(text, "vkgate_in_flight_requests") == 0
    assert value(text, "vkgate_breaker_state", provider="live") == 0

    for family in served.values():
        for sample in family.samples:
            for label, text_value in sample.labels.items():
                if label == "le":
                    continue
                assert len(text_value) <= 64, (sample.name, label, text_value)
                assert PROMPT not in text_value and not text_value.startswith("vk-")
            if "route" in sample.labels:
                assert sample.labels["route"] in ROUTES


async def test_metrics_listener_asks_for_its_token(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock
) -> None:
    port = free_port()
    settings = proxy_settings(metrics_port=port, metrics_token=METRICS_TOKEN)
    async with serve_proxy(app, clock, settings):
        assert (await scrape(port, token=None)).status_code == 401
        assert (await scrape(port, token="wrong")).status_code == 401
        assert (await scrape(port)).status_code == 200


async def test_no_prompt_key_credential_or_end_user_reaches_a_log_line_or_a_metric(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock, failover: Tenant
) -> None:
    _, limited = await add_key(client, failover, limits={"rpm": 1})
    port = free_port()
    settings = proxy_settings(
        metrics_port=port, metrics_token=METRICS_TOKEN, telemetry_key=TELEMETRY_KEY.encode()
    )
    with json_log_lines() as lines:
        async with serve_proxy(app, clock, settings) as proxy, proxy.http() as http:
            await traffic(http, failover, limited)
            metrics = (await scrape(port)).text
    written = "\n".join(lines)
    secrets = [
        PROMPT,
        failover.key,
        failover.key.removeprefix("vk-"),
        limited,
        "vk-not-a-real-key-but-secret",
        API_KEY,
        END_USER,
        METRICS_TOKEN,
        TELEMETRY_KEY,
    ]
    for secret in secrets:
        assert secret not in written, f"{secret!r} was logged"
        assert secret not in metrics, f"{secret!r} is in the metrics"

    completed = [json.loads(line) for line in lines if '"request_completed"' in line]
    assert len(completed) == 8
    served = completed[0]
    assert served["status"] == 200 and served["route"] == "/v1/chat/completions"
    assert served["vk_id"] == failover.key_id
    assert served["model"] == CHAT_ALIAS and served["provider"] == "live"
    assert served["attempts"] == 2
    assert served["end_user_hash"] == pseudonym(TELEMETRY_KEY.encode(), END_USER)
    assert isinstance(served["duration_ms"], float) and "code" not in served
    refused = [line for line in completed if line.get("code") == "rate_limited"]
    assert len(refused) == 1
    # A model the key does not know is named in the log (that is what went wrong), never in a
    # metric label (a client could send any number of them).
    unknown = next(line for line in completed if line.get("code") == "model_not_found")
    assert unknown["model"] == UNKNOWN_MODEL
    assert UNKNOWN_MODEL not in metrics


def test_an_end_user_is_left_out_without_a_telemetry_key() -> None:
    from proxy.telemetry.metrics import ProxyMetrics

    with json_log_lines() as lines:
        for key in (None, TELEMETRY_KEY.encode()):
            observer = RequestObserver(ProxyMetrics(), lambda: 2.0, telemetry_key=key)
            observer.completed("/v1/embeddings", 200, None, 1.0, b"r", end_user=END_USER)
    unkeyed, keyed = (json.loads(line) for line in lines)
    assert "end_user_hash" not in unkeyed
    assert keyed["end_user_hash"] == pseudonym(TELEMETRY_KEY.encode(), END_USER)
    assert len(keyed["end_user_hash"]) == 16
    assert END_USER not in "\n".join(lines)


async def test_readyz_says_draining_once_a_stop_signal_arrived(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock
) -> None:
    async with serve_proxy(app, clock, proxy_settings()) as proxy, proxy.http() as http:
        await proxy.following_changes()
        assert (await http.get("/readyz")).status_code == 200
        proxy.app.state["running"].stop_signalled("SIGTERM")
        answer = await http.get("/readyz")
        assert (await http.get("/healthz")).status_code == 200
    assert answer.status_code == 503
    assert answer.json()["status"] == "draining"


def test_stop_signals_tell_the_app_first_then_the_server() -> None:
    heard: list[str] = []
    original = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda sig, frame: heard.append("server"))
    try:
        signals = StopSignals(lambda name: heard.append(f"app:{name}"))
        signals.install()
        signal.raise_signal(signal.SIGTERM)
        signals.uninstall()
        signal.raise_signal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, original)
    assert heard == ["app:SIGTERM", "server", "server"]


async def test_health_names_a_refused_signature(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock
) -> None:
    settings = proxy_settings(internal_secret="not-the-control-planes-secret-0123456789")
    async with serve_proxy(app, clock, settings) as proxy, proxy.http() as http:
        answer = await http.get("/health")
    assert answer.status_code == 503
    body = answer.json()["controlplane"]
    assert body["cause"] == "signature"
    assert "VKGATE_INTERNAL_SECRET" in body["fix"]


async def test_health_names_a_control_plane_nobody_listens_for(
    app: Litestar, clock: ManualClock
) -> None:
    settings = proxy_settings(controlplane_url=f"http://127.0.0.1:{free_port()}")
    async with (
        serve_proxy(None, clock, settings, control_transport=httpx.AsyncHTTPTransport()) as proxy,
        proxy.http() as http,
    ):
        answer = await http.get("/health")
    assert answer.status_code == 503
    assert answer.json()["controlplane"]["cause"] == "connect"


def test_request_observer_counts_nothing_but_labels_it_was_given() -> None:
    from proxy.telemetry.metrics import ProxyMetrics
    from vkgate.errors import ErrorCode

    metrics = ProxyMetrics()
    observer = RequestObserver(metrics, lambda: 2.0, log_requests=False)
    observer.completed("/v1/embeddings", 429, ErrorCode.RATE_LIMITED, 1.5, b"req-1")
    text = metrics.render().decode()
    assert value(text, "vkgate_requests_total", code="rate_limited", model="") == 1
    assert value(text, "vkgate_request_duration_seconds_sum", route="/v1/embeddings") == 0.5
    assert "req-1" not in text


def test_a_failing_stop_hook_still_lets_the_server_hear_the_signal() -> None:
    heard: list[str] = []
    original = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda sig, frame: heard.append("server"))

    def broken(name: str) -> None:
        raise RuntimeError("the app's hook failed")

    try:
        signals = StopSignals(broken)
        signals.install()
        with pytest.raises(RuntimeError):
            signal.raise_signal(signal.SIGTERM)
        signals.uninstall()
    finally:
        signal.signal(signal.SIGTERM, original)
    assert heard == ["server"]


@pytest.mark.parametrize(
    ("env", "host", "port"),
    [
        ({}, "127.0.0.1", 9464),
        ({"VKGATE_METRICS_ADDR": "off"}, "127.0.0.1", None),
        ({"VKGATE_METRICS_ADDR": "0.0.0.0:9100"}, "0.0.0.0", 9100),
        # Several workers would each count alone: no listener unless asked for (refused then).
        ({"VKGATE_PROXY_WORKERS": "2"}, "127.0.0.1", None),
        ({"VKGATE_PROXY_WORKERS": "2", "VKGATE_METRICS_ADDR": "off"}, "127.0.0.1", None),
    ],
)
def test_metrics_address_settings(env: dict[str, str], host: str, port: int | None) -> None:
    settings = ProxySettings.from_env({"VKGATE_INTERNAL_SECRET": "s" * 32, **env})
    assert (settings.metrics_host, settings.metrics_port) == (host, port)


def test_a_metrics_address_for_several_workers_is_refused_by_name() -> None:
    with pytest.raises(SettingError, match="VKGATE_METRICS_ADDR cannot be served by 2 worker"):
        ProxySettings.from_env(
            {
                "VKGATE_INTERNAL_SECRET": "s" * 32,
                "VKGATE_PROXY_WORKERS": "2",
                "VKGATE_METRICS_ADDR": "127.0.0.1:9100",
            }
        )


@pytest.mark.parametrize(
    ("raw", "endpoint"),
    [
        ("http://collector:4318", "http://collector:4318"),
        ("http://collector:4318/", "http://collector:4318"),
        ("http://collector:4318/v1/traces", "http://collector:4318"),
    ],
)
def test_the_otel_endpoint_takes_the_base_or_the_traces_url(raw: str, endpoint: str) -> None:
    env = {"VKGATE_INTERNAL_SECRET": "s" * 32, "VKGATE_OTEL_ENDPOINT": raw}
    assert ProxySettings.from_env(env).otel_endpoint == endpoint


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("VKGATE_OTEL_ENDPOINT", "collector:4318", "VKGATE_OTEL_ENDPOINT must be the http"),
        ("VKGATE_OTEL_SAMPLE_RATIO", "1.5", "VKGATE_OTEL_SAMPLE_RATIO must be between 0 and 1"),
        ("VKGATE_TELEMETRY_KEY", "short", "VKGATE_TELEMETRY_KEY must be at least 32"),
        ("VKGATE_LOG_REQUESTS", "maybe", "VKGATE_LOG_REQUESTS must be true or false"),
        ("VKGATE_LOG_FORMAT", "xml", "VKGATE_LOG_FORMAT must be json or text"),
        ("VKGATE_METRICS_ADDR", "nowhere", "VKGATE_METRICS_ADDR must be host:port"),
    ],
)
def test_bad_telemetry_settings_are_refused_by_name(name: str, value: str, message: str) -> None:
    with pytest.raises(SettingError, match=message):
        ProxySettings.from_env({"VKGATE_INTERNAL_SECRET": "s" * 32, name: value})


def test_text_log_lines_cannot_be_forged_by_a_value() -> None:
    formatter = TextFormatter()
    record = logging.LogRecord("vkgate.proxy", logging.INFO, "", 0, "request_completed", (), None)
    record.vkgate_fields = {"model": 'a" b\nfake=1', "status": 200}
    line = formatter.format(record)
    assert "\n" not in line
    assert line.endswith('request_completed model="a\\" b\\nfake=1" status=200')


def test_guardrail_outcomes_counted_by_set_read_out_by_label() -> None:
    from proxy.telemetry.metrics import Outcomes

    labels = ("guardrail", "stage", "outcome")
    outcomes = Outcomes("vkgate_guardrail_outcomes", "help", labels, kept=2)
    clean = {"request:pii": "passed", "response:pii": "passed"}
    for _ in range(3):
        outcomes.add_verdicts(dict(clean))
    outcomes.add_verdicts({"request:pii": "redacted", "response:pii": "passed"})
    # A third distinct set is past what is kept whole: its outcomes are added one by one.
    outcomes.add_verdicts({"request:pii": "blocked"})
    assert len(outcomes.sets) == 2
    assert outcomes.counts() == {
        ("pii", "request", "passed"): 3.0,
        ("pii", "response", "passed"): 4.0,
        ("pii", "request", "redacted"): 1.0,
        ("pii", "request", "blocked"): 1.0,
    }
    samples = {
        (s.labels["guardrail"], s.labels["stage"], s.labels["outcome"]): s.value
        for s in outcomes.family().samples
    }
    assert samples == outcomes.counts()
