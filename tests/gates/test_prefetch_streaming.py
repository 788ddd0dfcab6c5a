"""Speculative prefetch (--prefetch): streamed output stays byte-identical to resident output, and
the bytes read are exactly the routed slices plus the wrong guesses.

Same comparison as G1 (64 greedy tokens and a perplexity run, logits bit for bit) on the tiny
qwen3moe and hybrid qwen35moe in F32, Q8_0 and Q4_K_M, with the cache off and --prefetch. Prefill
ubatches read ahead too: the prompt (narrower than the wide cut) guesses the union of its tokens'
guesses, the perplexity window (32 tokens, wider than the cut) every expert, each layer both
early (at the previous layer's route: two layers deep) and at the previous layer's output.
"""

import numpy as np
import pytest

from bmoe.errors import ConfigError
from bmoe.runtime.expert_streaming import StreamSetupError
from bmoe.stream import lookup
from helpers.decide_prompts import FULL_ARCHS
from helpers.gates import VARIANTS, assert_same, expert_bytes, opener, record_routes, run

# --prefetch runs where the registry allows it (here on the architectures that run the whole gate
# set; on the others G18a runs it); the others must refuse it, naming the reason.
PREFETCH = [v for v in VARIANTS if lookup(v[0]).can_prefetch and v[0] in FULL_ARCHS]
REFUSED = sorted({a for a, _ in VARIANTS if not lookup(a).can_prefetch})
assert REFUSED, "no gated architecture refuses --prefetch: the refusal test below would run on none"


@pytest.fixture(params=PREFETCH, ids=lambda v: f"{v[0]}-{v[1]}")
def variant(request, tiny_models, open_session, tmp_path):
    return opener(request.param, tiny_models, open_session, tmp_path)


def record_guesses(s, routes: list) -> list[tuple[int, tuple[int, ...], int]]:
    """Each guess as (layer, experts, how many routes had been recorded when it was made)."""
    streamer = s.streaming.streamer
    guesses: list[tuple[int, tuple[int, ...], int]] = []
    inner = streamer.prefetch

    def prefetch(il: int, ids: np.ndarray, **kw) -> None:
        guesses.append((il, tuple(np.unique(ids).tolist()), len(routes)))
        inner(il, ids, **kw)

    streamer.prefetch = prefetch
    return guesses


def test_prefetch_equals_resident_and_bytes_are_routed_plus_wrong_guesses(variant) -> None:
    open_, resident = variant
    s = open_(moe_stream=True, cache_mb=0, prefetch=True)
    routes = record_routes(s)
    guesses = record_guesses(s, routes)
    streamed = run(s)
    assert_same(resident, streamed)
    hook, st = s.streaming.hook, s.stream_stats()
    layers = s.streaming.layout.layers
    # Every decode token guesses every streamed layer but the first; prefill ubatches guess too.
    n_decode = len(streamed[0].tokens) - 1
    assert hook.n_prefetches == len(guesses) >= n_decode * (len(layers) - 1) + hook.n_wide_prefetches
    if len(layers) > 2:  # a prefill ubatch guesses every streamed layer but the first and the last
        assert hook.n_wide_prefetches > 0 and hook.guess.wide <= 32
        assert any(len(g) == s.streaming.layout.n_expert for _, g, _ in guesses)  # a wide ubatch read all
    # Read-ahead two layers deep: the graphs showed the arch's inp_node on every streamed layer but
    # the last, and a prefill ubatch guessed each layer but the first and the last early too.
    assert s.streaming.streamer.two_deep and hook.inp_found == set(layers[:-1])
    assert hook.n_early_prefetches <= hook.n_wide_prefetches
    if len(layers) > 2:
        assert hook.n_early_prefetches > 0
    # A layer's guesses (early, then at l_out) add up to one read-ahead, taken over by the next
    # route, which is of the guessed layer; the later guess reads only what the earlier left out.
    merged: dict[tuple[int, int], set[int]] = {}
    for il, guess, at in guesses:
        merged.setdefault((at, il), set()).update(guess)
    assert st.guessed == sum(len(g) for g in merged.values())
    per_expert = expert_bytes(s)
    hits = wasted = 0
    for (at, il), guess in merged.items():
        assert routes[at][0] == il
        routed = set(routes[at][1])
        hits += len(routed & guess)
        wasted += per_expert[il] * len(guess - routed)
    assert st.guess_hits == hits and st.wasted_bytes == wasted
    assert st.read_bytes == sum(per_expert[il] * len(ex) for il, ex in routes) + st.wasted_bytes
    assert st.routed == sum(len(ex) for _, ex in routes) and st.hits == 0
    # The guess is good but not perfect on these models: both paths (taken over, read anew) ran.
    assert 0 < st.guess_hits < st.guessed


def test_prefetch_with_an_evicting_cache_equals_resident_and_fills_the_cache(variant) -> None:
    """Read-ahead with the cache on: guessed experts the cache lacks are read into it (and kept),
    a route reads only what is neither cached nor guessed, and nothing a matmul reads is moved or
    evicted under it: output bit for bit the resident one, every byte accounted."""
    open_, resident = variant
    s = open_(moe_stream=True, cache_mb=1, cache_force=True, prefetch=True)
    routes = record_routes(s)
    guesses = record_guesses(s, routes)
    streamed = run(s)
    assert_same(resident, streamed)
    st = s.stream_stats()
    assert st.evictions > 0 and 0 < st.guessed <= sum(len(g) for _, g, _ in guesses)
    if len(s.streaming.layout.layers) > 2:  # early guesses made room while a route was still to compute
        assert s.streaming.hook.n_early_prefetches > 0
    assert st.hits + st.misses == st.routed == sum(len(ex) for _, ex in routes)
    per_expert = expert_bytes(s)
    assert st.wasted_bytes <= (st.guessed - st.guess_hits) * max(per_expert.values())
    routed_read = st.read_bytes - st.wasted_bytes  # the misses' bytes, each read once
    assert min(per_expert.values()) * st.misses <= routed_read <= max(per_expert.values()) * st.misses
    if len(set(per_expert.values())) == 1:
        (per,) = set(per_expert.values())
        assert st.wasted_bytes == per * (st.guessed - st.guess_hits) and routed_read == per * st.misses
    largest = max(per_expert[il] * s.streaming.layout.n_expert for il in per_expert)
    assert st.budget_bytes == 1 << 20 and st.resident_bytes <= max(st.budget_bytes, largest)


@pytest.mark.parametrize("arch", REFUSED)
def test_prefetch_is_refused_for_an_arch_whose_routing_the_guess_does_not_model(
    arch, tiny_models, open_session, tmp_path
) -> None:
    with pytest.raises(StreamSetupError, match=f"cannot guess the routing of architecture '{arch}': .+") as e:
        open_session(tiny_models(arch, "q8_0"), moe_stream=True, cache_mb=0, prefetch=True, twin_dir=tmp_path / "twins")
    assert isinstance(e.value, ConfigError)  # a setting's fault (--prefetch), as architecture.md's error root says


def test_prefetch_is_refused_where_it_cannot_work(tiny_models, open_session, tmp_path) -> None:
    model = tiny_models("qwen3moe", "q8_0")
    with pytest.raises(ConfigError, match="prefetch: .*needs moe_stream"):
        open_session(model, prefetch=True)


def test_prefetch_with_a_prefill_device_is_refused_before_anything_opens(tiny_models) -> None:
    from bmoe.config import SessionConfig

    with pytest.raises(ConfigError, match="prefetch: .*prefill device"):
        SessionConfig(model=tiny_models("qwen3moe", "q8_0"), moe_stream=True, prefetch=True, prefill_device="CUDA0")
