"""Every OpenAI field of the two completion routes, and what bmoe does with it: one table.

A field is honoured, ignored because it cannot change the answer, or refused with a 400 naming it
when it is set to anything but its neutral value. The refusals (``refuse_unset``) and the table in
docs/server.md ("Every OpenAI field", ``markdown_table``) are derived from these rows, and a test
holds the request bodies (schemas.py) to them: a field added to a body without a row fails it.
Fields OpenAI does not define are ignored (clients add their own), except bmoe's, which are rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from bmoe.constrain import ConstraintError, choice_grammar, constraint_of, from_response_format
from bmoe.server.errors import ApiError
from bmoe.server.schemas import ChatCompletionRequest, CompletionRequest

HONOURED = "honoured"
IGNORED = "ignored (harmless)"
REFUSED = "refused"
# The fields that constrain an answer (docs/server.md "Structured outputs"): one of them at a time.
CONSTRAINT_FIELDS = ("response_format", "json_schema", "grammar", "guided_choice", "structured_outputs")


@dataclass(frozen=True, slots=True)
class OpenAIField:
    name: str
    status: str  # HONOURED, IGNORED or REFUSED
    why: str  # what bmoe does with it; for a refused field the 400's message after "<name>: "
    neutral: tuple[Any, ...] = (None,)  # REFUSED: the values that ask for nothing, so pass


def _refused(name: str, why: str, *neutral: Any) -> OpenAIField:
    return OpenAIField(name, REFUSED, why, (None, *neutral))


CHAT_FIELDS: tuple[OpenAIField, ...] = (
    OpenAIField("messages", HONOURED, "the conversation; the last message must be the user's"),
    OpenAIField("model", IGNORED, "the server serves the model it was started with"),
    OpenAIField("max_tokens", HONOURED, "tokens to generate at most"),
    OpenAIField("max_completion_tokens", HONOURED, "OpenAI's newer name for max_tokens"),
    OpenAIField("temperature", HONOURED, "0..10; 0 is greedy"),
    OpenAIField("top_p", HONOURED, "nucleus sampling's mass"),
    OpenAIField("seed", HONOURED, "the sampler's seed"),
    OpenAIField("stop", HONOURED, "up to 16 stop strings"),
    OpenAIField("stream", HONOURED, "server-sent events"),
    OpenAIField("stream_options", HONOURED, "include_usage"),
    OpenAIField("n", HONOURED, "1 only (a larger n is a 422)"),
    OpenAIField("logprobs", HONOURED, "the answer's tokens' log-probs (Log-probs below)"),
    OpenAIField("top_logprobs", HONOURED, "0..20 alternatives per token; needs logprobs"),
    OpenAIField("logit_bias", HONOURED, "token id -> bias in [-100, 100], added before sampling"),
    OpenAIField("think", HONOURED, "bmoe: reasoning on or off for this turn"),
    OpenAIField(
        "reasoning_effort",
        HONOURED,
        "none/minimal: reasoning off; low..xhigh: on, the value passed where the template takes it (Reasoning switches below)",
    ),
    OpenAIField(
        "chat_template_kwargs",
        HONOURED,
        "vLLM / llama.cpp-server style: variables for the chat template; its switch must agree with think",
    ),
    OpenAIField("bmoe_logprobs_of", HONOURED, "bmoe: the log-prob of named strings at the answer's start"),
    OpenAIField("presence_penalty", HONOURED, "-2..2, lowers the logit of a token already in the answer once"),
    OpenAIField(
        "frequency_penalty", HONOURED, "-2..2, lowers a token's logit for each time it is already in the answer"
    ),
    OpenAIField("response_format", HONOURED, "text, json_object or json_schema (Structured outputs below)"),
    OpenAIField("json_schema", HONOURED, "llama.cpp-server style: the answer's JSON schema"),
    OpenAIField("grammar", HONOURED, "llama.cpp-server style: a GBNF grammar the answer keeps"),
    OpenAIField("jump_forward", HONOURED, "bmoe: with a constraint, the tokens it forces go in one batch"),
    OpenAIField("guided_choice", HONOURED, "vLLM style: the answer is one of these strings, answered by a decision"),
    OpenAIField("structured_outputs", HONOURED, 'vLLM style: {"choice": [...]}, as guided_choice'),
    OpenAIField("tools", HONOURED, "up to 128 functions, called in the model's own syntax (Tools below)"),
    OpenAIField("tool_choice", HONOURED, "auto, none, required or a named function"),
    OpenAIField("parallel_tool_calls", HONOURED, "false: one call at most; true: several where the format allows"),
    _refused("functions", "not supported (OpenAI's deprecated tool calls)", []),
    _refused("function_call", "not supported (OpenAI's deprecated tool calls)"),
    _refused("verbosity", "not supported"),
    _refused("modalities", "only text is supported", ["text"]),
    _refused("audio", "audio output is not supported"),
    _refused("web_search_options", "web search is not supported"),
    _refused("moderation", "moderation is not supported"),
    OpenAIField("prediction", IGNORED, "a hint for speed; the answer is the same without it"),
    OpenAIField("user", IGNORED, "an end-user id, for the caller's records"),
    OpenAIField("safety_identifier", IGNORED, "an end-user id, for the caller's records"),
    OpenAIField("metadata", IGNORED, "tags for stored completions; nothing is stored"),
    OpenAIField("store", IGNORED, "nothing is stored"),
    OpenAIField("service_tier", IGNORED, "there is one tier"),
    OpenAIField("prompt_cache_key", IGNORED, "the KV prefix is reused anyway"),
    OpenAIField("prompt_cache_options", IGNORED, "the KV prefix is reused anyway"),
    OpenAIField("prompt_cache_retention", IGNORED, "the KV prefix is reused anyway"),
)

COMPLETION_FIELDS: tuple[OpenAIField, ...] = (
    OpenAIField(
        "prompt", HONOURED, "text or token ids, up to 256 prompts, given to the model as they are (no template)"
    ),
    OpenAIField("model", IGNORED, "the server serves the model it was started with"),
    OpenAIField(
        "max_tokens", HONOURED, "tokens to generate at most (default 16); 0 or 1 with no stop or constraint: scored"
    ),
    OpenAIField("echo", HONOURED, "the prompt first in the text, its log-probs from its first token"),
    OpenAIField("logprobs", HONOURED, "0..20 alternatives per position (legacy shape)"),
    OpenAIField("temperature", HONOURED, "0..10; 0 is greedy (default: --temp; scored: 0)"),
    OpenAIField("top_p", HONOURED, "nucleus sampling's mass"),
    OpenAIField("seed", HONOURED, "the sampler's seed"),
    OpenAIField("stop", HONOURED, "up to 16 stop strings"),
    OpenAIField("stream", HONOURED, "server-sent events, text_completion chunks"),
    OpenAIField("stream_options", HONOURED, "include_usage"),
    OpenAIField("logit_bias", HONOURED, "token id -> bias in [-100, 100], added before sampling"),
    OpenAIField("presence_penalty", HONOURED, "-2..2, lowers the logit of a token already in the answer once"),
    OpenAIField(
        "frequency_penalty", HONOURED, "-2..2, lowers a token's logit for each time it is already in the answer"
    ),
    OpenAIField("response_format", HONOURED, "text, json_object or json_schema, as on chat"),
    OpenAIField("json_schema", HONOURED, "llama.cpp-server style: the answer's JSON schema"),
    OpenAIField("grammar", HONOURED, "llama.cpp-server style: a GBNF grammar the answer keeps"),
    OpenAIField("jump_forward", HONOURED, "bmoe: with a constraint, the tokens it forces go in one batch"),
    OpenAIField("guided_choice", HONOURED, "vLLM style: the answer is one of these strings, answered by a decision"),
    OpenAIField("structured_outputs", HONOURED, 'vLLM style: {"choice": [...]}, as guided_choice'),
    _refused("n", "only 1 is supported, got {value}", 1),
    _refused("best_of", "only 1 is supported, got {value}", 1),
    _refused("suffix", "insertion (a suffix) is not supported", ""),
    _refused("chat_template_kwargs", "the prompt is given as it is, no chat template renders it", {}),
    OpenAIField("user", IGNORED, "an end-user id, for the caller's records"),
)


def refuse_unset(body: BaseModel, table: Iterable[OpenAIField]) -> None:
    """ApiError(400, ``unsupported_field``) for the first refused field set to a value that is
    not neutral, in the table's order."""
    for f in table:
        if f.status != REFUSED:
            continue
        value = getattr(body, f.name)
        if not any(value == n and isinstance(value, bool) == isinstance(n, bool) for n in f.neutral):
            raise ApiError(400, f"{f.name}: {f.why.format(value=value)}", f.name, "unsupported_field")


def markdown_table(table: Iterable[OpenAIField]) -> str:
    """The rows as docs/server.md shows them; a refused field passes when left out or set to
    one of the listed values."""
    lines = ["| field | status | what bmoe does |", "|---|---|---|"]
    for f in table:
        status = f.status
        if f.status == REFUSED:
            status += "; passes as " + ", ".join(f"`{json.dumps(n)}`" for n in f.neutral)
        lines.append(f"| `{f.name}` | {status} | {f.why.replace('{value}', 'N')} |")
    return "\n".join(lines)


def constraint_fields(body: ChatCompletionRequest | CompletionRequest) -> tuple[dict | bool | None, str | None]:
    """A body's schema or grammar, from whichever one of CONSTRAINT_FIELDS it sets (vLLM's choice
    fields as a grammar), checked here so that a refusal is a 400 naming its field before the job
    is queued."""
    given = [n for n in CONSTRAINT_FIELDS if getattr(body, n) is not None]
    try:
        if len(given) > 1:
            raise ConstraintError(given[1], f"give one of {', '.join(CONSTRAINT_FIELDS)}, got {given}")
        schema = from_response_format(body.response_format)
        schema = body.json_schema if schema is None else schema
        choice = choice_grammar(body.guided_choice, body.structured_outputs)
        grammar = body.grammar if choice is None else choice[1]
        constraint_of(schema, grammar)
    except ConstraintError as e:
        raise ApiError(400, str(e), e.field, "invalid_request") from None
    return schema, grammar
