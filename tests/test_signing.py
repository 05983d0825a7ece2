"""Request signing: vkgate/signing.py on its own, then the guard in front of the internal API."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import World
from tests.support.clock import ManualClock
from tests.support.env import INTERNAL_SECRET
from vkgate import signing
from vkgate.keys import key_sha256
from vkgate.signing import SignatureProblem

SECRET = "unit-test-internal-secret-0123456789"
NOW = 1_773_144_000.0  # 2026-03-10T12:00:00Z
PATH = "/api/internal/gateway/changes?since=3&timeout_s=10"
BODY = b'{"key_sha256": "00"}'


def _verify(
    *,
    method: str = "POST",
    path_and_query: str = PATH,
    body: bytes = BODY,
    timestamp: str | None = None,
    signature: str | None = None,
    now: float = NOW,
    secret: str = SECRET,
) -> SignatureProblem | None:
    headers = signing.signed_headers(SECRET, "POST", PATH, BODY, NOW)
    return signing.verify(
        secret,
        method,
        path_and_query,
        body,
        headers[signing.TIMESTAMP_HEADER] if timestamp is None else timestamp,
        headers[signing.SIGNATURE_HEADER] if signature is None else signature,
        now,
    )


def test_canonical_string_is_method_path_timestamp_and_body_digest_on_four_lines() -> None:
    canonical = signing.canonical("post", PATH, "1773144000", BODY)
    assert canonical == (f"POST\n{PATH}\n1773144000\n{hashlib.sha256(BODY).hexdigest()}".encode())


def test_canonical_string_of_an_empty_body_carries_the_digest_of_no_bytes() -> None:
    canonical = signing.canonical("GET", "/api/internal/gateway/health", "1", b"")
    assert canonical.split(b"\n")[-1] == (
        b"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )


def test_signature_is_hex_hmac_sha256_of_the_canonical_string() -> None:
    expected = hmac.new(
        SECRET.encode(), signing.canonical("POST", PATH, "1773144000", BODY), hashlib.sha256
    ).hexdigest()
    assert signing.sign(SECRET, "POST", PATH, 1_773_144_000, BODY) == expected


def test_signed_headers_carry_whole_unix_seconds_and_their_signature() -> None:
    headers = signing.signed_headers(SECRET, "POST", PATH, BODY, NOW + 0.9)
    assert headers[signing.TIMESTAMP_HEADER] == "1773144000"
    assert headers[signing.SIGNATURE_HEADER] == signing.sign(
        SECRET, "POST", PATH, 1_773_144_000, BODY
    )


def test_a_fresh_authentic_request_verifies() -> None:
    assert _verify() is None


def test_the_method_is_compared_case_insensitively_and_the_signature_hex_too() -> None:
    signature = signing.sign(SECRET, "POST", PATH, int(NOW), BODY).upper()
    assert _verify(method="post", signature=signature) is None


@pytest.mark.parametrize("missing", ["timestamp", "signature"])
def test_a_request_without_timestamp_or_signature_is_missing(missing: str) -> None:
    problem = _verify(**{missing: ""})  # type: ignore[arg-type]
    assert problem is SignatureProblem.MISSING


@pytest.mark.parametrize(
    "timestamp",
    ["soon", "1773144000.5", "-1773144000", " 1773144000", "1_773_144_000", "9" * 400, "١٢٣"],
    ids=["word", "fraction", "negative", "padded", "underscores", "400-digits", "arabic-digits"],
)
def test_a_timestamp_that_is_not_ascii_unix_seconds_is_malformed_never_an_exception(
    timestamp: str,
) -> None:
    assert _verify(timestamp=timestamp) is SignatureProblem.MALFORMED


@pytest.mark.parametrize(
    "signature",
    ["é" * 64, "0" * 63, "0" * 65, "g" * 64],
    ids=["non-ascii", "short", "long", "not-hex"],
)
def test_a_signature_that_is_not_64_hex_digits_is_malformed_never_an_exception(
    signature: str,
) -> None:
    assert _verify(signature=signature) is SignatureProblem.MALFORMED


@pytest.mark.parametrize("skew", [-300, 300])
def test_a_skew_of_exactly_300_seconds_is_still_accepted(skew: int) -> None:
    assert _verify(now=NOW + skew) is None


@pytest.mark.parametrize("skew", [-301, 301])
def test_a_skew_over_300_seconds_either_way_is_refused(skew: int) -> None:
    assert _verify(now=NOW + skew) is SignatureProblem.SKEW


@pytest.mark.parametrize(
    "tampered",
    [
        {"method": "GET"},
        {"path_and_query": "/api/internal/gateway/changes?since=0&timeout_s=10"},
        {"path_and_query": "/api/internal/gateway/changes"},
        {"body": b'{"key_sha256": "01"}'},
        {"secret": "another-internal-secret-0123456789ab"},
    ],
    ids=["method", "query", "query-dropped", "body", "secret"],
)
def test_any_change_to_what_was_signed_is_a_mismatch(tampered: dict[str, object]) -> None:
    assert _verify(**tampered) is SignatureProblem.MISMATCH  # type: ignore[arg-type]


def test_a_replayed_signature_with_a_new_timestamp_is_a_mismatch() -> None:
    assert _verify(timestamp=str(int(NOW) + 1)) is SignatureProblem.MISMATCH


# --- the guard on /api/internal/gateway/ ---------------------------------------------------------

RESOLVE = "/api/internal/gateway/resolve-key"
HEALTH = "/api/internal/gateway/health"


async def send_signed(
    client: httpx.AsyncClient,
    *,
    signed_at: datetime,
    method: str = "GET",
    path: str = HEALTH,
    body: bytes = b"",
    sign_as: dict[str, Any] | None = None,
    secret: str = INTERNAL_SECRET,
    override: dict[str, str | bytes] | None = None,
) -> httpx.Response:
    """Sign what `sign_as` says (by default what is sent), then send `method path body` with
    the signature headers, replaced by `override` where it names one."""
    what = {"method": method, "path_and_query": path, "body": body, **(sign_as or {})}
    headers: dict[str, str | bytes] = {
        **signing.signed_headers(
            secret, what["method"], what["path_and_query"], what["body"], signed_at.timestamp()
        ),
        **(override or {}),
    }
    return await client.request(
        method, path, content=body, headers={**headers, "content-type": "application/json"}
    )


async def auth_failures(client: httpx.AsyncClient) -> dict[str, float]:
    text = (await client.get("/metrics")).text
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vkgate_controlplane_internal_auth_failures_total"
    }


def assert_bad_signature(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert error["code"] == "bad_signature"
    assert error["type"] == "authentication_error"


async def test_a_signed_request_at_the_clocks_time_passes_the_guard(
    client: httpx.AsyncClient, clock: ManualClock
) -> None:
    response = await send_signed(client, signed_at=clock.now())
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "ok"
    assert await auth_failures(client) == {}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", RESOLVE),
        ("GET", "/api/internal/gateway/config/vk_1"),
        ("GET", "/api/internal/gateway/changes?since=0&timeout_s=0"),
        ("GET", HEALTH),
    ],
    ids=["resolve-key", "config", "changes", "health"],
)
async def test_every_internal_route_refuses_an_unsigned_request(
    client: httpx.AsyncClient, method: str, path: str
) -> None:
    response = await client.request(method, path, json={"key_sha256": "0" * 64})
    assert_bad_signature(response)
    assert await auth_failures(client) == {"missing": 1.0}


CHANGES_SINCE_0 = "/api/internal/gateway/changes?since=0&timeout_s=0"
OTHER_SHA256_BODY = json.dumps({"key_sha256": "1" * 64}).encode()

# How each request breaks its signature: arguments to `send_signed` (on top of a signed POST of
# resolve-key), seconds the clock moves after signing, and the reason the metric counts.
BROKEN: dict[str, tuple[dict[str, Any], int, str]] = {
    "bad-signature": ({"override": {signing.SIGNATURE_HEADER: "0" * 64}}, 0, "mismatch"),
    "wrong-secret": ({"secret": "another-internal-secret-0123456789ab"}, 0, "mismatch"),
    "tampered-body": ({"sign_as": {"body": OTHER_SHA256_BODY}}, 0, "mismatch"),
    "tampered-query": (
        {
            "method": "GET",
            "path": CHANGES_SINCE_0,
            "body": b"",
            "sign_as": {"path_and_query": CHANGES_SINCE_0.replace("since=0", "since=3")},
        },
        0,
        "mismatch",
    ),
    "wrong-method": ({"sign_as": {"method": "PUT"}}, 0, "mismatch"),
    "stale": ({}, 301, "skew"),
    "future": ({}, -301, "skew"),
    "huge-timestamp": ({"override": {signing.TIMESTAMP_HEADER: "9" * 400}}, 0, "malformed"),
    "non-ascii-signature": (
        {"override": {signing.SIGNATURE_HEADER: b"\xe9" * 64}},
        0,
        "malformed",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
async def test_a_request_whose_signature_does_not_hold_is_401_and_counted(
    client: httpx.AsyncClient, world: World, clock: ManualClock, case: str
) -> None:
    how, clock_moves, reason = BROKEN[case]
    body = json.dumps({"key_sha256": key_sha256(world.key)}).encode()
    signed_at = clock.now()
    clock.advance(clock_moves)

    response = await send_signed(
        client, signed_at=signed_at, **{"method": "POST", "path": RESOLVE, "body": body, **how}
    )

    assert_bad_signature(response)
    assert world.key_id not in response.text
    assert await auth_failures(client) == {reason: 1.0}


@pytest.mark.parametrize("age", [300, -300], ids=["300s-old", "300s-ahead"])
async def test_a_signature_up_to_300_seconds_off_the_clock_is_accepted(
    client: httpx.AsyncClient, clock: ManualClock, age: int
) -> None:
    signed_at = clock.now()
    clock.advance(age)
    response = await send_signed(client, signed_at=signed_at)
    assert response.status_code == 200, response.text


async def test_failures_are_counted_by_reason(
    client: httpx.AsyncClient, clock: ManualClock
) -> None:
    await client.get(HEALTH)
    await client.get(HEALTH)
    await send_signed(client, signed_at=clock.now() - timedelta(hours=1))
    await send_signed(client, signed_at=clock.now(), sign_as={"method": "POST"})

    assert await auth_failures(client) == {"missing": 2.0, "skew": 1.0, "mismatch": 1.0}
    text = (await client.get("/metrics")).text
    assert 'vkgate_controlplane_internal_auth_failures_total{reason="missing"} 2.0' in text
