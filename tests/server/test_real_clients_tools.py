"""Tool calls from agents' own clients against a live bmoe-server (#36.3, #36.6): the `openai` SDK's
full tool loop (call, the tool's result, the final answer), pydantic-ai with a function tool and
with a Pydantic output (which it asks for by tool calling), and langchain-openai's `bind_tools`,
all unchanged. On SmolLM2 (its template has no tool syntax: the generic fallback) and on a tiny
MoE, resident and with its experts streamed from flash: the streamed server's calls equal the
resident one's.

The assertions are on what the clients parsed (the tool's name, arguments valid under its
schema), never on the answers' quality: a 135M model and a random tiny MoE write poor answers,
but their calls are of the tools' schemas.
"""

from __future__ import annotations

import json
from typing import Annotated

import jsonschema
import pytest
from pydantic import BaseModel, Field

from bmoe.config import SessionConfig
from bmoe.server import ServerSettings, close_app, create_app
from bmoe.session import Session
from helpers.server import LiveServer, openai_client

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# Bounded so that even a random model's call ends within max_tokens (a string's length, a number's range).
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The forecast.", "parameters": WEATHER}}
]
ASK = "What is the weather in Paris for the next 2 days? Use the tool."


class Town(BaseModel):
    name: str = Field(max_length=12)
    rainy: bool


def _open(path, **kw) -> tuple[Session, object, LiveServer]:
    session = Session(SessionConfig(model=path, n_ctx=2048, n_predict=128, decide=True, n_threads=1, **kw))
    app = create_app(session, ServerSettings())
    return session, app, LiveServer(app).start()


@pytest.fixture(scope="module", params=["smol", "tiny", "tiny-streamed"])
def server(request, tmp_path_factory):
    if request.param == "smol":
        path, kw = request.getfixturevalue("smol_path"), {}
    else:
        path = request.getfixturevalue("tiny_path")
        kw = {}
        if request.param == "tiny-streamed":
            kw = {"moe_stream": True, "cache_mb": 0, "twin_dir": tmp_path_factory.mktemp("twins")}
    session, app, live = _open(path, **kw)
    live.name = request.param  # type: ignore[attr-defined]
    yield live
    live.stop()
    close_app(app)
    session.close()


def _sdk_loop(url: str) -> tuple[list[tuple[str, dict]], str | None]:
    """The openai SDK's tool loop: a call, the tool's result sent back, the final answer."""
    client = openai_client(url)
    messages: list = [{"role": "user", "content": ASK}]
    r = client.chat.completions.create(
        model="bmoe",
        messages=messages,
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=96,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls or []
    parsed = [(c.function.name, json.loads(c.function.arguments)) for c in calls]  # type: ignore[union-attr]
    messages.append(choice.message)
    for c in calls:
        messages.append({"role": "tool", "tool_call_id": c.id, "content": json.dumps({"forecast": "sunny"})})
    final = client.chat.completions.create(
        model="bmoe",
        messages=messages,
        tools=TOOLS,
        tool_choice="none",
        max_tokens=16,
        temperature=0,  # type: ignore[arg-type]
    )
    assert final.choices[0].message.tool_calls is None
    return parsed, final.choices[0].message.content


def test_openai_sdk_tool_loop(server) -> None:
    parsed, answer = _sdk_loop(server.url)
    assert [name for name, _ in parsed] == ["get_weather"]
    jsonschema.validate(parsed[0][1], WEATHER)
    assert isinstance(answer, str)


def test_openai_sdk_streamed_tool_call(server) -> None:
    """The SDK's stream helper puts the deltas together into the same call as the whole answer."""
    client = openai_client(server.url)
    body = dict(
        model="bmoe",
        messages=[{"role": "user", "content": ASK}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        max_tokens=96,
        temperature=0,
    )
    whole = client.chat.completions.create(**body).choices[0]  # type: ignore[call-overload]
    with client.chat.completions.stream(**body) as s:  # type: ignore[arg-type]
        done = s.get_final_completion().choices[0]
    assert done.finish_reason == whole.finish_reason == "tool_calls"
    got = [(c.function.name, c.function.arguments) for c in done.message.tool_calls or []]
    assert got == [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
    jsonschema.validate(json.loads(got[0][1]), WEATHER)


def _pydantic_ai_model(url: str):
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel("bmoe", provider=OpenAIProvider(base_url=url + "/v1", api_key="none"))


SETTINGS = {"max_tokens": 96, "temperature": 0, "parallel_tool_calls": False}


def test_pydantic_ai_function_tool(server) -> None:
    """A function tool beside a Pydantic output (which pydantic-ai asks for as a tool of its own,
    tool_choice "required"): each call it read names one of the two with arguments it validated
    (no retry asked), and the tool ran with them. Whether the model calls the tool again rather
    than answering is its quality: the run may end at its request limit."""
    from pydantic_ai import Agent, capture_run_messages
    from pydantic_ai.exceptions import UsageLimitExceeded
    from pydantic_ai.messages import RetryPromptPart, ToolCallPart
    from pydantic_ai.usage import UsageLimits

    agent = Agent(_pydantic_ai_model(server.url), output_type=Town, model_settings=SETTINGS)  # type: ignore[arg-type]
    ran: list[tuple[str, int]] = []

    @agent.tool_plain
    def get_weather(city: str, days: int) -> str:
        """The forecast for a city, for some days."""
        ran.append((city, days))
        return "rain"

    with capture_run_messages() as messages:
        try:
            assert isinstance(agent.run_sync(ASK, usage_limits=UsageLimits(request_limit=3)).output, Town)
        except UsageLimitExceeded:
            pass
    parts = [p for m in messages for p in m.parts]
    calls = [p for p in parts if isinstance(p, ToolCallPart)]
    assert calls and {c.tool_name for c in calls} <= {"get_weather", "final_result"}
    assert not [p for p in parts if isinstance(p, RetryPromptPart)]  # every call's arguments validated
    assert len(ran) == sum(c.tool_name == "get_weather" for c in calls)


def test_pydantic_ai_output_function(server) -> None:
    """A tool whose call is the run's answer (pydantic-ai's output function): one call, its
    arguments validated into the function's parameters."""
    from pydantic_ai import Agent

    def forecast(city: Annotated[str, Field(max_length=12)], days: Annotated[int, Field(ge=1, le=7)]) -> Town:
        """The forecast for a city, for some days."""
        assert isinstance(city, str) and isinstance(days, int)
        return Town(name=city[:12], rainy=days > 1)

    agent = Agent(_pydantic_ai_model(server.url), output_type=forecast, model_settings=SETTINGS)  # type: ignore[arg-type]
    assert isinstance(agent.run_sync(ASK).output, Town)


def test_langchain_bind_tools(server) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    class Weather(BaseModel):
        city: str = Field(max_length=12)
        days: int = Field(ge=1, le=7)

    @tool(args_schema=Weather)
    def get_weather(city: str, days: int) -> str:
        """The forecast for a city, for some days."""
        return "sunny"

    llm = ChatOpenAI(
        model="bmoe", base_url=server.url + "/v1", api_key="none", temperature=0, max_tokens=96, max_retries=0
    )
    bound = llm.bind_tools([get_weather], tool_choice="get_weather", parallel_tool_calls=False)
    ask = [HumanMessage(ASK)]
    msg = bound.invoke(ask)
    assert [c["name"] for c in msg.tool_calls] == ["get_weather"] and not msg.invalid_tool_calls
    jsonschema.validate(msg.tool_calls[0]["args"], get_weather.args_schema.model_json_schema())  # type: ignore[union-attr]
    result = ToolMessage(get_weather.invoke(msg.tool_calls[0]["args"]), tool_call_id=msg.tool_calls[0]["id"])
    final = llm.bind_tools([get_weather], tool_choice="none").invoke([*ask, msg, result])
    assert not final.tool_calls and isinstance(final.content, str)


def test_tiny_moe_streamed_calls_equal_resident(tiny_path, tmp_path) -> None:
    """The tool loop on the tiny MoE with its experts streamed from flash gives the resident
    model's calls and answer exactly."""
    answers = []
    for kw in ({}, {"moe_stream": True, "cache_mb": 0, "twin_dir": tmp_path / "twins"}):
        session, app, live = _open(tiny_path, **kw)
        try:
            answers.append(_sdk_loop(live.url))
        finally:
            live.stop()
            close_app(app)
            session.close()
    assert answers[0] == answers[1]
