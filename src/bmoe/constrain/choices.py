"""Which answers a constraint allows, when they are a finite set: the texts a decision chooses among.

The texts are not guessed from the schema (``json.dumps`` and its spacing, key order and escapes
are not what the grammar engine writes): they are read off the compiled grammar itself. A matcher
over a byte vocabulary (256 one-byte tokens and an end token) is walked from the start: where the
grammar forces bytes they are taken at once, where it allows several bytes each is followed, and
wherever it allows the end a text is complete. The walk gives up (None) as soon as more than
``limit`` texts could come out, a text grows past ``MAX_TEXT_BYTES``, or the walk grows past
``MAX_NODES`` steps: the answer is then not a choice, and is generated token by token.

So an ``enum``, a ``const``, a ``boolean``, an object whose only free property is one of those,
vLLM's ``guided_choice`` and a GBNF grammar of a few alternatives all come out the same way, and
exactly as constrained generation would write them (docs/decide.md "Decisions behind the
standard fields"). ``guided_choice`` / ``structured_outputs.choice`` become a GBNF grammar here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from llguidance import LLMatcher, LLTokenizer, TokenizerWrapper

from bmoe.constrain.schema import MAX_ENUM, ConstraintError

MAX_TEXT_BYTES = 1024  # a longer answer is generated, not chosen
MAX_NODES = 1 << 15  # matcher steps one walk may take
EOS = 256  # the byte vocabulary's end token


class _Bytes:
    """The byte vocabulary: token i is byte i, 256 the end."""

    eos_token_id = EOS
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"<end>"]
    special_token_ids = [EOS]

    def __call__(self, s: bytes) -> list[int]:
        return list(s)


@lru_cache(maxsize=1)
def _tokenizer() -> LLTokenizer:
    return LLTokenizer(TokenizerWrapper(_Bytes()))


def _allowed(m: LLMatcher) -> np.ndarray:
    bits = np.zeros((EOS + 1 + 31) // 32, dtype=np.int32)
    m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
    return np.nonzero(np.unpackbits(bits.view(np.uint8), bitorder="little")[: EOS + 1])[0]


def finite_texts(grammar: str, limit: int = MAX_ENUM) -> tuple[str, ...] | None:
    """Every text the llguidance ``grammar`` accepts, in byte order, or None when they are more
    than ``limit``, one is longer than MAX_TEXT_BYTES, one is empty or not UTF-8, or the walk
    takes more than MAX_NODES steps."""
    m = LLMatcher(_tokenizer(), grammar, log_level=0)
    if m.is_error():
        return None
    done: list[bytes] = []
    todo: list[tuple[bytes, LLMatcher]] = [(b"", m)]
    steps = 0
    while todo:
        prefix, m = todo.pop()
        steps += 1
        forced = m.compute_ff_bytes()
        if forced:
            if not m.consume_tokens(list(forced)):
                return None
            prefix += forced
        if len(prefix) > MAX_TEXT_BYTES or steps > MAX_NODES:
            return None
        if m.is_stopped():
            done.append(prefix)
            continue
        allowed = _allowed(m)
        if EOS in allowed:
            done.append(prefix)
        nexts = [int(b) for b in allowed if b < EOS]
        if len(done) + len(todo) + len(nexts) > limit:
            return None
        for b in reversed(nexts):  # popped in byte order
            branch = m.deep_copy()
            if not branch.consume_token(b):
                return None
            todo.append((prefix + bytes([b]), branch))
    try:
        texts = tuple(sorted(t.decode("utf-8") for t in done))
    except UnicodeDecodeError:
        return None
    return texts if texts and "" not in texts else None


def _gbnf_literal(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _choice_list(value: object, field: str) -> list[str]:
    if not isinstance(value, list) or not value:
        raise ConstraintError(field, "must be a non-empty list of strings")
    if len(value) > MAX_ENUM:
        raise ConstraintError(field, f"has {len(value)} values, more than the {MAX_ENUM} one request may hold")
    seen: set[str] = set()
    for i, v in enumerate(value):
        if not isinstance(v, str) or not v:
            raise ConstraintError(f"{field}.{i}", f"must be a non-empty string, got {json.dumps(v)[:60]}")
        if len(v.encode()) > MAX_TEXT_BYTES:
            raise ConstraintError(f"{field}.{i}", f"is longer than {MAX_TEXT_BYTES} bytes")
        if v in seen:
            raise ConstraintError(f"{field}.{i}", f"repeats the value {v!r}")
        seen.add(v)
    return value


def choice_grammar(guided_choice: object = None, structured_outputs: object = None) -> tuple[str, str] | None:
    """vLLM's ``guided_choice`` or ``structured_outputs: {"choice": [...]}`` as (field, GBNF
    grammar) whose texts are exactly the choices; None when neither is given."""
    if guided_choice is not None and structured_outputs is not None:
        raise ConstraintError("structured_outputs", "give guided_choice or structured_outputs, not both")
    if guided_choice is not None:
        field, value = "guided_choice", guided_choice
    elif structured_outputs is not None:
        if not isinstance(structured_outputs, dict):
            raise ConstraintError("structured_outputs", "must be an object")
        other = sorted(k for k in structured_outputs if k != "choice")
        if other:
            raise ConstraintError(
                f"structured_outputs.{other[0]}",
                "is not supported here (only 'choice'; use response_format for a schema, grammar for GBNF)",
            )
        if "choice" not in structured_outputs:
            raise ConstraintError("structured_outputs", "must hold 'choice', a list of strings")
        field, value = "structured_outputs.choice", structured_outputs["choice"]
    else:
        return None
    choices = _choice_list(value, field)
    return field, "root ::= " + " | ".join(_gbnf_literal(c) for c in choices)


# The margin over 1/2 a token's probability needs (docs/decide.md): the decision's prefill and
# the generation's decode run the same prompt in different batches, whose logits may differ in
# the last bits; a token over 1/2 + 1e-3 in one is over 1/2 in the other.
GREEDY_MARGIN = 1e-3
_LOGP_HALF = math.log(0.5 + GREEDY_MARGIN)


def greedy_agrees(texts: Sequence[str], best: int, pieces: Sequence[bytes], token_logp: Sequence[float]) -> bool:
    """Whether constrained greedy decoding writes ``texts[best]``, from what the decision scored:
    the bytes of its tokens (``pieces``) and their log-probs, each given the ones before it.

    Greedy takes the most likely token the grammar allows. A token whose probability is over 1/2
    is the most likely of the whole vocabulary, so greedy takes it whatever the grammar allows
    besides. Once the text so far starts no other choice, the grammar forces the rest of this one
    and its end. So greedy writes ``texts[best]`` when every one of its tokens, up to the first
    after which no other choice fits, is over 1/2 (plus GREEDY_MARGIN); False when that is not
    shown (the answer is then generated, not decided)."""
    others = [t.encode() for i, t in enumerate(texts) if i != best]
    at = b""
    for piece, lp in zip(pieces, token_logp, strict=True):
        if lp <= _LOGP_HALF:
            return False
        at += piece
        if not any(o.startswith(at) for o in others):
            return True
    return False  # another choice extends this one: greedy's end token was not scored
