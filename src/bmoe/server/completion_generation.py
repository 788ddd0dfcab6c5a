"""/v1/completions' generation path: a raw prompt continued token by token (no chat template).

The prompt's tokens go into the model as they are (``Session.generate_iter(tokens=...)``): the
same KV reuse, sampler, constraint mask and jump-forward as a chat turn, and the session's chat
history untouched. Stop strings are watched on the streamed text (server/stops.py), log-probs are
given in the legacy shape, position by position, and with ``echo`` the prompt comes first (its
log-probs from the prompt scorer). A constrained answer that is one of a finite set is a
decision over the raw prompt instead (completion_choice.py). Each prompt of a list is answered in
turn; ``emit`` gets its pieces as they are released (what a streamed chunk carries).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from bmoe.constrain import constraint_of, finite_texts
from bmoe.server.completion_choice import choice_answer, why_not_a_choice
from bmoe.server.completion_text import Generation, LegacyLogprobs, Piece, PromptAnswer, texts_of, token_str
from bmoe.server.errors import ApiError
from bmoe.server.job_queue import Cancelled, Job
from bmoe.server.stops import StopMatcher
from bmoe.session import GenerateResult, ScoreRequest, Session, Step

DEFAULT_MAX_TOKENS = 16  # OpenAI's, when max_tokens is left out (capped to the context's room)
Emit = Callable[[Piece], None]


def n_predict_for(session: Session, g: Generation, n_prompt: int, param: str) -> int:
    """Tokens to generate after a prompt of ``n_prompt`` tokens, or a 400 when they do not fit."""
    room = session.n_ctx - n_prompt
    if g.max_tokens is not None and g.max_tokens > room:
        raise ApiError(
            400,
            f"{param}: {n_prompt} tokens, plus max_tokens ({g.max_tokens}), do not fit the context "
            f"(n_ctx {session.n_ctx})",
            param,
            "context_length_exceeded",
        )
    if room < 1:
        raise ApiError(
            400,
            f"{param}: {n_prompt} tokens leave no room to generate in the context (n_ctx {session.n_ctx})",
            param,
            "context_length_exceeded",
        )
    return g.max_tokens if g.max_tokens is not None else min(DEFAULT_MAX_TOKENS, room)


def _cancelled(job: Job) -> None:
    if job.cancelled.is_set():
        raise Cancelled("the client closed the request")


def answer_prompt(
    session: Session, job: Job, g: Generation, index: int, tokens: list[int], n_predict: int, emit: Emit
) -> PromptAnswer:
    """Prompt ``index``'s answer: by a decision where it is one of a finite set, else generated."""
    _cancelled(job)
    constraint = constraint_of(g.json_schema, g.grammar)
    texts = finite_texts(constraint.grammar) if constraint is not None else None
    if texts is not None and why_not_a_choice(session, g) is None:
        answer = choice_answer(session, job, g, index, tokens, n_predict, texts)
        if answer is not None:
            emit(Piece(index, answer.text, answer.logprobs, answer.finish_reason, answer.telemetry))
            return answer
    answer = _generate(session, job, g, index, tokens, n_predict, emit)
    emit(Piece(index, "", None, answer.finish_reason, answer.telemetry))
    return answer


def _step_entry(session: Session, step: Step) -> tuple[str, float | None, dict[str, float] | None]:
    lp = step.logprobs
    if lp is None:  # a token the constraint forced (jump-forward): no log-prob of its own
        return token_str(session, step.token), None, None
    top = {token_str(session, t): v for t, v in zip(lp.top_ids, lp.top_logprobs)}
    return token_str(session, step.token), lp.logprob, top


def _generate(
    session: Session, job: Job, g: Generation, index: int, tokens: list[int], n_predict: int, emit: Emit
) -> PromptAnswer:
    n_reused, n_prefilled, prefill_s = None, 0, 0.0
    lps = LegacyLogprobs() if g.top_n is not None else None
    prompt_text, offsets = texts_of(session, tokens)
    base = len(prompt_text)  # offsets count from the prompt's start, echoed or not (OpenAI's)
    if not g.echo:
        prompt_text = ""
    else:
        if lps is not None:  # the prompt's positions, scored (the generation then reuses its KV)
            sr = session.score(ScoreRequest(tokens=tuple(tokens), echo=True, top_n=g.top_n or 0, n_predict=0))
            n_reused, n_prefilled, prefill_s = sr.n_reused, sr.n_prefilled, sr.prefill_s
            for j, t in enumerate(tokens):
                lp = float(sr.token_logprobs[j])
                top = (
                    None
                    if j == 0
                    else {token_str(session, int(i)): float(v) for i, v in zip(sr.top_ids[j], sr.top_logprobs[j])}
                )
                lps.add(token_str(session, t), None if j == 0 else lp, top, offsets[j])
        emit(Piece(index, prompt_text, lps.cut(0) if lps is not None else None))
    given = len(lps) if lps is not None else 0  # positions handed to ``emit`` so far
    cancel = threading.Event()  # this prompt's own: set before it starts, it still takes effect
    it = session.generate_iter(g.request(n_predict), cancel=cancel, tokens=tokens)
    stops = StopMatcher(g.stops)
    n_chars, released = 0, 0  # characters of the answer decoded, and released past the stop matcher
    text = prompt_text

    def release(out: str, final: bool) -> None:
        nonlocal released, given, text
        released += len(out)
        text += out
        cut = None
        if lps is not None:  # the positions whose text has started (all of them at a natural end)
            end = len(lps) if final and not stops.hit else given
            while end < len(lps) and lps.text_offset[end] < base + released:
                end += 1
            cut, given = lps.cut(given, end), end
        if out or (cut is not None and len(cut)):
            emit(Piece(index, out, cut))

    while True:
        if job.cancelled.is_set():
            cancel.set()  # before the first token too: the generation then stops before its prefill
        try:
            step = next(it)
        except StopIteration as done:
            result: GenerateResult = done.value
            break
        if lps is not None and step.token >= 0:
            lps.add(*_step_entry(session, step), base + n_chars)
        n_chars += len(step.delta_text)
        out = stops.push(step.delta_text)
        if stops.hit:
            session.cancel()
        release(out, False)
    release(stops.finish(), True)
    if result.cancelled and not stops.hit:
        raise Cancelled("the client closed the request")
    if lps is not None:
        lps = lps.cut(0, given)
    finish = "stop" if stops.hit or result.stop == "eog" else "length"
    return PromptAnswer(
        index=index,
        text=text,
        logprobs=lps,
        finish_reason=finish,
        n_prompt=len(tokens),
        n_generated=len(result.tokens),
        n_reused=result.n_reused if n_reused is None else n_reused,
        telemetry={
            "n_reused": result.n_reused if n_reused is None else n_reused,
            "n_prefilled": n_prefilled + result.n_prompt,
            "prefill_s": prefill_s + result.prefill_s,
            "prefill_fallback": result.prefill_fallback,
            "decode_s": result.decode_s,
            "n_generated": len(result.tokens),
        },
        read_bytes=result.io.read_bytes,
    )
