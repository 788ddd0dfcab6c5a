"""Request bodies. FastAPI validates them, so a bad field gets a 422 naming it.

The chat and completion requests declare every OpenAI field, each honoured or refused by name
(openai_fields.py), and ignore fields OpenAI does not define (clients add their own); the decide request mirrors the session protocol's decide command and
refuses unknown fields, as the protocol does, since a typo would silently change the decision.
No field names a file: the model is the one the server was started with. Numbers must be finite
(JSON's NaN and Infinity, which Python's json reads, are refused as such, not as out of range).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Strict,
    Tag,
    ValidationInfo,
    create_model,
    field_validator,
)
from pydantic_core import PydanticCustomError

from bmoe import rules
from bmoe.decide.fields import DECIDE_TABLE, RENDER_TABLE
from bmoe.session import TOP_CAP
from bmoe.wire.protocol import repeated_id


def _utf8(v: str) -> str:
    # JSON can carry lone surrogates ("\ud800"); the tokenizer takes UTF-8 bytes only.
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (no lone surrogates)") from None
    return v


Text = Annotated[str, AfterValidator(_utf8)]
MAX_IMAGES = 16  # images in one decision or one chat request


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: Text


class ImageUrl(BaseModel):
    model_config = ConfigDict(extra="ignore")
    url: Text = Field(description="a data: URL (data:image/png;base64,...); remote URLs are refused")
    detail: str | None = Field(None, description="ignored: the projector decides the image's tokens")


class ImagePart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["image_url"]
    image_url: ImageUrl


def _part_tag(part: object) -> str | None:
    """A content part's union member, by its ``type``. The tags are the members' class names,
    never the ``type`` values: pydantic puts the tag in an error's field path, and a lower-case
    one read as a field (``image_url.image_url``); the error mapping drops capitalised names."""
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    return {"text": "TextPart", "image_url": "ImagePart"}.get(kind) if isinstance(kind, str) else None


ContentPart = Annotated[
    Annotated[TextPart, Tag("TextPart")] | Annotated[ImagePart, Tag("ImagePart")],
    Discriminator(
        _part_tag,
        custom_error_type="content_part_type",
        custom_error_message="a content part's type must be 'text' or 'image_url'",
    ),
]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # None: an assistant turn that only called tools (the route refuses it on other roles)
    content: Text | Annotated[list[ContentPart], Field(max_length=256)] | None = None
    # an assistant turn's calls (checked against the request's tools: server/tools_route.py)
    tool_calls: Annotated[list[Any], Field(max_length=128)] | None = None
    tool_call_id: Text | None = None  # a role "tool" message: the call it answers

    def text(self, marker: str) -> str:
        """The message's text, each image part an image ``marker`` where it stands."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text if isinstance(p, TextPart) else marker for p in self.content)

    def image_urls(self) -> list[str]:
        if not isinstance(self.content, list):
            return []
        return [p.image_url.url for p in self.content if isinstance(p, ImagePart)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


def _token_key(v: str) -> str:
    if not re.fullmatch(r"[0-9]{1,10}", v):
        raise PydanticCustomError(
            "token_id", "a logit_bias key must be a token id written as a JSON string, got {v!r}", {"v": v}
        )
    return v


# OpenAI's logit_bias: {"<token id>": bias}; an id the model does not have is a 400 from the route.
LogitBias = Annotated[
    dict[Annotated[str, AfterValidator(_token_key)], Annotated[float, Field(ge=-100.0, le=100.0)]],
    Field(max_length=1 << 16),
]
MAX_LOGPROBS_OF = 64  # strings in one bmoe_logprobs_of


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat request. Every OpenAI field is declared, so that the route can honour it or
    refuse it by name (openai_fields.CHAT_FIELDS says which); other fields are ignored."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    model: str | None = Field(None, description="ignored: the server serves the model it was started with")
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=4096)]
    max_tokens: int | None = Field(None, ge=1, le=1 << 20)
    max_completion_tokens: int | None = Field(None, ge=1, le=1 << 20, description="OpenAI's newer name for max_tokens")
    temperature: float | None = Field(None, ge=0.0, le=rules.TEMPERATURE_MAX)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: Text | Annotated[list[Text], Field(max_length=16)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(None, ge=1, le=1, description="only 1 is supported")
    think: bool | None = Field(None, description="bmoe: reasoning on/off for this turn (default: the session's)")
    response_format: dict[str, Any] | None = Field(
        None, description="text, json_object or json_schema (enforced whether strict or not): docs/server.md"
    )
    json_schema: dict[str, Any] | bool | None = Field(None, description="llama.cpp-server style: the answer's schema")
    grammar: Text | None = Field(None, description="llama.cpp-server style: a GBNF grammar the answer keeps")
    jump_forward: bool = Field(False, description="bmoe: a constraint's forced tokens go into the model in one batch")
    # vLLM's: the answer is one of these strings (checked by constrain/choices.py, so that a
    # refusal names the value); Any here so that the route's 400 names what was wrong.
    guided_choice: Any = Field(None, description="vLLM style: the answer is one of these strings")
    structured_outputs: Any = Field(None, description='vLLM style: {"choice": [...]}, as guided_choice')
    logprobs: bool | None = Field(None, description="return the answer's tokens' log-probs")
    top_logprobs: int | None = Field(None, ge=0, le=TOP_CAP, description="alternatives per token; needs logprobs")
    logit_bias: LogitBias | None = None
    bmoe_logprobs_of: (
        Annotated[list[Annotated[Text, Field(min_length=1)]], Field(min_length=1, max_length=MAX_LOGPROBS_OF)] | None
    ) = Field(None, description="bmoe: the log-prob of each string as the answer's start (docs/server.md)")
    presence_penalty: float | None = Field(None, ge=-rules.PENALTY_MAX, le=rules.PENALTY_MAX)
    frequency_penalty: float | None = Field(None, ge=-rules.PENALTY_MAX, le=rules.PENALTY_MAX)
    # Checked by server/tools_route.py, each refusal a 400 naming the field (not a 422 by type).
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    # Checked against the template's reasoning switch by server/think_fields.py (400s naming them).
    reasoning_effort: Any = Field(None, description="none, minimal, low, medium, high, xhigh or the template's own")
    chat_template_kwargs: Any = Field(None, description="vLLM / llama.cpp-server style: variables for the template")
    # Refused unless left out (or neutral): openai_fields.CHAT_FIELDS. Any: refused by name, not by type.
    functions: Any = None
    function_call: Any = None
    verbosity: Any = None
    modalities: Any = None
    audio: Any = None
    web_search_options: Any = None
    moderation: Any = None
    # Ignored: they cannot change the answer.
    prediction: Any = None
    user: Any = None
    safety_identifier: Any = None
    metadata: Any = None
    store: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None

    def bias(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(k), v) for k, v in (self.logit_bias or {}).items())

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


# The decide body is derived from the request's one table (bmoe.decide.fields.DECIDE_TABLE): each
# rule is a pydantic type with the same bounds; strings are Text (valid Unicode); lists are capped.
MAX_LIST = 1024  # choices, options, labels in one decision
_INT64 = Field(ge=-(2**63), le=2**63 - 1)
_TYPES: dict[rules.Rule, object] = {
    rules.INT: Annotated[int, _INT64],
    rules.STR: Text,
    rules.BOOL: bool,
    rules.PROB: Annotated[float, Field(ge=0.0, le=1.0)],
    rules.STR_LIST: Annotated[list[Text], Field(max_length=MAX_LIST)],
    rules.IMAGES: Annotated[list[Text], Field(max_length=MAX_IMAGES)],
}
_IMAGES_DOC = (
    "data: URLs of images, placed at the <__media__> markers of prefix + suffix, or in front of the "
    "prefix (docs/decide.md \"Images\"); the server reads no files"
)


def _body_fields(table: rules.Table, nested: dict[str, type[BaseModel]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in table:
        kind = nested[f.name] if f.name in nested else _TYPES[f.rule]
        doc = _IMAGES_DOC if f.rule is rules.IMAGES else re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", f.doc).replace("`", "")
        if f.required:
            out[f.name] = (kind, Field(description=doc))
        elif f.default is None:
            out[f.name] = (kind | None, Field(None, description=doc))  # type: ignore[operator]  # a type object
        else:
            default = list(f.default) if isinstance(f.default, tuple) else f.default
            out[f.name] = (kind, Field(default, description=doc))
    return out


# The structured form's rendering rule (docs/decide.md "Order debiasing"); left out: defaults.
RenderBody = create_model(
    "RenderBody", __config__=ConfigDict(extra="forbid", strict=True), **_body_fields(RENDER_TABLE, {})
)


def _choices_or_options(v: list[str] | None, info: ValidationInfo) -> list[str] | None:
    if v is None and info.data.get("options") is None:
        raise PydanticCustomError("missing", "Field required (or options, with question)")
    return v


def _decide_fields() -> dict[str, Any]:
    """DECIDE_TABLE's fields, ``choices`` last: it is required unless ``options`` is given, and its
    check sees only the fields before it."""
    out = _body_fields(DECIDE_TABLE, {"render": RenderBody})
    choices = out.pop("choices")[0]
    out["choices"] = (choices | None, Field(None, validate_default=True, description="the labels to choose from"))
    return out


# One decision; the fields and rules of the session protocol's decide request. The schema says what
# the choices check enforces: choices, or options with question.
DecideBody = create_model(
    "DecideBody",
    __doc__="One decision: the fields and rules of the session protocol's decide request.",
    __config__=ConfigDict(
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        json_schema_extra={"anyOf": [{"required": ["choices"]}, {"required": ["question", "options"]}]},
    ),
    __validators__={"_choices_or_options": field_validator("choices")(_choices_or_options)},
    **_decide_fields(),
)


def _ids_tell_answers_apart(v: list[DecideBody]) -> list[DecideBody]:  # type: ignore[valid-type]  # made by create_model
    why = repeated_id([b.id for b in v], "body.{}")  # type: ignore[attr-defined]  # the protocol's decide_batch rule
    if why is not None:
        raise PydanticCustomError("repeated_id", why)
    return v


DecideBatch = Annotated[
    list[DecideBody],  # type: ignore[valid-type]
    Field(min_length=1, max_length=256),
    AfterValidator(_ids_tell_answers_apart),
]


# --- /v1/completions and the tokenizer routes (completions_route.py, tokenizer_route.py) ---------

TokenId = Annotated[int, Strict()]  # a JSON integer: true, 1.0 or "1" are not token ids
TokenIds = Annotated[list[TokenId], Field(min_length=1, max_length=1 << 20)]
MAX_PROMPTS = 256  # prompts in one /v1/completions request


class CompletionRequest(BaseModel):
    """OpenAI's legacy completion request: raw prompts scored (``max_tokens`` 0 or 1) or continued.

    Every OpenAI field is declared, so that the route can honour it or refuse it by name
    (openai_fields.COMPLETION_FIELDS says which: ``n``, ``best_of``, ``suffix`` and
    ``chat_template_kwargs`` are refused unless neutral); other unknown fields are ignored.
    """

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    model: str | None = Field(None, description="ignored: the server serves the model it was started with")
    prompt: (
        Text
        | Annotated[list[TokenId], Field(min_length=1, max_length=1 << 20)]
        | Annotated[list[Text], Field(min_length=1, max_length=MAX_PROMPTS)]
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]
    )
    max_tokens: int | None = Field(
        None, ge=0, le=1 << 20, description="tokens to generate at most (default 16); 0 or 1: scored (lm-eval)"
    )
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=TOP_CAP)
    temperature: float | None = Field(None, ge=0.0, le=rules.TEMPERATURE_MAX)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    n: int | None = Field(None, ge=1, le=1 << 10)
    best_of: int | None = Field(None, ge=1, le=1 << 10)
    stream: bool = False
    suffix: Text | None = None
    chat_template_kwargs: Any = None  # refused: no template renders a completion's prompt
    stop: Text | Annotated[list[Text], Field(max_length=16)] | None = None
    logit_bias: LogitBias | None = None
    presence_penalty: float | None = Field(None, ge=-rules.PENALTY_MAX, le=rules.PENALTY_MAX)
    frequency_penalty: float | None = Field(None, ge=-rules.PENALTY_MAX, le=rules.PENALTY_MAX)
    response_format: dict[str, Any] | None = Field(None, description="text, json_object or json_schema, as on chat")
    json_schema: dict[str, Any] | bool | None = Field(None, description="llama.cpp-server style: the answer's schema")
    grammar: Text | None = Field(None, description="llama.cpp-server style: a GBNF grammar the answer keeps")
    jump_forward: bool = Field(False, description="bmoe: a constraint's forced tokens go into the model in one batch")
    guided_choice: Any = Field(None, description="vLLM style: the answer is one of these strings")
    structured_outputs: Any = Field(None, description='vLLM style: {"choice": [...]}, as guided_choice')
    stream_options: StreamOptions | None = None
    user: Any = None

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def bias(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(k), v) for k, v in (self.logit_bias or {}).items())

    @field_validator("prompt", mode="before")
    @classmethod
    def _at_most_256_prompts(cls, v: object) -> object:
        # A list of prompts (strings, or lists of token ids) over the limit is refused as such
        # before the union is tried: otherwise the deepest error wins, and that is the list of
        # token ids' "prompt.0: Input should be a valid integer".
        if isinstance(v, list) and len(v) > MAX_PROMPTS and isinstance(v[0], (str, list)):
            raise PydanticCustomError(
                "too_long",
                "List should have at most {max_length} items, not {actual_length}",
                {"max_length": MAX_PROMPTS, "actual_length": len(v)},
            )
        return v


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = Field(None, description="ignored")
    prompt: Text
    add_special_tokens: bool = Field(True, description="add BOS (and EOS) as the model asks")


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = Field(None, description="ignored")
    tokens: Annotated[list[TokenId], Field(max_length=1 << 20)]
