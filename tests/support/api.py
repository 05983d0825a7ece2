"""Small helpers for calling the admin API in tests and checking its error answers."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.env import ADMIN_TOKEN

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ANY: Any = object()
"""For `error_of(..., param=ANY)`: any `param`, or none."""


async def create(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], headers: dict[str, str] = ADMIN
) -> dict[str, Any]:
    """POST that must answer 201; its JSON."""
    response = await client.post(path, json=body, headers=headers)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def error_of(response: httpx.Response, status: int, code: str, param: Any = ANY) -> dict[str, Any]:
    """The error object of a refusal, after checking its status, code and (if given) param."""
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code
    if param is not ANY:
        assert error["param"] == param
    return error


async def walk_pages(client: httpx.AsyncClient, path: str, **filters: str) -> list[dict[str, Any]]:
    """Every item of a list route, one per page, following `next_cursor` to the end."""
    items: list[dict[str, Any]] = []
    params = {**filters, "limit": "1"}
    while True:
        response = await client.get(path, params=params, headers=ADMIN)
        assert response.status_code == 200, response.text
        body = response.json()
        assert len(body["data"]) <= 1
        items.extend(body["data"])
        if body["next_cursor"] is None:
            return items
        assert len(body["data"]) == 1
        params["cursor"] = body["next_cursor"]
