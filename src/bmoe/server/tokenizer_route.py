"""The tokenizer routes: /tokenize, /detokenize and /tokenizer_info (vLLM's shapes).

lm-evaluation-harness's ``tokenizer_backend="remote"`` (which ``local-completions`` picks by
itself when /tokenizer_info and /tokenize answer) tokenizes through them, so it counts context
tokens with the model's own tokenizer and never downloads one. They run on the worker like every
request that touches the model.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from bmoe.server.errors import ApiError
from bmoe.server.job_queue import Job, JobQueue
from bmoe.server.run_job import run_job
from bmoe.server.schemas import DetokenizeBody, TokenizeBody
from bmoe.session import Session


def _special_text(session: Session, tok: int) -> str | None:
    return None if tok < 0 else session.model.token_bytes(tok, special=True).decode("utf-8", "replace")


def tokenizer_info(session: Session) -> dict[str, Any]:
    m = session.model
    return {
        "tokenizer_class": "llama.cpp (GGUF vocabulary)",
        "eos_token": _special_text(session, m.eos),
        "eos_token_id": m.eos if m.eos >= 0 else None,
        "bos_token": _special_text(session, m.bos),
        "bos_token_id": m.bos if m.bos >= 0 else None,
        "pad_token": None,
        "add_bos_token": m.add_bos,
        "vocab_size": m.n_vocab,
        "model_max_length": session.n_ctx,
        "chat_template": m.chat_template(),
    }


def tokenizer_router(queue: JobQueue) -> APIRouter:
    r = APIRouter()

    @r.post("/tokenize", summary="Text to the model's token ids (special tokens in the text parsed)")
    async def tokenize(body: TokenizeBody, request: Request) -> dict[str, Any]:
        def fn(session: Session, job: Job) -> dict[str, Any]:
            toks = session.model.tokenize(body.prompt, add_special=body.add_special_tokens, parse_special=True)
            return {"tokens": toks, "count": len(toks), "max_model_len": session.n_ctx}

        return await run_job(queue, request, fn)

    @r.post("/detokenize", summary="Token ids to text (special tokens written out)")
    async def detokenize(body: DetokenizeBody, request: Request) -> dict[str, Any]:
        def fn(session: Session, job: Job) -> dict[str, Any]:
            n_vocab = session.model.n_vocab
            bad = next((i for i, t in enumerate(body.tokens) if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise ApiError(
                    400,
                    f"tokens.{bad}: {body.tokens[bad]} is not a token id of this model (0..{n_vocab - 1})",
                    f"tokens.{bad}",
                    "invalid_token",
                )
            return {"prompt": session.model.detokenize(body.tokens, special=True)}

        return await run_job(queue, request, fn)

    @r.get("/tokenizer_info", summary="The tokenizer's special tokens, vocabulary size and chat template")
    async def info(request: Request) -> dict[str, Any]:
        return await run_job(queue, request, lambda session, job: tokenizer_info(session))

    return r
