"""Tool calls over /v1/chat/completions (#36.3): tools, tool_choice, parallel_tool_calls and a
history of calls and results, on SmolLM2 (the generic fallback format) and a tiny MoE (Qwen3's
template: Hermes); streamed calls as OpenAI deltas; each bad input a 400 naming it, the session
answering the next request."""

from __future__ import annotations

import json

import jsonschema
import pytest
from fastapi.testclient import TestClient

from helpers.server import sse_events

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 30},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {"name": "noop", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
    },
]
ASK = [{"role": "user", "content": "What is the weather in Paris for 2 days?"}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module", params=["smol", "tiny"])
def client(request):
    from bmoe.config import SessionConfig
    from bmoe.server import ServerSettings, close_app, create_app
    from bmoe.session import Session

    path = request.getfixturevalue("smol_path" if request.param == "smol" else "tiny_path")
    session = Session(SessionConfig(model=path, n_ctx=2048, n_predict=96, decide=True, n_threads=1))
    app = create_app(session, ServerSettings())
    with TestClient(app, base_url="http://localhost") as c:
        yield c
    close_app(app)
    session.close()


def _post(client, **fields):
    return client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 96, "temperature": 0, **fields})


def _calls_valid(calls: list[dict]) -> None:
    for c in calls:
        assert c["type"] == "function" and c["id"]
        jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])


def test_required_answers_with_a_call_of_a_tool(client) -> None:
    r = _post(client, tools=TOOLS, tool_choice="required")
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "length":  # cut inside the call's arguments: no call to read
        return
    assert choice["finish_reason"] == "tool_calls"
    calls = choice["message"]["tool_calls"]
    assert len(calls) >= 1 and choice["message"]["content"] is None
    _calls_valid(calls)


def test_named_tool_and_parallel_false_give_one_call_of_it(client) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = _post(client, tools=TOOLS, tool_choice=named, parallel_tool_calls=False)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] in ("tool_calls", "length")
    if choice["finish_reason"] == "tool_calls":
        calls = choice["message"]["tool_calls"]
        assert [c["function"]["name"] for c in calls] == ["get_weather"]
        _calls_valid(calls)


def test_none_answers_in_text(client) -> None:
    r = _post(client, tools=TOOLS, tool_choice="none", max_tokens=8)
    choice = r.json()["choices"][0]
    assert r.status_code == 200 and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] in ("stop", "length")


def test_auto_answers_in_text_or_calls(client) -> None:
    r = _post(client, tools=TOOLS)
    choice = r.json()["choices"][0]
    assert r.status_code == 200
    if choice["finish_reason"] == "tool_calls":
        _calls_valid(choice["message"]["tool_calls"])
    else:
        assert "tool_calls" not in choice["message"] and isinstance(choice["message"]["content"], str)


def test_streamed_calls_are_the_resident_ones_as_deltas(client) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    whole = _post(client, tools=TOOLS, tool_choice=named).json()["choices"][0]
    r = _post(client, tools=TOOLS, tool_choice=named, stream=True)
    assert r.status_code == 200
    events = [e for e in sse_events(r.text) if isinstance(e, dict)]
    deltas = [c["delta"] for e in events for c in e["choices"]]
    finish = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert finish == [whole["finish_reason"]]
    streamed = [tc for d in deltas for tc in d.get("tool_calls", [])]
    if whole["finish_reason"] == "tool_calls":
        assert [tc["index"] for tc in streamed] == list(range(len(whole["message"]["tool_calls"])))
        strip = [{k: v for k, v in tc.items() if k not in ("index", "id")} for tc in streamed]
        assert strip == [{k: v for k, v in c.items() if k != "id"} for c in whole["message"]["tool_calls"]]


def test_tool_loop_call_result_answer(client) -> None:
    """The call, the tool's result as the last message, then the model's answer in text."""
    r = _post(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    msg = r.json()["choices"][0]["message"]
    # a named call's arguments are bounded (a city of 12 characters at most, an integer): it ends
    # well within max_tokens, so a call always comes
    assert msg.get("tool_calls"), msg
    call = msg["tool_calls"][0]
    history = [*ASK, msg, {"role": "tool", "tool_call_id": call["id"], "content": '{"temp_c": 21}'}]
    r2 = client.post(
        "/v1/chat/completions",
        json={"messages": history, "tools": TOOLS, "tool_choice": "none", "max_tokens": 8, "temperature": 0},
    )
    assert r2.status_code == 200, r2.text
    second = r2.json()
    assert "tool_calls" not in second["choices"][0]["message"]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the call's turn was kept


def _refused(client, field: str, message: str, **body) -> None:
    r = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert (e["message"], e["param"]) == (message, field)
    assert _post(client, max_tokens=2).status_code == 200  # the session answers the next request


BAD = {
    "duplicate": (
        "tools[1].function.name",
        "tools[1].function.name: duplicate tool name 'get_weather' (also tools[0])",
        {"tools": [TOOLS[0], TOOLS[0]]},
    ),
    "unknown tool_choice": (
        "tool_choice.function.name",
        "tool_choice.function.name: 'get_news' is not one of the tools ('get_weather', 'noop')",
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_news"}}},
    ),
    "tool_choice word": (
        "tool_choice",
        "tool_choice: must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}",
        {"tools": TOOLS, "tool_choice": "always"},
    ),
    "1000 tools": (
        "tools",
        "tools: holds 1000 tools, more than the 128 one request may hold",
        {"tools": [{"type": "function", "function": {"name": f"t{i}"}} for i in range(1000)]},
    ),
    "history call of no tool": (
        "messages[1].tool_calls[0].function.name",
        "messages[1].tool_calls[0].function.name: 'get_news' is not one of the tools ('get_weather', 'noop')",
        {
            "tools": TOOLS,
            "messages": [
                *ASK,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "get_news", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "x"},
            ],
        },
    ),
    "result of no call": (
        "messages[1].tool_call_id",
        "messages[1].tool_call_id: 'c9' answers no earlier assistant tool call",
        {"tools": TOOLS, "messages": [*ASK, {"role": "tool", "tool_call_id": "c9", "content": "x"}]},
    ),
    "parallel not bool": (
        "parallel_tool_calls",
        "parallel_tool_calls: must be true or false, got 'yes'",
        {"tools": TOOLS, "parallel_tool_calls": "yes"},
    ),
    "tools and a schema": (
        "tools",
        "tools: an answer keeps one constraint: give tools or a response_format/json_schema/grammar, not both "
        "(or tool_choice 'none')",
        {"tools": TOOLS, "json_schema": {"type": "object"}},
    ),
    "calls on a user message": (
        "messages.0.tool_calls",
        "messages[0].tool_calls: only an assistant message makes calls",
        {
            "tools": TOOLS,
            "messages": [
                {
                    "role": "user",
                    "content": "hi",
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "noop", "arguments": "{}"}}],
                }
            ],
        },
    ),
    "tool message without its call": (
        "messages.1.tool_call_id",
        "messages[1].tool_call_id: a tool message names the call it answers",
        {"messages": [*ASK, {"role": "tool", "content": "x"}]},
    ),
    "null content": (
        "messages.0.content",
        "messages[0].content: required (null only on an assistant turn with tool_calls)",
        {"messages": [{"role": "user", "content": None}]},
    ),
    "no content": (
        "messages.0.content",
        "messages[0].content: required (null only on an assistant turn with tool_calls)",
        {"messages": [{"role": "user"}]},
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_a_400_naming_it(client, case) -> None:
    field, message, body = BAD[case]
    _refused(client, field, message, **body)


@pytest.fixture(scope="module")
def qwen3_client(tiny_path):
    """The tiny MoE under Qwen3's real chat template: the native Hermes format, and a <think> block."""
    import sys
    from pathlib import Path

    from bmoe.config import SessionConfig
    from bmoe.runtime.chat import ChatRenderer
    from bmoe.server import ServerSettings, close_app, create_app
    from bmoe.session import Session

    templates = Path(sys.prefix) / "share" / "llama.cpp" / "models" / "templates"
    session = Session(SessionConfig(model=tiny_path, n_ctx=2048, n_predict=96, n_threads=1))
    session.runtime.chat = ChatRenderer("template", (templates / "Qwen-Qwen3-0.6B.jinja").read_text(), "", "")
    app = create_app(session, ServerSettings())
    with TestClient(app, base_url="http://localhost") as c:
        yield c
    close_app(app)
    session.close()


@pytest.mark.parametrize("think", [False, True])
def test_native_format_loop_on_a_thinking_template(qwen3_client, think) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = _post(qwen3_client, tools=TOOLS, tool_choice=named, parallel_tool_calls=False, think=think, max_tokens=160)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if think:  # a random model may reason until max_tokens; what it wrote is reasoning, not content
        assert choice["finish_reason"] in ("tool_calls", "length")
        if choice["finish_reason"] == "length":
            return
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    _calls_valid(msg["tool_calls"])
    call = msg["tool_calls"][0]
    history = [*ASK, msg, {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    r2 = qwen3_client.post(
        "/v1/chat/completions", json={"messages": history, "tools": TOOLS, "tool_choice": "none", "max_tokens": 4}
    )
    assert r2.status_code == 200, r2.text
