"""StopMatcher: streamed in any pieces, it releases exactly the text before the first stop string,
and never releases a character that later turns out to be part of one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bmoe.server.stops import StopMatcher

ALPHABET = "ab<>|"


def reference(text: str, stops: list[str]) -> tuple[str, bool]:
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


@given(
    text=st.text(ALPHABET, max_size=40),
    stops=st.lists(st.text(ALPHABET, max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=10),
)
def test_any_split_gives_the_reference(text: str, stops: list[str], cuts: list[int]) -> None:
    m = StopMatcher(stops)
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    released = ""
    for a, b in zip(bounds, bounds[1:], strict=False):
        released += m.push(text[a:b])
        want, _ = reference(text, stops)
        assert want.startswith(released)  # nothing released that a stop later claims
    released += m.finish()
    want, hit = reference(text, stops)
    assert released == want == m.text and m.hit == hit


def test_holds_back_only_a_possible_stop_start() -> None:
    m = StopMatcher(["</s>"])
    assert m.push("hello <") == "hello "
    assert m.push("b") == "<b"  # not a stop after all: released
    assert m.push(" </") == " "
    assert m.push("s> tail") == "" and m.hit
    assert m.push("more") == "" and m.finish() == "" and m.text == "hello <b "


def test_no_stops_is_a_pass_through() -> None:
    m = StopMatcher([""])
    assert m.push("abc") == "abc" and m.finish() == "" and not m.hit


def test_a_match_waits_while_a_stop_that_starts_earlier_may_still_complete() -> None:
    """Found by the property above: "<b" holds the stop "b", but may be the start of "<b<", which
    would match earlier. Nothing is released or decided until the text says which."""
    m = StopMatcher(["b", "<b<"])
    assert m.push("<b") == "" and not m.hit
    assert m.push("<") == "" and m.hit and m.text == ""
    m = StopMatcher(["b", "<b<"])
    assert m.push("<b") == "" and m.push("a") == "<" and m.hit  # "<b<" did not come: "b" matched
    m = StopMatcher(["b", "<b<"])
    assert m.push("<b") == "" and m.finish() == "<" and m.hit  # the end decides too
