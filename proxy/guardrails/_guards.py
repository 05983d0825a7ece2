"""A key's guardrails compiled from its bundle, and how one text list is screened by them.

Each guardrail that applies leaves an outcome (`passed`, `blocked`, `redacted`, `warned`,
`skipped`) under `<stage>:<name>` in the request's `Verdicts`; the spend record and the metrics
read them from there. A check that did not run (timed out under `on_error: allow`, or not
applicable to the route) is `skipped`, never `passed`. Nothing here logs or keeps the text.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import msgspec

from proxy.digests import Fingerprint, bytes_fingerprint, text_fingerprint
from proxy.documents import message_texts
from proxy.errors import ProxyError
from proxy.guardrails._detect import (
    Detector,
    DetectorTimeout,
    Finding,
    PiiDetector,
    RegexDetector,
    SecretsDetector,
    redacted,
)
from proxy.guardrails._remote import RemoteChecks, RemoteFailed, Verdict
from vkgate.errors import ErrorCode
from vkgate.guardrails import (
    ConfigError,
    ModerationConfig,
    PiiConfig,
    RegexConfig,
    SecretsConfig,
    WebhookConfig,
    parse_config,
)
from vkgate.logs import event
from vkgate.wire import ChainTarget, GuardrailSpec

log = logging.getLogger("vkgate.proxy")
V = TypeVar("V")
REQUEST = "request"
RESPONSE = "response"
PASSED, BLOCKED, REDACTED, WARNED, SKIPPED = "passed", "blocked", "redacted", "warned", "skipped"
_SEVERITY = {SKIPPED: 0, PASSED: 1, WARNED: 2, REDACTED: 3, BLOCKED: 4}
REGEX_BOUND_S = 0.05
"""The most one admin pattern may take over one text, whatever the guardrail's timeout: the
event loop serves every other request meanwhile."""

Verdicts = dict[str, str]
"""`<stage>:<guardrail name>` → outcome, for one request."""


class GuardrailBlocked(ProxyError):
    """400 `guardrail_blocked`, naming the guardrail and the stage, never what matched."""

    def __init__(self, name: str, stage: str, *, failed: bool = False) -> None:
        what = "could not be checked" if failed else "was refused"
        super().__init__(
            ErrorCode.GUARDRAIL_BLOCKED,
            f"guardrail {name!r} blocked the {stage}: it {what}",
            details={"guardrail": name, "stage": stage},
        )
        self.guardrail = name
        self.stage = stage


def note(verdicts: Verdicts, stage: str, name: str, outcome: str) -> None:
    """Record an outcome; a later one replaces it only when more severe (a stream is checked
    window by window)."""
    key = f"{stage}:{name}"
    before = verdicts.get(key)
    if before is None or _SEVERITY[outcome] > _SEVERITY[before]:
        verdicts[key] = outcome


SEEN_SIZE = 1024
"""Texts a pattern guardrail remembers its findings for (a fingerprint and a few positions
each)."""
SEEN_FROM = 256
"""Shorter texts are read again: most are said once (an answer, a new question), and
remembering each would push out the long ones that come again. (A chat request's messages
are all remembered, by their JSON: `LocalStage.clean_messages`.)"""


class Memory(Generic[V]):
    """What a guardrail or a stage learnt of the texts it read lately, by their fingerprints:
    never the texts. A conversation sends its system prompt and every earlier message again with
    each turn, and most keys send one system prompt with every request: the text is the same,
    so what a detector finds in it is too. The least recently used go first, past SEEN_SIZE."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: OrderedDict[Fingerprint, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[Fingerprint]:
        return list(self._entries)

    def get(self, key: Fingerprint) -> V | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: Fingerprint, value: V) -> None:
        self._entries[key] = value
        if len(self._entries) > SEEN_SIZE:
            self._entries.popitem(last=False)


@dataclass(frozen=True, slots=True)
class Guard:
    """One compiled guardrail."""

    name: str
    kind: str
    action: str
    on_error: str
    timeout_s: float
    request: bool
    response: bool
    detector: Detector | None = None
    webhook: WebhookConfig | None = None
    secret: str | None = None
    moderation: ModerationConfig | None = None
    target: ChainTarget | None = None
    seen: Memory[tuple[Finding, ...]] = field(default_factory=Memory)
    """What the detector found in texts it read lately."""

    @property
    def remote(self) -> bool:
        return self.detector is None

    def failed(self, verdicts: Verdicts, stage: str, reason: str) -> None:
        """The check could not run: `on_error` says whether that lets the text through."""
        event(
            log,
            "guardrail_failed",
            logging.WARNING,
            guardrail=self.name,
            stage=stage,
            reason=reason,
            on_error=self.on_error,
        )
        if self.on_error == "block":
            note(verdicts, stage, self.name, BLOCKED)
            raise GuardrailBlocked(self.name, stage, failed=True)
        note(verdicts, stage, self.name, SKIPPED)

    def found(self, verdicts: Verdicts, stage: str) -> str:
        """Something was found: the outcome the action gives it (a block raises)."""
        if self.action == "block":
            note(verdicts, stage, self.name, BLOCKED)
            raise GuardrailBlocked(self.name, stage)
        outcome = REDACTED if self.action == "redact" else WARNED
        note(verdicts, stage, self.name, outcome)
        return outcome


def _compile(spec: GuardrailSpec) -> Guard | None:
    try:
        config = parse_config(spec.kind, spec.config)
    except (ConfigError, KeyError):
        # Checked by the control plane; one this proxy cannot read (a newer kind) is left out.
        log.warning(
            "guardrail %s (%s) skipped: its config is not one this proxy reads", spec.id, spec.kind
        )
        return None
    timeout_s = spec.timeout_ms / 1000
    common = {
        "name": spec.name,
        "kind": spec.kind,
        "action": spec.action,
        "on_error": spec.on_error,
        "timeout_s": timeout_s,
        "request": spec.stage in (REQUEST, "both"),
        "response": spec.stage in (RESPONSE, "both"),
    }
    if isinstance(config, PiiConfig):
        return Guard(**common, detector=PiiDetector(config))  # type: ignore[arg-type]
    if isinstance(config, SecretsConfig):
        return Guard(**common, detector=SecretsDetector(config))  # type: ignore[arg-type]
    if isinstance(config, RegexConfig):
        bound = min(timeout_s, REGEX_BOUND_S)
        return Guard(**common, detector=RegexDetector(config, bound))  # type: ignore[arg-type]
    if isinstance(config, WebhookConfig):
        return Guard(**common, webhook=config, secret=spec.secret)  # type: ignore[arg-type]
    return Guard(**common, moderation=config, target=spec.target)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class LocalStage:
    """A stage whose guardrails all match patterns in this process (pii, secrets, regex).

    Most texts hold nothing any of them looks for: that is learnt with each detector run once
    over the texts (a long text seen lately is not read again), and every guardrail then passes
    in one step. Only when something is found are the guardrails run in turn, each acting on
    what the one before it left (`screen_texts`)."""

    guards: tuple[Guard, ...]
    passed: dict[str, str]
    """`<stage>:<name>` → `passed` for each guardrail: the verdicts when nothing is found."""
    clean: Memory[bool] = field(default_factory=Memory)
    """Long texts in which none of the stage's guardrails found anything."""
    clean_messages: Memory[bool] = field(default_factory=Memory)
    """Chat messages in which nothing was found, by the fingerprint of their JSON as sent: most
    keys send one system prompt with every request, and a conversation its earlier messages
    with every turn, byte for byte; these are known without being decoded."""

    @classmethod
    def of(cls, guards: tuple[Guard, ...], stage: str) -> LocalStage | None:
        if not guards or any(g.remote for g in guards):
            return None
        return cls(guards, {f"{stage}:{g.name}": PASSED for g in guards})

    def passes(self, texts: list[str], verdicts: Verdicts) -> bool:
        """Whether every guardrail passes `texts` as they are (then noted in `verdicts`)."""
        if self.nothing_found(texts):
            verdicts.update(self.passed)
            return True
        return False

    def passes_messages(self, messages: list[msgspec.Raw], verdicts: Verdicts) -> bool:
        """`passes` for a chat request's messages, each its JSON as sent; False also when a
        message is not one `message_texts` reads."""
        unread: list[str] = []
        digests: list[Fingerprint] = []
        clean = self.clean_messages
        for message in messages:
            # Short ones too (a system prompt, "continue"): the fingerprint costs far less
            # than a read by every guardrail.
            known = bytes_fingerprint(message)
            if clean.get(known):
                continue
            digests.append(known)
            texts = message_texts(message)
            if texts is None:
                return False
            unread.extend(texts)
        if unread and not self._finds_nothing(unread):
            return False
        for known in digests:
            clean.put(known, True)
        verdicts.update(self.passed)
        return True

    def nothing_found(self, texts: list[str]) -> bool:
        """Whether no guardrail finds anything in `texts`; False also when a detector ran out
        of time (the guardrails in turn then apply their `on_error`)."""
        unread: list[str] = []
        digests: list[Fingerprint] = []
        clean = self.clean
        for text in texts:
            if len(text) >= SEEN_FROM:
                known = text_fingerprint(text)
                if clean.get(known):
                    continue
                digests.append(known)
            unread.append(text)
        if unread and not self._finds_nothing(unread):
            return False
        for known in digests:
            clean.put(known, True)
        return True

    def _finds_nothing(self, texts: list[str]) -> bool:
        """Every detector once over `texts` (joined where it may be): True when none finds
        anything and none ran out of time; one call on the hot path where each costs."""
        joined = texts[0] if len(texts) == 1 else SEPARATOR.join(texts)
        try:
            for guard in self.guards:
                detector = guard.detector
                assert detector is not None
                if detector.joins or len(texts) == 1:
                    if detector.find(joined):
                        return False
                elif any(detector.find(text) for text in texts):
                    return False
        except DetectorTimeout:
            return False
        return True


@dataclass(frozen=True, slots=True, weakref_slot=True)
class KeyGuardrails:
    """The guardrails of a key, by stage, in the order the control plane gave them. Keys with
    the same guardrails (a project's, an organization's) share one: and with it what its
    stages and guardrails remember of texts, whose memory then grows with the sets of
    guardrails, not with the keys."""

    request: tuple[Guard, ...]
    response: tuple[Guard, ...]
    request_local: LocalStage | None = None
    """The request stage's guardrails when they all run in this process."""
    response_local: LocalStage | None = None
    warns: bool = False
    """Whether a guardrail's action is `warn`: only then can an answer carry a warning."""


_COMPILED: weakref.WeakValueDictionary[bytes, KeyGuardrails] = weakref.WeakValueDictionary()
"""Compiled guardrails by their specs, while a key's runtime holds them."""
_spec_bytes = msgspec.json.Encoder().encode


def guardrails_of(specs: Iterable[GuardrailSpec]) -> KeyGuardrails | None:
    """The compiled guardrails, or None for a key that has none: such keys pay nothing."""
    specs = list(specs)
    if not specs:
        return None
    identity = _spec_bytes(specs)
    shared = _COMPILED.get(identity)
    if shared is None:
        shared = _compiled(specs)
        if shared is not None:
            _COMPILED[identity] = shared
    return shared


def _compiled(specs: list[GuardrailSpec]) -> KeyGuardrails | None:
    guards = [g for g in map(_compile, specs) if g is not None]
    if not guards:
        return None
    request = tuple(g for g in guards if g.request)
    response = tuple(g for g in guards if g.response)
    return KeyGuardrails(
        request=request,
        response=response,
        request_local=LocalStage.of(request, REQUEST),
        response_local=LocalStage.of(response, RESPONSE),
        warns=any(g.action == "warn" for g in guards),
    )


SEPARATOR = "\n\x00\n"
"""Between the texts of a request when they are scanned as one: no pattern here matches
across it (`.` stops at a line end, no entity holds a NUL)."""


def digests_of(texts: list[str]) -> list[Fingerprint | None]:
    """Each long text's fingerprint for `Guard.seen`, made once for every guardrail that reads it."""
    return [text_fingerprint(text) if len(text) >= SEEN_FROM else None for text in texts]


def local_findings(
    guard: Guard,
    verdicts: Verdicts,
    stage: str,
    texts: list[str],
    digests: list[Fingerprint | None] | None = None,
) -> list[list[Finding]] | None:
    """What a pattern guardrail found in each text, or None when it could not run (a block
    raises); an outcome is noted unless something was found (the caller decides).

    A text it read lately is not read again (`Guard.seen`). The others are scanned joined, in one
    call: each call has a fixed cost (a pattern's set-up, a translation), which a conversation
    of many short messages would pay once a message."""
    detector = guard.detector
    assert detector is not None
    per_text: list[list[Finding]] = [[] for _ in texts]
    if digests is None:
        digests = digests_of(texts)
    unread: list[int] = []
    for i, digest in enumerate(digests):
        if digest is not None:
            known = guard.seen.get(digest)
            if known is not None:
                per_text[i] = list(known)
                continue
        unread.append(i)
    if not unread:
        return per_text
    try:
        if len(unread) == 1 or not detector.joins:
            found = {i: detector.find(texts[i]) for i in unread}
        else:
            found = _split_findings(
                detector.find(SEPARATOR.join(texts[i] for i in unread)),
                [texts[i] for i in unread],
                unread,
            )
    except DetectorTimeout:
        guard.failed(verdicts, stage, "pattern_timeout")
        return None
    for i, findings in found.items():
        per_text[i] = findings
        digest = digests[i]
        if digest is not None:
            guard.seen.put(digest, tuple(findings))
    return per_text


def _split_findings(
    found: list[Finding], texts: list[str], indexes: list[int]
) -> dict[int, list[Finding]]:
    """Findings in the joined texts, by the index (in `indexes`) of the text each lies in."""
    per_text: dict[int, list[Finding]] = {i: [] for i in indexes}
    starts = []
    position = 0
    for text in texts:
        starts.append(position)
        position += len(text) + len(SEPARATOR)
    for finding in found:
        k = bisect_right(starts, finding.start) - 1
        start = starts[k]
        end = min(finding.end - start, len(texts[k]))
        if finding.start - start < end:
            per_text[indexes[k]].append(Finding(finding.start - start, end, finding.entity))
    return per_text


async def remote_verdict(
    guard: Guard,
    remote: RemoteChecks | None,
    verdicts: Verdicts,
    stage: str,
    model: str,
    texts: list[str],
) -> Verdict | None:
    """A webhook's or moderation's verdict in time, or None when it gave none (then `on_error`
    decided, and a block raised)."""
    if remote is None:
        guard.failed(verdicts, stage, "no_client")
        return None
    try:
        async with asyncio.timeout(guard.timeout_s):
            if guard.webhook is not None:
                if guard.secret is None:
                    raise RemoteFailed("no secret")
                return await remote.webhook(
                    guard.webhook,
                    guard.secret,
                    guardrail=guard.name,
                    stage=stage,
                    model=model,
                    texts=texts,
                )
            assert guard.moderation is not None
            if guard.target is None:
                raise RemoteFailed("no moderation provider")
            flagged = await remote.moderation(guard.moderation, guard.target, texts)
            return Verdict("block" if flagged else "allow")
    except TimeoutError:
        guard.failed(verdicts, stage, "timeout")
    except RemoteFailed as exc:
        guard.failed(verdicts, stage, str(exc))
    return None


async def screen_texts(
    guards: tuple[Guard, ...],
    remote: RemoteChecks | None,
    verdicts: Verdicts,
    stage: str,
    model: str,
    texts: list[str],
) -> bool:
    """Run every guardrail over `texts` in order, redacting them in place; whether any text
    changed. A block raises `GuardrailBlocked`."""
    changed = False
    digests: list[Fingerprint | None] | None = None
    for guard in guards:
        if not guard.remote:
            if digests is None:
                digests = digests_of(texts)
            found = local_findings(guard, verdicts, stage, texts, digests)
            if found is None:
                continue
            if not any(found):
                note(verdicts, stage, guard.name, PASSED)
                continue
            if guard.found(verdicts, stage) == REDACTED:
                for i, findings in enumerate(found):
                    if findings:
                        texts[i] = redacted(texts[i], findings)
                changed = True
                digests = None  # the texts changed
            continue
        verdict = await remote_verdict(guard, remote, verdicts, stage, model, texts)
        if verdict is None:
            continue
        if verdict.action == "allow":
            note(verdicts, stage, guard.name, PASSED)
        elif verdict.action == "redact" and guard.action == "redact" and verdict.texts is not None:
            note(verdicts, stage, guard.name, REDACTED)
            texts[:] = verdict.texts
            changed = True
            digests = None
        elif guard.action == "warn":
            note(verdicts, stage, guard.name, WARNED)
        else:
            # The webhook would block (or redact, for a guardrail whose action is block).
            note(verdicts, stage, guard.name, BLOCKED)
            raise GuardrailBlocked(guard.name, stage)
    return changed


def skipped(guards: Iterable[Guard], verdicts: Verdicts, stage: str) -> None:
    """The route has nothing these guardrails read: each is skipped, not passed."""
    for guard in guards:
        note(verdicts, stage, guard.name, SKIPPED)


def warnings(verdicts: Verdicts) -> tuple[tuple[bytes, bytes], ...]:
    """`X-Vkgate-Guardrail-Warning` naming every guardrail that warned, when one did."""
    names = sorted(
        {key.partition(":")[2] for key, outcome in verdicts.items() if outcome == WARNED}
    )
    if not names:
        return ()
    # A name is configuration, but a header must not carry a line break or other control.
    value = "".join(c for c in ", ".join(names) if c.isprintable())
    return ((b"x-vkgate-guardrail-warning", value.encode("utf-8", "replace")),)
