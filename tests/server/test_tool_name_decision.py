"""The tool's name as a decision (#36 items 2-3; runtime/tool_choice.py): tools whose names share
first tokens (get, get_weather, get_time) on SmolLM2 (the generic format) and a tiny MoE (Qwen3's
template: Hermes, its markers special tokens).

- temperature 0: the answer (calls, arguments, text) is constrained greedy's, the same with the
  decision run (logprobs asked), watched only (no logprobs) and with no name decision at all;
- temperature > 0: the name is drawn from the decision (the sampler gets exactly its
  ``choice_logp``, and ``log p_outside`` for auto's text), seeded, and none of it is decoded;
- the tiny MoE streamed gives the resident numbers and calls bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from fastapi.testclient import TestClient

from bmoe.numerics import draw_choice
from helpers.server import sse_events

OBJ = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
    "additionalProperties": False,
}
NAMES = ("get", "get_weather", "get_time")
TOOLS = [{"type": "function", "function": {"name": n, "parameters": OBJ}} for n in NAMES]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _chat(client: TestClient, **fields) -> dict:
    """One turn from an empty KV (a reused prefix is prefilled in other pieces, which can round
    differently: every answer compared here is computed alike)."""
    client.app.state.session.runtime.kv.reset()
    body = {"messages": ASK, "max_tokens": 40, "tools": TOOLS, "think": False, **fields}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _answer(body: dict) -> tuple:
    """What the client reads: the text and the calls (names, arguments), without the call ids."""
    msg = body["choices"][0]["message"]
    calls = tuple((c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or ())
    return msg["content"], calls, body["choices"][0]["finish_reason"]


@pytest.fixture(params=["smol", "tiny"])
def client(request, make_app):
    path = request.getfixturevalue("smol_path" if request.param == "smol" else "tiny_path")
    with TestClient(make_app(path, n_predict=48), base_url="http://localhost") as c:
        yield c


@pytest.mark.parametrize("mode", ["required", "auto"])
def test_temperature_0_is_constrained_greedy_with_and_without_the_decision(client, mode, monkeypatch) -> None:
    watched = _chat(client, tool_choice=mode, temperature=0)
    decided = _chat(client, tool_choice=mode, temperature=0, logprobs=True)
    assert _answer(watched) == _answer(decided)
    d = decided["bmoe"]["decision"]
    assert d["kind"] == "tool" and d["choices"] == list(NAMES) and d["answered_by"] == "greedy_walk"
    assert d["text_outside"] == (mode == "auto") and len(d["choice_logp"]) == 3 and 0 <= d["p_outside"] <= 1
    assert "choice_logp" not in watched["bmoe"]["decision"]
    calls = _answer(decided)[1]
    assert (NAMES[d["chosen"]] if d["chosen"] is not None else None) == (calls[0][0] if calls else None)
    import bmoe.runtime.runtime as rt

    monkeypatch.setattr(rt, "name_pick", lambda *a, **k: None)  # the turn as it ran before the decision
    plain = _chat(client, tool_choice=mode, temperature=0, logprobs=True)
    assert _answer(plain) == _answer(decided) and "decision" not in plain["bmoe"]


def _decoded_by_greedy(entries: list[dict], names: tuple[str, ...], full: list[str]) -> int:
    """From greedy's tokens: those taken after the name position's first until one name is left."""
    text, n, started = "", 0, False
    common = min(full, key=len)
    while not all(f.startswith(common) for f in full):
        common = common[:-1]
    for e in entries:
        nxt = text + e["token"]
        if not started and not common.startswith(nxt):
            started = True
        elif started:
            n += 1
        text = nxt
        if started and sum(f.startswith(text) or text.startswith(f) for f in full) <= 1:
            return n
    raise AssertionError("greedy never settled the name")


def test_temperature_0_counts_the_name_tokens_greedy_decoded(smol_path, make_app) -> None:
    with TestClient(make_app(smol_path, n_predict=48), base_url="http://localhost") as c:
        body = _chat(c, tool_choice="required", temperature=0, logprobs=True)
    entries = body["choices"][0]["logprobs"]["content"]
    full = [f'<tool_call>\n{{"name": "{n}", "arguments": ' for n in NAMES]
    assert body["bmoe"]["decision"]["decoded"] == _decoded_by_greedy(entries, NAMES, full)
    assert body["bmoe"]["decision"]["decoded"] >= 1  # get / get_weather / get_time share "get"


@pytest.mark.parametrize("mode", ["required", "auto"])
def test_temperature_above_0_draws_the_name_from_the_decision(client, mode, monkeypatch) -> None:
    import bmoe.runtime.tool_choice as tc

    seen: list[tuple] = []

    def spy(logp, temperature, top_p, seed):
        seen.append((list(logp), temperature, top_p, seed))
        return draw_choice(logp, temperature, top_p, seed)

    monkeypatch.setattr(tc, "draw_choice", spy)
    first = _chat(client, tool_choice=mode, temperature=0.9, top_p=0.95, seed=11, logprobs=True)
    again = _chat(client, tool_choice=mode, temperature=0.9, top_p=0.95, seed=11, logprobs=True)
    assert _answer(first) == _answer(again) and first["bmoe"]["decision"] == again["bmoe"]["decision"]
    d = first["bmoe"]["decision"]
    assert d["answered_by"] == "decision" and d["decoded"] == 0
    logp, temperature, top_p, seed = seen[0]
    expect = d["choice_logp"] + ([math.log(d["p_outside"])] if mode == "auto" else [])
    assert logp == expect and (temperature, top_p, seed) == (0.9, 0.95, 11)
    assert d["chosen"] == (None if draw_choice(logp, 0.9, 0.95, 11) == 3 else draw_choice(logp, 0.9, 0.95, 11))
    calls = _answer(first)[1]
    if d["chosen"] is not None:
        assert calls and calls[0][0] == NAMES[d["chosen"]]


def test_a_drawn_name_carries_its_decision_log_probs(smol_path, make_app) -> None:
    """The drawn name's tokens come with log-probs, and they sum to its ``choice_logp``."""
    with TestClient(make_app(smol_path, n_predict=48), base_url="http://localhost") as c:
        body = _chat(c, tool_choice="required", temperature=0.7, seed=5, logprobs=True, top_logprobs=2)
    d = body["bmoe"]["decision"]
    entries = body["choices"][0]["logprobs"]["content"]
    full = f'<tool_call>\n{{"name": "{NAMES[d["chosen"]]}", "arguments": '
    end = next(i for i in range(len(entries) + 1) if "".join(e["token"] for e in entries[:i]) == full)
    span = entries[end - d["choice_tokens"][d["chosen"]] : end]
    assert all(len(e["top_logprobs"]) == 2 for e in span)
    assert math.isclose(sum(e["logprob"] for e in span), d["choice_logp"][d["chosen"]], abs_tol=1e-9)


def test_draw_choice_frequencies_follow_the_distribution() -> None:
    """Over seeds 0..N-1 the drawn frequencies are within Hoeffding's bound of the softmax (for a
    probability of failure of 1e-9 per choice, were the seeds random; they are fixed, so this
    either always passes or always fails)."""
    logp = [-0.3, -1.7, -2.2, math.log(0.05)]
    p = np.exp(np.asarray(logp) / 0.8)
    p /= p.sum()
    n = 4000
    counts = np.bincount([draw_choice(logp, 0.8, None, s) for s in range(n)], minlength=4)
    bound = math.sqrt(math.log(2 / 1e-9) / (2 * n))
    assert np.all(np.abs(counts / n - p) <= bound), (counts / n, p, bound)


def test_streamed_answer_carries_the_decision(smol_path, make_app) -> None:
    with TestClient(make_app(smol_path, n_predict=48), base_url="http://localhost") as c:
        whole = _chat(c, tool_choice="required", temperature=0.8, seed=2)
        body = {"messages": ASK, "max_tokens": 40, "tools": TOOLS, "think": False, "stream": True}
        c.app.state.session.runtime.kv.reset()
        r = c.post("/v1/chat/completions", json=body | {"tool_choice": "required", "temperature": 0.8, "seed": 2})
        events = sse_events(r.text)
    last = [e for e in events if isinstance(e, dict) and "bmoe" in e]
    assert last and last[-1]["bmoe"]["decision"] == whole["bmoe"]["decision"]


def test_tiny_moe_streamed_equals_resident(make_app, tiny_path) -> None:
    got = []
    for kw in ({}, {"moe_stream": True, "cache_mb": "auto"}):
        with TestClient(make_app(tiny_path, n_predict=48, **kw), base_url="http://localhost") as c:
            runs = []
            for mode, temp in (("required", 0), ("required", 0.8), ("auto", 0), ("auto", 0.8)):
                b = _chat(c, tool_choice=mode, temperature=temp, seed=4, logprobs=True)
                runs.append((_answer(b), b["bmoe"]["decision"]))
            got.append(runs)
    assert all("choice_logp" in d for _, d in got[0])
    assert got[0] == got[1]


def test_a_special_marker_is_scored_as_its_one_token() -> None:
    """A choice's rest is tokenized with each marker that is one special token as that token
    (Qwen3's ``<tool_call>``), the text around it as plain text."""
    from bmoe.runtime.tool_choice import NamePick

    class Chars:
        def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
            assert not add_special and not parse_special
            return [ord(c) for c in text]

    pick = NamePick(("a",), (b"",), True, True, 1.0, 1.0, None, {"<tool_call>": 7, "<|x|>": 9})
    got = pick._tokens(Chars(), '<tool_call>\n{"name": "a"<|x|>')  # type: ignore[arg-type]
    assert got == [7, *map(ord, '\n{"name": "a"'), 9]


def test_without_decide_the_name_is_sampled_token_by_token(smol_path, make_app) -> None:
    with TestClient(make_app(smol_path, n_predict=48, decide=False), base_url="http://localhost") as c:
        d = _chat(c, tool_choice="required", temperature=0.8, seed=3)["bmoe"]["decision"]
    assert d["answered_by"] == "sampled" and d["why_not"] == "decide is off (--no-decide)"
    assert "choice_logp" not in d and d["chosen"] in (0, 1, 2)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_drawn_name_goes_in_as_one_batch(make_app, smol_path, temperature) -> None:
    """The KV appends of a one-call turn: the prompt's prefill, then one per token but the last
    (which ends the grammar); a drawn name's k tokens go in as one append (k - 1 fewer), a
    greedy one token by token."""
    from bmoe.constrain import ToolChoice, parse_tools
    from bmoe.runtime.kv import KvSequence
    from bmoe.session import GenerateRequest

    app = make_app(smol_path, n_predict=48)
    s = app.state.session
    calls: list[int] = []
    real = KvSequence.append

    def counting(self, tokens, **kw):
        calls.append(len(tokens))
        return real(self, tokens, **kw)

    req = GenerateRequest(
        prompt=ASK[0]["content"],
        tools=parse_tools(TOOLS),
        tool_choice=ToolChoice("required"),
        parallel_tool_calls=False,
        think=False,
        n_predict=48,
        clear_kv=True,
        temperature=temperature,
        seed=3,
        top_logprobs=0,
    )
    KvSequence.append = counting  # type: ignore[method-assign]
    try:
        r = s.generate(req)
    finally:
        KvSequence.append = real  # type: ignore[method-assign]
    d = r.tool_decision
    assert r.stop == "eog" and d is not None and d["chosen"] is not None
    k = d["choice_tokens"][d["chosen"]] if temperature > 0 else 1
    assert len(calls) == 1 + (r.n_tokens - 1) - (k - 1)
    assert d["answered_by"] == ("decision" if temperature > 0 else "greedy_walk")
    if temperature > 0:
        assert d["decoded"] == 0 and k > 1 and k in calls


@pytest.mark.parametrize("pick", [1, 3])
def test_auto_goes_on_as_drawn(client, pick, monkeypatch) -> None:
    """Under auto a drawn tool is called (its name forced, its arguments generated), and drawn
    text starts with a token no choice starts with. The draw is fixed here: with these small
    models text has nearly all the probability."""
    import bmoe.runtime.tool_choice as tc

    monkeypatch.setattr(tc, "draw_choice", lambda logp, *a: pick)
    body = _chat(client, tool_choice="auto", temperature=0.8, seed=1, logprobs=True, parallel_tool_calls=False)
    d = body["bmoe"]["decision"]
    content, calls, finish = _answer(body)
    assert d["answered_by"] == "decision" and d["decoded"] == 0
    if pick == 1:
        assert d["chosen"] == 1 and finish == "tool_calls" and content is None
        assert calls[0][0] == "get_weather" and json.loads(calls[0][1]).keys() == {"city"}
        return
    assert d["chosen"] is None and content
    s = client.app.state.session
    from bmoe.constrain import ToolChoice, parse_tools, tool_decision

    decision = tool_decision(s.chat.tool_format, parse_tools(TOOLS), ToolChoice("auto"))
    assert decision is not None
    opener = decision.choices
    firsts = {bytes(s.model.token_bytes(s.model.tokenize(o, add_special=False, parse_special=True)[0])) for o in opener}
    assert bytes(body["choices"][0]["logprobs"]["content"][0]["bytes"]) not in firsts


def test_a_special_token_opener_is_drawn_and_forced_as_that_token(make_app, smol_path, monkeypatch) -> None:
    """A format whose opener is one special token of the vocabulary (as Qwen3's ``<tool_call>``):
    SmolLM2's ``<|im_start|>`` stands in for it. The opener is scored and forced as that token, and
    temperature 0 stays greedy's."""
    import dataclasses

    import bmoe.runtime.runtime as rt
    from bmoe.constrain import GENERIC, ToolChoice, parse_tools
    from bmoe.session import GenerateRequest

    s = make_app(smol_path, n_predict=48).state.session
    s.chat.tool_format = dataclasses.replace(
        GENERIC, name="special-test", call_open='<|im_start|>{{"name": "{name}", "arguments": '
    )
    [im_start] = s.model.tokenize("<|im_start|>", add_special=False, parse_special=True)

    def run(mode: str, temperature: float) -> tuple:
        s.runtime.kv.reset()
        r = s.generate(
            GenerateRequest(
                prompt=ASK[0]["content"],
                tools=parse_tools(TOOLS),
                tool_choice=ToolChoice(mode),
                think=False,
                n_predict=40,
                clear_kv=True,
                temperature=temperature,
                seed=7,
                top_logprobs=0,
            )
        )
        return r.text, r.tokens, r.tool_decision

    text, tokens, d = run("required", 0.8)
    assert d is not None and d["answered_by"] == "decision" and tokens[0] == im_start, (d, text)
    assert text.startswith('<|im_start|>{"name": "' + NAMES[d["chosen"]] + '", "arguments": ')
    greedy = [run(mode, 0.0) for mode in ("required", "auto")]
    monkeypatch.setattr(rt, "name_pick", lambda *a, **k: None)
    plain = [run(mode, 0.0) for mode in ("required", "auto")]
    assert [(t, k) for t, k, _ in greedy] == [(t, k) for t, k, _ in plain]
    assert all(d is not None and "choice_logp" in d for _, _, d in greedy)


def test_logit_bias_keeps_the_name_generated(smol_path, make_app) -> None:
    """A bias changes the tokens' scores, so the decision's would not be the sampler's: no draw."""
    with TestClient(make_app(smol_path, n_predict=48), base_url="http://localhost") as c:
        d = _chat(c, tool_choice="required", temperature=0.8, seed=3, logit_bias={"100": 1.0})["bmoe"]["decision"]
        greedy = _chat(c, tool_choice="required", temperature=0, logit_bias={"100": 1.0})["bmoe"]["decision"]
    assert d["answered_by"] == "sampled" and "choice_logp" not in d
    assert d["why_not"] == "logit_bias or a penalty changes the tokens' scores"
    assert greedy["answered_by"] == "greedy_walk" and "why_not" not in greedy


def test_a_turn_that_starts_inside_reasoning_decides_the_name_after_it(smol_path, make_app, monkeypatch) -> None:
    """A turn whose answer starts inside a reasoning block (a prompt that opened ``<think>``) has
    its name decision, at the position after the block (tests/constrain/test_tool_pick_reasoning.py
    runs it end to end); a turn without one decides at the answer's start."""
    from bmoe.constrain import ToolChoice, parse_tools
    from bmoe.session import GenerateRequest

    s = make_app(smol_path).state.session
    req = GenerateRequest(prompt="hi", tools=parse_tools(TOOLS), tool_choice=ToolChoice("required"), think=False)
    pick = s.runtime.prepare(req).pick
    assert pick is not None and pick.block.mode == "" and pick.block.phase == "body"
    from bmoe.runtime.reasoning import THINK

    s.chat.think_ctl, s.chat.reasoning = "template", THINK  # SmolLM2's has no switch: as Qwen3's
    turn = s.runtime.prepare(dataclasses.replace(req, think=True))
    assert turn.think and turn.pick is not None and turn.pick.block.phase == "maybe"


def test_a_reasoning_turn_s_name_is_decided_over_http(tiny_path, make_app, monkeypatch) -> None:
    """Qwen3's real template, thinking on (the default): the answer's reasoning comes as
    ``reasoning_content``, its call as ``tool_calls``, and the name after the reasoning is the
    decision's, whole and streamed (the tiny model's reasoning is scripted: it never closes it)."""
    import sys
    from pathlib import Path

    import bmoe.runtime.runtime as rt
    from bmoe.runtime.chat import ChatRenderer

    source = Path(sys.prefix) / "share" / "llama.cpp" / "models" / "templates" / "Qwen-Qwen3-0.6B.jinja"
    app = make_app(tiny_path, n_predict=64)
    s = app.state.session
    s.runtime.chat = ChatRenderer("template", source.read_text(), "", "")
    script = s.model.tokenize("<think>\nCall get.\n</think>\n\n<", add_special=False, parse_special=False)

    class Scripted(rt.Sampler):
        def __init__(self, *a, **k) -> None:
            super().__init__(*a, **k)
            self.left = list(script)

        def sample(self, logits):
            return self.left.pop(0) if self.left else super().sample(logits)

    monkeypatch.setattr(rt, "Sampler", Scripted)
    fields = {"tool_choice": "required", "temperature": 0.8, "seed": 6, "parallel_tool_calls": False, "max_tokens": 64}
    with TestClient(app, base_url="http://localhost") as c:
        body = _chat(c, think=True, **fields)
        c.app.state.session.runtime.kv.reset()
        req = {"messages": ASK, "tools": TOOLS, "stream": True, **fields}
        events = sse_events(c.post("/v1/chat/completions", json=req).text)
    msg, d = body["choices"][0]["message"], body["bmoe"]["decision"]
    assert msg["reasoning_content"].strip() == "Call get." and not msg["content"]
    assert d["answered_by"] == "decision" and d["decoded"] == 0 and len(d["choice_logp"]) == 3
    assert [c["function"]["name"] for c in msg["tool_calls"]] == [NAMES[d["chosen"]]]
    last = [e for e in events if isinstance(e, dict) and "bmoe" in e]
    assert last and last[-1]["bmoe"]["decision"] == d
