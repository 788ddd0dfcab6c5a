"""A generation turn that passed its checks (``Runtime.prepare``, runtime/raw_prompt.py): what
``Runtime.run`` needs. Its own module, so that the modules that build one need not import the
runtime that runs it."""

from __future__ import annotations

from typing import NamedTuple

from bmoe.constrain import TokenMask
from bmoe.runtime.chat import Message, Prompt
from bmoe.runtime.results import GenerateRequest
from bmoe.runtime.sampling import Sampler
from bmoe.runtime.tool_choice import NamePick


class Turn(NamedTuple):
    """A generation turn that passed its checks: what ``Runtime.run`` needs."""

    req: GenerateRequest
    messages: list[Message] | None  # None: a raw prompt (runtime/raw_prompt.py), the history untouched
    prompt: list[int]
    n_predict: int
    sampler: Sampler
    rendered: Prompt
    think: bool
    opens_reasoning: bool = False  # the template's generation prompt left a <think> block open
    mask: TokenMask | None = None  # the answer's constraint (json_schema or grammar), if any
    pick: NamePick | None = None  # a tool turn's name decision (runtime/tool_choice.py)
