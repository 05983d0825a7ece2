"""Sealed response ids: they round-trip, say nothing readable, resist forgery and outlive a
secret rotation."""

from __future__ import annotations

import base64

from hypothesis import given
from hypothesis import strategies as st

from proxy.responses.ids import PREFIX, ResponseIds, Sealed

SECRET = "a-test-internal-secret-of-32-characters-or-more"
OLD_SECRET = "the-previous-internal-secret-also-32-characters"
PROVIDER = "prov_0193a1b2c3d4e5f6a7b8c9d0"
ORG = "org_0193a1b2c3d4e5f6a7b8c9d1"
UPSTREAM = "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b"


def test_an_id_opens_to_what_was_sealed_and_shows_none_of_it() -> None:
    ids = ResponseIds([SECRET])
    sealed = ids.seal(PROVIDER, ORG, UPSTREAM, stored=True)
    assert sealed.startswith(PREFIX)
    assert ids.open(sealed) == Sealed(PROVIDER, ORG, UPSTREAM, stored=True)
    for part in (PROVIDER, ORG, UPSTREAM, "0193a1b2", "67ccd2be"):
        assert part not in sealed
    raw = base64.urlsafe_b64decode(sealed[len(PREFIX) :] + "==")
    for part in (b"prov", b"org", bytes.fromhex("67ccd2bed1ec8190")):
        assert part not in raw


def test_sealing_is_deterministic_so_every_event_and_answer_carries_one_id() -> None:
    ids = ResponseIds([SECRET])
    first = ids.seal(PROVIDER, ORG, UPSTREAM, stored=True)
    assert ResponseIds([SECRET]).seal(PROVIDER, ORG, UPSTREAM, stored=True) == first
    assert ids.seal(PROVIDER, ORG, UPSTREAM, stored=False) != first
    assert ids.seal(PROVIDER, "org_0193a1b2c3d4e5f6a7b8c9d2", UPSTREAM, stored=True) != first


def test_a_translated_response_is_marked_as_not_stored() -> None:
    ids = ResponseIds([SECRET])
    sealed = ids.seal(PROVIDER, ORG, "msg_01FakeUpstreamReply000001", stored=False)
    assert ids.open(sealed) == Sealed(PROVIDER, ORG, "msg_01FakeUpstreamReply000001", False)


def test_an_altered_or_foreign_id_does_not_open() -> None:
    ids = ResponseIds([SECRET])
    sealed = ids.seal(PROVIDER, ORG, UPSTREAM, stored=True)
    body = bytearray(base64.urlsafe_b64decode(sealed[len(PREFIX) :] + "=="))
    for at in (0, 12, len(body) // 2, len(body) - 1):
        altered = bytearray(body)
        altered[at] ^= 0x01
        forged = PREFIX + base64.urlsafe_b64encode(bytes(altered)).rstrip(b"=").decode()
        assert ids.open(forged) is None
    assert ResponseIds(["another-secret-of-thirty-two-characters!!"]).open(sealed) is None
    for junk in (UPSTREAM, "resp_", "resp_!!!!", "resp_AAAA", "msg_abc", "resp_" + "A" * 2000, ""):
        assert ids.open(junk) is None


def test_ids_sealed_under_a_previous_secret_still_open_after_rotation() -> None:
    before = ResponseIds([OLD_SECRET])
    old = before.seal(PROVIDER, ORG, UPSTREAM, stored=True)
    rotated = ResponseIds([SECRET, OLD_SECRET])
    assert rotated.open(old) == Sealed(PROVIDER, ORG, UPSTREAM, stored=True)
    # New ids are sealed under the current secret, which the old set does not know.
    assert before.open(rotated.seal(PROVIDER, ORG, UPSTREAM, stored=True)) is None


@given(
    provider=st.text(min_size=1, max_size=80),
    organization=st.from_regex(r"org_[0-9a-f]{0,40}", fullmatch=True),
    upstream=st.one_of(
        st.text(max_size=300), st.from_regex(r"resp_[0-9a-f]{1,80}", fullmatch=True)
    ),
    stored=st.booleans(),
)
def test_any_ids_round_trip(provider: str, organization: str, upstream: str, stored: bool) -> None:
    ids = ResponseIds([SECRET])
    sealed = ids.seal(provider, organization, upstream, stored=stored)
    assert ids.open(sealed) == Sealed(provider, organization, upstream, stored)
