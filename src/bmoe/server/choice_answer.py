"""A constrained chat turn whose answers are a finite set, answered without decoding them (#36 item 2).

When the turn's schema or grammar allows only a few texts (constrain/choices.py):
- at a temperature over 0, one decision over them (one prefill on the kept prefix, the rules of
  /v1/decide) gives their distribution, and the text is drawn from it; nothing is decoded;
- at temperature 0 the text must be constrained greedy's. Where the decision was run (logprobs
  asked) and its own scores show greedy's text (``greedy_agrees``), that is the answer; else
  greedy runs over the turn's own prompt and stops where only one text is left
  (``Session.walk_choices``): a prefill, and a decode only where the texts share tokens.
Anything else (images, stops, logit_bias, top_logprobs, --no-decide, a max_tokens that could cut
an answer) is generated as any constrained turn. docs/decide.md "Decisions behind the standard
fields".
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bmoe.constrain import constraint_of, finite_texts, greedy_agrees
from bmoe.decide.types import ChoiceScores
from bmoe.numerics import draw_choice
from bmoe.server.conversation import ChatTurn, Delta, TurnOutcome, _n_predict, reasoning_of, run_turn
from bmoe.server.errors import ApiError
from bmoe.server.job_queue import STEP, Job
from bmoe.server.logprobs import conversation_decision
from bmoe.session import DecideResult, GenerateRequest, GenerateResult, Message, Session

GREEDY = "greedy_walk"  # bmoe.decision.answered_by: temperature 0
DECIDED = "decision"  # a temperature over 0: drawn from the decision


def _why_not(session: Session, turn: ChatTurn) -> str | None:
    """Why this turn cannot be a decision (None: it can, as far as its fields go)."""
    if session.decider is None:
        return "decide is off (--no-decide)"
    if turn.tools.tools:
        return "the tools are rendered into the prompt (a tool turn's name is runtime/tool_choice.py's decision)"
    if any(m.role == "tool" or m.tool_calls for m in turn.messages):
        return "the conversation holds tool calls (a decision's history is plain messages)"
    if any(m.images for m in turn.messages):
        return "the conversation has images"
    if turn.logit_bias or turn.presence_penalty or turn.frequency_penalty:
        return "logit_bias or a penalty changes the tokens' scores"
    if turn.stops:
        return "stop strings could cut the answer"
    if turn.top_logprobs:
        return "top_logprobs asks for alternatives per token"
    if turn.logprobs_of:
        return "bmoe_logprobs_of is answered on the generation path"
    if turn.template_kwargs:
        return "chat_template_kwargs change the template's render"
    return None


def answer_turn(session: Session, job: Job, turn: ChatTurn) -> TurnOutcome:
    """The turn's outcome: by a decision where it can be one, else generated (``run_turn``)."""
    constraint = constraint_of(turn.json_schema, turn.grammar)
    texts = finite_texts(constraint.grammar) if constraint is not None else None
    if texts is None or _why_not(session, turn) is not None:
        return run_turn(session, job, turn)
    r = reasoning_of(session, turn)  # the reasoning fields' 400s, as a generated turn
    *prior, user = turn.messages
    walk_req = GenerateRequest(
        prompt=user.content,
        think=False,
        reasoning_effort=r.effort,
        template_vars=r.template_vars,
        clear_kv=False,
        temperature=0.0,
        seed=turn.seed,
        json_schema=turn.json_schema,
        grammar=turn.grammar,
    )
    n_predict = _n_predict(session, turn, walk_req)  # the context's 400s, as a generated turn
    if n_predict < max(len(t.encode()) for t in texts):
        return run_turn(session, job, turn)  # max_tokens could cut the answer: "length" is generation's
    if job.cancelled.is_set():
        raise ApiError(499, "the client closed the request", None, "cancelled")
    temperature = session.config.temperature if turn.temperature is None else turn.temperature
    io0 = session.stream_stats()
    decision: dict[str, Any] = {"choices": list(texts)}
    decided = _decide(session, job, turn, texts) if temperature > 0 or turn.top_logprobs is not None else None
    s, sc = decided if decided is not None else (None, None)
    if sc is not None:
        decision |= {
            "choice_logp": list(sc.choice_logp),
            "p_outside": sc.p_outside,
            "abstained": sc.abstained,
        }
    elif temperature > 0:
        return run_turn(session, job, turn)  # a choice the decision refuses is still generated
    tokens = [session.model.tokenize(t, add_special=False, parse_special=False) for t in texts]
    agree = _agreeing(session, texts, tokens, sc) if temperature == 0 else None
    if agree is not None:  # the decision shows greedy's text (greedy_agrees): no walk
        assert s is not None
        chosen = agree
        decision |= {"answered_by": DECIDED, "chosen": chosen}
        session.set_history([*prior, user, Message("assistant", texts[chosen])])
        n_prompt, n_reused, n_past = s.n_tokens - s.n_reused, s.n_reused, s.n_tokens
        prefill_s, decode_s = s.prefill_s + s.score_s, 0.0
    elif temperature == 0:
        if prior != session.history:
            session.set_history(prior)
        walk = session.walk_choices(dataclasses.replace(walk_req, n_predict=n_predict), texts)
        chosen = texts.index(walk.text)
        decision |= {"answered_by": GREEDY, "chosen": chosen, "decoded": len(walk.tokens) - 1}
        n_prompt, n_reused, n_past = walk.n_prompt, walk.n_reused, walk.n_past
        prefill_s, decode_s = walk.prefill_s + (s.prefill_s + s.score_s if s else 0.0), walk.decode_s
    else:
        assert s is not None and sc is not None
        top_p = session.config.top_p if turn.top_p is None else turn.top_p
        chosen = sample_choice(sc.choice_logp, temperature, top_p, turn.seed, session.config.seed)
        decision |= {"answered_by": DECIDED, "chosen": chosen}
        session.set_history([*prior, user, Message("assistant", texts[chosen])])
        n_prompt, n_reused, n_past = s.n_tokens - s.n_reused, s.n_reused, s.n_tokens
        prefill_s, decode_s = s.prefill_s + s.score_s, 0.0
    text = texts[chosen]
    entries: tuple[dict, ...] = ()
    if sc is not None and sc.choice_token_logp is not None:
        pieces = (session.model.token_bytes(t) for t in tokens[chosen])
        entries = tuple(
            {"token": p.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(p), "top_logprobs": []}
            for p, lp in zip(pieces, sc.choice_token_logp[chosen], strict=True)
        )
    job.emit(STEP, Delta(text, "", entries))
    result = GenerateResult(
        id=0,
        text=text,
        reasoning="",
        tokens=tuple(tokens[chosen]),
        cancelled=False,
        stop="eog",
        n_prompt=n_prompt,
        n_reused=n_reused,
        n_past=n_past,
        prefill_fallback="",
        prefill_s=prefill_s,
        decode_s=decode_s,
        load_s=session.load_s,
        io=session.stream_stats().minus(io0),
        majflt=0,
        cpu_s=0.0,
    )
    lps = {"content": list(entries), "refusal": None} if turn.top_logprobs is not None else None
    return TurnOutcome(result, text, "stop", lps, None, decision=decision)


def _agreeing(session: Session, texts: tuple[str, ...], tokens: list[list[int]], sc: ChoiceScores | None) -> int | None:
    """The choice the decision shows constrained greedy writes, if it shows one."""
    if sc is None or sc.choice_token_logp is None:
        return None
    for i, toks in enumerate(tokens):
        pieces = [session.model.token_bytes(t) for t in toks]
        lps = sc.choice_token_logp[i]
        if len(pieces) == len(lps) and greedy_agrees(texts, i, pieces, lps):
            return i
    return None


def _decide(
    session: Session, job: Job, turn: ChatTurn, texts: tuple[str, ...]
) -> tuple[DecideResult, ChoiceScores] | None:
    """The decision over ``texts`` after the conversation (None: refused, e.g. a choice that
    tokenizes to nothing); a cancelled one is a 499."""
    r = session.decide(conversation_decision(turn.messages, texts), cancel=job.cancelled)
    if job.cancelled.is_set():
        raise ApiError(499, "the client closed the request", None, "cancelled")
    return None if r.error is not None or r.scores is None or r.scores.choice_token_logp is None else (r, r.scores)


def sample_choice(logp: tuple[float, ...], temperature: float, top_p: float | None, *seeds: int | None) -> int:
    """``draw_choice`` seeded by the first seed given."""
    return draw_choice(logp, temperature, top_p, next((x for x in seeds if x is not None), None))
