"""Fuzzing the admin and finance API from its own OpenAPI document, with three kinds of caller.

Schemathesis turns each documented operation into a Hypothesis strategy of requests, valid
and invalid; the app answers in-process, in the test's event loop, on a throwaway SQLite
database that holds a few real objects so path parameters hit existing ids too.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import cache
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import APIOperation, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from controlplane.app import create_app
from controlplane.db import Database, create_engine
from controlplane.migrate import upgrade
from controlplane.settings import ControlPlaneSettings, LedgerLocation
from tests.conftest import seed_world, serve_in_loop
from tests.support.api import ADMIN, create
from tests.support.clock import ManualClock
from tests.support.env import secrets_env
from vkgate.errors import ERRORS, ErrorCode

BASE_URL = "http://controlplane.test"
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# Small enough that the whole module runs in about a minute on a 2-core machine.
EXAMPLES = 8
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def _openapi_document() -> dict[str, Any]:
    # Building the app opens nothing (engines and the ledger connect on first use), and its
    # routes do not depend on settings: any valid ones describe the same API.
    app = create_app(ControlPlaneSettings.from_env(secrets_env("sqlite:///unused.db")))
    return app.openapi_schema.to_schema()


SCHEMA = schemathesis.openapi.from_dict(_openapi_document())


def _operations() -> dict[str, APIOperation[Any, Any, Any, Any]]:
    operations: dict[str, APIOperation[Any, Any, Any, Any]] = {}
    for result in SCHEMA.get_all_operations():
        # An operation schemathesis cannot read is a defect of the document itself.
        assert isinstance(result, Ok), result
        operation = result.ok()
        operations[operation.label] = operation
    return operations


OPERATIONS = _operations()
READS = sorted(label for label, op in OPERATIONS.items() if op.method.upper() not in MUTATING)
# Admin tokens are credentials: listing them is for admins only, whatever the method.
ADMIN_ONLY_READS = frozenset({"GET /api/admin/tokens"})
WRITES = sorted(label for label, op in OPERATIONS.items() if op.method.upper() in MUTATING)


@dataclass(frozen=True)
class Target:
    """The running app, an HTTP client for it, and real ids by path parameter name."""

    client: httpx.AsyncClient
    finance_token: str
    known: dict[str, str]


@pytest.fixture(scope="module")
async def target(
    tmp_path_factory: pytest.TempPathFactory, ledger_location: LedgerLocation
) -> AsyncIterator[Target]:
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'controlplane.db'}"
    upgrade(url)
    # Every garbage-token case fails from the same client address: throttling it after 30
    # would answer the rest 429 (tests/robustness/test_security.py pins that behaviour).
    cp_settings = dataclasses.replace(
        ControlPlaneSettings.from_env(secrets_env(url)),
        ledger=ledger_location,
        admin_auth_failures_per_minute=1_000_000,
    )
    database = Database(create_engine(url))
    app = create_app(cp_settings, clock=ManualClock(), database=database)
    try:
        async with serve_in_loop(app, BASE_URL) as client:
            yield Target(client, *await _seed(client))
    finally:
        await database.close()


async def _seed(client: httpx.AsyncClient) -> tuple[str, dict[str, str]]:
    """One of each resource; the finance token, and the ids by path parameter name."""
    world = await seed_world(client, {"name": "main", "kind": "mock"}, "mock-small")
    budget = (
        await create(
            client,
            "/api/admin/budgets",
            {
                "organization_id": world.org,
                "scope": {"kind": "project", "id": world.project},
                "window": "month",
                "limit_usd": "10",
            },
        )
    )["id"]
    finance = await create(client, "/api/admin/tokens", {"name": "finance", "role": "finance"})
    # A token of its own for the revoke route, so fuzzing it never revokes the finance caller.
    spare = (await create(client, "/api/admin/tokens", {"name": "spare", "role": "finance"}))["id"]
    known = {
        "organization_id": world.org,
        "team_id": world.team,
        "project_id": world.project,
        "provider_id": world.provider,
        "policy_id": world.policy,
        "vk_id": world.key_id,
        "budget_id": budget,
        "token_id": spare,
    }
    return finance["token"], known


@cache
def _cases(label: str, known_items: tuple[tuple[str, str], ...]) -> st.SearchStrategy[Any]:
    """Valid and invalid requests for one operation, some of them aimed at existing ids."""
    operation = OPERATIONS[label]
    known = dict(known_items)
    strategies = [
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    ]
    path = [p.name for p in operation.path_parameters]
    aimed: dict[str, Any] = {}
    if path and all(name in known for name in path):
        aimed["path_parameters"] = {name: known[name] for name in path}
    # The other query parameters are still generated around the ones given.
    query = {p.name: known[p.name] for p in operation.query if p.name in known}
    if query:
        aimed["query"] = query
    variants = [aimed] if aimed else []
    if query and any(p.name == "format" for p in operation.query):
        variants.append({**aimed, "query": {**query, "format": "csv"}})
    for variant in variants:
        strategies += [
            operation.as_strategy(GenerationMode.POSITIVE, **variant),
            operation.as_strategy(GenerationMode.NEGATIVE, **variant),
        ]
    return st.one_of(strategies)


async def _send(target: Target, case: Any, authorization: str | None) -> httpx.Response:
    """The case as an HTTP request, with `authorization` in place of whatever it generated."""
    kwargs = case.as_transport_kwargs(base_url=BASE_URL)
    headers = {
        name: value
        for name, value in kwargs["headers"].items()
        if name.lower() not in {"authorization", "connection", "accept-encoding"}
    }
    if authorization is not None:
        headers["Authorization"] = authorization
    content: bytes | None = None
    if "json" in kwargs:
        content = json.dumps(kwargs["json"]).encode()
    elif kwargs.get("data") is not None:
        data = kwargs["data"]
        content = data if isinstance(data, bytes) else str(data).encode()
    return await target.client.request(
        kwargs["method"],
        kwargs["url"],
        params=kwargs.get("params") or None,
        headers=headers,
        content=content,
    )


def _routes_to_its_operation(case: Any) -> bool:
    """Whether the request's path still names the operation after URL decoding.

    A path parameter that decodes to nothing, to a `/`, or to a dot segment yields another
    path (or another route), which may rightly answer 404 or 405 before any guard runs.
    """
    for value in (case.path_parameters or {}).values():
        text = unquote(str(value))
        if not text or "/" in text or text in {".", ".."}:
            return False
    return True


def _assert_error_shape(response: httpx.Response) -> dict[str, Any]:
    """A refusal is `{"error": {message, type, code, param}}`, its code matching its status."""
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "code", "param"}, error
    assert isinstance(error["message"], str) and error["message"], error
    code = ErrorCode(error["code"])
    assert ERRORS[code].status == response.status_code, (response.status_code, error)
    assert error["type"] == ERRORS[code].openai_type, error
    assert error["param"] is None or isinstance(error["param"], str), error
    return error


async def _fuzz_once(target: Target, label: str, case: Any, authorization: str | None) -> int:
    response = await _send(target, case, authorization)
    case.validate_response(response, checks=CHECKS)
    if response.status_code >= 400:
        _assert_error_shape(response)
    return response.status_code


def _known(target: Target) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(target.known.items()))


@pytest.mark.parametrize("label", sorted(OPERATIONS))
@FUZZ
@given(data=st.data())
async def test_admin_token_never_breaks_the_contract(
    target: Target, label: str, data: st.DataObject
) -> None:
    case = data.draw(_cases(label, _known(target)), label="case")
    await _fuzz_once(target, label, case, ADMIN["Authorization"])


@pytest.mark.parametrize("label", READS)
@FUZZ
@given(data=st.data())
async def test_finance_token_reads_within_the_contract(
    target: Target, label: str, data: st.DataObject
) -> None:
    case = data.draw(_cases(label, _known(target)), label="case")
    status = await _fuzz_once(target, label, case, f"Bearer {target.finance_token}")
    if not _routes_to_its_operation(case):
        return
    if label in ADMIN_ONLY_READS:
        assert status == 403, status
    else:
        assert status not in {401, 403}, status


@pytest.mark.parametrize("label", WRITES)
@FUZZ
@given(data=st.data())
async def test_finance_token_never_changes_anything(
    target: Target, label: str, data: st.DataObject
) -> None:
    case = data.draw(_cases(label, _known(target)), label="case")
    status = await _fuzz_once(target, label, case, f"Bearer {target.finance_token}")
    if _routes_to_its_operation(case):
        assert status == 403, status
    else:
        assert status in {403, 404, 405}, status


# No header at all, other schemes, empty and unknown bearer tokens, and near-misses of the
# real admin token (a prefix, a different case, padded inside).
GARBAGE_AUTHORIZATION = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "",
            "Bearer",
            "Bearer ",
            "Basic YWRtaW46YWRtaW4=",
            ADMIN["Authorization"][:-1],
            ADMIN["Authorization"].upper(),
            ADMIN["Authorization"].replace("Bearer ", "Bearer  x"),
            "Token " + ADMIN["Authorization"].removeprefix("Bearer "),
        ]
    ),
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=60).map(
        lambda token: f"Bearer {token}"
    ),
)


@pytest.mark.parametrize("label", sorted(OPERATIONS))
@FUZZ
@given(data=st.data())
async def test_without_a_valid_token_every_route_answers_401(
    target: Target, label: str, data: st.DataObject
) -> None:
    case = data.draw(_cases(label, _known(target)), label="case")
    authorization = data.draw(GARBAGE_AUTHORIZATION, label="authorization")
    response = await _send(target, case, authorization)
    case.validate_response(response, checks=CHECKS)
    error = _assert_error_shape(response)
    if _routes_to_its_operation(case):
        assert response.status_code == 401, (response.status_code, error)
        assert response.headers["www-authenticate"] == "Bearer"
    else:
        assert response.status_code in {401, 404, 405}, (response.status_code, error)


# Explicit requests for what fuzzing found: the document described Litestar's own validation
# error (`{status_code, detail}`) and no other refusal, and the spend routes' JSON as a string.


async def _conforms(target: Target, case: Any, authorization: str | None, status: int) -> None:
    response = await _send(target, case, authorization)
    assert response.status_code == status, response.text
    case.validate_response(response, checks=CHECKS)
    if status >= 400:
        _assert_error_shape(response)


async def test_served_schema_describes_refusals_with_the_error_body(target: Target) -> None:
    response = await target.client.get("/schema/openapi.json")
    assert response.status_code == 200
    document = response.json()
    schemas = document["components"]["schemas"]

    def resolved(schema: dict[str, Any]) -> dict[str, Any]:
        found: dict[str, Any] = (
            schemas[schema["$ref"].rsplit("/", 1)[1]] if "$ref" in schema else schema
        )
        return found

    for path, item in document["paths"].items():
        for method, operation in item.items():
            for status in ("400", "401", "403", "404", "422"):
                content = operation["responses"][status]["content"]["application/json"]
                body = resolved(content["schema"])
                assert body["required"] == ["error"], (path, method, status)
                detail = resolved(body["properties"]["error"])
                assert {"message", "type", "code"} <= set(detail["required"]), (path, method)


async def test_refusals_conform_to_the_schema(target: Target) -> None:
    orgs = OPERATIONS["GET /api/admin/organizations/{organization_id}"]
    missing = orgs.Case(path_parameters={"organization_id": "org_missing"})
    await _conforms(target, missing, ADMIN["Authorization"], 404)
    await _conforms(target, missing, None, 401)
    listing = OPERATIONS["GET /api/admin/organizations"].Case(query={"limit": "0"})
    await _conforms(target, listing, ADMIN["Authorization"], 422)
    creation = OPERATIONS["POST /api/admin/organizations"]
    await _conforms(
        target, creation.Case(body={"name": "x"}), f"Bearer {target.finance_token}", 403
    )
    await _conforms(target, creation.Case(body={"name": "acme"}), ADMIN["Authorization"], 409)


@pytest.mark.parametrize("label", ["GET /api/spend/report", "GET /api/spend/ledger"])
@pytest.mark.parametrize("format", ["json", "csv"])
async def test_spend_answers_conform_to_the_schema(target: Target, label: str, format: str) -> None:
    query = {"organization_id": target.known["organization_id"], "format": format}
    case = OPERATIONS[label].Case(query=query)
    await _conforms(target, case, f"Bearer {target.finance_token}", 200)
