"""Chat rendering with tools, as policy over OpenAI-shaped messages (the renderer in
bmoe.runtime.chat applies it): the messages as templates take them, which format a template
writes (seen in its render of a probe call), and, for templates that render no tools, the tools
described by bmoe (docs/server.md "Tools").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from bmoe.constrain.tool_formats import FORMATS, GENERIC, ToolFormat, detect_tool_format, native_id, write_calls

# A conversation with one call, rendered by a template to see which format it writes (``probe``).
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_fn",
        "description": "A probe.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}}},
    },
}
PROBE_VALUE = "probe value"
PROBE_CALL = ("probe_fn", {"text": PROBE_VALUE, "n": 7}, "abcDE1234")
PROBE_MESSAGES = [
    {"role": "user", "content": "Probe?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": PROBE_CALL[2], "type": "function", "function": {"name": PROBE_CALL[0], "arguments": PROBE_CALL[1]}}
        ],
    },
    {"role": "tool", "tool_call_id": PROBE_CALL[2], "name": PROBE_CALL[0], "content": "probe result"},
]


def probe(template: str | None, rendered: str | None) -> ToolFormat:
    """The format of a template from its render of PROBE_MESSAGES (with ``tools=[PROBE_TOOL]``;
    None where it refused them): the first format whose writing of the call is in the render.
    A template that writes the call in no format bmoe knows gets GENERIC (a wrong native format
    would be worse than bmoe's own); one that refused the probe or did not write the call is
    read by its markers (``detect_tool_format``)."""
    if rendered is not None and PROBE_VALUE in rendered:  # the call's value: it wrote the call
        return next((f for f in FORMATS if _probe_call(f) in rendered), GENERIC)
    return detect_tool_format(template)


def _probe_call(fmt: ToolFormat) -> str:
    """The probe's call as ``fmt`` writes it, with the probe's own id (the probe renders it as
    given, where bmoe would turn it into the format's shape: Solar Open's 10 lowercase characters)."""
    return write_calls(fmt, [PROBE_CALL]).replace(native_id(fmt, PROBE_CALL[2]), PROBE_CALL[2])


def template_messages(messages: Sequence[Any], fmt: ToolFormat) -> list[dict]:
    """The messages as chat templates take them: OpenAI's shape, a call's arguments as an object
    (templates write them with ``tojson``), ids as the format takes them (Mistral's 9 characters),
    and a tool result's ``name`` (the call it answers), which some templates print. ``messages``:
    records with ``role``, ``content``, ``tool_calls`` (ToolCall) and ``tool_call_id``."""
    names: dict[str, str] = {}
    out: list[dict] = []
    for m in messages:
        d: dict = {"role": m.role, "content": m.content}
        if m.tool_calls:
            d["tool_calls"] = [
                {"id": native_id(fmt, c.id), "type": "function", "function": {"name": c.name, "arguments": c.args()}}
                for c in m.tool_calls
            ]
            names.update({c.id: c.name for c in m.tool_calls})
        if m.tool_call_id is not None:
            d["tool_call_id"] = native_id(fmt, m.tool_call_id)
            d["name"] = names.get(m.tool_call_id, "")
        out.append(d)
    return out


TOOLS_PROMPT = (
    "You may call functions to answer. The functions, as JSON schemas:\n{tools}\n"
    "To call one, answer with nothing but the call, written like this:\n{example}"
)


def takes_tools(template: str | None) -> bool:
    """Whether a chat template renders ``tools`` itself (else bmoe describes them: ``describe_tools``)."""
    return bool(template) and "tools" in template  # type: ignore[operator]


def describe_tools(messages: list[dict], tools: list[dict], fmt: ToolFormat) -> list[dict]:
    """The conversation with the tools described for a template that does not render them: in
    the system message, or at the start of the first message where there is none (some templates
    refuse a system role)."""
    listed = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    example = write_calls(fmt, [("<function-name>", {"<parameter>": "<value>"}, "")])
    prompt = TOOLS_PROMPT.format(tools=listed, example=example)
    if not messages:
        return [{"role": "system", "content": prompt}]
    first = messages[0]
    text = first["content"] + "\n\n" + prompt if first["role"] == "system" else prompt + "\n\n" + first["content"]
    return [{**first, "content": text}, *messages[1:]]


def generic_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """A conversation with tools for a template that knows no tool calls (GENERIC): the tools
    described (``describe_tools``), each assistant call written into its text in the GENERIC
    syntax, each tool result a user message in ``<tool_response>`` tags."""
    out: list[dict] = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [(c["function"]["name"], c["function"]["arguments"], c["id"]) for c in m["tool_calls"]]
            text = write_calls(GENERIC, calls)
            out.append({"role": "assistant", "content": (m["content"] + "\n" if m["content"] else "") + text})
        elif m["role"] == "tool":  # the results of one turn's calls: one user message
            text = "<tool_response>\n" + m["content"] + "\n</tool_response>"
            if out and out[-1].get("tool_results"):
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + text}
            else:
                out.append({"role": "user", "content": text, "tool_results": True})
        else:
            out.append(m)
    out = [{k: v for k, v in m.items() if k != "tool_results"} for m in out]
    return describe_tools(out, tools, GENERIC) if tools else out
