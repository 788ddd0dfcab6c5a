"""Typed requests and results at the session's public seam."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bmoe import rules
from bmoe.constrain import Tool, ToolChoice
from bmoe.image_refs import ImageSource
from bmoe.runtime.sampling import TokenLogprobs
from bmoe.stream.stats import StreamStats


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    prompt: str
    id: int = 0
    n_predict: int | None = None  # None: the session's n_predict
    think: bool | None = None  # None: the session's think setting
    clear_kv: bool = True  # True: a new chat; False: continue the conversation
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    keep_logits: bool = False  # keep every step's logit row (gates compare them bit for bit)
    # image file paths, data: URLs or bytes (bmoe.image_refs), placed at the prompt's markers
    # (rules.IMAGE_MARKER), or in front of it without one; needs a session opened with mmproj
    images: tuple[ImageSource, ...] = ()
    # the answer must be JSON valid under this schema, or text the GBNF grammar accepts (at most
    # one of them; bmoe.constrain refuses what it cannot enforce): docs/protocol.md "Constrained"
    json_schema: dict | bool | None = None
    grammar: str | None = None
    jump_forward: bool = False  # the tokens a constraint forces go into the model in one batch
    # None: no log-probs; 0..20: each Step carries its token's log-prob and this many alternatives
    # (runtime/sampling.py TokenLogprobs: the model's distribution, before bias and temperature)
    top_logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]) added before sampling
    # OpenAI's penalties on tokens already in the answer (runtime/sampling.py Sampler), in [-2, 2]
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # Python and the server only (docs/server.md "Tools"): the functions the model may call,
    # rendered by its chat template, the answer held to its call syntax (tool_choice None: "auto"
    # with tools); ``tool_call_id``: ``prompt`` is a tool's result answering that call (a role
    # "tool" message), not a user message
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    tool_call_id: str | None = None
    # Python and the server only (docs/server.md "Reasoning"): the template's own reasoning effort
    # (runtime/think_switch.py ThinkSwitch.efforts) and more variables for the chat template
    # (chat_template_kwargs), none of them a variable bmoe renders itself
    reasoning_effort: str | None = None
    template_vars: tuple[tuple[str, Any], ...] = ()


# The generate request's field table, written once: the session checks a GenerateRequest built in
# Python against it (check_generate), the line protocol checks a generate line by it and builds the
# request with generate_request (wire/protocol.py), and docs/protocol.md's table is rendered from
# it (a test compares). GenerateRequest keeps the same names and defaults (a test holds it to them).
GENERATE_TABLE: rules.Table = (
    rules.Field("id", rules.INT, 0, "echoed in the answer; what `cancel` names"),
    rules.Field(
        "prompt", rules.STR, rules.REQUIRED, "the user message (a new chat, or the next turn with `clear_kv` false)"
    ),
    rules.Field("n_predict", rules.POS_INT, None, "tokens to generate at most", default_doc="`-n`"),
    rules.Field("think", rules.BOOL, None, "reasoning on or off for this turn", default_doc="not `--no-think`"),
    rules.Field("clear_kv", rules.BOOL, True, "`true`: a new chat; `false`: continue the conversation"),
    rules.Field("temperature", rules.TEMPERATURE, None, "sampling temperature; 0 is greedy", default_doc="`--temp`"),
    rules.Field("top_p", rules.TOP_P, None, "nucleus sampling's mass", default_doc="`--top-p`"),
    rules.Field("seed", rules.SEED, None, "the sampler's seed", default_doc="`--seed`"),
    rules.Field(
        "presence_penalty",
        rules.PENALTY,
        0,
        "lowers once the logit of each token already in the answer (OpenAI's; the prompt's tokens do not count)",
    ),
    rules.Field(
        "frequency_penalty",
        rules.PENALTY,
        0,
        "lowers a token's logit by this for each time it is already in the answer (OpenAI's)",
    ),
    rules.Field(
        "images",
        rules.IMAGES,
        (),
        "image file paths or `data:` URLs, at the prompt's `<__media__>` "
        "markers or in front of it; needs `--mmproj` "
        "([decide.md](decide.md#images))",
    ),
    rules.Field(
        "json_schema",
        rules.SCHEMA,
        None,
        "the answer is JSON valid under this schema ([protocol.md](protocol.md#constrained-generation))",
    ),
    rules.Field(
        "grammar",
        rules.STR,
        None,
        "the answer is text this GBNF grammar accepts ([protocol.md](protocol.md#constrained-generation))",
    ),
    rules.Field(
        "jump_forward",
        rules.BOOL,
        False,
        "with a constraint: the tokens it forces are decoded in one batch "
        "([protocol.md](protocol.md#constrained-generation))",
    ),
)
GENERATE_FIELDS: rules.Spec = rules.spec(GENERATE_TABLE)


def generate_request(fields: dict) -> GenerateRequest:
    """The GenerateRequest of checked generate ``fields`` (a field left out takes its default)."""
    f: dict[str, Any] = rules.with_defaults(fields, GENERATE_TABLE)
    values: dict[str, Any] = {k: tuple(v) if k == "images" else v for k, v in f.items()}
    return GenerateRequest(**values)


def check_generate(req: GenerateRequest) -> None:
    """Refuse (``rules.FieldError``, a RequestError) a request whose fields break GENERATE_TABLE."""
    rules.check_fields(
        {k: getattr(req, k) for k in GENERATE_FIELDS if getattr(req, k) is not None}, GENERATE_FIELDS, "generate"
    )


@dataclass(frozen=True, slots=True)
class TimeSplit:
    """Where a span's wall time went: computing, cache bookkeeping (``mgmt_s``) and waiting for
    expert reads (``stall_s``); the parts are >= 0 and add up to ``wall_s`` exactly.

    The counters come from the streamer (``StreamStats``), measured on the graph's thread inside the
    span, so they fit in it; where they claim more than the span (a wait counted inside a
    bookkeeping interval too, clock granularity) the waiting is capped at the wall time first and
    bookkeeping at what is left, never letting compute go negative or the sum exceed the wall."""

    wall_s: float
    compute_s: float
    mgmt_s: float
    stall_s: float

    @classmethod
    def of(cls, wall_s: float, io: StreamStats) -> "TimeSplit":
        wall = max(0.0, wall_s)
        stall = min(max(0.0, io.stall_s), wall)
        mgmt = min(max(0.0, io.mgmt_s), wall - stall)
        return cls(wall_s=wall, compute_s=wall - stall - mgmt, mgmt_s=mgmt, stall_s=stall)

    def per(self, n: int) -> "TimeSplit":
        """The same split per item (a decode token): each part divided by ``n`` (at least 1)."""
        n = max(1, n)
        return TimeSplit(self.wall_s / n, self.compute_s / n, self.mgmt_s / n, self.stall_s / n)


@dataclass(frozen=True, slots=True)
class Step:
    index: int
    token: int
    delta_text: str
    delta_reasoning: str
    wall_ms: float
    io_ms: float
    mgmt_ms: float
    stall_ms: float
    compute_ms: float
    read_mb: float
    cache_hit_pct: float
    majflt: int
    cpu_ms: float
    logits: np.ndarray | None = None  # [n_vocab] the row this token was chosen from
    logprobs: TokenLogprobs | None = None  # with GenerateRequest.top_logprobs set


@dataclass(frozen=True, slots=True)
class GenerateResult:
    id: int
    text: str
    reasoning: str
    tokens: tuple[int, ...]
    cancelled: bool
    stop: str  # "eog" | "length" | "ctx" | "cancelled"
    n_prompt: int  # tokens prefilled this turn (after the reused prefix)
    n_reused: int  # tokens of the KV kept from the previous turn
    n_past: int  # context length after the turn
    prefill_fallback: str  # "" or why the KV prefix could not be reused
    prefill_s: float
    decode_s: float
    load_s: float
    io: StreamStats  # this request's streaming counters (prefill and decode)
    majflt: int
    cpu_s: float
    logits: tuple[np.ndarray, ...] = field(default=())
    prefill_dev_tokens: int | None = None  # prompt tokens the prefill device ran; None without one
    decode_io: StreamStats = field(default_factory=StreamStats)  # the decode steps' part of ``io``
    reuse_tier: str = ""  # "ram" or "disk": the state store's tier a kept state came from ("" when none did)
    restore_s: float = 0.0  # seconds restoring it (reading its file included)
    tool_decision: dict | None = None  # a tool turn's name decision (runtime/tool_choice.py; not on the wire)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def decode_split(self) -> TimeSplit:
        """The decode steps' wall time split into compute, bookkeeping and waiting for reads (the
        prefill's reads and waits are the request's, in ``io``, not any token's)."""
        return TimeSplit.of(self.decode_s, self.decode_io)

    @property
    def prefill_tps(self) -> float:
        return self.n_prompt / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def tok_s(self) -> float:
        return self.n_tokens / self.decode_s if self.decode_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class PerplexityResult:
    ppl: float
    nll_mean: float
    n_scored: int
    n_window: int
    token_logprobs: np.ndarray  # [n_scored] float64 log p of each scored token
    logits: np.ndarray | None = None  # [n_scored, n_vocab] when asked for


@dataclass(frozen=True, slots=True)
class ScoreRequest:
    """Score a token list position by position (runtime/scoring.py), optionally pick one more."""

    tokens: tuple[int, ...]
    echo: bool = True  # score every prompt position; False: only the picked token, if any
    top_n: int = 0  # most likely alternatives reported per scored position (0..rules.TOP_CAP)
    n_predict: int = 0  # 0: score only; 1: also pick the next token
    temperature: float = 0.0  # for the picked token: 0 = greedy
    top_p: float = 1.0
    seed: int | None = None
    reuse: bool = True  # False: prefill from an empty KV, keeping nothing of earlier requests
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) added before the token is picked


@dataclass(frozen=True, slots=True)
class ScoreResult:
    tokens: tuple[int, ...]  # the prompt, then the picked token (if any)
    n_prompt: int
    token_logprobs: np.ndarray  # [len(tokens)] float64 log p(token j | tokens before j); nan where not scored
    top_ids: np.ndarray  # [len(tokens), top_n] int64, most likely first (rows of unscored positions: 0)
    top_logprobs: np.ndarray  # [len(tokens), top_n] float64
    generated: tuple[int, ...]  # () or the one picked token
    eog: bool  # the picked token ends generation (end of text / turn)
    n_reused: int  # prompt tokens whose KV (and scores) came from the previous request
    n_prefilled: int  # prompt tokens prefilled for this request
    prefill_s: float
    prefill_fallback: str  # "" or why the KV prefix could not be reused
    io: StreamStats = field(default_factory=StreamStats)  # this request's streaming counters
