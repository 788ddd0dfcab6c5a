"""Reasoning fields as OpenAI clients send them (issue #36: nothing silently ignored):
``reasoning_effort`` (OpenAI's) and ``chat_template_kwargs`` (vLLM's and llama.cpp-server's,
``{"enable_thinking": false}`` from Qwen3 users), read against the template's switch
(server/think_fields.py, runtime/think_switch.py); the real ``openai`` SDK against a live server,
on SmolLM2 (its template has no switch and no reasoning) and on the tiny qwen3moe under Qwen3's
real template."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import openai
import pytest

from bmoe.runtime.chat import ChatRenderer
from bmoe.runtime.think_switch import ENABLE_THINKING, GPT_OSS, HY3, NO_SWITCH, SOLAR_OPEN
from bmoe.server.errors import ApiError
from bmoe.server.think_fields import Reasoning, resolve, template_kwargs
from helpers.server import openai_client

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
TEMPLATES = Path(
    os.environ.get("BMOE_LLAMA_TEMPLATES") or Path(sys.prefix) / "share" / "llama.cpp" / "models" / "templates"
)
MSGS = [{"role": "user", "content": "Say hi."}]


def refusal(fn, *a) -> tuple[str, str | None]:  # type: ignore[no-untyped-def]
    with pytest.raises(ApiError) as e:
        fn(*a)
    return e.value.message, e.value.param


def test_template_kwargs_are_a_json_object_without_bmoes_own_variables() -> None:
    assert template_kwargs({"enable_thinking": False, "x": [1]}) == (("enable_thinking", False), ("x", [1]))
    assert refusal(template_kwargs, ["x"]) == (
        "chat_template_kwargs: a JSON object of template variables, got list",
        "chat_template_kwargs",
    )
    for key in ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token"):
        assert refusal(template_kwargs, {key: 1}) == (
            f"chat_template_kwargs: {key!r} is a variable bmoe renders itself (messages, tools, "
            "add_generation_prompt, bos_token, eos_token); it cannot be given",
            f"chat_template_kwargs.{key}",
        )
    assert refusal(template_kwargs, {"enable_thinking": "no"}) == (
        "chat_template_kwargs: 'enable_thinking' is true or false, got 'no'",
        "chat_template_kwargs.enable_thinking",
    )


def test_each_field_sets_think_and_they_must_agree() -> None:
    kw = (("enable_thinking", False),)
    assert resolve(ENABLE_THINKING, True, None, None, kw) == Reasoning(False)  # bmoe sets it from think
    assert resolve(ENABLE_THINKING, True, False, "none", kw) == Reasoning(False)
    assert resolve(ENABLE_THINKING, True, None, "high", ()) == Reasoning(True)  # no effort variable: on
    assert refusal(resolve, ENABLE_THINKING, True, True, None, kw) == (
        "chat_template_kwargs.enable_thinking: enable_thinking=False turns reasoning off, but the request's "
        "other reasoning fields turn it on; give one",
        "chat_template_kwargs.enable_thinking",
    )
    assert refusal(resolve, ENABLE_THINKING, True, None, "low", kw)[1] == "reasoning_effort"
    assert refusal(resolve, ENABLE_THINKING, True, None, "extreme", ()) == (
        "reasoning_effort: one of none, minimal, low, medium, high, xhigh, got 'extreme'",
        "reasoning_effort",
    )


def test_effort_values_per_template() -> None:
    assert resolve(GPT_OSS, True, None, "high", ()) == Reasoning(True, "high")
    assert resolve(GPT_OSS, True, None, "xhigh", ()) == Reasoning(True)  # the template's default effort
    for asked in ((False, None, ()), (None, "none", ()), (None, None, (("enable_thinking", False),))):
        field = ("think", "reasoning_effort", "chat_template_kwargs.enable_thinking")[
            [a is not None and a != () for a in asked].index(True)
        ]
        assert refusal(resolve, GPT_OSS, True, *asked) == (
            f"{field}: asks for no reasoning, and this model's chat template always reasons "
            "(reasoning_effort low, medium, high)",
            field,
        )
    assert resolve(HY3, True, None, "low", ()) == Reasoning(True, "low")
    assert resolve(HY3, True, None, "medium", ()) == Reasoning(True)  # not Hy3's: its on value, "high"
    assert resolve(HY3, True, None, "minimal", ()) == Reasoning(False)
    assert resolve(HY3, True, None, None, (("reasoning_effort", "low"),)) == Reasoning(
        True, None, (("reasoning_effort", "low"),)
    )
    assert resolve(SOLAR_OPEN, True, None, "low", ()) == Reasoning(False)  # Solar's low is its off
    assert resolve(SOLAR_OPEN, True, None, "medium", ()) == Reasoning(True, "medium")
    assert refusal(resolve, NO_SWITCH, False, None, "high", ()) == (
        "reasoning_effort: 'high': this model's chat template does not reason (only none or minimal)",
        "reasoning_effort",
    )
    assert resolve(NO_SWITCH, False, None, "none", ()) == Reasoning(False)


@pytest.fixture(scope="module")
def smol(smol_path):
    from bmoe.config import SessionConfig
    from bmoe.server import ServerSettings, close_app, create_app
    from bmoe.session import Session
    from helpers.server import LiveServer

    session = Session(SessionConfig(model=smol_path, n_ctx=1024, n_predict=12, decide=True, n_threads=1))
    app = create_app(session, ServerSettings())
    live = LiveServer(app).start()
    yield live
    live.stop()
    close_app(app)
    session.close()


def _ask(url: str, **kw):  # type: ignore[no-untyped-def]
    r = openai_client(url).chat.completions.create(model="m", messages=MSGS, max_tokens=8, temperature=0, **kw)
    return r.choices[0].message.content, r.usage.prompt_tokens


def test_smollm2_has_no_switch_so_its_prompt_is_the_same(smol) -> None:
    """SmolLM2's template has no switch and no reasoning: ``enable_thinking`` false is the
    reasoning it does not do anyway, and its template does not read the variable; an effort that
    asks for reasoning is refused."""
    plain = _ask(smol.url)
    assert _ask(smol.url, extra_body={"chat_template_kwargs": {"enable_thinking": False}}) == plain
    assert _ask(smol.url, reasoning_effort="none") == plain
    with pytest.raises(openai.BadRequestError) as e:
        _ask(smol.url, reasoning_effort="high")
    assert e.value.body["message"] == (
        "reasoning_effort: 'high': this model's chat template does not reason (only none or minimal)"
    )
    assert e.value.body["param"] == "reasoning_effort"
    with pytest.raises(openai.BadRequestError) as e:
        _ask(smol.url, extra_body={"chat_template_kwargs": {"add_generation_prompt": False}})
    assert e.value.body["param"] == "chat_template_kwargs.add_generation_prompt"
    with pytest.raises(openai.BadRequestError) as e:
        _ask(smol.url, extra_body={"chat_template_kwargs": {"x": 1}, "bmoe_logprobs_of": ["Hi"]})
    assert e.value.body["message"] == (
        "bmoe_logprobs_of: scored on a decision's prompt, which takes no chat_template_kwargs; not with them"
    )
    assert _ask(smol.url) == plain  # the session stays usable


@pytest.fixture(scope="module")
def qwen3(tiny_models):
    from bmoe.config import SessionConfig
    from bmoe.server import ServerSettings, close_app, create_app
    from bmoe.session import Session
    from helpers.server import LiveServer

    session = Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), n_ctx=1024, n_threads=1))
    session.runtime.chat = ChatRenderer("template", (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text(), "", "")
    app = create_app(session, ServerSettings())
    live = LiveServer(app).start()
    yield live
    live.stop()
    close_app(app)
    session.close()


def test_qwen3s_enable_thinking_false_from_chat_template_kwargs_is_think_false(qwen3) -> None:
    on = _ask(qwen3.url)
    off = _ask(qwen3.url, extra_body={"think": False})
    assert off[1] > on[1]  # the empty <think></think> block Qwen3's template writes
    assert _ask(qwen3.url, extra_body={"chat_template_kwargs": {"enable_thinking": False}}) == off
    assert _ask(qwen3.url, reasoning_effort="minimal") == off
    assert _ask(qwen3.url, reasoning_effort="high") == on
    with pytest.raises(openai.BadRequestError) as e:
        _ask(qwen3.url, reasoning_effort="high", extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert e.value.body["param"] == "reasoning_effort"
    assert e.value.body["message"] == (
        "reasoning_effort: 'high' turns reasoning on, but the request's other reasoning fields turn it off; give one"
    )
