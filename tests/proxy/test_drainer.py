"""The drainer against a fake ledger: order, acks, back-off, refusals, shutdown; the signed
`ship_spend` call; and the proxy's start-up and shutdown wiring of spool and drainer."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import re
from pathlib import Path

import httpx
import msgspec
import pytest
from litestar.testing import AsyncTestClient

from proxy.app import create_app
from proxy.control import ControlPlaneClient, Refused, Unreachable
from proxy.spend.drainer import Ship, SpoolDrainer
from proxy.spend.spool import SpendSpool, SpoolError
from tests.proxy.conftest import proxy_settings
from tests.proxy.spool_support import FakeLedger, SteppedClock, record
from tests.support.env import INTERNAL_SECRET
from vkgate import signing
from vkgate.errors import ErrorCode
from vkgate.spend import SPEND_COMMANDS_PATH, SpendAck, SpendSegment
from vkgate.wire import INTERNAL_PREFIX, HealthResponse

DOWN = Unreachable("control plane answered 503")


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


@pytest.fixture
def spool(tmp_path: Path, clock: SteppedClock) -> SpendSpool:
    return SpendSpool.open(tmp_path / "spool", clock, replica_id="r0")


def segments_of(spool: SpendSpool, *sizes: int) -> list[str]:
    """Write and seal one segment of each size; their ids, oldest first."""
    for size in sizes:
        for n in range(size):
            spool.append(record(f"r{spool.seq + 1}-{n}"))
        spool.seal()
    return [segment.segment_id for segment in spool.pending_segments()]


def drainer_for(
    spool: SpendSpool, ship: Ship, clock: SteppedClock, **options: object
) -> tuple[SpoolDrainer, list[float]]:
    """A drainer whose waits only move the stepped clock on, and the waits it asked for."""
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.elapse(seconds)
        await asyncio.sleep(0)

    drainer = SpoolDrainer(spool, ship, clock, sleep=sleep, **options)  # type: ignore[arg-type]
    return drainer, slept


async def test_sealed_segments_are_shipped_oldest_first_and_deleted(
    spool: SpendSpool, clock: SteppedClock
) -> None:
    ids = segments_of(spool, 3, 2, 4)
    ledger = FakeLedger()
    drainer, _ = drainer_for(spool, ledger, clock)
    await drainer.step()
    assert ledger.calls == ids
    assert [rec.seq for rec in ledger.records] == list(range(1, 10))
    assert spool.pending_segments() == []
    assert not [p for p in spool.directory.iterdir() if p.suffix == ".seg"]
    stats = spool.stats()
    assert (stats.shipped_segments, stats.shipped_records, stats.bytes) == (3, 9, 0)
    spool.close()


async def test_the_pass_seals_what_was_written_since_the_last_one(
    spool: SpendSpool, clock: SteppedClock
) -> None:
    ledger = FakeLedger()
    drainer, _ = drainer_for(spool, ledger, clock, interval_s=1.0)
    spool.append(record("a"))
    assert await drainer.step() == 1.0  # not yet due: nothing sealed, nothing shipped
    assert ledger.calls == []
    clock.elapse(1.0)
    await drainer.step()
    assert [rec.request_id for rec in ledger.records] == ["a"]
    spool.close()


async def test_a_segment_is_kept_until_its_ack(spool: SpendSpool, clock: SteppedClock) -> None:
    segments_of(spool, 2)
    [segment] = spool.pending_segments()
    seen_on_disk: list[bool] = []

    async def ship(body: bytes) -> SpendAck:
        seen_on_disk.append(segment.path.exists())
        raise DOWN

    drainer = SpoolDrainer(spool, ship, clock)
    await drainer.step()
    assert seen_on_disk == [True]
    assert spool.pending_segments() == [segment] and segment.path.exists()
    assert drainer.failures == 1 and drainer.retry_in_s == 1.0
    spool.close()


async def test_failures_back_off_1_2_4_to_60_s_and_a_success_resets_it(
    spool: SpendSpool, clock: SteppedClock
) -> None:
    segments_of(spool, 1, 1)
    # Nine failures; the first segment goes; the second fails once, then goes too.
    script: list[Exception | None] = [*[DOWN] * 9, None, DOWN, None]
    ledger = FakeLedger()
    attempts: list[float] = []
    done = asyncio.Event()

    async def ship(body: bytes) -> SpendAck:
        attempts.append(clock.monotonic())
        outcome = script.pop(0)
        if outcome is not None:
            raise outcome
        ack = await ledger(body)
        if not script:
            done.set()
        return ack

    drainer, _ = drainer_for(spool, ship, clock)
    drainer.start()
    await asyncio.wait_for(done.wait(), timeout=30)
    await drainer.stop(grace_s=5)
    waits = [round(b - a, 6) for a, b in itertools.pairwise(attempts)]
    # 9 failures: 1 2 4 8 16 32 60 60 60; the success ships the first segment and (at once)
    # tries the second, which fails: back to 1 s.
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60, 0, 1]
    assert spool.pending_segments() == []
    assert len(ledger.segments) == 2
    spool.close()


async def test_sealing_goes_on_while_shipping_backs_off(
    spool: SpendSpool, clock: SteppedClock
) -> None:
    ledger = FakeLedger(*[DOWN] * 20)
    drainer, _ = drainer_for(spool, ledger, clock)
    for _ in range(10):
        spool.append(record())
        clock.elapse(1.0)
        await drainer.step()
    # One seal a second, whatever the back-off; three tries in ten seconds (t = 0, 1, 3, 7).
    assert len(spool.pending_segments()) == 10
    assert len(ledger.calls) == 4
    spool.close()


async def test_records_written_while_a_backlog_ships_are_still_sealed_on_time(
    spool: SpendSpool, clock: SteppedClock
) -> None:
    segments_of(spool, 1, 1, 1, 1)
    ledger = FakeLedger()

    async def slow(body: bytes) -> SpendAck:
        clock.elapse(0.6)  # each round trip takes a while
        if len(ledger.calls) < 4:
            spool.append(record("during"))
        return await ledger(body)

    drainer, _ = drainer_for(spool, slow, clock, interval_s=1.0)
    await drainer.step()
    # One pass: the backlog, and what came in meanwhile, sealed at the interval and shipped.
    assert [rec.request_id for rec in ledger.records].count("during") == 4
    assert len(ledger.calls) == 6
    assert spool.pending_segments() == []
    spool.close()


async def test_a_refused_segment_is_set_aside_and_the_next_one_ships(
    spool: SpendSpool, clock: SteppedClock
) -> None:
    ids = segments_of(spool, 2, 2)
    ledger = FakeLedger(Refused(ErrorCode.VALIDATION_ERROR, "segment_id is malformed"))
    drainer, _ = drainer_for(spool, ledger, clock)
    await drainer.step()
    assert ledger.calls == ids
    assert [segment.segment_id for segment in ledger.segments] == ids[1:]
    assert (spool.directory / "rejected" / f"{ids[0]}.seg").exists()
    assert spool.stats().rejected_segments == 1 and spool.pending_segments() == []
    spool.close()


async def test_a_segment_without_one_good_line_is_never_shipped(
    spool: SpendSpool, clock: SteppedClock
) -> None:
    [bad, good] = segments_of(spool, 1, 1)
    spool.pending_segments()[0].path.write_bytes(b"garbage\n")
    ledger = FakeLedger()
    drainer, _ = drainer_for(spool, ledger, clock)
    await drainer.step()
    assert ledger.calls == [good]
    assert (spool.directory / "rejected" / f"{bad}.seg").exists()
    spool.close()


async def test_an_ack_for_another_segment_is_a_failure(
    spool: SpendSpool, clock: SteppedClock
) -> None:
    segments_of(spool, 1)

    async def confused(body: bytes) -> SpendAck:
        return SpendAck(segment_id="something-else", accepted=1, duplicates=0)

    drainer = SpoolDrainer(spool, confused, clock)
    await drainer.step()
    assert len(spool.pending_segments()) == 1 and drainer.failures == 1
    spool.close()


async def test_a_segment_shipped_again_after_a_crash_is_only_duplicates(
    tmp_path: Path, clock: SteppedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = SpendSpool.open(tmp_path, clock)
    [segment_id] = segments_of(first, 3)
    ledger = FakeLedger()

    class Crash(Exception):
        pass

    def die(segment: object, loaded: object) -> None:
        raise Crash

    # The ledger acknowledges; the process dies before it deletes the segment.
    monkeypatch.setattr(first, "acknowledge", die)
    with pytest.raises(Crash):
        await SpoolDrainer(first, ledger, clock).ship_ready()
    first.close()
    again = SpendSpool.open(tmp_path, clock)
    acks: list[SpendAck] = []

    async def ship(body: bytes) -> SpendAck:
        acks.append(await ledger(body))
        return acks[-1]

    await SpoolDrainer(again, ship, clock).ship_ready()
    assert ledger.calls == [segment_id, segment_id]
    assert (acks[0].accepted, acks[0].duplicates) == (0, 3)
    assert len(ledger.records) == 3
    assert again.pending_segments() == []
    again.close()


async def test_a_full_segment_wakes_the_drainer_at_once(
    tmp_path: Path, clock: SteppedClock
) -> None:
    spool = SpendSpool.open(tmp_path, clock, segment_max_bytes=1000)
    ledger = FakeLedger()
    ledger.calls_wanted = 1
    # An hour between passes: only the wake can make this one ship.
    drainer = SpoolDrainer(spool, ledger, clock, interval_s=3600)
    drainer.start()
    await asyncio.sleep(0)
    for n in range(6):
        spool.append(record(f"r{n}"))
    await asyncio.wait_for(ledger.called.wait(), timeout=10)
    await drainer.stop(grace_s=5)
    assert len(ledger.records) == 6
    spool.close()


async def test_a_full_segment_is_sealed_alone_and_the_next_one_fills_for_an_interval(
    tmp_path: Path, clock: SteppedClock
) -> None:
    spool = SpendSpool.open(tmp_path, clock, segment_max_bytes=1000)
    ledger = FakeLedger()
    drainer, _ = drainer_for(spool, ledger, clock, interval_s=1.0)
    clock.elapse(0.9)
    for n in range(7):
        spool.append(record(f"r{n}"))  # about 190 bytes each: the sixth fills the segment
    assert await drainer.step() == 1.0
    assert [rec.request_id for rec in ledger.records] == [f"r{n}" for n in range(6)]
    clock.elapse(0.5)  # past the interval the drainer began with, not the one since the fill
    await drainer.step()
    assert len(ledger.calls) == 1
    clock.elapse(0.5)
    await drainer.step()
    assert [rec.request_id for rec in ledger.records][6:] == ["r6"]
    assert len(ledger.calls) == 2
    spool.close()


class TestShutdown:
    async def test_shutdown_seals_and_ships_everything_it_can(
        self, spool: SpendSpool, clock: SteppedClock
    ) -> None:
        segments_of(spool, 2)
        spool.append(record("late"))  # after the last pass
        ledger = FakeLedger()
        drainer, _ = drainer_for(spool, ledger, clock)
        await drainer.stop(grace_s=5)
        assert [rec.seq for rec in ledger.records] == [1, 2, 3]
        assert spool.pending_segments() == []
        spool.close()

    async def test_shutdown_stops_at_the_first_failure_and_leaves_the_rest(
        self, spool: SpendSpool, clock: SteppedClock
    ) -> None:
        ids = segments_of(spool, 1, 1, 1)
        ledger = FakeLedger("ok", DOWN)
        drainer, _ = drainer_for(spool, ledger, clock)
        await drainer.stop(grace_s=5)
        assert ledger.calls == ids[:2]
        assert [s.segment_id for s in spool.pending_segments()] == ids[1:]
        assert all(s.path.exists() for s in spool.pending_segments())
        spool.close()

    async def test_shutdown_gives_up_when_the_grace_runs_out(
        self, spool: SpendSpool, clock: SteppedClock
    ) -> None:
        ids = segments_of(spool, 1, 1)
        ledger = FakeLedger("hang")
        drainer, _ = drainer_for(spool, ledger, clock)
        await drainer.stop(grace_s=0.05)  # the control plane never answers
        assert ledger.calls == ids[:1]
        assert [s.segment_id for s in spool.pending_segments()] == ids
        assert not any(s.in_flight for s in spool.pending_segments())
        spool.close()


# -- the signed call ----------------------------------------------------------------------------


def fake_control_plane(
    clock: SteppedClock, answer: httpx.Response | None = None
) -> tuple[httpx.MockTransport, list[SpendSegment]]:
    """spend-commands, in process: checks the signature, then answers `answer` or acks."""
    received: list[SpendSegment] = []

    def handle(request: httpx.Request) -> httpx.Response:
        if (refusal := _unsigned_or_elsewhere(request, clock)) is not None:
            return refusal
        if answer is not None:
            return answer
        segment = msgspec.json.decode(request.content, type=SpendSegment)
        received.append(segment)
        return _ack(segment)

    return httpx.MockTransport(handle), received


def gzip_control_plane(
    clock: SteppedClock, *, reads_gzip: bool
) -> tuple[httpx.MockTransport, list[tuple[str | None, SpendSegment]]]:
    """spend-commands answering `Accept-Encoding: gzip` on every success; a gzip body is read
    (`reads_gzip`) or refused with a 400, as a replica that cannot read it would."""
    received: list[tuple[str | None, SpendSegment]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == INTERNAL_PREFIX + "/health":
            health = HealthResponse(
                status="ok", revision=1, time="2026-03-10T12:00:00Z", version="t"
            )
            return httpx.Response(
                200, content=msgspec.json.encode(health), headers={"Accept-Encoding": "gzip"}
            )
        if (refusal := _unsigned_or_elsewhere(request, clock)) is not None:
            return refusal
        encoding = request.headers.get("content-encoding")
        body = request.content
        if encoding == "gzip":
            if not reads_gzip:
                return httpx.Response(400, json={"error": {"code": "x", "message": "not JSON"}})
            body = gzip.decompress(body)
        segment = msgspec.json.decode(body, type=SpendSegment)
        received.append((encoding, segment))
        answer = _ack(segment)
        answer.headers["Accept-Encoding"] = "gzip"
        return answer

    return httpx.MockTransport(handle), received


def _unsigned_or_elsewhere(request: httpx.Request, clock: SteppedClock) -> httpx.Response | None:
    path = request.url.raw_path.decode()
    problem = signing.verify(
        INTERNAL_SECRET,
        request.method,
        path,
        request.content,
        request.headers.get(signing.TIMESTAMP_HEADER),
        request.headers.get(signing.SIGNATURE_HEADER),
        clock.time(),
    )
    if problem is not None:
        return httpx.Response(401, json={"error": {"code": "bad_signature", "message": ""}})
    if path != INTERNAL_PREFIX + SPEND_COMMANDS_PATH:
        return httpx.Response(503)  # the change feed and the rest: down
    return None


def _ack(segment: SpendSegment) -> httpx.Response:
    ack = SpendAck(segment_id=segment.segment_id, accepted=len(segment.records), duplicates=0)
    return httpx.Response(200, content=msgspec.json.encode(ack))


def client(clock: SteppedClock, transport: httpx.MockTransport) -> ControlPlaneClient:
    return ControlPlaneClient("http://cp.test", INTERNAL_SECRET, clock, transport=transport)


class TestShipSpend:
    async def test_a_signed_segment_is_acknowledged(
        self, spool: SpendSpool, clock: SteppedClock
    ) -> None:
        transport, received = fake_control_plane(clock)
        control = client(clock, transport)
        [segment_id] = segments_of(spool, 2)
        await SpoolDrainer(spool, control.ship_spend, clock).ship_ready()
        assert [s.segment_id for s in received] == [segment_id]
        assert spool.pending_segments() == []
        await control.close()
        spool.close()

    @pytest.mark.parametrize(
        ("status", "code"),
        [
            (400, ErrorCode.INVALID_REQUEST),
            (422, ErrorCode.VALIDATION_ERROR),
        ],
    )
    async def test_a_malformed_segment_is_refused(
        self, clock: SteppedClock, status: int, code: ErrorCode
    ) -> None:
        answer = httpx.Response(status, json={"error": {"code": "x", "message": "bad records"}})
        control = client(clock, fake_control_plane(clock, answer)[0])
        with pytest.raises(Refused) as refused:
            await control.ship_spend(b"{}")
        assert refused.value.code is code and refused.value.message == "bad records"
        await control.close()

    @pytest.mark.parametrize("status", [401, 403, 404, 409, 429, 500, 503])
    async def test_anything_else_is_tried_again_later(
        self, clock: SteppedClock, status: int
    ) -> None:
        answer = httpx.Response(status, json={"error": {"code": "x", "message": "no"}})
        control = client(clock, fake_control_plane(clock, answer)[0])
        with pytest.raises(Unreachable):
            await control.ship_spend(b"{}")
        await control.close()

    async def test_segments_go_gzipped_to_a_control_plane_that_says_it_takes_them(
        self, spool: SpendSpool, clock: SteppedClock
    ) -> None:
        transport, received = gzip_control_plane(clock, reads_gzip=True)
        control = client(clock, transport)
        ids = segments_of(spool, 3, 2)
        await SpoolDrainer(spool, control.ship_spend, clock).ship_ready()
        # Nothing had answered before the first shipment: the control plane was asked first.
        assert [(encoding, s.segment_id) for encoding, s in received] == [
            ("gzip", ids[0]),
            ("gzip", ids[1]),
        ]
        assert [len(s.records) for _, s in received] == [3, 2]
        assert control.gzip_segments
        assert spool.pending_segments() == []
        await control.close()
        spool.close()

    async def test_a_gzip_segment_refused_goes_again_as_it_is(
        self, spool: SpendSpool, clock: SteppedClock
    ) -> None:
        transport, received = gzip_control_plane(clock, reads_gzip=False)
        control = client(clock, transport)
        control.gzip_segments = True  # as a reading replica's answer would have set it
        [segment_id] = segments_of(spool, 2)
        await SpoolDrainer(spool, control.ship_spend, clock).ship_ready()
        assert [(encoding, s.segment_id) for encoding, s in received] == [(None, segment_id)]
        assert spool.pending_segments() == []
        await control.close()
        spool.close()

    async def test_a_gzip_segment_refused_by_a_reader_of_gzip_is_not_sent_again(
        self, clock: SteppedClock
    ) -> None:
        sent: list[str | None] = []

        def handle(request: httpx.Request) -> httpx.Response:
            if request.method == "POST":
                sent.append(request.headers.get("content-encoding"))
            error = {"error": {"code": "validation_error", "message": "records[0].at"}}
            return httpx.Response(422, json=error, headers={"Accept-Encoding": "gzip"})

        control = client(clock, httpx.MockTransport(handle))
        control.gzip_segments = True
        with pytest.raises(Refused, match=re.escape("records[0].at")):
            await control.ship_spend(b"{}")
        assert sent == ["gzip"]
        await control.close()

    async def test_a_segment_too_large_as_it_is_waits_instead_of_being_set_aside(
        self, spool: SpendSpool, clock: SteppedClock
    ) -> None:
        too_large = httpx.Response(413, text="<html>413 Request Entity Too Large</html>")
        control = client(clock, fake_control_plane(clock, too_large)[0])
        segments_of(spool, 2)
        assert not await SpoolDrainer(spool, control.ship_spend, clock).ship_ready()
        assert len(spool.pending_segments()) == 1
        with pytest.raises(Unreachable, match="raise the body limit"):
            await control.ship_spend(b"{}")
        await control.close()
        spool.close()

    @pytest.mark.parametrize(
        ("header", "takes"),
        [("gzip", True), ("deflate, GZIP;q=1", True), ("deflate", False), ("", False)],
    )
    async def test_an_answer_without_gzip_in_accept_encoding_turns_it_off(
        self, clock: SteppedClock, header: str, takes: bool
    ) -> None:
        ack = SpendAck(segment_id="s", accepted=0, duplicates=0)
        answer = httpx.Response(
            200, content=msgspec.json.encode(ack), headers={"Accept-Encoding": header}
        )
        control = client(clock, fake_control_plane(clock, answer)[0])
        control.gzip_segments = not takes
        await control.ship_spend(
            msgspec.json.encode(SpendSegment(replica_id="r0", segment_id="s", records=[]))
        )
        assert control.gzip_segments is takes
        await control.close()

    async def test_an_unreadable_ack_is_tried_again_later(self, clock: SteppedClock) -> None:
        control = client(clock, fake_control_plane(clock, httpx.Response(200, text="ok"))[0])
        with pytest.raises(Unreachable, match="unreadable"):
            await control.ship_spend(b"{}")
        await control.close()


# -- the proxy's wiring -------------------------------------------------------------------------


async def test_the_proxy_recovers_at_start_and_ships_at_shutdown(
    tmp_path: Path, clock: SteppedClock
) -> None:
    transport, received = fake_control_plane(clock)
    spool_dir = tmp_path / "spool"
    left = SpendSpool.open(spool_dir, clock, replica_id="pod-a")
    left.append(record("from-before"))
    left.close()
    settings = proxy_settings(
        controlplane_url="http://cp.test",
        spool_dir=spool_dir,
        replica_id="pod-a",
        spend_flush_interval_s=3600,  # nothing is shipped before shutdown but by the drainer's
        shutdown_grace_s=5,  # first pass, which ships what start-up recovered
    )
    app = create_app(settings, clock=clock, control_transport=transport)
    async with AsyncTestClient(app) as http:
        running = app.state["running"]
        assert running.spool.replica_id == "pod-a"
        ready = (await http.get("/readyz")).json()
        assert ready["spend_spool"] == {"writable": True, "full": False}
        running.spool.append(record("during"))
    shipped = [rec.request_id for segment in received for rec in segment.records]
    assert shipped == ["from-before", "during"]
    assert not [p for p in (spool_dir / "pod-a").iterdir() if p.suffix in (".seg", ".open")]


async def test_the_proxy_refuses_to_start_on_a_spool_it_cannot_use(
    tmp_path: Path, clock: SteppedClock
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    settings = proxy_settings(spool_dir=blocker / "spool")
    app = create_app(settings, clock=clock, control_transport=fake_control_plane(clock)[0])
    with pytest.raises(BaseException) as failed:
        async with AsyncTestClient(app):
            pass
    [error] = leaves(failed.value)
    assert isinstance(error, SpoolError)
    assert str(error).startswith("VKGATE_SPOOL_DIR: cannot use the spool directory")


def leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]
