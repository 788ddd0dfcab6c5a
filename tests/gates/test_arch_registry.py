"""The streaming registry lists exactly the architectures whose gates run in this suite."""
from bmoe.stream.archs import list_archs
from bmoe.testing import ARCHS, HF_ARCHS
from decide_prompts import ARCHS as DECIDE_ARCHS
from test_g1_g4_streaming import VARIANTS


def test_every_listed_arch_has_a_tiny_model_and_runs_the_gates() -> None:
    listed = {e.arch for e in list_archs()}
    tiny = set(ARCHS) | set(HF_ARCHS)
    assert listed == tiny, f"listed without a tiny model: {listed - tiny}; tiny but unlisted: {tiny - listed}"
    assert {a for a, _ in VARIANTS} == listed  # G1-G4 and prefetch
    assert set(DECIDE_ARCHS) == listed  # G18, G19


def test_an_arch_refusing_prefetch_says_why() -> None:
    for e in list_archs():
        assert e.can_prefetch != bool(e.no_prefetch), e.arch
