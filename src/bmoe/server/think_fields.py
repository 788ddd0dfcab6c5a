"""A chat request's reasoning fields, read against the model's template switch (runtime/think_switch.py).

``think`` (bmoe's), ``reasoning_effort`` (OpenAI's) and ``chat_template_kwargs`` (vLLM's and
llama.cpp-server's: variables for the chat template) may each turn reasoning on or off; where
more than one of them does, they must agree (a 400 names the field that disagrees). The result is
the turn's ``think``, the template's own effort value, and the client's other template variables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from bmoe.server.errors import ApiError

# OpenAI's reasoning_effort values; "none" and "minimal" ask for no reasoning.
OPENAI_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
EFFORTS_OFF = ("none", "minimal")

FIELD = "chat_template_kwargs"
# What bmoe renders itself: a client's variable of these names would replace the conversation.
OWN_VARIABLES = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token")


class ThinkSwitch(Protocol):  # runtime/think_switch.py's, as the session's chat renderer holds it
    @property
    def var(self) -> str | None: ...
    @property
    def effort_var(self) -> str | None: ...
    @property
    def efforts(self) -> tuple[str, ...]: ...
    @property
    def efforts_off(self) -> tuple[str, ...]: ...

    def think_of(self, key: str, value: Any) -> bool | None: ...

    def sets(self, key: str, value: Any) -> bool: ...


@dataclass(frozen=True, slots=True)
class Reasoning:
    think: bool | None  # None: the session's
    effort: str | None = None  # the template's own effort value (ThinkSwitch.efforts)
    template_vars: tuple[tuple[str, Any], ...] = ()  # the client's, less what set ``think``


def template_kwargs(value: Any) -> tuple[tuple[str, Any], ...]:
    """A request's chat_template_kwargs checked (ApiError 400 naming the key): a JSON object whose
    keys are none of bmoe's own render variables."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ApiError(400, f"{FIELD}: a JSON object of template variables, got {type(value).__name__}", FIELD)
    for key in value:
        if key in OWN_VARIABLES:
            raise ApiError(
                400,
                f"{FIELD}: {key!r} is a variable bmoe renders itself ({', '.join(OWN_VARIABLES)}); it cannot be given",
                f"{FIELD}.{key}",
            )
        if key == "enable_thinking" and not isinstance(value[key], bool):
            raise ApiError(400, f"{FIELD}: 'enable_thinking' is true or false, got {value[key]!r}", f"{FIELD}.{key}")
    return tuple(value.items())


def _agree(think: bool | None, said: bool, field: str, what: str) -> bool:
    if think is not None and think != said:
        raise ApiError(
            400,
            f"{field}: {what} turns reasoning {'on' if said else 'off'}, but the request's other "
            f"reasoning fields turn it {'on' if think else 'off'}; give one",
            field,
        )
    return said


def resolve(switch: ThinkSwitch, reasons: bool, think: bool | None, effort: Any, kwargs: tuple) -> Reasoning:
    """The turn's reasoning from ``think``, ``reasoning_effort`` and ``chat_template_kwargs``
    (``kwargs``) against the template's ``switch``; ``reasons``: the template has reasoning at all
    (a switch, a ``<think>`` block, or a format bmoe reads)."""
    rest: list[tuple[str, Any]] = []
    source = "think"  # the field that set ``think``
    for key, value in kwargs:
        said = switch.think_of(key, value)
        if not switch.sets(key, value):  # another variable, or another value of the switch's
            rest.append((key, value))
        if said is not None:
            think, source = _agree(think, said, f"{FIELD}.{key}", f"{key}={value!r}"), f"{FIELD}.{key}"
    own: str | None = None
    if effort is not None:
        if not isinstance(effort, str) or effort not in OPENAI_EFFORTS + switch.efforts:
            takes = ", ".join(dict.fromkeys(OPENAI_EFFORTS + switch.efforts))
            raise ApiError(400, f"reasoning_effort: one of {takes}, got {effort!r}", "reasoning_effort")
        off = effort in (switch.efforts_off if effort in switch.efforts else EFFORTS_OFF)
        if not off and not reasons:
            raise ApiError(
                400,
                f"reasoning_effort: {effort!r}: this model's chat template does not reason (only none or minimal)",
                "reasoning_effort",
            )
        think, source = _agree(think, not off, "reasoning_effort", repr(effort)), "reasoning_effort"
        own = effort if effort in switch.efforts and not off else None
    if think is False and switch.var is None and switch.effort_var is not None:  # gpt-oss
        raise ApiError(
            400,
            f"{source}: asks for no reasoning, and this model's chat template always reasons "
            f"(reasoning_effort {', '.join(switch.efforts)})",
            source,
        )
    return Reasoning(think, own, tuple(rest))
