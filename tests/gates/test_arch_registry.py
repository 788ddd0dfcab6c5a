"""The streaming registry lists exactly the architectures whose gates run in this suite."""

from bmoe.stream.archs import list_archs
from bmoe.testing import FAMILIES, RECIPES, names
from helpers.decide_prompts import ARCHS as DECIDE_ARCHS
from helpers.decide_prompts import FULL_ARCHS, FULL_GATES, family_of
from helpers.gates import VARIANTS


def test_every_listed_arch_has_a_tiny_model_and_runs_the_gates() -> None:
    listed = {e.arch for e in list_archs()}
    # The text gates' recipes: one per listed architecture, named after it.
    gated = names("hand-written", "converted")
    assert all(RECIPES[n].arch == n for n in gated), [n for n in gated if RECIPES[n].arch != n]
    tiny = set(gated)
    assert listed == tiny, f"listed without a tiny model: {listed - tiny}; tiny but unlisted: {tiny - listed}"
    # The image and K-quant recipes stand for listed architectures, whose own recipes run the text gates.
    others = {RECIPES[n].arch for n in names("vision-language", "k-quant")}
    assert others <= listed, f"recipes of unlisted architectures: {others - listed}"
    assert {a for a, _ in VARIANTS} == listed  # G1, G2 (the core gates with G18a)
    assert set(DECIDE_ARCHS) == listed  # G18a


def test_each_family_runs_the_whole_gate_set_on_one_of_its_archs() -> None:
    families = {family_of(a) for a in DECIDE_ARCHS}
    assert families == {RECIPES[a].family for a in DECIDE_ARCHS}  # the recipe table says each arch's family
    assert families <= set(FAMILIES), f"families no one describes: {families - set(FAMILIES)}"
    assert set(FULL_GATES) == families, f"families without a whole-gate arch: {families - set(FULL_GATES)}"
    for family, arch in FULL_GATES.items():
        assert arch in DECIDE_ARCHS and family_of(arch) == family, (family, arch)
    assert len(FULL_ARCHS) == len(FULL_GATES)


def test_an_arch_refusing_prefetch_says_why() -> None:
    for e in list_archs():
        assert e.can_prefetch != bool(e.why_no_prefetch), e.arch
