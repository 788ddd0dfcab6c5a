"""Constrain: what an answer may be (issue #36), as policy over text and token ids.

A JSON schema or a grammar becomes a constraint the sampler applies; a schema whose answers are a
finite set becomes a decision; the tool-call formats of the model families are one table with their
parsers. Nothing here imports the engine: the grammar sampler over a model's vocabulary is an
adapter in ``bmoe.llama``. ``__all__`` is what other packages may use.
"""

from bmoe.constrain.choices import choice_grammar, finite_texts, greedy_agrees
from bmoe.constrain.constraint import Constraint, constraint_of, from_response_format
from bmoe.constrain.mask import TokenMask
from bmoe.constrain.schema import MAX_ENUM, ConstraintError
from bmoe.constrain.tool_decision import ToolDecision, tool_decision
from bmoe.constrain.tool_formats import FORMATS, GENERIC, ToolFormat, detect_tool_format, native_id
from bmoe.constrain.tool_grammar import THINK_CLOSE, THINK_OPEN, Think, tool_constraint
from bmoe.constrain.tool_grammar import markers as tool_markers
from bmoe.constrain.tool_parse import ToolCallError, ToolStream, parse_tool_calls
from bmoe.constrain.tool_render import (
    PROBE_MESSAGES,
    PROBE_TOOL,
    describe_tools,
    generic_messages,
    takes_tools,
    template_messages,
)
from bmoe.constrain.tool_render import probe as probe_tool_format
from bmoe.constrain.tool_spec import (
    MAX_TOOLS,
    Tool,
    ToolCall,
    ToolChoice,
    check_history,
    parse_call,
    parse_choice,
    parse_tools,
)

__all__ = [
    "MAX_ENUM",
    "THINK_CLOSE",
    "THINK_OPEN",
    "Think",
    "Constraint",
    "ConstraintError",
    "TokenMask",
    "choice_grammar",
    "finite_texts",
    "greedy_agrees",
    "constraint_of",
    "from_response_format",
    # tools (tool_*.py)
    "FORMATS",
    "PROBE_MESSAGES",
    "PROBE_TOOL",
    "GENERIC",
    "MAX_TOOLS",
    "Tool",
    "ToolCall",
    "ToolCallError",
    "ToolChoice",
    "ToolDecision",
    "ToolFormat",
    "ToolStream",
    "check_history",
    "describe_tools",
    "detect_tool_format",
    "generic_messages",
    "native_id",
    "parse_call",
    "parse_choice",
    "parse_tool_calls",
    "parse_tools",
    "probe_tool_format",
    "takes_tools",
    "template_messages",
    "tool_constraint",
    "tool_markers",
    "tool_decision",
]
