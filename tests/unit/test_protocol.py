"""Request parsing: each refusal names what was wrong; random lines never escape as crashes."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bmoe.runtime.results import GenerateRequest
from bmoe.wire.protocol import (
    MAX_LINE_BYTES,
    Cancel,
    Close,
    Decide,
    DecideBatch,
    ProtocolError,
    Stats,
    decode_line,
    line_too_long,
    parse_line,
    request_fields,
)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{", "request is not valid JSON"),
        (
            '{"cmd":"stats","id":' + "1" * 5000 + "}",  # over Python's digit limit: no advice a client cannot take
            "request is not valid JSON: an integer of more than 4300 digits, more than Python reads",
        ),
        ("[1,2]", "request must be a JSON object, got list"),
        ('{"id":1}', "request has no 'cmd' field"),
        ('{"cmd":5}', "field 'cmd' must be a string, got 5"),
        ('{"cmd":"fly"}', "unknown cmd 'fly' (expected generate, cancel, close, stats, decide, decide_batch)"),
        ('{"cmd":"generate","id":1}', "generate: missing field 'prompt'"),
        ('{"cmd":"generate","prompt":7}', "generate: field 'prompt' must be a string, got 7"),
        ('{"cmd":"generate","prompt":"x","n_predict":0}', "generate: field 'n_predict' must be an integer >= 1, got 0"),
        (
            '{"cmd":"generate","prompt":"x","clear_kv":"no"}',
            "generate: field 'clear_kv' must be true or false, got \"no\"",
        ),
        ('{"cmd":"generate","prompt":"x","n_predit":3}', "generate: unknown field(s) 'n_predit'"),
        (
            '{"cmd":"generate","prompt":"x","temperature":-1}',
            "generate: field 'temperature' must be a number in [0, 10], got -1",
        ),
        ('{"cmd":"decide","choices":"AB"}', "decide: field 'choices' must be a list of strings, got \"AB\""),
        ('{"cmd":"decide","prefix":"x"}', "decide: missing field 'choices'"),
        (
            '{"cmd":"decide","choices":["A"],"abstain_below":2}',
            "decide: field 'abstain_below' must be a number in [0, 1], got 2",
        ),
        ('{"cmd":"decide","choices":["A"],"scoring":1}', "decide: field 'scoring' must be a string, got 1"),
        (
            '{"cmd":"decide","choices":["A"],"unconditional":null}',
            "decide: field 'unconditional' must be a string, got null",
        ),
        (
            '{"cmd":"decide_batch","requests":[]}',
            "decide_batch: field 'requests' must be a list of decide objects, got []",
        ),
        ('{"cmd":"decide_batch","requests":[3]}', "decide_batch: requests[0] must be an object"),
        # ids that could not tell the answers apart (0, given or left out, may repeat: answers are in order)
        (
            '{"cmd":"decide_batch","requests":[{"id":5,"choices":["A"]},{"id":6,"choices":["A"]},{"id":5,"choices":["B"]},'
            '{"choices":["A"]},{"id":5,"choices":["A"]}]}',
            "decide_batch: id 5 is given to requests[0], requests[2] and requests[4]; give each request its own id (or "
            "none: those answer as id 0, in the order of the requests)",
        ),
        # one unknown-field rule for every command
        ('{"cmd":"close","x":1}', "close: unknown field(s) 'x'"),
        ('{"cmd":"cancel","x":1}', "cancel: unknown field(s) 'x'"),
        ('{"cmd":"cancel","id":"a"}', "cancel: field 'id' must be an integer, got \"a\""),
        ('{"cmd":"stats","x":1}', "stats: unknown field(s) 'x'"),
        (
            '{"cmd":"decide_batch","requests":[{"cmd":"decide","choices":["A"]}]}',
            "decide_batch: requests[0]: unknown field(s) 'cmd'",
        ),
        # strings must be valid Unicode: JSON can spell a lone surrogate, UTF-8 cannot carry it
        (
            '{"cmd":"generate","prompt":"ab\\ud800"}',
            "generate: field 'prompt' is not valid Unicode: a lone surrogate \\ud800 at index 2",
        ),
        (
            '{"cmd":"generate","prompt":"\\udfff\\ud83d"}',
            "generate: field 'prompt' is not valid Unicode: a lone surrogate \\udfff at index 0",
        ),
        (
            '{"cmd":"decide","prefix":"\\udc00","choices":["A"]}',
            "decide: field 'prefix' is not valid Unicode: a lone surrogate \\udc00 at index 0",
        ),
        (
            '{"cmd":"decide","choices":["A","B\\ud800"]}',
            "decide: field 'choices' is not valid Unicode: a lone surrogate \\ud800 at index 1 of item 1",
        ),
    ],
)
def test_refusals_name_the_problem(line: str, message: str) -> None:
    with pytest.raises(ProtocolError) as e:
        parse_line(line)
    assert str(e.value).startswith(message)


@pytest.mark.parametrize(
    "line",
    [
        '{"cmd":"generate","id":42}',
        '{"cmd":"generate","id":42,"prompt":"\\ud800"}',
        '{"cmd":"close","id":42,"x":1}',
        '{"cmd":"cancel","id":42,"x":1}',
        '{"cmd":"decide_batch","id":42,"requests":[{"cmd":"decide","choices":["A"]}]}',
    ],
)
def test_refusal_carries_the_request_id(line: str) -> None:
    with pytest.raises(ProtocolError) as e:
        parse_line(line)
    assert e.value.request_id == 42


def test_a_paired_surrogate_is_one_character() -> None:
    assert parse_line('{"cmd":"generate","prompt":"\\ud83d\\ude00"}') == GenerateRequest(prompt="\U0001f600")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\xff", "request line is not valid UTF-8: byte 0xff at offset 0 (invalid start byte)"),
        (b'{"p":"\xc3(', "request line is not valid UTF-8: byte 0xc3 at offset 6 (invalid continuation byte)"),
        (b"ab\xe2\x82", "request line is not valid UTF-8: byte 0xe2 at offset 2 (unexpected end of data)"),
        (
            b"\xed\xa0\x80",
            "request line is not valid UTF-8: byte 0xed at offset 0 (invalid continuation byte)",
        ),  # an encoded surrogate
    ],
)
def test_bytes_that_are_not_utf8_are_refused(raw: bytes, message: str) -> None:
    with pytest.raises(ProtocolError) as e:
        decode_line(raw)
    assert str(e.value) == message and e.value.request_id is None


def test_the_line_limit_is_named_in_its_refusal() -> None:
    assert MAX_LINE_BYTES == 1 << 20
    assert str(line_too_long()) == "request line is longer than the limit of 1048576 bytes (1 MiB); it was skipped"


def test_valid_commands() -> None:
    g = parse_line('{"cmd":"generate","id":3,"prompt":"hi","n_predict":5,"think":false,"clear_kv":false}')
    assert g == GenerateRequest(prompt="hi", id=3, n_predict=5, think=False, clear_kv=False)
    assert parse_line('{"cmd":"cancel"}') == Cancel()
    assert parse_line('{"cmd":"cancel","id":4}') == Cancel(id=4)
    assert parse_line('{"cmd":"close"}') == Close()
    assert parse_line('{"cmd":"close","id":4}') == Close()
    assert parse_line('{"cmd":"stats","id":9}') == Stats(id=9)
    d = parse_line('{"cmd":"decide","id":1,"prefix":"p","suffix":"s","choices":["A","B"]}')
    assert isinstance(d, Decide) and d.id == 1 and d.fields["choices"] == ["A", "B"]
    b = parse_line('{"cmd":"decide_batch","id":2,"requests":[{"id":5,"choices":["A"]}]}')
    assert isinstance(b, DecideBatch) and b.requests[0].id == 5
    b = parse_line(
        '{"cmd":"decide_batch","requests":[{"choices":["A"]},{"id":0,"choices":["A"]},{"choices":["A"]},'
        '{"id":3,"choices":["A"]}]}'
    )
    assert isinstance(b, DecideBatch) and [r.id for r in b.requests] == [0, 0, 0, 3]  # 0 is "no id": it may repeat
    assert (d.request.scoring, d.request.best_by, d.request.unconditional) == ("first", "sum", None)
    f = parse_line('{"cmd":"decide","choices":["A b"],"scoring":"full","best_by":"norm","unconditional":"Q:"}')
    assert isinstance(f, Decide)
    assert (f.request.scoring, f.request.best_by, f.request.unconditional) == ("full", "norm", "Q:")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
    max_leaves=8,
)
keys = st.sampled_from(
    ["cmd", "id", "prompt", "n_predict", "think", "clear_kv", "choices", "prefix", "suffix", "requests"]
)
cmds = st.sampled_from(["generate", "decide", "decide_batch", "stats", "cancel", "close", "x", ""])


@settings(max_examples=3000, deadline=None)
@given(
    st.one_of(
        st.text(max_size=60),
        st.dictionaries(keys, json_values, max_size=6).map(json.dumps),
        st.tuples(cmds, st.dictionaries(keys, json_values, max_size=5)).map(
            lambda t: json.dumps({**t[1], "cmd": t[0]})
        ),
    )
)
def test_any_line_parses_or_is_refused_cleanly(line: str) -> None:
    try:
        parse_line(line)
    except ProtocolError as e:
        assert str(e)


# text with lone surrogates in it (st.text leaves them out)
odd_text = st.lists(st.characters() | st.integers(0xD800, 0xDFFF).map(chr), max_size=12).map("".join)


@settings(max_examples=2000, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=60),
        odd_text.map(lambda t: json.dumps({"cmd": "generate", "prompt": t}).encode()),  # surrogates as \\uXXXX
        odd_text.map(
            lambda t: json.dumps({"cmd": "generate", "prompt": t}, ensure_ascii=False).encode("utf-8", "surrogatepass")
        ),  # surrogates as (invalid) UTF-8 bytes
    )
)
def test_any_bytes_decode_and_parse_or_are_refused_cleanly(raw: bytes) -> None:
    """Whatever passes both steps is a command whose strings UTF-8 can carry (a BMOE line can echo them)."""
    try:
        cmd = parse_line(decode_line(raw))
    except ProtocolError as e:
        assert str(e)
        return
    if isinstance(cmd, GenerateRequest):
        cmd.prompt.encode("utf-8")


def test_python_requests_get_the_same_rules() -> None:
    from bmoe.rules import FieldError
    from bmoe.runtime.results import check_generate

    check_generate(GenerateRequest(prompt="ok", n_predict=3))
    cases = [
        (
            GenerateRequest(prompt=12),
            '{"cmd":"generate","prompt":12}',  # type: ignore[arg-type]
            r"^generate: field 'prompt' must be a string, got 12$",
        ),
        (
            GenerateRequest(prompt="x", top_p=0),
            '{"cmd":"generate","prompt":"x","top_p":0}',
            r"^generate: field 'top_p' must be a number in \(0, 1\], got 0$",
        ),
        (
            GenerateRequest(prompt="x", temperature=10.5),
            '{"cmd":"generate","prompt":"x","temperature":10.5}',
            r"^generate: field 'temperature' must be a number in \[0, 10\], got 10.5$",
        ),
        (
            GenerateRequest(prompt="\ud800", id=2),
            '{"cmd":"generate","id":2,"prompt":"\\ud800"}',
            r"^generate: field 'prompt' is not valid Unicode: a lone surrogate \\ud800 at index 0$",
        ),
    ]
    for request, line, message in cases:  # one table: the session and the protocol refuse alike
        with pytest.raises(FieldError, match=message):
            check_generate(request)
        with pytest.raises(ProtocolError, match=message):
            parse_line(line)


def test_a_record_with_a_lone_surrogate_is_still_writable_utf8() -> None:
    from bmoe.wire.records import line

    out = line("READY", {"model": "/models/bad\udcff.gguf"})
    out.encode("utf-8")  # a strict UTF-8 stdout takes it
    assert out == 'BMOE_READY {"model":"/models/bad\\udcff.gguf"}'
    assert line("READY", {"model": "é"}) == 'BMOE_READY {"model":"é"}'  # others stay as they are


def test_images_ride_generate_and_decide_lines_as_tuples() -> None:
    g = parse_line(
        '{"cmd":"generate","prompt":"<__media__> what is it?","images":["a.png","data:image/png;base64,AA=="]}'
    )
    assert g == GenerateRequest(prompt="<__media__> what is it?", images=("a.png", "data:image/png;base64,AA=="))
    d = parse_line('{"cmd":"decide","id":2,"prefix":"p","suffix":"s","choices":["A","B"],"images":["shot.png"]}')
    assert d.request.images == ("shot.png",)
    assert parse_line(json.dumps({"cmd": "decide", **request_fields(d.request)})).request == d.request
    for bad in ('"images":"a.png"', '"images":[1]', '"images":[""]'):
        with pytest.raises(ProtocolError, match="images"):
            parse_line('{"cmd":"generate","prompt":"x",' + bad + '}')
