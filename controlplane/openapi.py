"""What the OpenAPI document says beyond what Litestar infers: refusals, and CSV answers."""

from __future__ import annotations

from dataclasses import dataclass

from litestar import Litestar
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIResponse, Operation, Schema
from litestar.openapi.spec.enums import OpenAPIType
from litestar.routes import HTTPRoute

from vkgate.wire import ErrorBody

READ_ERRORS = {
    400: "Malformed request (not JSON, or not the shape the route takes)",
    401: "Missing or invalid admin token",
    403: "The token's role may not do this, or the token is bound to an organization",
    404: "No such resource (or one of another organization than the token's)",
    422: "A field or query parameter is invalid; `param` names it",
    429: "Too many failed admin authentications from this address lately; see Retry-After",
}
WRITE_ERRORS = {
    **READ_ERRORS,
    409: "The change conflicts with the resource's current state",
    413: "Request body is larger than VKGATE_CONTROLPLANE_MAX_BODY_BYTES",
}


def document_refusals(app: Litestar) -> None:
    """Declare the error body the exception handlers really send on every route's refusals.

    Left alone, Litestar documents only its own validation error (`{status_code, detail}`),
    which those handlers never answer. Only the declarations change here: the document is
    still built on its first read, so an app that is never asked for it pays nothing.
    """
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for handler in route.route_handlers:
            reads = handler.http_methods <= {"GET", "HEAD"}
            refusals = {
                status: ResponseSpec(ErrorBody, description=text, generate_examples=False)
                for status, text in (READ_ERRORS if reads else WRITE_ERRORS).items()
            }
            handler.responses = {**refusals, **(handler.responses or {})}


@dataclass
class CsvAlternative(Operation):
    """An operation whose 200 is text/csv instead of JSON when asked (`format=csv`).

    Litestar gives a documented response one media type; these routes choose it per request.
    """

    def __post_init__(self) -> None:
        ok = (self.responses or {}).get("200")
        if isinstance(ok, OpenAPIResponse) and ok.content is not None:
            ok.content["text/csv"] = OpenAPIMediaType(schema=Schema(type=OpenAPIType.STRING))
