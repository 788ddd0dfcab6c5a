"""Chat rendering: template, ChatML, raw; how think:false is honoured."""
import pytest

from bmoe.runtime.chat import CHATML_TEMPLATE, EMPTY_THINK, ChatRenderer, Message, think_control
from bmoe.errors import RequestError

QWEN_LIKE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
THINKER = "{% for m in messages %}{{ m.content }}{% endfor %}<think>"  # opens <think>, no switch
HI = [Message("user", "hi")]


def test_think_control_is_read_from_the_template() -> None:
    assert think_control(QWEN_LIKE) == "template"
    assert think_control("{{ '<think>' }}") == "prefill"
    assert think_control(CHATML_TEMPLATE) == "none"
    assert think_control(None) == "none"


def test_template_mode_passes_enable_thinking() -> None:
    r = ChatRenderer("template", QWEN_LIKE, "", "")
    assert r.render(HI, think=True) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert r.render(HI, think=False).endswith("assistant\n<think>\n\n</think>\n\n")


def test_prefill_mode_appends_an_empty_think_block() -> None:
    r = ChatRenderer("template", "{% for m in messages %}{{ m.content }}{% endfor %}{{ '<think>' if false }}", "", "")
    assert r.think_ctl == "prefill"
    assert r.render(HI, think=False) == "hi" + EMPTY_THINK
    assert r.render(HI, think=True) == "hi"


def test_chatml_forced_and_raw() -> None:
    assert ChatRenderer("chatml", QWEN_LIKE, "", "").render(HI, think=True) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    raw = ChatRenderer("none", QWEN_LIKE, "", "")
    assert raw.render([Message("user", "a"), Message("assistant", "b"), Message("user", "c")], think=True) == "abc"
    assert not raw.templated


def test_gguf_without_template_is_fed_raw() -> None:
    r = ChatRenderer("template", None, "", "")
    assert r.mode == "none" and r.render(HI, think=True) == "hi"


def test_reasoning_opened_by_the_prompt() -> None:
    r = ChatRenderer("template", THINKER, "", "")
    assert r.opens_reasoning(r.render(HI, think=True))
    assert not r.opens_reasoning("a<think>x</think>")


def test_template_errors_are_request_errors() -> None:
    r = ChatRenderer("template", "{{ raise_exception('only user and assistant roles') }}", "", "")
    with pytest.raises(RequestError, match=r"^the chat template refused the conversation: only user and assistant roles$"):
        r.render(HI, think=True)


@pytest.mark.parametrize("template", [QWEN_LIKE, "{% for m in messages %}{{ m.content }}{% endfor %}{{ '<think>' if false }}"],
                         ids=["enable_thinking", "empty-think-block"])
def test_a_decision_is_rendered_with_reasoning_off(template: str) -> None:
    """A decision reads the answer's first token, so its prompt is the chat turn with reasoning
    off, whatever the session's think default; the adapter renders it through the runtime."""
    from types import SimpleNamespace

    from bmoe.runtime.decide import LlamaDecideBackend

    r = ChatRenderer("template", template, "", "")
    assert r.think_ctl in ("template", "prefill")
    runtime = SimpleNamespace(render=r.render, model=SimpleNamespace(is_recurrent=False, is_hybrid=False))
    backend = LlamaDecideBackend(runtime)  # type: ignore[arg-type]
    off, on = r.render(HI, think=False), r.render(HI, think=True)
    assert backend.render_user("hi") == off != on
