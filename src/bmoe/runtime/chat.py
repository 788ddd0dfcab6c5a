"""Chat rendering: one function turns a conversation into the prompt text.

generate() and decide share it, so a decision and a first chat turn over the same text
see the same prompt. The model's own Jinja template comes from the GGUF; --chatml forces
ChatML; --no-chat feeds the text raw.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Sequence

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..config import ChatMode
from ..errors import ModelFileError, RequestError

ThinkCtl = Literal["template", "prefill", "none"]

CHATML_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
# What a template-less "think off" looks like for models that open a <think> block.
EMPTY_THINK = "<think>\n\n</think>\n\n"


@dataclass(frozen=True, slots=True)
class Message:
    role: Literal["system", "user", "assistant"]
    content: str


def _raise(msg: str) -> None:
    raise TemplateError(msg)


def _tojson(value: object, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def think_control(template: str | None) -> ThinkCtl:
    """How a think:false request can be honoured, read from the template itself."""
    if not template:
        return "none"
    if "enable_thinking" in template:
        return "template"
    if "<think>" in template:
        return "prefill"
    return "none"


class ChatRenderer:
    def __init__(self, mode: ChatMode, gguf_template: str | None, bos_text: str, eos_text: str) -> None:
        if mode == "chatml":
            source: str | None = CHATML_TEMPLATE
        elif mode == "template":
            source = gguf_template  # a GGUF without a template is fed raw (base models)
        else:
            source = None
        self.mode: ChatMode = mode if source is not None or mode == "none" else "none"
        self.source = source
        self.think_ctl: ThinkCtl = think_control(source)
        try:
            self._template = _environment().from_string(source) if source else None
        except TemplateError as e:  # the GGUF's own template (chatml's is ours and parses)
            raise ModelFileError(f"the model's chat template is not valid Jinja ({e}); run it with --chatml or "
                                 "--no-chat instead") from None
        self._bos_text = bos_text
        self._eos_text = eos_text

    @property
    def templated(self) -> bool:
        return self._template is not None

    def render(self, messages: Sequence[Message], *, think: bool) -> str:
        """The prompt text for ``messages``, opening a fresh assistant turn."""
        if self._template is None:
            return "".join(m.content for m in messages)
        try:
            text = self._template.render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                add_generation_prompt=True,
                enable_thinking=think,
                bos_token=self._bos_text,
                eos_token=self._eos_text,
            )
        except TemplateError as e:
            raise RequestError(f"the chat template refused the conversation: {e}") from e
        if not think and self.think_ctl == "prefill" and not text.rstrip().endswith("</think>"):
            text += EMPTY_THINK
        return text

    def opens_reasoning(self, rendered: str) -> bool:
        """True when the rendered prompt leaves a <think> block open (output starts as reasoning)."""
        return rendered.rfind("<think>") > rendered.rfind("</think>")
