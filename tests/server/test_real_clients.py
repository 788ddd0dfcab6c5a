"""Agents' own clients against a live bmoe-server (#36.6): the `openai` SDK's structured outputs and
two agent frameworks from PyPI (pydantic-ai, langchain-openai) through their OpenAI-compatible
providers, unchanged. What they send is the interface; nothing here imitates them.

SmolLM2 is the model: a 135M model's answers are poor, but a constrained answer is always of the
schema, which is what these clients parse.
"""

from __future__ import annotations

from enum import Enum

import pytest
from pydantic import BaseModel, Field

from bmoe.config import SessionConfig
from bmoe.server import ServerSettings, close_app, create_app
from bmoe.session import Session
from helpers.server import LiveServer, openai_client

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class City(BaseModel):
    name: str = Field(max_length=40)
    population: int
    tags: list[str] = Field(max_length=3)


class Mood(str, Enum):
    happy = "happy"
    sad = "sad"
    unsure = "unsure"


class Verdict(BaseModel):
    mood: Mood


@pytest.fixture(scope="module")
def server(smol_path):
    session = Session(SessionConfig(model=smol_path, n_ctx=2048, n_predict=256, decide=True, n_threads=1))
    app = create_app(session, ServerSettings())
    live = LiveServer(app).start()
    yield live
    live.stop()
    close_app(app)
    session.close()


def test_openai_sdk_parse_gives_the_pydantic_model(server) -> None:
    r = openai_client(server.url).chat.completions.parse(
        model="smol",
        messages=[{"role": "user", "content": "Describe Paris as JSON: name, population, tags."}],
        response_format=City,
        max_tokens=200,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, City)
    assert City.model_validate_json(choice.message.content) == choice.message.parsed


def test_openai_sdk_parse_of_an_enum_field(server) -> None:
    r = openai_client(server.url).chat.completions.parse(
        model="smol",
        messages=[{"role": "user", "content": "I won the lottery! How do I feel?"}],
        response_format=Verdict,
        max_tokens=40,
        temperature=0,
    )
    assert isinstance(r.choices[0].message.parsed, Verdict)
    assert r.choices[0].message.parsed.mood in set(Mood)


def test_pydantic_ai_native_output(server) -> None:
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("smol", provider=OpenAIProvider(base_url=server.url + "/v1", api_key="none"))
    agent = Agent(model, output_type=NativeOutput(City), model_settings={"max_tokens": 200, "temperature": 0})
    out = agent.run_sync("Describe Paris: its name, population and a few tags.").output
    assert isinstance(out, City)


def test_langchain_with_structured_output(server) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model="smol", base_url=server.url + "/v1", api_key="none", temperature=0, max_tokens=200, max_retries=0
    )
    out = llm.with_structured_output(City, method="json_schema").invoke("Describe Paris: name, population, tags.")
    assert isinstance(out, City)
