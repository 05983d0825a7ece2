"""What guardrails cost a request, in process: µs per call of each built-in detector on a prose
prompt, and of a request's request and response stages with none, one and three guardrails,
for prompts never seen before and for one sent again (a guardrail remembers what it found in
a text by the text's digest).

    .venv/bin/python bench/guardrail_cost.py [--bytes 4096] [--n 2000] [--rounds 5]

Each row is timed `--rounds` times (`--n` calls each, interleaved with the other rows) and
printed as its minimum and median: on a shared machine the minimum is the steadier figure.
The prompt is prose with a few numbers and no personal data or credentials (what most prompts
are): the detectors find nothing, and pay for looking.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Callable

from proxy.body import chat_fields
from proxy.documents import Shape
from proxy.guardrails import AnswerScreen, guardrails_of, request_passes, screen_request
from proxy.guardrails._detect import PiiDetector, RegexDetector, SecretsDetector
from proxy.guardrails._guards import SEEN_SIZE
from vkgate.guardrails import PiiConfig, RegexConfig, SecretsConfig
from vkgate.wire import GuardrailSpec

PROSE = (
    "The committee reviewed the quarterly figures and agreed to revisit the plan next month. ",
    "In 2024 the team shipped 3 releases across 12 regions, and the backlog shrank by a third. ",
    "Customers asked for clearer invoices, faster exports and a calmer onboarding flow. ",
    "Before the meeting ends, summarise the open questions and who will answer each of them. ",
)
PATTERNS = {"ticket": r"\bTICKET-\d{6}\b", "codename": r"(?i)\bbluebird\b"}
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Paris, on the Seine."},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 1000, "completion_tokens": 8},
}


def prompt(size: int) -> str:
    text, i = "", 0
    while len(text) < size:
        text += PROSE[i % len(PROSE)]
        i += 1
    return text


def spec(kind: str, config: dict[str, object]) -> GuardrailSpec:
    return GuardrailSpec(
        id=kind, name=kind, stage="both", kind=kind, config=config, action="redact"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=4096)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    text = prompt(args.bytes)

    def body_of(user: str) -> bytes:
        return json.dumps(
            {
                "model": "gpt-4o-mini",
                "messages": [
                    {"role": "system", "content": "You are a concise assistant."},
                    {"role": "user", "content": user},
                ],
                "max_tokens": 64,
            }
        ).encode()

    body = body_of(text)
    # Twice as many distinct prompts as a guardrail remembers, in turn: each is read anew.
    fresh = itertools.cycle([body_of(f"{text} (request {i})") for i in range(2 * SEEN_SIZE)])
    answer = json.dumps(ANSWER).encode()
    one = guardrails_of([spec("pii", {})])
    three = guardrails_of(
        [spec("regex", {"patterns": PATTERNS}), spec("pii", {}), spec("secrets", {})]
    )
    loop = asyncio.new_event_loop()

    async def stages(guards: object, request: bytes) -> None:
        if guards is None:
            return
        # As the gateway does: the messages its chat route read, each looked at in process
        # first, and the request read as a whole only when that is not enough.
        verdicts: dict[str, str] = {}
        messages = chat_fields(request).messages
        if not request_passes(guards, verdicts, messages):  # type: ignore[arg-type]
            await screen_request(guards, None, verdicts, Shape.CHAT, request, "m", looked=True)  # type: ignore[arg-type]
        screen = AnswerScreen.of(guards, None, verdicts, Shape.CHAT, "m")  # type: ignore[arg-type]
        if screen is not None and not screen.passes(answer):
            await screen.plain(answer)

    async def calls(n: int, guards: object, again: bool) -> None:
        for _ in range(n):
            await stages(guards, body if again else next(fresh))

    pii, secrets = PiiDetector(PiiConfig()), SecretsDetector(SecretsConfig())
    regex = RegexDetector(RegexConfig(patterns=PATTERNS), 0.05)
    rows: dict[str, Callable[[int], None]] = {
        f"pii on {args.bytes} B": lambda n: [pii.find(text) for _ in range(n)] and None,
        f"secrets on {args.bytes} B": lambda n: [secrets.find(text) for _ in range(n)] and None,
        f"regex (2 patterns) on {args.bytes} B": lambda n: (
            [regex.find(text) for _ in range(n)] and None
        ),
        "both stages, no guardrail": lambda n: loop.run_until_complete(calls(n, None, False)),
        "both stages, pii, new prompts": lambda n: loop.run_until_complete(calls(n, one, False)),
        "both stages, 3 guardrails, new prompts": lambda n: loop.run_until_complete(
            calls(n, three, False)
        ),
        "both stages, 3 guardrails, prompt again": lambda n: loop.run_until_complete(
            calls(n, three, True)
        ),
    }
    timings: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, run in rows.items():
            started = time.perf_counter()
            run(args.n)
            timings[name].append((time.perf_counter() - started) / args.n * 1e6)
    print(f"| {'µs per call':40} | min | median |")
    print(f"|{'-' * 42}|-----|--------|")
    for name, values in timings.items():
        print(f"| {name:40} | {min(values):.1f} | {statistics.median(values):.1f} |")


if __name__ == "__main__":
    main()
