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
from .textstream import CLOSE, OPEN

ThinkCtl = Literal["template", "prefill", "none"]

CHATML_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
# What a template-less "think off" looks like for models that open a <think> block.
EMPTY_THINK = OPEN + "\n\n" + CLOSE + "\n\n"


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
        return self._render_turn(messages, think, want_opens=False).text

    def render_turn(self, messages: Sequence[Message], *, think: bool) -> "Rendered":
        """``render``, and whether the model's output starts inside a <think> block.

        Only the template's own generation prompt (what it adds after the conversation) can open
        or close a block: a ``<think>`` or ``</think>`` a user typed is text, never a marker."""
        return self._render_turn(messages, think, want_opens=True)

    def _render_turn(self, messages: Sequence[Message], think: bool, *, want_opens: bool) -> "Rendered":
        """The generation prompt is found (by rendering the conversation again, see
        ``_generation_prompt``) only where the text or ``want_opens`` needs it: ``render`` is on
        every decision's path, and with a template that takes ``enable_thinking`` it does not."""
        if self._template is None:
            return Rendered("".join(m.content for m in messages), False)
        text = self._render(messages, generation_prompt=True, think=think)
        closes = not think and self.think_ctl == "prefill"
        if self.think_ctl == "none" or not (want_opens or closes):
            return Rendered(text, False)
        prompt = self._generation_prompt(messages, text, think)
        opens = _opens(prompt)
        if closes:
            if opens:  # the template opened the block itself: close it, without a second <think>
                text += _closing(prompt[prompt.rfind(OPEN) + len(OPEN):])
                opens = False
            elif not prompt.rstrip().endswith(CLOSE):
                text += EMPTY_THINK
        return Rendered(text, opens)

    def _render(self, messages: Sequence[Message], *, generation_prompt: bool, think: bool) -> str:
        assert self._template is not None
        try:
            return self._template.render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                add_generation_prompt=generation_prompt,
                enable_thinking=think,
                bos_token=self._bos_text,
                eos_token=self._eos_text,
            )
        except TemplateError as e:
            raise RequestError(f"the chat template refused the conversation: {e}") from e

    def _generation_prompt(self, messages: Sequence[Message], text: str, think: bool) -> str:
        """The tail of ``text`` the template adds after the last message: the conversation
        rendered again with a placeholder for each message's content shows where the last one
        ends, whatever the user typed. A template that hides the placeholder (or renders a
        different tail with it) is cut where it stops agreeing with its render without the
        generation prompt instead."""
        marks = [f"\ue000bmoe-{i}\ue001" for i in range(len(messages))]
        try:
            shown = self._render([Message(m.role, k) for m, k in zip(messages, marks)],
                                 generation_prompt=True, think=think)
        except RequestError:
            shown = ""
        if marks and marks[-1] in shown:
            tail = shown[shown.rfind(marks[-1]) + len(marks[-1]):]
            if text.endswith(tail):
                return tail
        try:
            bare = self._render(messages, generation_prompt=False, think=think)
        except RequestError:
            return ""
        n = 0
        for a, b in zip(bare, text):
            if a != b:
                break
            n += 1
        return text[n:]

    def opens_reasoning(self, messages: Sequence[Message], *, think: bool) -> bool:
        """True when the prompt for ``messages`` leaves a <think> block open (output starts as
        reasoning): decided by the template's generation prompt alone, never the user's text."""
        return self.render_turn(messages, think=think).opens_reasoning


@dataclass(frozen=True, slots=True)
class Rendered:
    text: str
    opens_reasoning: bool  # the generation prompt leaves a <think> block open


def _opens(prompt: str) -> bool:
    return prompt.rfind(OPEN) > prompt.rfind(CLOSE)


def _closing(tail: str) -> str:
    """What closes an empty block after an opening ``<think>`` followed by ``tail``: the rest of
    EMPTY_THINK where ``tail`` is its start (``<think>\n`` -> ``\n</think>\n\n``)."""
    rest = EMPTY_THINK[len(OPEN):]
    return rest[len(tail):] if rest.startswith(tail) else CLOSE + "\n\n"
