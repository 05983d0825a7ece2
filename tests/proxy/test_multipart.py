"""Reading multipart/form-data uploads once and patching their `model` in place: what real
encoders write is read exactly, and anything else is a 400 naming the problem, never a crash."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy import multipart
from proxy.errors import ProxyError
from vkgate.errors import ErrorCode

FUZZ = settings(max_examples=150, deadline=None)
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(range(256)) * 4


def encoded(
    data: dict[str, str], files: list[tuple[str, tuple[str, bytes, str]]]
) -> tuple[bytes, bytes]:
    """A body and Content-Type as httpx (the OpenAI SDK's client) writes them."""
    request = httpx.Request("POST", "http://x/", data=data, files=files)
    return request.read(), request.headers["content-type"].encode()


def refusal(content_type: bytes | None, body: bytes) -> str:
    with pytest.raises(ProxyError) as raised:
        multipart.parse(content_type, body)
    assert raised.value.code is ErrorCode.INVALID_REQUEST
    return raised.value.message


def test_a_form_written_by_httpx_is_read_field_by_field_with_the_files_untouched() -> None:
    body, content_type = encoded(
        {"model": "whisper", "response_format": "verbose_json", "prompt": "é\r\n--x"},
        [("file", ("speech.wav", WAV, "audio/wav"))],
    )
    form = multipart.parse(content_type, body)
    assert [p.name for p in form.parts] == ["model", "response_format", "prompt", "file"]
    assert form.text("model") == "whisper"
    assert form.text("prompt") == "é\r\n--x"
    assert form.text("missing") is None
    [audio] = form.files("file")
    assert (audio.filename, audio.content_type, audio.size) == ("speech.wav", "audio/wav", len(WAV))
    assert body[audio.start : audio.end] == WAV


def test_replacing_the_model_changes_those_bytes_and_nothing_else() -> None:
    body, content_type = encoded({"model": "alias"}, [("file", ("a.mp3", WAV, "audio/mpeg"))])
    form = multipart.parse(content_type, body)
    model = form.first("model")
    assert model is not None
    patched = form.with_value(model, b"whisper-1")
    assert patched == body.replace(b"\r\n\r\nalias\r\n", b"\r\n\r\nwhisper-1\r\n")
    again = multipart.parse(content_type, patched)
    assert again.text("model") == "whisper-1"
    [audio] = again.files("file")
    assert patched[audio.start : audio.end] == WAV


def test_several_files_of_one_name_are_all_kept() -> None:
    body, content_type = encoded(
        {"model": "img", "prompt": "a cat"},
        [
            ("image[]", ("a.png", b"\x89PNG one", "image/png")),
            ("image[]", ("b.png", b"\x89PNG two", "image/png")),
            ("mask", ("m.png", b"\x89PNG mask", "image/png")),
        ],
    )
    form = multipart.parse(content_type, body)
    assert [p.filename for p in form.files("image", "image[]")] == ["a.png", "b.png"]
    assert [p.filename for p in form.files("mask")] == ["m.png"]


def test_quoted_parameters_may_hold_semicolons_and_escaped_quotes() -> None:
    body = (
        b'--b\r\nContent-Disposition: form-data; name="file"; '
        b'filename="a;b \\"c\\".wav"\r\n\r\nRIFF\r\n--b--\r\n'
    )
    [part] = multipart.parse(b'multipart/form-data; boundary="b"', body).parts
    assert (part.name, part.filename) == ("file", 'a;b "c".wav')


def test_a_preamble_and_an_epilogue_are_ignored() -> None:
    body = b"ignored\r\n--b\r\ncontent-disposition: form-data; name=m\r\n\r\nv\r\n--b--\r\nafter"
    form = multipart.parse(b"multipart/form-data; boundary=b", body)
    assert form.text("m") == "v"


@pytest.mark.parametrize(
    ("content_type", "wanted"),
    [
        (None, "no Content-Type"),
        (b"application/json", "takes multipart/form-data, not 'application/json'"),
        (b"multipart/form-data", "names no boundary"),
        (b"multipart/form-data; boundary=" + b"x" * 71, "1 to 70 characters"),
    ],
)
def test_a_content_type_that_is_not_a_form_with_a_boundary_is_refused(
    content_type: bytes | None, wanted: str
) -> None:
    assert wanted in refusal(content_type, b"--x\r\n")


@pytest.mark.parametrize(
    ("body", "wanted"),
    [
        (b"", "no part opens with the boundary"),
        (b"--b\r\ncontent-disposition: form-data; name=m\r\n\r\nvalue", "ends inside a part"),
        (b"--b\r\ncontent-disposition: form-data; name=m", "ends inside a part's headers"),
        (b"--b\r\ncontent-disposition: form-data; name=m\r\n\r\nv\r\n--b", "before its closing"),
        (b"--b\r\ncontent-type: text/plain\r\n\r\nv\r\n--b--", "no Content-Disposition"),
        (b"--b\r\ncontent-disposition: attachment; name=m\r\n\r\nv\r\n--b--", "not form-data"),
        (b"--b\r\ncontent-disposition: form-data\r\n\r\nv\r\n--b--", "has no name"),
        (b"--b\r\nno colon here\r\n\r\nv\r\n--b--", "without a colon"),
        (b"--bX\r\n", "not followed by a line break"),
    ],
)
def test_a_malformed_body_is_refused_saying_what_is_wrong(body: bytes, wanted: str) -> None:
    assert wanted in refusal(b"multipart/form-data; boundary=b", body)


def test_a_file_where_a_text_field_is_wanted_is_refused_naming_the_field() -> None:
    body, content_type = encoded({}, [("model", ("m.txt", b"gpt", "text/plain"))])
    form = multipart.parse(content_type, body)
    with pytest.raises(ProxyError) as raised:
        form.text("model")
    assert raised.value.param == "model"


def test_a_text_field_that_is_not_utf8_is_refused_naming_the_field() -> None:
    body = b"--b\r\ncontent-disposition: form-data; name=model\r\n\r\n\xff\r\n--b--"
    form = multipart.parse(b"multipart/form-data; boundary=b", body)
    with pytest.raises(ProxyError, match="not valid UTF-8"):
        form.text("model")


FIELD_NAMES = st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=8)
FIELD_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=30)


@st.composite
def forms(draw: st.DrawFn) -> tuple[dict[str, str], list[tuple[str, tuple[str, bytes, str]]]]:
    data = draw(st.dictionaries(FIELD_NAMES, FIELD_TEXT, max_size=4))
    files = draw(
        st.lists(
            st.tuples(
                FIELD_NAMES,
                st.tuples(st.just("f.bin"), st.binary(max_size=200), st.just("audio/wav")),
            ),
            min_size=1,
            max_size=3,
        )
    )
    return data, files


@FUZZ
@given(form=forms())
def test_any_form_httpx_writes_is_read_back_exactly(
    form: tuple[dict[str, str], list[tuple[str, tuple[str, bytes, str]]]],
) -> None:
    data, files = form
    body, content_type = encoded(data, files)
    parsed = multipart.parse(content_type, body)
    texts = [p for p in parsed.parts if p.filename is None]
    # httpx writes a field's line breaks as it got them; the value is read back the same.
    assert {p.name: parsed.body[p.start : p.end].decode() for p in texts} == data
    assert [(p.name, body[p.start : p.end]) for p in parsed.parts if p.filename] == [
        (name, content) for name, (_, content, _) in files
    ]


@FUZZ
@given(form=forms(), cut=st.floats(0, 1, exclude_max=True))
def test_a_body_cut_short_anywhere_is_refused_or_read_whole(
    form: tuple[dict[str, str], list[tuple[str, tuple[str, bytes, str]]]], cut: float
) -> None:
    body, content_type = encoded(*form)
    closing = body.rindex(b"--\r\n")
    short = body[: int(len(body) * cut)]
    try:
        parsed = multipart.parse(content_type, short)
    except ProxyError as exc:
        assert exc.code is ErrorCode.INVALID_REQUEST
    else:
        # Only a cut past the closing delimiter still reads: the parts are all there.
        assert len(short) >= closing + 2
        assert len(parsed.parts) == len(multipart.parse(content_type, body).parts)


@FUZZ
@given(body=st.binary(max_size=300), boundary=st.sampled_from([b"b", b"--", b"x y", b"\r\n"]))
@example(body=b"--b\r\n\r\n\r\n--b--", boundary=b"b")
@example(body=b"--b" + b"\r\n" * 40, boundary=b"b")
def test_arbitrary_bytes_are_a_400_or_a_form_never_a_crash(body: bytes, boundary: bytes) -> None:
    content_type = b'multipart/form-data; boundary="' + boundary + b'"'
    try:
        form = multipart.parse(content_type, body)
    except ProxyError as exc:
        assert exc.code is ErrorCode.INVALID_REQUEST and exc.message
        return
    for part in form.parts:
        assert 0 <= part.start <= part.end <= len(body)
        try:
            form.text(part.name)
        except ProxyError as exc:
            assert exc.code is ErrorCode.INVALID_REQUEST
