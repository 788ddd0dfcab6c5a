"""A /v1/completions answer that is one of a finite set, answered without decoding it (#36 item 2).

``guided_choice``, ``structured_outputs.choice`` and a schema or grammar that allows only a few
texts (constrain/choices.py) over a raw prompt, as server/choice_answer.py answers them after a
conversation:
- the decision is the prompt scorer's: each text's tokens scored after the prompt's
  (``Session.score``, echo), the prompt prefilled once and each text's tail after it; a text's
  log-prob is the sum of its tokens' (docs/decide.md "full" scoring);
- at temperature 0 the text is constrained greedy's: the decision's own scores where they show it
  (``greedy_agrees``), else greedy over the raw prompt, stopped where one text is left
  (``Session.walk_choices(tokens=...)``); the decision runs at temperature 0 only when
  ``logprobs`` asks for the answer's log-probs;
- at a temperature over 0 the text is drawn from softmax(log-prob / temperature) within top_p.
Anything else (stop strings, logit_bias, penalties, alternatives per token, --no-decide, a
max_tokens that could cut an answer) is generated as any constrained completion.
"""

from __future__ import annotations

import math
from typing import Any

from bmoe.constrain import greedy_agrees
from bmoe.server.choice_answer import DECIDED, GREEDY, sample_choice
from bmoe.server.completion_text import Generation, LegacyLogprobs, PromptAnswer, texts_of, token_str
from bmoe.server.job_queue import Cancelled, Job
from bmoe.session import GenerateRequest, ScoreRequest, ScoreResult, Session


def why_not_a_choice(session: Session, g: Generation) -> str | None:
    """Why this request's answers cannot be a decision (None: they can, as far as its fields go)."""
    if session.decider is None:
        return "decide is off (--no-decide)"
    if g.logit_bias or g.presence_penalty or g.frequency_penalty:
        return "logit_bias or a penalty changes the tokens' scores"
    if g.stops:
        return "stop strings could cut the answer"
    if g.top_n:
        return "logprobs asks for alternatives per position"
    if g.echo and g.top_n is not None:
        return "the prompt's log-probs are the generation path's"
    return None


def _scores(
    session: Session, job: Job, tokens: list[int], texts: tuple[str, ...]
) -> tuple[list[list[int]], list[list[float]], list[ScoreResult]] | None:
    """Each text's tokens and their log-probs after the prompt (None: a text tokenizes to
    nothing or does not fit the context)."""
    toks = [session.model.tokenize(t, add_special=False, parse_special=False) for t in texts]
    if any(not t or len(tokens) + len(t) > session.n_ctx for t in toks):
        return None
    per_token: list[list[float]] = []
    results: list[ScoreResult] = []
    for t in toks:
        if job.cancelled.is_set():
            raise Cancelled("the client closed the request")
        r = session.score(ScoreRequest(tokens=tuple(tokens + t), echo=True, top_n=0, n_predict=0))
        per_token.append([float(x) for x in r.token_logprobs[len(tokens) :]])
        results.append(r)
    return toks, per_token, results


def choice_answer(
    session: Session, job: Job, g: Generation, index: int, tokens: list[int], n_predict: int, texts: tuple[str, ...]
) -> PromptAnswer | None:
    """The answer among ``texts`` (None: it is to be generated)."""
    if n_predict < max(len(t.encode()) for t in texts):
        return None  # max_tokens could cut the answer: "length" is generation's
    temperature = session.config.temperature if g.temperature is None else g.temperature
    decision: dict[str, Any] = {"choices": list(texts)}
    scored = _scores(session, job, tokens, texts) if temperature > 0 or g.top_n is not None else None
    if scored is None and temperature > 0:
        return None
    telemetry: dict[str, Any] = {}
    chosen: int | None = None
    if scored is not None:
        toks, per_token, results = scored
        sums = [sum(p) for p in per_token]
        firsts = {t[0]: p[0] for t, p in zip(toks, per_token)}  # texts may share a first token
        decision |= {
            "choice_logp": sums,
            "p_outside": max(0.0, 1.0 - sum(math.exp(v) for v in firsts.values())),
            "abstained": False,
        }
        telemetry = {
            "n_reused": results[0].n_reused,
            "n_prefilled": sum(r.n_prefilled for r in results),
            "prefill_s": sum(r.prefill_s for r in results),
            "prefill_fallback": results[0].prefill_fallback,
        }
        if temperature > 0:
            top_p = session.config.top_p if g.top_p is None else g.top_p
            chosen = sample_choice(tuple(sums), temperature, top_p, g.seed, session.config.seed)
        else:
            chosen = next(
                (
                    i
                    for i, t in enumerate(toks)
                    if greedy_agrees(texts, i, [session.model.token_bytes(x) for x in t], per_token[i])
                ),
                None,
            )
        if chosen is not None:
            decision |= {"answered_by": DECIDED, "chosen": chosen}
    if chosen is None:  # temperature 0, not shown by the scores: greedy's walk
        req = GenerateRequest(
            prompt="",
            n_predict=n_predict,
            clear_kv=False,
            temperature=0.0,
            json_schema=g.json_schema,
            grammar=g.grammar,
        )
        walk = session.walk_choices(req, texts, tokens=tokens)
        chosen = texts.index(walk.text)
        decision |= {"answered_by": GREEDY, "chosen": chosen, "decoded": len(walk.tokens) - 1}
        telemetry = {
            "n_reused": telemetry.get("n_reused", walk.n_reused),
            "n_prefilled": telemetry.get("n_prefilled", 0) + walk.n_prompt,
            "prefill_s": telemetry.get("prefill_s", 0.0) + walk.prefill_s,
            "prefill_fallback": walk.prefill_fallback,
            "decode_s": walk.decode_s,
        }
    prompt_text = texts_of(session, tokens)[0]  # offsets count from the prompt's start, echoed or not
    text = texts[chosen]
    out = session.model.tokenize(text, add_special=False, parse_special=False)
    lps = None
    if g.top_n is not None and scored is not None:
        lps = LegacyLogprobs()
        _, offsets = texts_of(session, out)
        for t, lp, o in zip(out, scored[1][chosen], offsets):
            lps.add(token_str(session, t), lp, {}, len(prompt_text) + o)
    return PromptAnswer(
        index=index,
        text=(prompt_text if g.echo else "") + text,
        logprobs=lps,
        finish_reason="stop",
        n_prompt=len(tokens),
        n_generated=len(out),
        n_reused=telemetry["n_reused"],
        telemetry={**telemetry, "decision": decision},
    )
