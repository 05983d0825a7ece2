"""The built-in detectors on plain text, and the stream window on every way a provider may cut
its text into events: what reaches the client is the whole answer redacted, never a match."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.digests import bytes_fingerprint, text_fingerprint
from proxy.documents import Shape, message_texts
from proxy.guardrails import GuardrailBlocked, guardrails_of, screen_request
from proxy.guardrails._detect import PiiDetector, RegexDetector, SecretsDetector, redacted
from proxy.guardrails._stream import StreamScreen
from vkgate.guardrails import PiiConfig, RegexConfig, SecretsConfig
from vkgate.wire import GuardrailSpec

PII = PiiDetector(PiiConfig())
SECRETS = SecretsDetector(SecretsConfig())


@pytest.mark.parametrize(
    ("text", "entity"),
    [
        ("mail jane.doe+tag@mail.example.co.uk now", "email"),
        ("call +44 20 7946 0958 today", "phone"),
        ("call (415) 555-0199 today", "phone"),
        ("call 415-555-0100 today", "phone"),
        ("card 4111 1111 1111 1111 ok", "credit_card"),
        ("card 5500-0000-0000-0004 ok", "credit_card"),
        ("iban GB82 WEST 1234 5698 7654 32 ok", "iban"),
        ("iban DE89370400440532013000 ok", "iban"),
        ("ssn 123-45-6789 ok", "us_ssn"),
        ("host 192.168.10.20 up", "ip_address"),
        ("host 2001:db8::ff00:42:8329 up", "ip_address"),
    ],
)
def test_pii_finds_each_entity(text: str, entity: str) -> None:
    [finding] = PII.find(text)
    assert finding.entity == entity
    assert " " not in text[finding.start : finding.end].strip() or entity in (
        "phone",
        "credit_card",
        "iban",
    )


@pytest.mark.parametrize(
    "text",
    [
        "In 2024 the team shipped 3 releases across 12 regions.",
        "card 4111 1111 1111 1112 fails Luhn",
        "iban GB82 WEST 1234 5698 7654 33 fails mod 97",
        "ssn 666-45-6789 and 000-12-3456 are never issued",
        "version 1.2.3 and 999.1.1.1 are no addresses",
        "an @ alone, and user@localhost without a domain",
        "Note: this has: colons",
    ],
)
def test_pii_passes_over_what_only_looks_like_it(text: str) -> None:
    assert PII.find(text) == []


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("AKIAIOSFODNN7EXAMPLE", "aws_access_key"),
        ("AIzaSyA-1234567890abcdefghijklmnopqrstu", "gcp_api_key"),
        ("sk-proj-Zq3xT9bW2mK7vN4pL8rY1cD6", "openai_key"),
        ("sk-ant-api03-Zq3xT9bW2mK7vN4pL8rY1cD6eF", "anthropic_key"),
        ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "github_token"),
        ("xoxb-1234567890-abcdefghijklmnop", "slack_token"),
        ("sk_live_abcdefghijklmnop1234", "stripe_key"),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlLWhlcmU", "jwt"),
        (
            "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----",
            "private_key",
        ),
    ],
)
def test_secrets_finds_each_kind_whole(text: str, kind: str) -> None:
    [finding] = SECRETS.find(f"token: {text} (rotate it)")
    assert finding.entity == kind
    assert (finding.end - finding.start) == len(text)


@pytest.mark.parametrize(
    "text",
    [
        "a task-force of well-meaning stake-holders",
        "sk-short and AKIA alone",
        "antidisestablishmentarianism is long but no key",
    ],
)
def test_secrets_passes_over_prose(text: str) -> None:
    assert SECRETS.find(text) == []


def test_redaction_names_each_entity_and_keeps_the_rest() -> None:
    text = "to jane@example.com, key AKIAIOSFODNN7EXAMPLE."
    assert redacted(text, PII.find(text) + SECRETS.find(text)) == (
        "to [REDACTED:email], key [REDACTED:aws_access_key]."
    )


def test_an_admin_pattern_that_backtracks_stops_at_its_bound() -> None:
    from proxy.guardrails._detect import DetectorTimeout

    detector = RegexDetector(RegexConfig(patterns={"evil": r"^(a|aa)+$"}), bound_s=0.01)
    with pytest.raises(DetectorTimeout):
        detector.find("a" * 60 + "b")


def test_a_backtracking_pattern_among_others_stops_at_its_bound_in_a_short_text_too() -> None:
    from proxy.guardrails._detect import DetectorTimeout

    patterns = {"ticket": r"\bTICKET-\d{6}\b", "evil": r"^(a|aa)+$"}
    detector = RegexDetector(RegexConfig(patterns=patterns), bound_s=0.01)
    assert detector._any is not None  # the short text is searched for both at once
    with pytest.raises(DetectorTimeout):
        detector.find("a" * 60 + "b")


_ADMIN_PATTERNS = {
    "ticket": r"\bTICKET-\d{6}\b",
    "bird": r"(?i)\bbluebird\b",
    "deploy": r"^\s*deploy\b",
    "end": r"(?m)end$",
    "ahead": r"x{2,}(?=y)",
    "behind": r"(?<![A-Z])AB",
    "dots": r"(?s)a.b",
    "atomic": r"(?>Bx+)y",
}


@settings(max_examples=400, deadline=None)
@given(
    st.text(alphabet="TICKET-0123456789 bluBIRDdeploy\nendxyABa.", max_size=60),
    st.booleans(),
    st.sets(st.sampled_from(sorted(_ADMIN_PATTERNS)), min_size=2),
)
def test_a_short_text_searched_for_all_patterns_at_once_finds_what_each_would(
    text: str, ignore_case: bool, names: set[str]
) -> None:
    config = RegexConfig(
        patterns={n: _ADMIN_PATTERNS[n] for n in sorted(names)}, ignore_case=ignore_case
    )
    detector = RegexDetector(config, bound_s=1.0)
    assert detector._any is not None
    one_by_one = RegexDetector(config, bound_s=1.0)
    one_by_one._any = None
    assert detector.find(text) == one_by_one.find(text)


@pytest.mark.parametrize(
    "pattern",
    [r"(a)\1", r"(?P<x>a)(?P=x)", r"(a)\g<1>", r"(?x) a b", r"a(?i)b", r"(?a)\w+", r"(?V1)x"],
)
def test_a_pattern_that_could_mean_otherwise_in_an_alternation_is_searched_alone(
    pattern: str,
) -> None:
    detector = RegexDetector(RegexConfig(patterns={"t": r"TICKET", "p": pattern}), bound_s=1.0)
    assert detector._any is None


def _chat_events(pieces: list[str]) -> bytes:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        body = {
            "id": "c",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in pieces]
    events.append(chunk({}, "stop"))
    return b"".join(events) + b"data: [DONE]\n\n"


def _streamed_text(data: bytes) -> str:
    text = []
    for event in data.split(b"\n\n"):
        if event.startswith(b"data: {"):
            delta = json.loads(event[6:])["choices"][0]["delta"]
            text.append(delta.get("content") or "")
    return "".join(text)


def _screen(action: str, window: int) -> StreamScreen:
    guards = guardrails_of(
        [GuardrailSpec(id="g", name="pii", stage="response", kind="pii", config={}, action=action)]
    )
    assert guards is not None
    return StreamScreen(guards.response, None, {}, Shape.CHAT, "m", window=window)


ANSWER = (
    "filler " * 20
    + "Write to jane.doe@example.com or call +1 415-555-0100; "
    + "filler " * 30
    + "and mail ops@example.org. "
    + "filler " * 40
)


@settings(max_examples=300, deadline=None)
@given(
    cuts=st.lists(st.integers(1, len(ANSWER) - 1), max_size=60, unique=True),
    feeds=st.integers(1, 7),
    # The last quarter of the window is kept back: entities shorter than that are never cut.
    window=st.sampled_from([128, 256, 512]),
)
def test_a_stream_cut_anywhere_is_redacted_as_the_whole_answer(
    cuts: list[int], feeds: int, window: int
) -> None:
    bounds = [0, *sorted(cuts), len(ANSWER)]
    pieces = [ANSWER[a:b] for a, b in itertools.pairwise(bounds)]
    data = _chat_events(pieces)
    screen = _screen("redact", window)

    async def run() -> bytes:
        out = b""
        step = max(1, len(data) // feeds)
        for i in range(0, len(data), step):
            out += await screen.feed(data[i : i + step])
            assert b"jane.doe" not in out and b"555-0100" not in out and b"ops@" not in out
        return out + await screen.finish()

    out = asyncio.run(run())
    assert _streamed_text(out) == redacted(ANSWER, PII.find(ANSWER))
    assert out.endswith(b"data: [DONE]\n\n")


def test_a_block_leaves_what_was_sent_before_it_clean() -> None:
    pieces = ["safe words " * 3] * 20 + ["now jane.doe@example.com"] + ["more"] * 5
    screen = _screen("block", 64)

    async def run() -> bytes:
        return await screen.feed(_chat_events(pieces))

    with pytest.raises(GuardrailBlocked):
        asyncio.run(run())
    sent = _streamed_text(screen.released)
    assert sent and "jane" not in sent and set(sent.split()) == {"safe", "words"}


def test_a_block_at_the_streams_end_keeps_what_passed_in_its_last_bytes() -> None:
    pieces = ["safe words " * 3] * 20 + ["now jane.doe@example.com"]
    screen = _screen("block", 64)

    async def run() -> bytes:
        # The whole answer arrives as the stream's last bytes: its clean part is released by
        # the feed, the email only when all that is held must go.
        return await screen.close(_chat_events(pieces))

    with pytest.raises(GuardrailBlocked):
        asyncio.run(run())
    sent = _streamed_text(screen.released)
    assert sent and "jane" not in sent and set(sent.split()) == {"safe", "words"}


def test_a_long_text_read_lately_is_not_read_again_and_only_its_fingerprint_is_kept() -> None:
    from proxy.guardrails._guards import Guard, local_findings

    class Counting(PiiDetector):
        __slots__ = ("texts",)

        def __init__(self) -> None:
            super().__init__(PiiConfig())
            self.texts: list[str] = []

        def find(self, text: str) -> list[Any]:
            self.texts.append(text)
            return super().find(text)

    detector = Counting()
    guard = Guard("pii", "pii", "redact", "allow", 1.0, True, True, detector=detector)
    system = "You answer questions about invoices. " * 10 + "Escalate to ops@example.com."
    first = local_findings(guard, {}, "request", [system, "short one"])
    second = local_findings(guard, {}, "request", [system, "another short one"])
    assert first is not None and second is not None
    assert [f.entity for f in first[0]] == [f.entity for f in second[0]] == ["email"]
    assert second[0][0].start == system.index("ops@")
    # The second time only the new message was read.
    assert detector.texts[-1] == "another short one"
    assert guard.seen.keys() == [text_fingerprint(system)]


def test_an_anchored_admin_pattern_is_matched_in_every_message_not_only_the_first() -> None:
    guards = guardrails_of(
        [
            GuardrailSpec(
                id="g",
                name="codes",
                stage="request",
                kind="regex",
                config={"patterns": {"code": r"^CODE-\d+$"}},
                action="block",
            )
        ]
    )
    assert guards is not None
    body = json.dumps(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "You help."},
                {"role": "user", "content": "CODE-1234"},
            ],
        }
    ).encode()
    with pytest.raises(GuardrailBlocked):
        asyncio.run(screen_request(guards, None, {}, Shape.CHAT, body, "m"))


def _three(action: str = "redact") -> Any:
    return guardrails_of(
        [
            GuardrailSpec(
                id=kind,
                name=kind,
                stage="both",
                kind=kind,
                config=config,
                action=action,
            )
            for kind, config in (
                ("regex", {"patterns": {"ticket": r"\bTICKET-\d{3}\b", "bird": r"(?i)bluebird"}}),
                ("pii", {}),
                ("secrets", {}),
            )
        ]
    )


def test_texts_with_nothing_found_pass_every_guardrail_and_keep_only_a_fingerprint() -> None:
    guards = _three()
    system = "You answer questions about invoices, politely and briefly. " * 6
    body = json.dumps(
        {
            "model": "m",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}],
        }
    ).encode()
    for _ in range(2):
        verdicts: dict[str, str] = {}
        assert asyncio.run(screen_request(guards, None, verdicts, Shape.CHAT, body, "m")) is None
        assert verdicts == {
            "request:regex": "passed",
            "request:pii": "passed",
            "request:secrets": "passed",
        }
    # The long system prompt; "hi" is read each time.
    assert guards.request_local.clean.keys() == [text_fingerprint(system)]


def test_a_finding_runs_the_guardrails_in_turn_and_a_clean_text_seen_before_still_counts() -> None:
    guards = _three()
    system = "You answer questions about invoices, politely and briefly. " * 6

    def body(user: str) -> bytes:
        return json.dumps(
            {
                "model": "m",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": user},
                ],
            }
        ).encode()

    asyncio.run(screen_request(guards, None, {}, Shape.CHAT, body("hello"), "m"))
    verdicts: dict[str, str] = {}
    out = asyncio.run(
        screen_request(guards, None, verdicts, Shape.CHAT, body("TICKET-123 to a@b.example"), "m")
    )
    assert out is not None
    sent = json.loads(out)["messages"]
    assert sent[0]["content"] == system
    assert sent[1]["content"] == "[REDACTED:ticket] to [REDACTED:email]"
    assert verdicts == {
        "request:regex": "redacted",
        "request:pii": "redacted",
        "request:secrets": "passed",
    }


def test_a_message_found_clean_is_known_by_its_json_and_only_its_fingerprint_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from proxy import body as B
    from proxy.guardrails import _guards, request_passes

    guards = _three()
    system = {"role": "system", "content": "You answer questions about invoices, briefly. " * 6}
    read: list[bytes] = []

    def counted(message: Any) -> list[str] | None:
        read.append(bytes(message))
        return message_texts(message)

    monkeypatch.setattr(_guards, "message_texts", counted)

    def body(*messages: Any) -> bytes:
        return json.dumps({"model": "m", "messages": list(messages)}).encode()

    def passes(request: bytes, verdicts: dict[str, str]) -> bool:
        return request_passes(guards, verdicts, B.chat_fields(request).messages)

    hello = {"role": "user", "content": "hi"}
    for _ in range(2):
        verdicts: dict[str, str] = {}
        assert passes(body(system, hello), verdicts)
        assert verdicts == {f"request:{k}": "passed" for k in ("regex", "pii", "secrets")}
    # Each message was decoded once, the second request's not at all.
    assert [json.loads(m)["role"] for m in read] == ["system", "user"]
    clean = guards.request_local.clean_messages
    assert clean.keys() == [bytes_fingerprint(json.dumps(m).encode()) for m in (system, hello)]

    # A finding in a new message: the stage does not pass, and screen_request redacts it
    # without asking the pattern guardrails as a whole again.
    found = body(system, {"role": "user", "content": "TICKET-123 to a@b.example"})
    verdicts = {}
    assert not passes(found, verdicts) and verdicts == {}
    out = asyncio.run(screen_request(guards, None, verdicts, Shape.CHAT, found, "m", looked=True))
    assert out is not None
    assert json.loads(out)["messages"][1]["content"] == "[REDACTED:ticket] to [REDACTED:email]"
    assert verdicts["request:regex"] == verdicts["request:pii"] == "redacted"
    assert len(clean) == 2

    # The same text in other JSON (its keys in another order) is read as a new message.
    read.clear()
    assert passes(body({"content": system["content"], "role": "system"}), {})
    assert len(read) == 1 and len(clean) == 3

    # A message this does not read (not an object) leaves the request to screen_request.
    assert not passes(body(system, "a bare string"), {})


_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))
_part = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["text", "input_text", "output_text", "image_url", 3]),
        "text": _json_leaf,
    },
)
_content = st.one_of(_json_leaf, st.lists(st.one_of(_part, _json_leaf), max_size=4))
_message = st.one_of(
    st.fixed_dictionaries({}, optional={"role": st.just("user"), "content": _content}),
    _json_leaf,
)


@settings(max_examples=300, deadline=None)
@given(_message)
def test_a_chat_messages_texts_read_in_c_are_the_documents_slots(message: Any) -> None:
    from proxy.documents import texts

    fast = message_texts(json.dumps(message).encode())
    slow = [c[k] for c, k in texts(Shape.CHAT, {"model": "m", "messages": [message]})]
    # None: a message the fast reader declines; the guardrails then read the document.
    assert fast is None or fast == slow
    if isinstance(message, dict):
        assert fast == slow


_choice = st.one_of(
    st.fixed_dictionaries(
        {"index": st.just(0)},
        optional={
            "message": st.one_of(
                st.none(), st.fixed_dictionaries({}, optional={"content": _content})
            )
        },
    ),
    _json_leaf,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(_choice, max_size=3), _json_leaf))
def test_a_chat_answers_texts_read_in_c_are_the_documents_slots(choices: Any) -> None:
    from proxy.documents import answer_texts, chat_answer_texts

    body = json.dumps({"id": "c", "choices": choices, "usage": {"prompt_tokens": 1}}).encode()
    fast = chat_answer_texts(body)
    slow = [c[k] for c, k in answer_texts(Shape.CHAT, json.loads(body))]
    assert fast is None or fast == slow
    if choices is None or (
        isinstance(choices, list)
        and all(isinstance(c, dict) and isinstance(c.get("message"), dict | None) for c in choices)
    ):
        assert fast == slow


def test_keys_with_the_same_guardrails_share_them_and_what_they_remember() -> None:
    import gc
    import weakref

    from proxy.guardrails._guards import _COMPILED

    first, second = _three(), _three()
    assert first is second  # one set of memories for every key of the project
    assert _three("block") is not first  # another action: other guardrails
    held = weakref.ref(first)
    assert any(compiled is first for compiled in _COMPILED.values())
    del first, second
    gc.collect()
    # Held only while a key's runtime holds them (other tests' sets may go meanwhile).
    assert held() is None
