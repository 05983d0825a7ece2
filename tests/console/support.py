"""Helpers for driving the web console over HTTP as a browser would, without one."""

from __future__ import annotations

import re

import httpx

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(page: httpx.Response) -> str:
    found = CSRF.search(page.text)
    assert found, f"no CSRF field on {page.request.url}"
    return found.group(1)


async def sign_in(client: httpx.AsyncClient, token: str) -> str:
    """Signs in with `token` and returns the session's CSRF token (from the overview)."""
    form = await client.get("/console/sign-in")
    assert form.status_code == 200, form.text
    signed = await client.post(
        "/console/sign-in", data={"csrf_token": csrf_of(form), "token": token}
    )
    assert signed.status_code == 303, signed.text
    assert signed.headers["location"] == "/console/"
    overview = await client.get("/console/")
    assert overview.status_code == 200, overview.text
    return csrf_of(overview)


async def post_form(
    client: httpx.AsyncClient, path: str, csrf: str | None, **fields: str
) -> httpx.Response:
    data = dict(fields)
    if csrf is not None:
        data["csrf_token"] = csrf
    return await client.post(path, data=data)
