from bmoe.runtime.detokenize import Detokenizer


def feed(ts: Detokenizer, pieces: list[bytes]) -> tuple[str, str]:
    for p in pieces:
        ts.push(p)
    ts.finish()
    return ts.text, ts.reasoning


def test_utf8_split_across_tokens() -> None:
    e = "é".encode()
    ts = Detokenizer(split_think=False)
    assert ts.push(e[:1]) == ("", "")
    assert ts.push(e[1:] + b"!") == ("é!", "")


def test_think_markers_split_across_tokens() -> None:
    text, reasoning = feed(Detokenizer(split_think=True), [b"<th", b"ink>plan", b" a</thi", b"nk>answer"])
    assert (text, reasoning) == ("answer", "plan a")


def test_prompt_that_opens_reasoning() -> None:
    assert feed(Detokenizer(split_think=True, in_reasoning=True), [b"why</think>", b"so"]) == ("so", "why")


def test_no_split_keeps_markers() -> None:
    assert feed(Detokenizer(split_think=False), [b"<think>x</think>y"]) == ("<think>x</think>y", "")
