"""Request parsing: each refusal names what was wrong; random lines never escape as crashes."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bmoe.wire.protocol import Cancel, Close, Decide, DecideBatch, ProtocolError, Stats, parse_line
from bmoe.runtime.results import GenerateRequest


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{", "request is not valid JSON"),
        ("[1,2]", "request must be a JSON object, got list"),
        ('{"id":1}', "request has no 'cmd' field"),
        ('{"cmd":5}', "field 'cmd' must be a string, got 5"),
        ('{"cmd":"fly"}', "unknown cmd 'fly' (expected generate, cancel, close, stats, decide, decide_batch)"),
        ('{"cmd":"generate","id":1}', "generate: missing field 'prompt'"),
        ('{"cmd":"generate","prompt":7}', "generate: field 'prompt' must be a string, got 7"),
        ('{"cmd":"generate","prompt":"x","n_predict":0}', "generate: field 'n_predict' must be an integer >= 1, got 0"),
        ('{"cmd":"generate","prompt":"x","clear_kv":"no"}', "generate: field 'clear_kv' must be true or false, got \"no\""),
        ('{"cmd":"generate","prompt":"x","n_predit":3}', "generate: unknown field(s) 'n_predit'"),
        ('{"cmd":"generate","prompt":"x","temperature":-1}', "generate: field 'temperature' must be a number in [0, 10], got -1"),
        ('{"cmd":"decide","choices":"AB"}', "decide: field 'choices' must be a list of strings, got \"AB\""),
        ('{"cmd":"decide","prefix":"x"}', "decide: missing field 'choices'"),
        ('{"cmd":"decide","choices":["A"],"abstain_below":2}', "decide: field 'abstain_below' must be a number in [0, 1], got 2"),
        ('{"cmd":"decide_batch","requests":[]}', "decide_batch: field 'requests' must be a list of decide objects, got []"),
        ('{"cmd":"decide_batch","requests":[3]}', "decide_batch: requests[0] must be an object"),
    ],
)
def test_refusals_name_the_problem(line: str, message: str) -> None:
    with pytest.raises(ProtocolError) as e:
        parse_line(line)
    assert str(e.value).startswith(message)


def test_refusal_carries_the_request_id() -> None:
    with pytest.raises(ProtocolError) as e:
        parse_line('{"cmd":"generate","id":42}')
    assert e.value.request_id == 42


def test_valid_commands() -> None:
    g = parse_line('{"cmd":"generate","id":3,"prompt":"hi","n_predict":5,"think":false,"clear_kv":false}')
    assert g == GenerateRequest(prompt="hi", id=3, n_predict=5, think=False, clear_kv=False)
    assert parse_line('{"cmd":"cancel"}') == Cancel()
    assert parse_line('{"cmd":"close"}') == Close()
    assert parse_line('{"cmd":"stats","id":9}') == Stats(id=9)
    d = parse_line('{"cmd":"decide","id":1,"prefix":"p","suffix":"s","choices":["A","B"]}')
    assert isinstance(d, Decide) and d.id == 1 and d.fields["choices"] == ["A", "B"]
    b = parse_line('{"cmd":"decide_batch","id":2,"requests":[{"id":5,"choices":["A"]}]}')
    assert isinstance(b, DecideBatch) and b.requests[0].id == 5


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
    max_leaves=8,
)
keys = st.sampled_from(["cmd", "id", "prompt", "n_predict", "think", "clear_kv", "choices", "prefix", "suffix", "requests"])
cmds = st.sampled_from(["generate", "decide", "decide_batch", "stats", "cancel", "close", "x", ""])


@settings(max_examples=3000, deadline=None)
@given(st.one_of(
    st.text(max_size=60),
    st.dictionaries(keys, json_values, max_size=6).map(json.dumps),
    st.tuples(cmds, st.dictionaries(keys, json_values, max_size=5)).map(lambda t: json.dumps({**t[1], "cmd": t[0]})),
))
def test_any_line_parses_or_is_refused_cleanly(line: str) -> None:
    try:
        parse_line(line)
    except ProtocolError as e:
        assert str(e)


def test_python_requests_get_the_same_rules() -> None:
    from bmoe.wire.protocol import validate_generate

    validate_generate(GenerateRequest(prompt="ok", n_predict=3))
    with pytest.raises(ProtocolError, match=r"^generate: field 'prompt' must be a string, got 12$"):
        validate_generate(GenerateRequest(prompt=12))  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match=r"^generate: field 'top_p' must be a number in \(0, 1\], got 0$"):
        validate_generate(GenerateRequest(prompt="x", top_p=0))
