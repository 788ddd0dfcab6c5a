"""The RAM tier's eviction order, measured on a replay of agent-like key traffic (counts, no
clock): agents whose prompts grow ~70 tokens a step, in turns or skewed, against a budget of a few
states. The figure is the prompt tokens prefilled again because their state had left RAM
(docs/decide.md "The state store" quotes them).

* ``StateStore``: the store's policy, superseded states first (a state a longer one extends), then LRU;
* ``Lru``: plain LRU, the baseline of issue #37;
* ``CostAware``: GreedyDual-Size over recompute cost against bytes (cost: the state's tokens, what
  its prefill takes; priority = L + tokens / bytes, refreshed on a hit; the lowest leaves and L
  becomes its priority).
"""

from __future__ import annotations

import random

import pytest

from bmoe.decide.port import KeptState
from bmoe.state_store import StateStore

ATTENTION = (0, 32768)  # (fixed bytes, bytes a token): the bench model's f16 KV, 16 layers
HYBRID = (20 << 20, 8192)  # a recurrent state of 20 MiB, a quarter of the layers attention


class Size:
    """A state of ``n`` bytes that holds none (the policy only reads len())."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


class Lru(StateStore):
    def _victim(self) -> tuple[int, ...]:
        return next(iter(self._ram))


class CostAware(StateStore):
    def __init__(self, ram_budget: int | None) -> None:
        super().__init__(ram_budget)
        self.inflation = 0.0
        self.priority: dict[tuple[int, ...], float] = {}

    def _rate(self, tokens: tuple[int, ...]) -> None:
        kept = self._ram[tokens]
        self.priority[tokens] = self.inflation + len(tokens) / max(1, kept.state.nbytes)

    def _put_ram(self, kept) -> None:  # type: ignore[no-untyped-def]
        super()._put_ram(kept)
        if kept.tokens in self._ram:
            self._rate(kept.tokens)

    def lookup(self, prefix_tokens):  # type: ignore[no-untyped-def]
        found = super().lookup(prefix_tokens)
        if found.kept is not None and found.kept.tokens in self._ram:
            self._rate(found.kept.tokens)
        return found

    def _victim(self) -> tuple[int, ...]:
        keys = list(self._ram)
        victim = min(keys[:-1] or keys, key=lambda t: self.priority.get(t, 0.0))
        self.inflation = self.priority.pop(victim, self.inflation)
        return victim


def replay(store: StateStore, n_agents: int, skew: float, shape: tuple[int, int], steps: int = 8) -> int:
    """Prompt tokens prefilled again over ``steps`` requests an agent on average (skew 0: in
    turns; else agent k is picked with weight 1/(k+1)**skew)."""
    fixed, per_token = shape
    rng = random.Random(1)
    lengths = {k: 600 + rng.randrange(400) for k in range(n_agents)}
    weights = [1 / (k + 1) ** skew for k in range(n_agents)]
    prefilled = 0
    for i in range(steps * n_agents):
        k = i % n_agents if skew == 0 else rng.choices(range(n_agents), weights)[0]
        tokens = tuple(k * 100_000 + t for t in range(lengths[k]))
        found = store.lookup(tokens)
        prefilled += len(tokens) - (found.kept.state.n_tokens if found.kept is not None else 0)
        store.store(tokens, KeptState(data=Size(fixed + per_token * len(tokens)), n_tokens=len(tokens)))
        lengths[k] += 60 + rng.randrange(20)
    return prefilled


def budget(states: int, shape: tuple[int, int]) -> int:
    return states * (shape[0] + shape[1] * 900)


# (agents, budget in states of ~900 tokens, skew, shape) -> prefilled again: (store, LRU, cost-aware)
MEASURED = {
    (4, 6, 0.0, ATTENTION): (5105, 19441, 19441),
    (8, 4, 1.0, ATTENTION): (37668, 42581, 42581),
    (16, 6, 1.0, ATTENTION): (89663, 100969, 100969),
    (8, 4, 1.0, HYBRID): (33184, 39735, 37868),
    (8, 4, 0.0, ATTENTION): (66851, 66851, 66851),  # more agents than room: every policy misses all
}


@pytest.mark.parametrize("case", list(MEASURED), ids=lambda c: f"{c[0]}agents-{c[1]}states-skew{c[2]}-{c[3][0]}")
def test_the_store_prefills_no_more_than_lru_or_cost_aware(case) -> None:
    n_agents, states, skew, shape = case
    b = budget(states, shape)
    got = tuple(replay(cls(b), n_agents, skew, shape) for cls in (StateStore, Lru, CostAware))
    assert got == MEASURED[case]
    assert got[0] <= min(got[1:])


def test_four_agents_in_turns_keep_their_latest_states() -> None:
    """The bench's traffic with room for six states: plain LRU keeps each agent's last two (eight
    states, two too many) and loses every one in turn; the store drops the superseded ones."""
    b = budget(6, ATTENTION)
    assert replay(StateStore(b), 4, 0.0, ATTENTION) * 3 < replay(Lru(b), 4, 0.0, ATTENTION)
