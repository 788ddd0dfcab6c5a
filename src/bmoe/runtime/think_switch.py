"""How a chat template turns its model's reasoning on and off: one row per family's switch.

Qwen3, GLM, Nemotron, SmolLM3 and most reasoning templates read ``enable_thinking``; others read
a variable of their own: DeepSeek V3.1 to V4 ``thinking``, MiniMax M3 ``thinking_mode``
("enabled"/"disabled"), Kimi K3 ``thinking``, Seed-OSS ``thinking_budget`` (0 is off), Granite 3.3
``thinking``, Cohere's North ``reasoning``, Hy3 and Solar Open ``reasoning_effort`` (where
"no_think", or "low"/"minimal", is off). gpt-oss has no switch: it always reasons, at the
``reasoning_effort`` it is given. The renderer sets the row's variable from ``think``
(``variables``); a request's ``reasoning_effort`` or ``chat_template_kwargs`` is read against the
same row (server/think_fields.py, where OpenAI's values are).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ThinkSwitch:
    name: str
    detect: str  # a text of the template that says it switches this way
    var: str | None  # the variable that turns reasoning on or off (None: it has none)
    on: Any = True
    off: Any = False  # None: reasoning cannot be turned off (the model always reasons)
    # The template's own effort variable and the values it takes, passed as the client gives
    # them when reasoning is on; those in ``efforts_off`` turn reasoning off instead.
    effort_var: str | None = None
    efforts: tuple[str, ...] = ()
    efforts_off: tuple[str, ...] = ()

    @property
    def can_off(self) -> bool:
        return self.var is not None and self.off is not None

    def variables(self, think: bool, effort: str | None = None) -> dict[str, Any]:
        """The template variables for a turn that reasons (``think``) or not, at ``effort`` (one
        of ``efforts``, else the template's default)."""
        out: dict[str, Any] = {}
        if self.var is not None and (think or self.off is not None):
            out[self.var] = self.on if think else self.off
        if think and self.effort_var is not None and effort in self.efforts:
            out[self.effort_var] = effort
        return out

    def think_of(self, key: str, value: Any) -> bool | None:
        """Whether ``key: value`` (a client's template variable) turns reasoning on (True) or off
        (False); None where it is not the switch. Any value of the switch's variable but its off
        value is on (MiniMax M3's "adaptive", a Seed-OSS budget)."""
        if key == ENABLE_THINKING.var and isinstance(value, bool):
            return value
        if key != self.var:
            return None
        return not self.is_value(value, self.off)

    def is_value(self, value: Any, of: Any) -> bool:
        """``value`` is ``of`` (True is not 1)."""
        return of is not None and value == of and isinstance(value, bool) == isinstance(of, bool)

    def sets(self, key: str, value: Any) -> bool:
        """Whether bmoe sets ``key: value`` itself from ``think`` (it is the switch's on or off)."""
        if key == ENABLE_THINKING.var:
            return isinstance(value, bool)
        return key == self.var and (self.is_value(value, self.on) or self.is_value(value, self.off))


ENABLE_THINKING = ThinkSwitch("enable_thinking", "enable_thinking", "enable_thinking")
NO_SWITCH = ThinkSwitch("none", "", None)
GPT_OSS = ThinkSwitch(
    "gpt-oss",
    '"Reasoning: " + reasoning_effort',
    None,
    off=None,
    effort_var="reasoning_effort",
    efforts=("low", "medium", "high"),
)
HY3 = ThinkSwitch(
    "hy3",
    "should be no_think/low/high",
    "reasoning_effort",
    "high",
    "no_think",
    effort_var="reasoning_effort",
    efforts=("low", "high"),
)
SOLAR_OPEN = ThinkSwitch(
    "solar-open",
    'reasoning_effort in ["low", "minimal"]',
    "reasoning_effort",
    "high",
    "minimal",
    effort_var="reasoning_effort",
    efforts=("minimal", "low", "medium", "high"),
    efforts_off=("minimal", "low"),
)
COHERE_NORTH = ThinkSwitch("cohere-north", "reasoning if reasoning is not undefined", "reasoning")
DEEPSEEK_V4_FLASH = ThinkSwitch(
    "deepseek-v4-flash",
    "reasoning_effort == 'high'",
    "thinking",
    effort_var="reasoning_effort",
    efforts=("high", "max"),
)
DEEPSEEK_V4 = ThinkSwitch(
    "deepseek-v4", "reasoning_effort == 'max'", "thinking", effort_var="reasoning_effort", efforts=("max",)
)
DEEPSEEK = ThinkSwitch("deepseek", "set thinking = enable_thinking", "thinking")
MINIMAX_M3 = ThinkSwitch("minimax-m3", 'thinking_mode == "disabled"', "thinking_mode", "enabled", "disabled")
KIMI_K3 = ThinkSwitch(
    "kimi-k3", "thinking_effort", "thinking", effort_var="thinking_effort", efforts=("low", "high", "max")
)
SEED_OSS = ThinkSwitch("seed-oss", "thinking_budget", "thinking_budget", -1, 0)
GRANITE = ThinkSwitch("granite", "{%- elif thinking %}", "thinking")

# The first row whose ``detect`` text the template holds is its switch (the DeepSeek rows before
# ``enable_thinking``, which their templates read only where ``thinking`` is not given).
SWITCHES: tuple[ThinkSwitch, ...] = (
    GPT_OSS,
    HY3,
    SOLAR_OPEN,
    COHERE_NORTH,
    DEEPSEEK_V4_FLASH,
    DEEPSEEK_V4,
    DEEPSEEK,
    MINIMAX_M3,
    KIMI_K3,
    SEED_OSS,
    GRANITE,
    ENABLE_THINKING,
)


def think_switch(template: str | None) -> ThinkSwitch:
    """The template's reasoning switch (NO_SWITCH where it has none bmoe knows)."""
    if template:
        for s in SWITCHES:
            if s.detect in template:
                return s
    return NO_SWITCH
