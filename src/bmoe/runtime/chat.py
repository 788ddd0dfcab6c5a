"""Chat rendering: one function turns a conversation into the prompt text.

generate() and decide share it, so a decision and a first chat turn over the same text
see the same prompt. The model's own Jinja template comes from the GGUF; --chatml forces
ChatML; --no-chat feeds the text raw.

A rendered prompt (``Prompt``) also says which of its text is the template's markup and which
the messages' own: the tokenizer parses special tokens in the markup only, so a message holding
``<|im_end|>`` cannot end its turn (llama/markup.py). The messages are found by rendering the
conversation again with a placeholder for each message's text; a template that changes a
message's text (``| trim``) is asked for each message on its own. A raw prompt (no template)
is the client's own markup: its special tokens are parsed, as llama.cpp's raw prompt.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

from jinja2 import TemplateError

from bmoe.config import ChatMode
from bmoe.constrain import (
    GENERIC,
    PROBE_MESSAGES,
    PROBE_TOOL,
    Tool,
    ToolCall,
    ToolFormat,
    describe_tools,
    generic_messages,
    probe_tool_format,
    takes_tools,
    template_messages,
)
from bmoe.errors import ModelFileError, RequestError
from bmoe.image_refs import ImageSource
from bmoe.runtime.jinja_env import environment as _environment
from bmoe.runtime.reasoning import (
    CLOSE,
    EMPTY_THINK,
    OPEN,
    ReasoningFormat,
    ThinkCtl,
    closing,
    opens,
    reasoning_format,
    think_control,
)
from bmoe.runtime.think_switch import ThinkSwitch, think_switch

CHATML_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


@dataclass(frozen=True, slots=True)
class Message:
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    # the images (file paths, data: URLs or bytes: bmoe.image_refs) at the image markers of
    # ``content``, in order (docs/decide.md "Images"); a continued conversation reads them again,
    # so its KV prefix, images included, is reused
    images: tuple[ImageSource, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant turn's calls (docs/server.md "Tools")
    tool_call_id: str | None = None  # a role "tool" message: the call it answers


class Prompt(str):
    """A rendered prompt: its text (it is a ``str``), and ``parts``, the text cut into
    ``(text, plain)`` pieces, ``plain`` true for a message's own text (whoever wrote it: the
    user, the system message, an assistant turn of the history, a decide field), false for the
    template's markup and what bmoe adds. The tokenizer parses special tokens in the markup only.

    ``unplaced``: messages' texts the renderer could not find in the text (a template that
    renders a message's text in a way its placeholder does not show); the tokenizer refuses the
    prompt when one of them holds a special token's text, and parses the whole text otherwise.
    A plain ``str`` given where a ``Prompt`` is taken is all markup (a raw prompt)."""

    parts: tuple[tuple[str, bool], ...]
    unplaced: tuple[str, ...]

    def __new__(cls, parts: "Sequence[tuple[str, bool]]", unplaced: "Sequence[str]" = ()) -> "Prompt":
        merged: list[tuple[str, bool]] = []
        for text, plain in parts:
            if not text:
                continue
            if merged and merged[-1][1] == plain:
                merged[-1] = (merged[-1][0] + text, plain)
            else:
                merged.append((text, plain))
        self = super().__new__(cls, "".join(text for text, _ in merged))
        self.parts = tuple(merged)
        self.unplaced = tuple(unplaced)
        return self

    def __reduce__(self):  # noqa: ANN204  (copies and pickles keep the parts)
        return (Prompt, (self.parts, self.unplaced))

    def then(self, markup: str) -> "Prompt":
        """The prompt followed by more markup (what bmoe appends after the template's text). A
        plain ``+`` gives a ``str``, all of it markup."""
        return Prompt(self.parts + ((markup, False),), self.unplaced)

    @property
    def plain(self) -> tuple[str, ...]:
        """The plain parts' texts, in order."""
        return tuple(text for text, plain in self.parts if plain)


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
        self.switch: ThinkSwitch = think_switch(source)  # the variable that turns its reasoning on/off
        self.reasoning: ReasoningFormat | None = reasoning_format(source)  # how its model marks reasoning
        try:
            self._template = _environment().from_string(source) if source else None
        except TemplateError as e:  # the GGUF's own template (chatml's is ours and parses)
            raise ModelFileError(
                f"the model's chat template is not valid Jinja ({e}); run it with --chatml or --no-chat instead"
            ) from None
        self._bos_text = bos_text
        self._eos_text = eos_text
        self.tool_format = self._probe_tools()  # how the model writes tool calls
        self._tools: tuple[Tool, ...] = ()
        self._effort: str | None = None  # the template's own reasoning effort (ThinkSwitch.efforts)
        self._vars: Mapping[str, Any] = {}  # the client's chat_template_kwargs

    def _probe_tools(self) -> ToolFormat:
        """The tool-call format the template writes, seen in its render of a call (constrain's probe)."""
        rendered = None
        if self._template is not None:
            try:
                rendered = self._template.render(
                    messages=PROBE_MESSAGES,
                    tools=[PROBE_TOOL],
                    add_generation_prompt=False,
                    enable_thinking=False,
                    bos_token=self._bos_text,
                    eos_token=self._eos_text,
                )
            except Exception:  # noqa: BLE001  (any refusal of the probe: the template's markers decide)
                rendered = None
        return probe_tool_format(self.source, rendered)

    def _with_tools(
        self, tools: Sequence[Tool], effort: str | None = None, template_vars: Mapping[str, Any] | None = None
    ) -> "ChatRenderer":
        """This renderer, rendering ``tools`` into each prompt (the template's ``tools``), at the
        template's reasoning ``effort``, with the client's ``template_vars``."""
        template_vars = template_vars or {}
        if tuple(tools) == self._tools and effort == self._effort and template_vars == self._vars:
            return self
        other = copy.copy(self)
        other._tools, other._effort, other._vars = tuple(tools), effort, dict(template_vars)
        return other

    @property
    def templated(self) -> bool:
        return self._template is not None

    def render(
        self,
        messages: Sequence[Message],
        *,
        think: bool,
        tools: Sequence[Tool] = (),
        effort: str | None = None,
        template_vars: Mapping[str, Any] | None = None,
    ) -> Prompt:
        """The prompt for ``messages``, opening a fresh assistant turn; ``tools``: the functions
        the model may call, rendered by the template (or by bmoe where it takes none: GENERIC).
        ``think`` sets the template's reasoning switch (``self.switch``), ``effort`` its own
        effort variable; ``template_vars`` (a request's chat_template_kwargs) go to the template
        as they are."""
        return self._with_tools(tools, effort, template_vars)._render_turn(messages, think, want_opens=False).text

    def render_turn(
        self,
        messages: Sequence[Message],
        *,
        think: bool,
        tools: Sequence[Tool] = (),
        effort: str | None = None,
        template_vars: Mapping[str, Any] | None = None,
    ) -> "Rendered":
        """``render``, and whether the model's output starts inside its reasoning block
        (``self.reasoning``: ``<think>``, or the template's own channel).

        Only the template's own generation prompt (what it adds after the conversation) can open
        or close a block: a ``<think>`` or ``</think>`` a user typed is text, never a marker."""
        return self._with_tools(tools, effort, template_vars)._render_turn(messages, think, want_opens=True)

    def _render_turn(self, messages: Sequence[Message], think: bool, *, want_opens: bool) -> "Rendered":
        """The generation prompt is found (by rendering the conversation again, see
        ``_generation_prompt``) only where the text or ``want_opens`` needs it: ``render`` is on
        every decision's path, and with a template that takes ``enable_thinking`` it does not."""
        if self._template is None:
            return Rendered(Prompt([("".join(m.content for m in messages), False)]), False)
        rendered = self._render(messages, generation_prompt=True, think=think)
        text = self._separate(messages, rendered, think)
        closes = not think and self.think_ctl == "prefill"
        if self.think_ctl == "none" or not (want_opens or closes):
            return Rendered(text, False)
        prompt = self._generation_prompt(messages, rendered, think)
        opened = opens(prompt, self.reasoning)
        if closes:
            if opened:  # the template opened the block itself: close it, without a second <think>
                text = text.then(closing(prompt[prompt.rfind(OPEN) + len(OPEN) :]))
                opened = False
            elif not prompt.rstrip().endswith(CLOSE):
                text = text.then(EMPTY_THINK)
        return Rendered(text, opened)

    def _separate(self, messages: Sequence[Message], text: str, think: bool) -> Prompt:
        """``text``, the template's render of ``messages``, as a Prompt: where each message's text
        lies in it. The conversation is rendered again with a placeholder for each non-empty
        message (an empty one adds no text of its own, and a template may test for it); where the
        messages put back into the placeholders' places give ``text`` again, they are there.

        A template may change a message's text. Trimmed whitespace (Jinja's ``| trim``, as
        Llama 3's and Gemma's templates do) is found in one walk over the markup: each message's
        text, stripped on neither, both or one side, followed by the markup after it. Any other
        change (a reasoning block cut off) is found by asking the template once more for each
        message, in conversations of up to ``ASKED_ALONE`` messages: rendered with that message
        alone shown and placeholders for the others, what stands between the markup around its
        placeholder is its text as rendered. Where none of that gives ``text``, the messages stay
        unplaced (Prompt)."""
        contents = [m.content for m in messages]
        marks = _marks(contents)
        pieces = self._marked(messages, marks, think, show=None)
        if pieces is None:
            return Prompt([(text, False)], [c for c in contents if c])
        shown = Prompt([(contents[p], True) if isinstance(p, int) else (p, False) for p in pieces])
        if shown == text:
            return shown
        stripped = _match_stripped(pieces, contents, text)
        if stripped is not None:
            return stripped
        if len(messages) <= ASKED_ALONE:
            rendered: dict[int, str] = {}
            for i in {p for p in pieces if isinstance(p, int)}:
                found = self._rendered_as(messages, marks, pieces, i, think)
                if found is None:
                    break
                rendered[i] = found
            else:
                shown = Prompt([(rendered[p], True) if isinstance(p, int) else (p, False) for p in pieces])
                if shown == text:
                    return shown
        return Prompt([(text, False)], [c for c in contents if c])

    def _marked(
        self, messages: Sequence[Message], marks: list[str | None], think: bool, show: int | None
    ) -> list[str | int] | None:
        """The conversation rendered with each marked message's text replaced by its mark (but
        message ``show``'s), cut into markup strings and message indices; None where the template
        refuses the placeholders."""
        try:
            out = self._render(
                [
                    dataclasses.replace(m, content=m.content if k is None or i == show else k)
                    for i, (m, k) in enumerate(zip(messages, marks))
                ],
                generation_prompt=True,
                think=think,
            )
        except RequestError:
            return None
        if not any(marks):
            return [out]
        tag = next(k for k in marks if k is not None)
        find = re.compile(re.escape(tag[: tag.index("-") + 1]) + r"(\d+)" + re.escape(_MARK_END))
        pieces: list[str | int] = []
        at = 0
        for m in find.finditer(out):
            i = int(m.group(1))
            if i >= len(marks) or marks[i] != m.group(0):
                return None
            pieces += [out[at : m.start()], i]
            at = m.end()
        pieces.append(out[at:])
        return pieces

    def _rendered_as(
        self, messages: Sequence[Message], marks: list[str | None], pieces: list[str | int], i: int, think: bool
    ) -> str | None:
        """Message ``i``'s text as the template renders it: the conversation rendered with it
        alone shown, less the markup (and other marks) the placeholder render has around it."""
        if pieces.count(i) != 1:
            return None
        j = pieces.index(i)
        alone = self._marked(messages, marks, think, show=i)
        if alone is None:
            return None
        before = "".join(p if isinstance(p, str) else marks[p] or "" for p in pieces[:j])
        after = "".join(p if isinstance(p, str) else marks[p] or "" for p in pieces[j + 1 :])
        whole = "".join(p if isinstance(p, str) else marks[p] or "" for p in alone)
        if len(whole) < len(before) + len(after) or not whole.startswith(before) or not whole.endswith(after):
            return None
        return whole[len(before) : len(whole) - len(after)]

    def _render(self, messages: Sequence[Message], *, generation_prompt: bool, think: bool) -> str:
        assert self._template is not None
        turns = template_messages(messages, self.tool_format)
        tools = [t.openai() for t in self._tools]
        extra: dict = {}
        if self.tool_format is GENERIC:  # bmoe describes the tools; calls and results become text
            if tools or any(m.tool_calls or m.role == "tool" for m in messages):
                turns = generic_messages(turns, tools)
        elif tools and not takes_tools(self.source):  # a native syntax, but no tools in the template
            turns = describe_tools(turns, tools, self.tool_format)
        elif tools:
            extra["tools"] = tools
        variables = {"enable_thinking": think, **self.switch.variables(think, self._effort), **self._vars}
        try:
            return self._template.render(
                {
                    **variables,
                    **extra,
                    "messages": turns,
                    "add_generation_prompt": generation_prompt,
                    "bos_token": self._bos_text,
                    "eos_token": self._eos_text,
                }
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
            shown = self._render(
                [dataclasses.replace(m, content=k) for m, k in zip(messages, marks)],
                generation_prompt=True,
                think=think,
            )
        except RequestError:
            shown = ""
        if marks and marks[-1] in shown:
            tail = shown[shown.rfind(marks[-1]) + len(marks[-1]) :]
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
        """True when the prompt for ``messages`` leaves its reasoning block open (output starts as
        reasoning): decided by the template's generation prompt alone, never the user's text."""
        return self.render_turn(messages, think=think).opens_reasoning


@dataclass(frozen=True, slots=True)
class Rendered:
    text: Prompt
    opens_reasoning: bool  # the generation prompt leaves the reasoning block open


_MARK_START, _MARK_END = "\ue000bmoe", "\ue001"
# The most messages a template that changes a message's text (other than trimming it) is asked
# about one by one: each asks the template for the whole conversation again.
ASKED_ALONE = 64


def _match_stripped(pieces: list[str | int], contents: Sequence[str], text: str) -> Prompt | None:
    """``text`` as the placeholder render's markup ``pieces`` with each message's text put back
    as it is or stripped of whitespace on both sides or one, where one walk finds it so: each
    message's text the first of those that the markup after it follows."""
    parts: list[tuple[str, bool]] = []
    at = 0
    for k, p in enumerate(pieces):
        if isinstance(p, str):
            if not text.startswith(p, at):
                return None
            parts.append((p, False))
            at += len(p)
            continue
        after = pieces[k + 1] if k + 1 < len(pieces) and isinstance(pieces[k + 1], str) else ""
        c = contents[p]
        for cand in dict.fromkeys((c, c.strip(), c.lstrip(), c.rstrip())):
            if text.startswith(cand, at) and text.startswith(after, at + len(cand)):  # type: ignore[arg-type]
                parts.append((cand, True))
                at += len(cand)
                break
        else:
            return None
    return Prompt(parts) if at == len(text) else None


def _marks(contents: Sequence[str]) -> list[str | None]:
    """A placeholder for each non-empty text, none of them written in any of the texts."""
    k = 0
    while any(f"{_MARK_START}{k}-" in c for c in contents):
        k += 1
    return [f"{_MARK_START}{k}-{i}{_MARK_END}" if c else None for i, c in enumerate(contents)]
