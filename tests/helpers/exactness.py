"""What a test may assert when two computations are NOT run by llama.cpp in the same pieces.

docs/testing.md, "What a bit-exact test may compare": bit for bit only when both sides run the same
tokens at the same positions over the same KV, cut into the same ubatches, with the same kernels.
When the pieces differ (a continued chat turn against the conversation prefilled whole, a prefix
prefilled as kept part + new part against one piece), llama.cpp rounds differently, and how much
depends on the CPU's kernels (AVX2 and AVX-512 builds differ). What is promised then is the same
greedy choices up to the first near-tie, and log-probs within a stated tolerance:
``assert_same_up_to_near_tie``.

Importable from every test folder: pytest puts tests/ on sys.path when it loads tests/conftest.py
(the default prepend import mode).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bmoe.numerics import log_softmax


def assert_same_up_to_near_tie(
    a_tokens: Sequence[int],
    a_logits: Sequence[np.ndarray],
    b_tokens: Sequence[int],
    b_logits: Sequence[np.ndarray],
    *,
    tol: float,
) -> int:
    """Two greedy generations of the same request, computed in different pieces, agree as promised.

    ``*_logits`` are the kept rows (``keep_logits=True``): row i is the one token i was chosen from;
    a run that stopped on an end-of-generation token has one row more than tokens. At every step
    both runs have a row for, up to and including the first step where they choose differently:

    * each side's choice is the argmax of its own row (greedy: this is what was generated);
    * where the choices differ, it is a near-tie: each side rates the other's choice within
      ``2 * tol`` nats of its own;
    * the log-prob of each of the two choices agrees between the two rows within ``tol`` nats
      (which implies the line above; that one is checked first, so the message says what happened).

    After the first different choice the two runs continue different texts: nothing more is compared.
    Returns the number of steps compared (at least 1).
    """
    assert tol > 0
    n = min(len(a_logits), len(b_logits))
    assert n > 0, "no logit rows kept: generate with keep_logits=True"
    for tokens, logits in ((a_tokens, a_logits), (b_tokens, b_logits)):
        assert len(tokens) <= len(logits) <= len(tokens) + 1
        assert all(int(np.argmax(logits[i])) == int(t) for i, t in enumerate(tokens)), "not a greedy run"
    for i in range(n):
        ta, tb = int(np.argmax(a_logits[i])), int(np.argmax(b_logits[i]))
        la, lb = log_softmax(a_logits[i]), log_softmax(b_logits[i])
        if ta != tb:
            assert la[ta] - la[tb] <= 2 * tol and lb[tb] - lb[ta] <= 2 * tol, (
                f"step {i}: the choices differ ({ta} vs {tb}) without a near-tie: margins "
                f"{la[ta] - la[tb]:.4f} and {lb[tb] - lb[ta]:.4f} nats (near-tie: <= {2 * tol})"
            )
        for t in {ta, tb}:
            assert abs(la[t] - lb[t]) <= tol, (
                f"step {i}: log-prob of token {t} is {la[t]:.4f} on one side and {lb[t]:.4f} on the other "
                f"(tolerance {tol} nats)"
            )
        if ta != tb:
            return i + 1
    return n
