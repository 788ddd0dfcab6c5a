"""The tool-call formats of the model families: one record each, one table (docs/server.md "Tools").

A format says how a model writes its calls: an optional section around all of them, each call's
opening and closing text (with holes: ``{name}``, and where the format has them ``{index}``
(counted from ``index_from``) and ``{id}``), and the arguments either as one JSON object
(``args="json"``) or one element per parameter (``args="xml"``: ``{key}``, and where the format
marks a value's kind ``{string}`` "true"/"false" or ``{type}`` its JSON type). A string value is
written raw; any other as JSON (``values="json"``), or as nested elements (``values="xml"``,
MiniMax M3: an object's keys and an array's ``item``s each an element of the parameter's own
syntax, a scalar as text, booleans ``true``/``false``, a null left out). Gemma 4 writes neither:
``args="keyed"``, its own notation of ``key:value`` pairs (tool_keyed); LFM2 writes a Python call,
``args="python"``: keyword arguments with Python literals (tool_python). ``detect_tool_format`` reads the format
from a chat template's source; a template with no known tool syntax gets ``GENERIC``: bmoe
describes the tools in a system message and the model calls them in Hermes' JSON syntax.

The parser (tool_parse) and the grammar (tool_grammar) are both built from these records: there
is no per-family code.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Iterator, Literal

from bmoe.constrain.tool_keyed import write_pairs
from bmoe.constrain.tool_python import write_kwargs

HOLE = re.compile(r"\{(name|index|id|key|string|type)\}")
_PART = re.compile(r"(\{\{|\}\}|\{(?:name|index|id|key|string|type)\})")


@dataclass(frozen=True, slots=True)
class ToolFormat:
    name: str
    families: str  # the model families that write it (docs)
    detect: tuple[str, ...]  # texts that all occur in a template of this format
    call_open: str
    call_close: str
    section_open: str = ""  # before the first call ("" : none)
    section_close: str = ""
    separator: str = ""  # between two calls
    args: Literal["json", "xml", "keyed", "python"] = "json"
    param_open: str = ""  # xml: before a parameter's value
    param_close: str = ""  # xml: after it (may name the parameter: ``{key}``)
    values: Literal["json", "xml"] = "json"  # xml: how a value that is not a string is written
    parallel: bool = True  # several calls in one answer
    id_pattern: str | None = None  # the regex of a call id the model writes ({id}), where it writes one
    index_from: int = 0  # the {index} of the first call
    # The family's own reasoning block before the calls, where it is not ``<think>``: its opening
    # and what ends it (gpt-oss's analysis channel, Gemma 4's thought channel); ("", ""): none.
    reasoning: tuple[str, str] = ("", "")
    # Every answer starts inside that block and closes it before anything else (its opening
    # optional, the text before the close reasoning): MiniMax M3, Kimi K3.
    reasoning_first: bool = False
    quote: str = ""  # keyed: the marks around a string value
    text_open: str = ""  # what opens an answer in text, not part of its content (gpt-oss's final channel)

    @property
    def opener(self) -> str:
        """The fixed text that starts the calls: where text ends and calls begin."""
        return fill(self.section_open or fixed(self.call_open))


def fixed(text: str) -> str:
    """The start of ``text`` before its first hole (unfilled: ``{{`` still doubled)."""
    m = HOLE.search(text)
    return text[: m.start()] if m else text


_JSON_OPEN = '{{"name": "{name}", "arguments": '  # a call as one JSON object in a JSON list
_MM = "]<]minimax[>["  # MiniMax M3's namespace marker, before each of its tags

FORMATS: tuple[ToolFormat, ...] = (
    ToolFormat(
        "gpt-oss",
        "gpt-oss (harmony)",
        ("<|call|>",),
        " to=functions.{name}<|channel|>commentary json<|message|>",
        "<|call|>",
        parallel=False,
        reasoning=("<|channel|>analysis<|message|>", "<|end|><|start|>assistant"),
        text_open="<|channel|>final<|message|>",
    ),
    ToolFormat(
        "kimi-k2",
        "Kimi K2",
        ("<|tool_calls_section_begin|>",),
        "<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
    ),
    ToolFormat(
        "kimi-k3",
        "Kimi K3",
        ("<|open|>", "'call'"),
        '<|open|>call tool="{name}" index="{index}"<|sep|>',
        "<|close|>call<|sep|>",
        "<|close|>response<|sep|><|open|>tools<|sep|>",  # the text is the response's: it ends first
        "<|close|>tools<|sep|>",
        args="xml",
        param_open='<|open|>argument key="{key}" type="{type}"<|sep|>',
        param_close="<|close|>argument<|sep|>",
        index_from=1,
        reasoning=("<|open|>think<|sep|>", "<|close|>think<|sep|><|open|>response<|sep|>"),
        reasoning_first=True,
    ),
    ToolFormat(
        "deepseek-r1",
        "DeepSeek R1 and its distills, V3-0324",
        ("<｜tool▁calls▁begin｜>", "```json"),
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n",
        "\n```<｜tool▁call▁end｜>",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
        "\n",
    ),
    ToolFormat(
        "deepseek-v3",
        "DeepSeek V3.1",
        ("<｜tool▁calls▁begin｜>",),
        "<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
    ),
    ToolFormat(
        "deepseek-v3.2",
        "DeepSeek V3.2 (DSML)",
        ("DSML", "function_calls>"),
        '<｜DSML｜invoke name="{name}">\n',
        "</｜DSML｜invoke>\n",
        "<｜DSML｜function_calls>\n",
        "</｜DSML｜function_calls>",
        args="xml",
        param_open='<｜DSML｜parameter name="{key}" string="{string}">',
        param_close="</｜DSML｜parameter>\n",
    ),
    ToolFormat(
        "deepseek-v4",
        "DeepSeek V4 (DSML)",
        ("DSML", "tool_calls>"),
        '<｜DSML｜invoke name="{name}">\n',
        "</｜DSML｜invoke>\n",
        "<｜DSML｜tool_calls>\n",
        "</｜DSML｜tool_calls>",
        args="xml",
        param_open='<｜DSML｜parameter name="{key}" string="{string}">',
        param_close="</｜DSML｜parameter>\n",
    ),
    ToolFormat(
        "minimax-m3",
        "MiniMax M3",
        (_MM,),
        _MM + '<invoke name="{name}">',
        _MM + "</invoke>\n",
        _MM + "<tool_call>\n",
        _MM + "</tool_call>",
        args="xml",
        param_open=_MM + "<{key}>",
        param_close=_MM + "</{key}>",
        values="xml",
        reasoning=("<mm:think>", "</mm:think>"),
        reasoning_first=True,
    ),
    ToolFormat(
        "minimax-m2",
        "MiniMax M2",
        ("<minimax:tool_call>",),
        '<invoke name="{name}">\n',
        "</invoke>\n",
        "<minimax:tool_call>\n",
        "</minimax:tool_call>",
        args="xml",
        param_open='<parameter name="{key}">',
        param_close="</parameter>\n",
    ),
    ToolFormat(
        "ling-3",
        "Ling 3.0 (Bailing MoE 3)",
        ("<arg_key>", "<role>ASSISTANT</role>"),
        "<tool_call>{name}\n",
        "\n</tool_call>",
        separator="\n",
        args="xml",
        param_open="<arg_key>{key}</arg_key>\n<arg_value>",
        param_close="</arg_value>",
    ),
    ToolFormat(
        "hy3",
        "Hunyuan 3 (tencent Hy3)",
        ("<tool_calls{}>", ":opensource"),
        "<tool_call:opensource>{name}<tool_sep:opensource>\n",
        "</tool_call:opensource>",
        "<tool_calls:opensource>\n",
        "\n</tool_calls:opensource>",
        "\n",
        args="xml",
        param_open="<arg_key:opensource>{key}</arg_key:opensource>\n<arg_value:opensource>",
        param_close="</arg_value:opensource>\n",
    ),
    ToolFormat(
        "glm-4.7",
        "GLM-4.7",
        ("<tool_call>{function-name}<arg_key>",),
        "<tool_call>{name}",
        "</tool_call>",
        args="xml",
        param_open="<arg_key>{key}</arg_key><arg_value>",
        param_close="</arg_value>",
    ),
    ToolFormat(
        "glm-4.5",
        "GLM-4.5, GLM-4.6",
        ("<arg_key>",),
        "<tool_call>{name}\n",
        "</tool_call>",
        separator="\n",
        args="xml",
        param_open="<arg_key>{key}</arg_key>\n<arg_value>",
        param_close="</arg_value>\n",
    ),
    ToolFormat(
        "seed-oss",
        "Seed-OSS",
        ("<seed:tool_call>",),
        "<seed:tool_call>\n<function={name}>\n",
        "</function>\n</seed:tool_call>",
        separator="\n",
        args="xml",
        param_open="<parameter={key}>",
        param_close="</parameter>\n",
    ),
    ToolFormat(
        "qwen3-coder",
        "Qwen3-Coder, Qwen3.5, Nemotron 3",
        ("<function=",),
        "<tool_call>\n<function={name}>\n",
        "</function>\n</tool_call>",
        separator="\n",
        args="xml",
        param_open="<parameter={key}>\n",
        param_close="\n</parameter>\n",
    ),
    ToolFormat(
        "gemma-4",
        "Gemma 4",
        ("<|tool_call>call:",),
        "<|tool_call>call:{name}{{",
        "}}<tool_call|>",
        args="keyed",
        quote='<|"|>',
        reasoning=("<|channel>thought\n", "<channel|>"),
    ),
    ToolFormat(
        "lfm2",
        "LFM2, LFM2.5 (Liquid)",
        ("List of tools: ",),
        "{name}(",
        ")",
        "<|tool_call_start|>[",
        "]<|tool_call_end|>",
        ", ",
        args="python",
    ),
    ToolFormat(
        "command-r7b",
        "Command R7B, Command A, Cohere2 MoE",
        ("<|START_ACTION|>",),
        '\n    {{"tool_call_id": "{index}", "tool_name": "{name}", "parameters": ',
        "}}",
        "<|START_ACTION|>[",
        "\n]<|END_ACTION|>",
        ",",
    ),
    ToolFormat(
        "solar-open",
        "Solar Open",
        ("<|tool_call:begin|>",),
        "<|tool_call:begin|>{id}<|tool_call:name|>{name}<|tool_call:args|>",
        "<|tool_call:end|>",
        "<|tool_calls|>",
        "<|calls|>",
        id_pattern="[a-z0-9]{10}",
        reasoning=("<|think|>", "<|end|><|begin|>assistant"),
        text_open="<|content|>",
    ),
    ToolFormat(
        "mistral-v11",
        "Mistral Small 3.2",
        ("[CALL_ID]",),
        "[TOOL_CALLS]{name}[CALL_ID]{id}[ARGS]",
        "",
        id_pattern="[A-Za-z0-9]{9}",
    ),
    ToolFormat("mistral", "Ministral 3, Devstral, Magistral", ("[ARGS]",), "[TOOL_CALLS]{name}[ARGS]", ""),
    ToolFormat(
        "mistral-nemo",
        "Mistral Nemo (v3)",
        ("[TOOL_CALLS]",),
        '{{"name": "{name}", "arguments": ',
        ', "id": "{id}"}}',
        "[TOOL_CALLS][",
        "]",
        ", ",
        id_pattern="[A-Za-z0-9]{9}",
    ),
    ToolFormat("granite-3", "Granite 3.x", ("<|tool_call|>",), _JSON_OPEN, "}}", "<|tool_call|>[", "]", ", "),
    ToolFormat(
        "nemotron-v2", "Nemotron Nano v2", ("<TOOLCALL>",), _JSON_OPEN, "}}", "<TOOLCALL>[", "]</TOOLCALL>", ", "
    ),
    ToolFormat(
        "minimax-m1",
        "MiniMax M1",
        ("<tool_calls>", "<beginning_of_sentence>"),
        _JSON_OPEN,
        "}}",
        "<tool_calls>\n",
        "\n</tool_calls>",
        "\n",
    ),
    ToolFormat(
        "gigachat-3.1", "GigaChat 3.1", ("<|function_call|>",), "<|function_call|>" + _JSON_OPEN, "}}", parallel=False
    ),
    ToolFormat(  # the call is a message of its own role, after the assistant's (markers: 3.1's row first)
        "gigachat-3",
        "GigaChat 3",
        ("function call", "<|role_sep|>"),
        "<|message_sep|>\n\nfunction call<|role_sep|>\n" + _JSON_OPEN,
        "}}",
        parallel=False,
    ),
    ToolFormat(
        "hermes",
        "Qwen3, Qwen2.5, Hermes 2/3, Granite 4",
        ("<tool_call>",),
        '<tool_call>\n{{"name": "{name}", "arguments": ',
        "}}\n</tool_call>",
        separator="\n",
    ),
    ToolFormat(
        "llama3",
        "Llama 3.1, 3.2, 3.3",
        ('"parameters": ', "<|start_header_id|>"),
        '{{"name": "{name}", "parameters": ',
        "}}",
        parallel=False,
    ),
)
GENERIC = ToolFormat(
    "generic",
    "any template without tool support (SmolLM2)",
    (),
    '<tool_call>\n{{"name": "{name}", "arguments": ',
    "}}\n</tool_call>",
    separator="\n",
)
BY_NAME = {f.name: f for f in (*FORMATS, GENERIC)}


def detect_tool_format(template: str | None) -> ToolFormat:
    """The tool-call format a chat template's source writes; GENERIC where it writes none bmoe knows."""
    if not template:
        return GENERIC
    for fmt in FORMATS:
        if all(m in template for m in fmt.detect):
            return fmt
    return GENERIC


def parts(text: str) -> Iterator[tuple[str, str | None]]:
    """A format's text in order, as ``(literal, None)`` pieces (``{{``/``}}`` read as braces)
    and ``("", hole name)`` for each hole: what the grammar and the parser each turn into their own
    language."""
    for part in _PART.split(text):
        hole = HOLE.fullmatch(part)
        if hole:
            yield "", hole.group(1)
        elif part:
            yield part[0] if part in ("{{", "}}") else part, None


def fill(text: str, **holes: str) -> str:
    """``text`` with its holes filled and ``{{``/``}}`` as braces."""
    out = HOLE.sub(lambda m: holes.get(m.group(1), m.group(0)), text)
    return out.replace("{{", "{").replace("}}", "}")


def native_id(fmt: ToolFormat, call_id: str) -> str:
    """A call id as the format takes it (Mistral's 9 letters and digits, Solar Open's 10 lowercase
    letters and digits), derived from any other id the same way each time (so a tool message still
    names its call)."""
    if fmt.id_pattern is None or re.fullmatch(fmt.id_pattern, call_id):
        return call_id
    digest = hashlib.sha256(call_id.encode()).hexdigest()
    mixed = "".join(c.upper() if i % 2 and c.isalpha() else c for i, c in enumerate(digest[:9]))
    return mixed if re.fullmatch(fmt.id_pattern, mixed) else digest[:10]


def json_type(value: object) -> str:
    """A value's JSON type name (the ``{type}`` hole)."""
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "number"
    return "string" if isinstance(value, str) else "object" if isinstance(value, dict) else "array"


def write_value(fmt: ToolFormat, value: object) -> str:
    """An xml-format parameter's value: a string raw, anything else as JSON, or (``values="xml"``)
    as nested elements, a scalar as its text."""
    if isinstance(value, str):
        return value
    if fmt.values == "json" or isinstance(value, bool) or value is None:
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        return "".join(element(fmt, k, v) for k, v in value.items() if v is not None)
    if isinstance(value, list):
        return "".join(element(fmt, "item", v) for v in value)
    return str(value)


def element(fmt: ToolFormat, key: str, value: object) -> str:
    """One parameter (or, nested, one key or item) as its element."""
    is_str = "true" if isinstance(value, str) else "false"
    head = fill(fmt.param_open, key=key, string=is_str, type=json_type(value))
    return head + write_value(fmt, value) + fill(fmt.param_close, key=key)


def write_call(fmt: ToolFormat, name: str, args: dict, index: int = 0, call_id: str = "") -> str:
    """One call in the format's text (without the section)."""
    n = index + fmt.index_from
    holes = {"name": name, "index": str(n), "id": native_id(fmt, call_id or f"call{index}")}
    if fmt.args == "json":
        body = json.dumps(args, ensure_ascii=False)
    elif fmt.args == "keyed":
        body = write_pairs(args, fmt.quote)
    elif fmt.args == "python":
        body = write_kwargs(args)
    else:
        body = "".join(element(fmt, k, v) for k, v in args.items() if v is not None or fmt.values == "json")
    return fill(fmt.call_open, **holes) + body + fill(fmt.call_close, **holes)


def write_calls(fmt: ToolFormat, calls: list[tuple[str, dict, str]]) -> str:
    """Calls ``(name, args, id)`` as the model writes them, section included."""
    inner = fmt.separator.join(write_call(fmt, n, a, i, c) for i, (n, a, c) in enumerate(calls))
    return fmt.section_open + inner + fmt.section_close
