"""Which architectures each gate runs on, and the agent prompts and session modes the decide gates
(G18a-g) share."""

from bmoe.decide.types import DecideRequest
from bmoe.stream import lookup
from bmoe.testing import HF_ARCHS

# Every listed architecture: the hand-written fixtures, then every converted tiny model of a real
# one. Each runs the core gates (G1, G2, G18a).
ARCHS = ["qwen3moe", "qwen35moe", *sorted(HF_ARCHS)]
# One architecture of each attention/state family (bmoe.testing.FAMILIES; the hand-written ones
# stand for theirs) runs the whole gate set (docs/testing.md "Which architectures run which gates").
FULL_GATES = {
    "attention": "qwen3moe",
    "deltanet": "qwen35moe",
    "mla": "deepseek2",
    "sliding-window": "gpt-oss",
    "chunked": "llama4",
    "mamba": "jamba",
    "mamba2": "granitehybrid",
    "kda": "bailingmoe3",
    "msa": "minimax-m3",
    "dsa": "glm-dsa",
    "kda-dsa": "glm5-next",
    "csa": "deepseek4",
    "lightning": "minimax-01",
    "short-conv": "lfm2moe",
}
HAND_WRITTEN_FAMILIES = {"qwen3moe": "attention", "qwen35moe": "deltanet"}
FULL_ARCHS = [a for a in ARCHS if a in FULL_GATES.values()]


def family_of(arch: str) -> str:
    return HAND_WRITTEN_FAMILIES[arch] if arch in HAND_WRITTEN_FAMILIES else HF_ARCHS[arch].family


MODES = {
    "resident": {},
    "stream-nocache": {"moe_stream": True, "cache_mb": 0},
    "stream-evicting": {"moe_stream": True, "cache_mb": 1, "cache_force": True},
}
# Streamed with read-ahead (--prefetch, prefill ubatches included), with the cache off and with an
# evicting cache that the read-ahead fills: where the architecture allows it.
PREFETCH_MODE = {
    "stream-prefetch": {"moe_stream": True, "cache_mb": 0, "prefetch": True},
    "stream-evicting-prefetch": {"moe_stream": True, "cache_mb": 1, "cache_force": True, "prefetch": True},
}


def modes_of(arch: str) -> dict[str, dict]:
    """MODES, plus read-ahead where ``arch``'s routing can be guessed (docs/streaming.md)."""
    return MODES | PREFETCH_MODE if lookup(arch).can_prefetch else MODES


P1 = "You control a phone. Task: turn on Wi-Fi. History:"
P2 = P1 + " opened Settings, opened Network."
S1 = " none. Screen: Home. Options: A) Open Settings B) Open Camera C) Call Mom. Answer with the letter."
S2 = " none. Screen: Settings. Options: A) Network B) Display C) Battery. Answer with the letter."
S3 = " Screen: Network. Options: A) Bluetooth B) Internet C) Hotspot. Answer with the letter."
ABC = ("A", "B", "C")


SUFFIXES = [S1, S2, S3, " Screen: Home.", S2 + " Be quick.", " Options: A) yes B) no C) maybe."]


def requests() -> list[DecideRequest]:
    out = [DecideRequest(id=i, prefix=P1, suffix=s, choices=ABC) for i, s in enumerate(SUFFIXES)]
    out.insert(3, DecideRequest(id=90, prefix=P2, suffix=S3, choices=ABC))  # another prefix, alone
    out.insert(5, DecideRequest(id=91, prefix=P1, suffix=S1, choices=("A", "A")))  # refused: collide
    out.append(DecideRequest(id=92, prefix=P1, suffix=S2, choices=ABC, reuse_prefix=False))  # opted out
    return out


def answers(results):
    """What a decision answers. (How it got its prefix, ``reuse``/``n_reused``, may differ: a batch
    runs its prefix groups in the order of their last request, not of their first.) Id 90 is left
    out: its prefix P2 extends P1, so one by one it restores P1's kept state and prefills the rest
    of P2 in a second piece, where the batch, which runs P2's group first, prefills P2 whole;
    pieces that differ are not compared bit for bit (docs/testing.md). ``near`` checks it."""
    return [
        (
            r.id,
            r.error,
            None if r.scores is None else (r.scores.choice_logp, r.scores.p_outside, r.scores.best),
            r.n_tokens,
        )
        for r in results
        if r.id != 90
    ]
