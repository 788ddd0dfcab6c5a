"""The tool's name as a decision inside a generation turn with tools (docs/decide.md "Decisions
behind the standard fields", the choice of tool).

``constrain.tool_decision`` says what the model writes to pick a tool: per tool, the text from
the answer's start through the name and the fixed text after it (for ``auto`` the opener is part
of each, and text is the option outside them). The generation runs as ever until the *name
position*: the first step at which the grammar allows a token that leaves the text all the
choices share. There, with what the generation has taken so far, the rest of each choice is
tokenized (a marker that is one special token as that token) and scored in one batched prefill
of its branches on side sequences (``forks.decode_forks``; seq 0 is not touched):

- temperature 0: the decision is telemetry only (run where log-probs are asked); the text is
  constrained greedy's, token by token as before;
- temperature > 0: the choice is drawn from softmax(choice_logp / T) within top_p (for ``auto``
  the text option weighs ``p_outside``), seeded; a drawn tool's rest goes in as forced tokens, and
  its arguments follow by constrained generation. Drawn text: the token at the name position is
  sampled with the choices' first tokens banned, and the turn goes on under its grammar.

A turn that may reason first (a ``<think>`` block, gpt-oss's analysis channel, Gemma 4's thought
channel, Kimi K3's and MiniMax M3's blocks that every answer starts inside) has its name position
after the block (``tool_position.Block``): the choices' text starts where the block's close ends,
after the whitespace the grammar allows there (``</think>``'s blank). A token that opens the block
at the answer's start, or whitespace right after its close, leaves nothing; where one is taken at
a name position (``auto``: text drawn, or greedy's token), the position is looked for again.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from bmoe.constrain import TokenMask, ToolChoice, tool_decision
from bmoe.decide import full_scores, token_logps
from bmoe.numerics import draw_choice, log_softmax
from bmoe.runtime.forks import RowLimits, batch_limits, decode_forks
from bmoe.runtime.sampling import TokenLogprobs
from bmoe.runtime.scoring import token_logprobs
from bmoe.runtime.tool_position import Block

if TYPE_CHECKING:
    from bmoe.llama.model import LlamaModel
    from bmoe.runtime.chat import ChatRenderer
    from bmoe.runtime.results import GenerateRequest
    from bmoe.runtime.runtime import Runtime

DECIDED = "decision"  # answered_by: drawn from the decision (temperature > 0)
GREEDY = "greedy_walk"  # temperature 0: constrained greedy wrote it
SAMPLED = "sampled"  # temperature > 0 without a decision (no side sequences, --no-decide)


@functools.lru_cache(maxsize=8)
def _limits(model: str) -> RowLimits:
    return batch_limits(model)


def _shared(texts: tuple[bytes, ...]) -> bytes:
    """The bytes all ``texts`` start with."""
    n = 0
    while all(len(t) > n and t[n] == texts[0][n] for t in texts):
        n += 1
    return texts[0][:n]


def banned(logits: np.ndarray | None, mask: TokenMask | None, ban: list[int]) -> np.ndarray:
    """The row a token is sampled from: the constraint's mask, and ``ban`` (a tool turn's drawn
    text: the tool choices' first tokens) at -inf where something else is left."""
    assert logits is not None  # sampled tokens always have their row
    row = logits if mask is None else mask.mask(logits)
    if ban:
        row = row.copy()
        row[ban] = -np.inf
        if not np.isfinite(row).any():
            return logits if mask is None else mask.mask(logits)
    return row


@dataclass(eq=False)
class NamePick:
    """One turn's name decision: built by ``name_pick``, asked by the generate loop before each
    sampled token (``before_sample``), told each token taken (``taken``)."""

    names: tuple[str, ...]
    full: tuple[bytes, ...]  # per tool: the answer's text from its start through the choice
    text_outside: bool  # auto: the answer may be text
    score: bool  # run the decision (temperature > 0, or log-probs asked)
    temperature: float
    top_p: float
    seed: int | None
    special: dict[str, int]
    why_not: str = ""  # why no decision was run where one was wanted
    at: bytes = b""  # the answer's bytes so far
    point: bytes | None = None  # ``at`` at the name position, once reached
    scores: dict = field(default_factory=dict)
    chosen: int | None = None  # the drawn tool (temperature > 0, decided)
    drew_text: bool = False
    decoded: int = 0  # sampled tokens of the name after its first
    settled: bool = False
    _common: bytes | None = None  # the bytes all choices start with
    _markers: dict[int, bytes] | None = None  # special marker token -> its text
    _rows: list[np.ndarray] = field(default_factory=list)  # the drawn tool's rows, for its log-probs
    block: Block = field(default_factory=Block)  # a reasoning block before the choices, if any

    def off(self, why: str) -> None:
        self.score, self.why_not = False, why

    def _at_point(self, mask: TokenMask, model: LlamaModel) -> bool:
        if self.block.phase == "in":
            return False
        if self._common is None:
            self._common = _shared(self.full)
        common = self._common
        for t in mask.allowed_ids():
            t = int(t)
            if model.is_eog(t) or self.block.leaves(self.at + self.piece(t, model.token_bytes(t)), common):
                return True
        return False

    def _rel(self) -> bytes:
        """The answer's text from where the choices' text starts."""
        return self.at[self.block.base :]

    def piece(self, token: int, text: bytes) -> bytes:
        """A token's bytes as the choices spell it: a special marker's is its text (``text``,
        its piece without special tokens, is empty for a control token)."""
        if self._markers is None:
            self._markers = {i: m.encode() for m, i in self.special.items()}
        return self._markers.get(token, text)

    def _tokens(self, model: LlamaModel, text: str) -> list[int]:
        """``text``'s tokens, each special marker as its one token."""
        out: list[int] = []
        cut = re.compile("|".join(re.escape(m) for m in sorted(self.special, key=len, reverse=True)) or "(?!)")
        at = 0
        for m in cut.finditer(text):
            if m.start() > at:
                out += model.tokenize(text[at : m.start()], add_special=False, parse_special=False)
            out.append(self.special[m.group(0)])
            at = m.end()
        if text[at:]:
            out += model.tokenize(text[at:], add_special=False, parse_special=False)
        return out

    def before_sample(self, rt: Runtime, logits: np.ndarray, mask: TokenMask) -> tuple[list[int], list[int]]:
        """At the name position: run the decision where wanted. Returns the tokens to force (a
        drawn tool's rest) and the tokens to ban at this step (drawn text: the choices' first)."""
        if self.point is not None or not self._at_point(mask, rt.model):
            return [], []
        self.point = self.at
        if not self.score:
            return [], []
        try:
            rests = [f[len(self._rel()) :].decode("utf-8") for f in self.full]
        except UnicodeDecodeError:
            self.off("the name position splits a character")
            return [], []
        tokens = [self._tokens(rt.model, r) for r in rests]
        if any(not t or not mask.accepts(t) for t in tokens):
            self.off("a choice's tokens are not the grammar's there")
            return [], []
        if rt.kv.n_past + max(len(t) for t in tokens) > rt.n_ctx:
            self.off("the choices do not fit the context after the prompt")
            return [], []
        multi = [i for i, t in enumerate(tokens) if len(t) > 1]
        fork_rows = (
            decode_forks(
                rt.live_ctx,
                [tokens[i][:-1] for i in multi],
                rt.kv.pos_of(rt.kv.n_past),
                limits=_limits(rt.config.model),
            )
            if multi
            else []
        )
        rows: list[np.ndarray | None] = [None] * len(tokens)
        for i, r in zip(multi, fork_rows):
            rows[i] = r
        first = log_softmax(logits)
        per_token = [token_logps(first, None if r is None else log_softmax(r), t) for r, t in zip(rows, tokens)]
        sc = full_scores(rests, [t[0] for t in tokens], first, per_token, "sum", None)
        self.scores = {
            "choice_logp": list(sc.choice_logp),
            "p_outside": sc.p_outside,
            "abstained": sc.abstained,
            "choice_tokens": [len(t) for t in tokens],
        }
        if self.temperature <= 0:
            return [], []
        logp = list(sc.choice_logp)
        if self.text_outside:
            logp.append(float(np.log(sc.p_outside)) if sc.p_outside > 0 else -np.inf)
        k = draw_choice(logp, self.temperature, self.top_p, self.seed)
        if k == len(self.names):
            self.drew_text = True
            return [], sorted({t[0] for t in tokens})
        self.chosen = k
        chosen_rows = rows[k]
        self._rows = [logits] + ([] if chosen_rows is None else list(chosen_rows))
        return list(tokens[k]), []

    def logprobs(self, token: int, top_n: int) -> TokenLogprobs | None:
        """A drawn tool's forced token's log-probs, from the rows the decision scored it on."""
        return token_logprobs(self._rows.pop(0), token, top_n) if self._rows else None

    def taken(self, token: int, piece: bytes, sampled: bool) -> None:
        """The generation took ``token`` (its text ``piece``; ``sampled``: not forced)."""
        piece = self.piece(token, piece)
        first = self.point is not None and self.at == self.point  # the token at the name position
        if self.point is not None and not self.settled and sampled and not first:
            self.decoded += 1
        self.at += piece
        self.block.update(self.at)
        if first and self.chosen is None and self.block.phase != "body":
            # the block's opening or the blank after it, not a choice: the position comes later
            self.point, self.scores, self.drew_text = None, {}, False
        elif self.point is not None and not self.settled:
            at = self._rel()
            left = [f for f in self.full if f.startswith(at) or at.startswith(f)]
            self.settled = len(left) <= 1

    def report(self) -> dict | None:
        """``bmoe.decision`` of the turn (docs/server.md "Tools"); None before the name position."""
        if self.point is None:
            return None
        chosen = self.chosen
        if chosen is None and not self.drew_text:
            hits = [i for i, f in enumerate(self.full) if self._rel().startswith(f)]
            chosen = hits[0] if hits else None
        by = DECIDED if self.chosen is not None or self.drew_text else GREEDY if self.temperature <= 0 else SAMPLED
        out: dict = {
            "kind": "tool",
            "choices": list(self.names),
            "text_outside": self.text_outside,
            "chosen": chosen,
            "answered_by": by,
            "decoded": self.decoded,
        }
        if self.scores:
            out |= self.scores
        if self.why_not:
            out["why_not"] = self.why_not
        return out


def name_pick(
    chat: ChatRenderer,
    req: GenerateRequest,
    special: dict[str, int],
    temperature: float,
    top_p: float,
    seed: int | None,
    block: Block | None = None,
) -> NamePick | None:
    """The name decision of a turn with tools (None: no tools, "none", a named tool, one tool
    under "required": nothing to choose); ``block``: the reasoning block the answer may start
    with, if any."""
    choice = req.tool_choice or ToolChoice("auto" if req.tools else "none")
    d = tool_decision(chat.tool_format, req.tools, choice)
    if d is None or (not d.text_outside and len(d.choices) < 2):
        return None
    full = tuple((d.forced + c).encode() for c in d.choices)
    pick = NamePick(
        names=d.names,
        full=full,
        text_outside=d.text_outside,
        score=temperature > 0 or req.top_logprobs is not None,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        special=special,
        block=block or Block(),
    )
    if pick.score and (req.logit_bias or req.presence_penalty or req.frequency_penalty):
        pick.off("logit_bias or a penalty changes the tokens' scores")
    return pick
