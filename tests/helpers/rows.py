"""The data set the Ray tests run: decisions over several prefixes, shuffled, plus bad rows."""

from __future__ import annotations

import json
import random

FLASH = "bmoe_flash"  # the custom resource each node of the test cluster has one unit of

# Prefixes none of which starts another on tokens: every decision is the prefix then the suffix,
# prefilled in those two pieces, whatever another row kept before it (docs/decide.md).
TASKS = [
    "You control a phone. Task: turn on Wi-Fi. History:",
    "Agent for a shop: find the cheapest kettle. Steps so far:",
    "Robot in a kitchen, goal: boil water. Done:",
    "Mail assistant. Goal: archive old newsletters. Log:",
    "Calendar helper; aim: book a dentist. Progress:",
    "Browser agent, objective: download the invoice. Trace:",
]
SCREENS = ["Home", "Settings", "Network", "Search", "Results", "Cart", "Inbox", "Login", "Menu", "Dialog"]
BAD = [
    "not json at all",
    '{"prefix": "x", "suffix": "y"}',  # no choices
    '{"cmd": "stats", "id": 7}',  # not a row
    '{"id": 8, "prefix": "P", "suffix": "S", "choices": ["A", "A"]}',  # refused by decide: collide
    '{"id": 9, "prefix": "P", "suffix": "S", "choices": ["A"], "colour": "red"}',  # unknown field
]


def decide_rows(n_per_task: int, *, seed: int = 0) -> list[str]:
    rows = []
    for t, task in enumerate(TASKS):
        for k in range(n_per_task):
            suffix = (
                f" step {k}. Screen: {SCREENS[k % len(SCREENS)]} #{k}. Options: A) back B) next C) stop."
                " Answer with the letter."
            )
            rows.append(json.dumps({"id": t * 1000 + k, "prefix": task, "suffix": suffix, "choices": ["A", "B", "C"]}))
    random.Random(seed).shuffle(rows)
    return rows


def with_bad_rows(rows: list[str]) -> list[str]:
    out = list(rows)
    for i, bad in enumerate(BAD):
        out.insert((i * 37) % (len(out) + 1), bad)
    return out


# What a decision answers, as opposed to how it got there (n_reused, reuse, prefix_state_mib, batch_*)
# and what it cost (prefill_s, prefill_tps, store_s, restore_s).
ANSWER_KEYS = ("id", "error", "best", "choice_logp", "p_outside", "abstained", "scoring", "best_by", "n_tokens")
HOW_KEYS = {
    "n_reused",
    "reuse",
    "reuse_tier",  # present only when a kept state was restored: how, like reuse
    "prefix_state_mib",
    "prefill_s",
    "prefill_tps",
    "store_s",
    "restore_s",
    "batch_id",
    "batch_size",
    "batch_tokens",
    "batch_prefill_s",
    "batch_read_mb",
}


def answers(results: list[dict]) -> list[tuple]:
    return [tuple(r.get(k) for k in ANSWER_KEYS) for r in results]


def keys(results: list[dict]) -> list[set[str]]:
    return [set(r) - HOW_KEYS for r in results]
