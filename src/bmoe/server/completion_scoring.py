"""/v1/completions' scoring path: ``max_tokens`` 0 or 1, no stop strings, no constraint.

What lm-evaluation-harness's ``local-completions`` model sends for log-likelihood tasks: token-id
(or text) prompts with ``echo``, ``logprobs`` and ``max_tokens`` 1; it reads
``choices[i].logprobs.token_logprobs`` and ``top_logprobs`` past the context. Each prompt is
scored by the session's prompt scorer (``Session.score``), which reuses what the one before it (in
this request or the previous one) left in the KV: only the tail past the common prefix is
prefilled (``bmoe.n_reused``). The one token it may pick is picked from the same row.
"""

from __future__ import annotations

import math

from bmoe.server.completion_text import LegacyLogprobs, PromptAnswer, lp_or_none, texts_of, token_str
from bmoe.session import ScoreRequest, ScoreResult, Session


def score_request(tokens: list[int], n_predict: int, echo: bool, top_n: int | None, sampling: dict) -> ScoreRequest:
    """The scorer's request for one prompt; ``sampling``: temperature, top_p, seed, logit_bias."""
    return ScoreRequest(tokens=tuple(tokens), echo=echo, top_n=top_n or 0, n_predict=n_predict, **sampling)


def scored_answer(session: Session, index: int, r: ScoreResult, echo: bool, top_n: int | None) -> PromptAnswer:
    """One answer: the text (with the prompt when echoed), and logprobs per position (from
    position 0 with echo, else only the picked token's)."""
    prompt_text, offsets = texts_of(session, r.tokens[: r.n_prompt])
    gen = [] if r.eog else list(r.generated)  # an end-of-generation token adds no text
    gen_text, gen_offsets = texts_of(session, gen)
    text = (prompt_text if echo else "") + gen_text
    offsets = (
        offsets + [len(prompt_text) + o for o in gen_offsets] + ([len(prompt_text) + len(gen_text)] if r.eog else [])
    )
    logprobs = None
    if top_n is not None:
        logprobs = LegacyLogprobs()
        for j in range(0 if echo else r.n_prompt, len(r.tokens)):
            lp = r.token_logprobs[j]
            top = (
                None
                if math.isnan(lp)
                else {token_str(session, int(t)): float(v) for t, v in zip(r.top_ids[j], r.top_logprobs[j])}
            )
            logprobs.add(token_str(session, r.tokens[j]), lp_or_none(lp), top, offsets[j])
    return PromptAnswer(
        index=index,
        text=text,
        logprobs=logprobs,
        finish_reason="stop" if r.eog else "length",
        n_prompt=r.n_prompt,
        n_generated=len(r.generated),
        n_reused=r.n_reused,
        telemetry={
            "n_reused": r.n_reused,
            "n_prefilled": r.n_prefilled,
            "prefill_s": r.prefill_s,
            "prefill_fallback": r.prefill_fallback,
        },
        read_bytes=r.io.read_bytes,
    )
