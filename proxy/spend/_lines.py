"""The spool's line format: one `SpendRecord` per line, each guarded by its own CRC-32.

    <SpendRecord as compact JSON> <CRC-32 of that JSON, 8 lowercase hex digits>\\n

Why a checksum when JSON already fails to parse when torn: a flipped bit inside a number
(`"input_tokens":1234` read back as `1634`) still parses, and would be billed. The CRC makes
every line self-checking, costs ~0.4 µs per append, and keeps the JSON first on the line so a
segment stays readable with `cut -d' ' -f1` or a text editor. The checksum is never shipped: a
`SpendSegment` body is built from the JSON parts of the lines that pass it, as they are on disk.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec

from vkgate.spend import SpendRecord

SUFFIX_LEN = 10
"""`' '`, eight hex digits and `'\\n'`."""
_LINE_START = b'{"id":'
"""How every line begins: `id` is `SpendRecord`'s first field, and msgspec keeps field order.
Inside a string a quote is escaped, so these bytes occur nowhere else in a line."""

_decoder = msgspec.json.Decoder(SpendRecord)


def checksum_suffix(json: bytes | bytearray) -> bytes:
    return b" %08x\n" % zlib.crc32(json)


def json_of(line: bytes | memoryview) -> memoryview | None:
    """The JSON part of one line (without its `\\n`) when its checksum holds, else None."""
    if len(line) <= SUFFIX_LEN - 1 or line[-9] != 0x20:
        return None
    view = memoryview(line)
    json = view[:-9]
    try:
        expected = int(bytes(view[-8:]), 16)
    except ValueError:
        return None
    return json if zlib.crc32(json) == expected else None


@dataclass
class Scan:
    """What reading one segment file found."""

    records: list[memoryview] = field(default_factory=list)
    """The JSON of every good line, in file order."""
    good_end: int = 0
    """Offset just past the last good line: where a torn tail is cut off."""
    corrupt: int = 0
    """Bad lines before the last good one: skipped, never shipped."""
    torn: int = 0
    """Bytes after the last good line: an unfinished write, or a last line that fails its check."""
    first_seq: int | None = None
    last_seq: int = 0
    first_at: str | None = None


def scan(data: bytes, *, decode: bool) -> Scan:
    """Split a segment into good lines; with `decode`, also check that each is a `SpendRecord`.

    A line is good when it ends with `\\n`, its checksum holds and (with `decode`) it decodes.
    Without `decode` only the first good line is decoded, for the segment's first record time.
    """
    result = Scan()
    for _ in scan_in_steps(data, result, decode=decode):
        pass
    return result


def scan_in_steps(
    data: bytes, result: Scan, *, decode: bool, lines_per_step: int = 0
) -> Iterator[None]:
    """`scan` into `result`, pausing (yielding) after every `lines_per_step` lines (0: never):
    the event loop runs it a step at a time between requests."""
    budget = lines_per_step
    view = memoryview(data)
    start = 0
    bad_since_good = 0
    size = len(data)
    while start < size:
        budget -= 1
        if budget == 0:
            budget = lines_per_step
            yield
        end = data.find(b"\n", start)
        if end < 0:
            break  # no newline: the last write never finished
        json = json_of(view[start:end])
        if json is None and (glued := _glued_start(data, start, end)) >= 0:
            bad_since_good += 1  # the damaged line the good one was glued to
            json = json_of(view[glued:end])
        record = None
        if json is not None and (decode or result.first_at is None):
            try:
                record = _decoder.decode(json)
            except msgspec.DecodeError:
                json = None
        if json is None:
            bad_since_good += 1
        else:
            result.corrupt += bad_since_good
            bad_since_good = 0
            result.records.append(json)
            result.good_end = end + 1
            if record is not None:
                if result.first_at is None:
                    result.first_at = record.at
                if result.first_seq is None:
                    result.first_seq = record.seq
                result.last_seq = max(result.last_seq, record.seq)
        start = end + 1
    result.torn = size - result.good_end


def _glued_start(data: bytes, start: int, end: int) -> int:
    """Where a good line begins inside the bad line `data[start:end]`, or -1.

    A damaged `\\n` glues its line to the next, which is still whole from its own start:
    without this one bad byte would lose two records, and cutting a torn tail would delete the
    second from disk.
    """
    view = memoryview(data)
    at = data.find(_LINE_START, start + 1, end)
    while at >= 0:
        if json_of(view[at:end]) is not None:
            return at
        at = data.find(_LINE_START, at + 1, end)
    return -1


def segment_body(replica_id: str, segment_id: str, records: list[memoryview]) -> bytes:
    """A `SpendSegment` as JSON, from the records' own bytes: nothing is decoded and re-encoded."""
    head = b'{"replica_id":%b,"segment_id":%b,"records":[' % (
        msgspec.json.encode(replica_id),
        msgspec.json.encode(segment_id),
    )
    return b"".join((head, b",".join(records), b"]}"))
