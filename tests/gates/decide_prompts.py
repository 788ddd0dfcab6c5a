"""The agent prompts and session modes the decide gates (G18a-g) share."""
from bmoe.stream import lookup
from bmoe.testing import HF_ARCHS

# The hand-written fixtures, then every converted tiny model of a real architecture.
ARCHS = ["qwen3moe", "qwen35moe", *sorted(HF_ARCHS)]
MODES = {
    "resident": {},
    "stream-nocache": {"moe_stream": True, "cache_mb": 0},
    "stream-evicting": {"moe_stream": True, "cache_mb": 1, "cache_force": True},
}
# Streamed with read-ahead (--prefetch, prefill ubatches included), with the cache off and with an
# evicting cache that the read-ahead fills: where the architecture allows it.
PREFETCH_MODE = {"stream-prefetch": {"moe_stream": True, "cache_mb": 0, "prefetch": True},
                 "stream-evicting-prefetch": {"moe_stream": True, "cache_mb": 1, "cache_force": True, "prefetch": True}}


def modes_of(arch: str) -> dict[str, dict]:
    """MODES, plus read-ahead where ``arch``'s routing can be guessed (docs/streaming.md)."""
    return MODES | PREFETCH_MODE if lookup(arch).can_prefetch else MODES
P1 = "You control a phone. Task: turn on Wi-Fi. History:"
P2 = P1 + " opened Settings, opened Network."
S1 = " none. Screen: Home. Options: A) Open Settings B) Open Camera C) Call Mom. Answer with the letter."
S2 = " none. Screen: Settings. Options: A) Network B) Display C) Battery. Answer with the letter."
S3 = " Screen: Network. Options: A) Bluetooth B) Internet C) Hotspot. Answer with the letter."
ABC = ("A", "B", "C")
