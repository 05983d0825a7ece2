"""`multipart/form-data` bodies (RFC 7578) read once for their fields, and patched in place.

The audio and image uploads are multipart: the gateway needs a few small text fields of them
(`model`, `stream`, `response_format`, …) and the size of the files, and forwards the body as the
client sent it with only `model` replaced. So a body is scanned once for its delimiters (a bytes
search, at memchr speed), each part is kept as the offsets of its value, and only the text fields
routing needs are decoded; a file is never copied or decoded. Anything malformed is an
`invalid_request` naming what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.errors import ProxyError, invalid

MAX_PARTS = 1_000
"""More parts than any upload of these APIs has: a body of empty parts cannot cost a walk of
millions."""
MAX_HEADER_BYTES = 16 * 1024
"""The most a part's headers may take (they hold a name, a file name and a type)."""
MAX_FIELD_BYTES = 64 * 1024
"""The most a text field the gateway reads may hold (a prompt may be long; a model name not)."""
_CRLF = b"\r\n"
_HEADERS_END = b"\r\n\r\n"


@dataclass(frozen=True, slots=True)
class Part:
    """One part of the form: its name, what it says of itself, and where its value lies."""

    name: str
    filename: str | None
    content_type: str | None
    start: int
    """The value's first byte in the body."""
    end: int
    """One past its last byte."""

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Form:
    body: bytes
    parts: tuple[Part, ...]

    def first(self, name: str) -> Part | None:
        return next((p for p in self.parts if p.name == name), None)

    def text(self, name: str) -> str | None:
        """A text field's value, or None when the form has no such field."""
        part = self.first(name)
        if part is None:
            return None
        if part.filename is not None:
            raise invalid(f"multipart field {name!r} must be a text field, not a file", param=name)
        if part.size > MAX_FIELD_BYTES:
            raise invalid(
                f"multipart field {name!r} is longer than {MAX_FIELD_BYTES} bytes", param=name
            )
        try:
            return self.body[part.start : part.end].decode()
        except UnicodeDecodeError:
            raise invalid(f"multipart field {name!r} is not valid UTF-8", param=name) from None

    def files(self, *names: str) -> list[Part]:
        """The file parts named any of `names`, in order (`image` and `image[]` alike)."""
        return [p for p in self.parts if p.name in names and p.filename is not None]

    def with_value(self, part: Part, value: bytes) -> bytes:
        """The body with `part`'s value replaced by `value`: the rest is joined from views of
        the body, so a large upload is copied once."""
        view = memoryview(self.body)
        return b"".join((view[: part.start], value, view[part.end :]))


def boundary_of(content_type: bytes | None) -> bytes:
    """The boundary a `multipart/form-data` Content-Type names, or the 400 saying what is
    wrong with it."""
    if content_type is None:
        raise invalid("this route takes multipart/form-data; the request has no Content-Type")
    text = content_type.decode("latin-1")
    kind, _, params = text.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        raise invalid(
            f"this route takes multipart/form-data, not {kind.strip() or 'an empty type'!r}"
        )
    for name, value in _parameters(params):
        if name == "boundary":
            # RFC 2046: 1 to 70 characters, and none may end it as a space.
            if not 1 <= len(value) <= 70 or value.endswith(" "):
                raise invalid("the multipart boundary must be 1 to 70 characters")
            return value.encode("latin-1")
    raise invalid("the multipart/form-data Content-Type names no boundary")


def parse(content_type: bytes | None, body: bytes) -> Form:
    """Every part of `body`, or the 400 naming the first thing wrong with it."""
    boundary = boundary_of(content_type)
    dash = b"--" + boundary
    delimiter = _CRLF + dash
    # The first delimiter may open the body; before it may stand a preamble, to be ignored.
    if body.startswith(dash):
        at = len(dash)
    else:
        found = body.find(delimiter)
        if found < 0:
            raise _malformed("no part opens with the boundary the Content-Type names")
        at = found + len(delimiter)
    parts: list[Part] = []
    while True:
        after = body[at : at + 2]
        if after == b"--":
            return Form(body, tuple(parts))  # the closing delimiter: an epilogue may follow
        # Transport padding (spaces, tabs) may stand between a delimiter and its line break.
        while at < len(body) and body[at] in b" \t":
            at += 1
        if not body.startswith(_CRLF, at):
            if at >= len(body):
                raise _malformed("the body ends before its closing boundary (truncated?)")
            raise _malformed("a boundary is not followed by a line break")
        if len(parts) >= MAX_PARTS:
            raise _malformed(f"more than {MAX_PARTS} parts")
        start = at + 2
        headers_end = body.find(_HEADERS_END, start, start + MAX_HEADER_BYTES + 4)
        if headers_end < 0 and body.startswith(_CRLF, start):
            headers_end = start - 2  # a part with no headers at all
        if headers_end < 0:
            if body.find(_HEADERS_END, start) < 0 and len(body) - start <= MAX_HEADER_BYTES:
                raise _malformed("the body ends inside a part's headers (truncated?)")
            raise _malformed(f"a part's headers are longer than {MAX_HEADER_BYTES} bytes")
        value_start = headers_end + 4
        value_end = body.find(delimiter, value_start)
        if value_end < 0:
            raise _malformed("the body ends inside a part (truncated?)")
        parts.append(_part(body[start:headers_end], value_start, value_end, len(parts)))
        at = value_end + len(delimiter)


def _part(headers: bytes, start: int, end: int, index: int) -> Part:
    name = filename = content_type = None
    disposition = False
    for line in headers.split(_CRLF) if headers else ():
        field, colon, value = line.partition(b":")
        if not colon:
            raise _malformed(f"part {index} has a header line without a colon")
        lowered = field.strip().lower()
        text = value.decode("utf-8", "replace").strip()
        if lowered == b"content-disposition":
            kind, _, params = text.partition(";")
            if kind.strip().lower() != "form-data":
                raise _malformed(f"part {index} is not form-data ({kind.strip()!r})")
            disposition = True
            for param, param_value in _parameters(params):
                if param == "name":
                    name = param_value
                elif param == "filename":
                    filename = param_value
        elif lowered == b"content-type":
            content_type = text
    if not disposition:
        raise _malformed(f"part {index} has no Content-Disposition: form-data header")
    if name is None:
        raise _malformed(f"part {index} has no name")
    return Part(name, filename, content_type, start, end)


def _parameters(text: str) -> list[tuple[str, str]]:
    """`; name="value"; other=token` as (lower-cased name, value) pairs; quoted values may
    hold `;` and backslash-escaped quotes."""
    found: list[tuple[str, str]] = []
    at, size = 0, len(text)
    while at < size:
        while at < size and text[at] in "; \t":
            at += 1
        if at >= size:
            break
        equals = text.find("=", at)
        if equals < 0:
            break  # a bare word: no parameter
        name = text[at:equals].strip().lower()
        at = equals + 1
        while at < size and text[at] in " \t":
            at += 1
        if at < size and text[at] == '"':
            at += 1
            chars: list[str] = []
            while at < size and text[at] != '"':
                if text[at] == "\\" and at + 1 < size:
                    at += 1
                chars.append(text[at])
                at += 1
            if at >= size:
                raise _malformed("a quoted parameter of a header is not closed")
            at += 1
            value = "".join(chars)
        else:
            stop = text.find(";", at)
            stop = size if stop < 0 else stop
            value = text[at:stop].strip()
            at = stop
        found.append((name, value))
    return found


def _malformed(what: str) -> ProxyError:
    return invalid(f"malformed multipart/form-data body: {what}")
