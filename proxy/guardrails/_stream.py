"""Response guardrails on a stream: its text read as it passes, through a bounded window.

Events are held back while their text is at most `window` characters; then the held text is
checked whole, and the events that end before the last quarter of the window go on, redacted
where a finding lies in them. A finding that reaches into the kept part holds back from its
start, so a match split between events is still seen whole; an event is never split, so one
longer than the window waits for a quarter window of text after it. Held text past eight
windows goes on regardless (a match that never ends, such as a private-key block without its
end line, cannot hold the stream back without bound). A block ends the stream
with an error event in the client's format: the caller sends it in place of what is held.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from proxy.documents import Shape, Slot, delta_texts, whole_texts
from proxy.guardrails._detect import Finding, _distinct, redacted
from proxy.guardrails._guards import (
    PASSED,
    REDACTED,
    RESPONSE,
    Guard,
    GuardrailBlocked,
    Verdicts,
    digests_of,
    local_findings,
    note,
    screen_texts,
)
from proxy.guardrails._remote import RemoteChecks

WINDOW = 512
"""Characters of a stream's text held back before they are checked and sent on."""
FORCED = 8
"""Held text past this many windows goes on whatever it holds: a match that never ends (a
private-key block with no end line) cannot hold a stream back without bound."""
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_DATA = b"data:"


@dataclass(slots=True)
class _Event:
    raw: bytes
    doc: Any = None
    slots: list[Slot] = field(default_factory=list)
    start: int = 0
    """Where its text begins in the held text."""
    end: int = 0
    edited: bool = False

    def encoded(self) -> bytes:
        if not self.edited:
            return self.raw
        lines = self.raw.split(b"\n")
        for i, line in enumerate(lines):
            if line.startswith(_DATA):
                lines[i] = b"data: " + _encode(self.doc) + (b"\r" if line.endswith(b"\r") else b"")
                break
        return b"\n".join(lines)


def _split(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Whole events (each with its blank line) and what is left of an unfinished one."""
    events: list[bytes] = []
    start = 0
    while True:
        lf = buffer.find(b"\n\n", start)
        crlf = buffer.find(b"\r\n\r\n", start)
        if lf == -1 and crlf == -1:
            return events, buffer[start:]
        end = crlf + 4 if crlf != -1 and (lf == -1 or crlf < lf) else lf + 2
        events.append(buffer[start:end])
        start = end


def _payload(raw: bytes) -> Any:
    for line in raw.split(b"\n"):
        if line.startswith(_DATA):
            data = line[len(_DATA) :].strip()
            if not data or data == b"[DONE]":
                return None
            try:
                return _decode(data)
            except msgspec.DecodeError:
                return None
    return None


class StreamScreen:
    """One stream's response guardrails, fed the client-format bytes the pipe gives out."""

    def __init__(
        self,
        guards: tuple[Guard, ...],
        remote: RemoteChecks | None,
        verdicts: Verdicts,
        shape: Shape,
        model: str,
        window: int = WINDOW,
    ) -> None:
        self._guards = guards
        self._remote = remote
        self._verdicts = verdicts
        self._shape = shape
        self._model = model
        self._window = window
        self._keep = window // 4
        self._buffer = b""
        self._held: list[_Event] = []
        self._text: list[str] = []
        self._length = 0
        self.released = b""
        """What had passed the guardrails in the call that blocked: it goes before the error."""

    async def feed(self, data: bytes) -> bytes:
        events, self._buffer = _split(self._buffer + data)
        out = []
        try:
            for raw in events:
                await self._take(raw)
                # Checked event by event: a chunk of many events goes on up to a block.
                if self._length >= self._window:
                    out.append(await self._release(final=self._length >= FORCED * self._window))
        except GuardrailBlocked:
            self.released = b"".join(out)
            raise
        return b"".join(out)

    async def close(self, data: bytes) -> bytes:
        """The stream's last bytes fed and all that is held released. A block at the end keeps
        in `released` what had passed, as `feed` does."""
        out = await self.feed(data)
        try:
            return out + await self.finish()
        except GuardrailBlocked:
            self.released = out
            raise

    async def finish(self) -> bytes:
        if self._buffer:
            await self._take(self._buffer)
            self._buffer = b""
        return await self._release(final=True)

    async def _take(self, raw: bytes) -> None:
        event = _Event(raw, start=self._length, end=self._length)
        doc = _payload(raw)
        if doc is not None:
            event.doc = doc
            whole = list(whole_texts(self._shape, doc))
            if whole:
                # Repeated whole after its deltas: checked as a plain answer's text is.
                values = [container[key] for container, key in whole]
                if await screen_texts(
                    self._guards, self._remote, self._verdicts, RESPONSE, self._model, values
                ):
                    for (container, key), value in zip(whole, values, strict=True):
                        container[key] = value
                    event.edited = True
            event.slots = list(delta_texts(self._shape, doc))
            for container, key in event.slots:
                self._text.append(container[key])
                self._length += len(container[key])
            event.end = self._length
        self._held.append(event)

    async def _release(self, *, final: bool) -> bytes:
        if not self._held:
            return b""
        text = "".join(self._text)
        findings = self._findings(text)
        boundary = len(text) if final else self._boundary(text, findings)
        count = 0
        while count < len(self._held) and self._held[count].end <= boundary:
            count += 1
        released, self._held = self._held[:count], self._held[count:]
        mine = [f for f in findings if f.end <= boundary]
        sent = text[:boundary]
        replacement = await self._remote_checks(redacted(sent, mine) if mine else sent)
        for event in released:
            if event.slots:
                self._rewrite(event, text, mine, replacement, released)
        # What is kept is renumbered from the start of the held text.
        kept = text[boundary:]
        self._text = [kept] if kept else []
        self._length = len(kept)
        for event in self._held:
            event.start -= boundary
            event.end -= boundary
        return b"".join(event.encoded() for event in released)

    def _findings(self, text: str) -> list[Finding]:
        """Redactions to make in the held text; a block raises, a warning is noted."""
        redact: list[Finding] = []
        verdicts = self._verdicts
        digests = digests_of([text])
        for guard in self._guards:
            if guard.remote:
                continue
            found = local_findings(guard, verdicts, RESPONSE, [text], digests)
            if found is None:
                continue
            if not found[0]:
                note(verdicts, RESPONSE, guard.name, PASSED)
            elif guard.found(verdicts, RESPONSE) == REDACTED:
                redact.extend(found[0])
        return _distinct(redact)

    def _boundary(self, text: str, findings: list[Finding]) -> int:
        """The end of the last event that may go now: before the kept tail, and never inside
        a finding."""
        cut = len(text) - self._keep
        ends = [e.end for e in self._held if e.slots and e.end <= cut]
        boundary = ends[-1] if ends else 0
        moved = True
        while moved and boundary:
            moved = False
            for finding in findings:
                if finding.start < boundary < finding.end:
                    ends = [end for end in ends if end <= finding.start]
                    boundary = ends[-1] if ends else 0
                    moved = True
                    break
        return boundary

    async def _remote_checks(self, text: str) -> str | None:
        """The webhook and moderation guardrails on the text about to go: a replacement for
        it when one redacted it, else None (a block raises)."""
        remote = [g for g in self._guards if g.remote]
        if not remote or not text:
            return None
        values = [text]
        if await screen_texts(
            tuple(remote), self._remote, self._verdicts, RESPONSE, self._model, values
        ):
            return values[0]
        return None

    @staticmethod
    def _rewrite(
        event: _Event,
        text: str,
        findings: list[Finding],
        replacement: str | None,
        released: list[_Event],
    ) -> None:
        if replacement is not None:
            # A webhook rewrote the text whole: the first event carries it, the rest nothing.
            first = next(e for e in released if e.slots) is event
            pieces = [replacement if first else ""]
        else:
            inside = [f for f in findings if f.start < event.end and f.end > event.start]
            if not inside:
                return
            pieces = []
            position = event.start
            for finding in inside:
                if finding.start > position:
                    pieces.append(text[position : finding.start])
                if finding.start >= event.start:
                    pieces.append(f"[REDACTED:{finding.entity}]")
                position = max(position, min(finding.end, event.end))
            pieces.append(text[position : event.end])
        # The event's own text slots take the new text in turn: all of it in the first.
        new_text = "".join(pieces)
        for i, (container, key) in enumerate(event.slots):
            container[key] = new_text if i == 0 else ""
        event.edited = True
