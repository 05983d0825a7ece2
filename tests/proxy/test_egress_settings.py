"""Reading the egress at start-up: HTTPS_PROXY / HTTP_PROXY / NO_PROXY in both cases, the proxy's
credentials, and VKGATE_PROVIDER_CA_BUNDLE; every malformed value refused, naming it."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from proxy.egress import egress_from_env
from proxy.settings import ProxySettings
from tests.support.certificates import TestCA
from tests.support.env import INTERNAL_SECRET
from vkgate.env import SettingError


def test_the_lowercase_variable_wins_over_the_uppercase_one() -> None:
    egress = egress_from_env(
        {
            "HTTPS_PROXY": "http://upper:1",
            "https_proxy": "http://lower:2",
            "HTTP_PROXY": "http://upper:3",
            "http_proxy": "",  # empty is unset: the uppercase one applies
        }
    )
    assert egress.https_proxy is not None and egress.http_proxy is not None
    assert (egress.https_proxy.address, egress.https_proxy.variable) == ("lower:2", "https_proxy")
    assert (egress.http_proxy.address, egress.http_proxy.variable) == ("upper:3", "HTTP_PROXY")


def test_https_calls_use_the_https_proxy_and_http_calls_the_http_one() -> None:
    egress = egress_from_env({"HTTPS_PROXY": "http://secure:3128", "HTTP_PROXY": "plain:8080"})
    https = egress.proxy_for("https", "api.openai.com", 443)
    http = egress.proxy_for("http", "vllm.example", 80)
    assert https is not None and https.address == "secure:3128"
    assert http is not None and http.address == "plain:8080"
    assert (
        egress_from_env({"HTTP_PROXY": "plain:8080"}).proxy_for("https", "a.example", 443) is None
    )


def test_a_proxy_without_a_scheme_or_port_is_http_on_port_80() -> None:
    egress = egress_from_env({"HTTPS_PROXY": "proxy.corp"})
    assert egress.https_proxy is not None and egress.https_proxy.address == "proxy.corp:80"


def test_credentials_in_the_proxy_url_are_decoded_and_kept_out_of_reprs() -> None:
    settings = ProxySettings.from_env(
        {
            "VKGATE_INTERNAL_SECRET": INTERNAL_SECRET,
            "HTTPS_PROXY": "http://vk%40corp:s3cr%3At@proxy.corp:3128",
        }
    )
    proxy = settings.egress.https_proxy
    assert proxy is not None
    assert proxy.authorization == "Basic " + base64.b64encode(b"vk@corp:s3cr:t").decode()
    shown = repr(settings) + settings.egress.describe()
    assert "s3cr" not in shown and proxy.authorization not in shown
    assert "proxy.corp:3128" in shown


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("https://proxy.corp:3128", "HTTPS_PROXY names a https:// proxy"),
        ("socks5://proxy.corp:1080", "HTTPS_PROXY names a socks5:// proxy"),
        ("http://proxy.corp:3128/path", "HTTPS_PROXY must be http://"),
        ("http://proxy.corp:port", "HTTPS_PROXY is not a URL"),
        ("http://:3128", "HTTPS_PROXY names no host"),
    ],
)
def test_a_proxy_url_that_cannot_be_used_is_refused_naming_the_variable(
    value: str, expected: str
) -> None:
    with pytest.raises(SettingError, match=expected):
        egress_from_env({"HTTPS_PROXY": value})


def test_a_refused_proxy_url_does_not_repeat_its_password() -> None:
    with pytest.raises(SettingError) as refused:
        egress_from_env({"https_proxy": "socks5://vk:hunter2@proxy.corp:1080"})
    assert "hunter2" not in str(refused.value)


def test_no_proxy_takes_names_subdomains_addresses_blocks_and_ports() -> None:
    egress = egress_from_env(
        {
            "HTTPS_PROXY": "http://proxy.corp:3128",
            "NO_PROXY": "internal.example, .svc.cluster.local,*.corp.example,10.0.0.0/8,"
            "192.168.1.7,fd00::/8,[2001:db8::1]:8443,gpu-box:8000",
        }
    )

    def direct(host: str, port: int = 443) -> bool:
        return egress.proxy_for("https", host, port) is None

    assert direct("internal.example") and direct("llm.internal.example")
    assert direct("vllm.ns.svc.cluster.local") and direct("svc.cluster.local")
    assert direct("api.corp.example")
    assert direct("10.1.2.3") and direct("192.168.1.7") and direct("fd00::5")
    assert direct("2001:db8::1", 8443) and not direct("2001:db8::1", 443)
    assert direct("gpu-box", 8000) and not direct("gpu-box", 443)
    assert not direct("api.openai.com")
    assert not direct("notinternal.example")  # a suffix, not a whole label
    assert not direct("192.168.1.8")
    assert not direct("10.example")  # a block matches addresses, not names


def test_no_proxy_star_sends_everything_direct() -> None:
    egress = egress_from_env({"HTTPS_PROXY": "proxy:3128", "no_proxy": "*"})
    assert egress.proxy_for("https", "api.openai.com", 443) is None


def test_loopback_destinations_are_always_direct() -> None:
    egress = egress_from_env({"HTTPS_PROXY": "proxy:3128", "HTTP_PROXY": "proxy:3128"})
    for host in ("localhost", "api.localhost", "127.0.0.1", "127.9.9.9", "::1", "LOCALHOST."):
        assert egress.proxy_for("https", host, 443) is None, host
        assert egress.proxy_for("http", host, 80) is None, host


def test_a_malformed_no_proxy_is_refused_when_a_proxy_is_set_and_ignored_when_not() -> None:
    with pytest.raises(SettingError, match=r"no_proxy holds '<local>', which is not a host name"):
        egress_from_env({"HTTPS_PROXY": "proxy:3128", "no_proxy": "localhost,<local>"})
    with pytest.raises(SettingError, match="NO_PROXY holds 'host:99999', whose port"):
        egress_from_env({"HTTPS_PROXY": "proxy:3128", "NO_PROXY": "host:99999"})
    assert egress_from_env({"no_proxy": "<local>"}).configured is False


def test_the_ca_bundle_must_be_a_pem_file_of_certificates(tmp_path: Path) -> None:
    name = "VKGATE_PROVIDER_CA_BUNDLE"
    with pytest.raises(SettingError, match=f"{name} must name a PEM file .* is not a file"):
        egress_from_env({name: str(tmp_path / "missing.pem")})
    with pytest.raises(SettingError, match="is not a file"):
        egress_from_env({name: str(tmp_path)})
    junk = tmp_path / "junk.pem"
    junk.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    with pytest.raises(SettingError, match=f"{name}: .*junk.pem holds no PEM CA certificate"):
        egress_from_env({name: str(junk)})
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    with pytest.raises(SettingError, match="holds no PEM CA certificate"):
        egress_from_env({name: str(empty)})
    ca = TestCA(tmp_path)
    egress = egress_from_env({name: str(ca.bundle)})
    assert egress.ca_bundle == ca.bundle
    context = egress.provider_tls()
    assert context is not None and len(context.get_ca_certs()) == 1


def test_the_proxy_settings_read_the_proxy_variables_and_still_refuse_unknown_vkgate_ones(
    tmp_path: Path,
) -> None:
    ca = TestCA(tmp_path)
    env = {
        "VKGATE_INTERNAL_SECRET": INTERNAL_SECRET,
        "https_proxy": "http://proxy.corp:3128",
        "NO_PROXY": ".corp",
        "VKGATE_PROVIDER_CA_BUNDLE": str(ca.bundle),
    }
    settings = ProxySettings.from_env(env)
    assert settings.egress.proxy_for("https", "api.openai.com", 443) is not None
    assert settings.egress.ca_bundle == ca.bundle
    assert settings.egress.describe() == (
        "https through proxy.corp:3128 (https_proxy); NO_PROXY: 1 entry, and loopback, "
        f"direct; provider certificates checked against {ca.bundle}"
    )
    with pytest.raises(SettingError, match="VKGATE_PROVIDER_CA_BUNDEL is not a vkgate setting"):
        ProxySettings.from_env({**env, "VKGATE_PROVIDER_CA_BUNDEL": str(ca.bundle)})
    assert (
        ProxySettings.from_env({"VKGATE_INTERNAL_SECRET": INTERNAL_SECRET}).egress.configured
        is False
    )
