"""One request's cycle on the proxy's HTTP/1.1 protocol: uvicorn's, with the answer's head
made and checked in a few calls instead of a loop over its headers.

uvicorn checks an answer's header names and values with two regular-expression searches per
header: 24 searches for a governed answer's 12 headers. Here every name and every value is
still checked, against the same bytes (a name must be an RFC 9110 token, a value may hold no
control character but tab), but by two `bytes.translate` calls over all the names and all the
values at once, and the head is joined without a Python loop.

Only a common head takes this path: lowercase names (as ASGI asks), and no `transfer-encoding`
or `connection` header. Any other head, a head sent with the access log on or while writing
is paused, the body, `receive` and the handling of errors are uvicorn's.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

_LOWER_TOKEN_BYTES = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz\n"
"""What a lowercase header name may hold (RFC 9110 `tchar`), and the names' separator."""
_VALUE_BYTES = bytes([0x09, *range(0x20, 0x7F), *range(0x80, 0x100)])
"""What a header value may hold: tab, visible ASCII, space and obs-text."""
_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"connection"))
_LENGTH_ONLY = frozenset((b"content-length",))
_NO_BODY = frozenset((204, 304))
_uvicorn_send = RequestResponseCycle.send


class RequestCycle(RequestResponseCycle):
    """uvicorn's request cycle whose `send` makes a common answer head in a few calls."""

    async def send(self, message: Any) -> None:
        if (
            self.response_started
            or self.disconnected
            or self.flow.write_paused
            or self.access_log
            or message["type"] != "http.response.start"
            or not self._common_head(message)
        ):
            await _uvicorn_send(self, message)

    def _common_head(self, message: Any) -> bool:
        """Write the head of `message` if it is a common one (and say whether it was)."""
        headers = [*self.default_headers, *message.get("headers", ())]
        if not headers:
            return False
        names, values = zip(*headers, strict=True)
        if b"\n".join(names).translate(None, _LOWER_TOKEN_BYTES) or b"".join(values).translate(
            None, _VALUE_BYTES
        ):
            return False  # uvicorn lowercases the names, or refuses the head
        framing = _FRAMING.intersection(names)
        if framing and framing != _LENGTH_ONLY:
            return False
        status = message["status"]
        if framing:
            self.expected_content_length = int(values[names.index(b"content-length")])
            self.chunked_encoding = False
        elif status not in _NO_BODY and self.scope["method"] != "HEAD":
            # Neither a length nor an encoding: the body is sent in chunks.
            self.chunked_encoding = True
            headers.append((b"transfer-encoding", b"chunked"))
        if not self.keep_alive:
            headers.append((b"connection", b"close"))
        self.response_started = True
        self.waiting_for_100_continue = False
        self.transport.write(
            b"".join((STATUS_LINE[status], b"\r\n".join(map(b": ".join, headers)), b"\r\n\r\n"))
        )
        return True
