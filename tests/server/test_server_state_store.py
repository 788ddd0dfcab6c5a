"""/v1/decide streams with different prefixes, interleaved, each restore their own kept state from
the state store (--state-ram-mib); /metrics counts the store per tier (docs/server.md)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from helpers.server import metric

AGENTS = [
    "You control a phone. Task: turn on Wi-Fi. History:",
    "You control a phone. Task: call Mom on speaker. History:",
    "You route requests. Pick the team for this ticket:",
]


def decision(i: int, prefix: str, step: int) -> dict:
    return {"id": i, "prefix": prefix, "suffix": f" step {step}. Options: A) yes B) no. Answer:", "choices": ["A", "B"]}


def test_interleaved_decide_streams_each_restore_their_own_state(make_app, tiny_path) -> None:
    with TestClient(make_app(tiny_path, state_ram_mib=16), base_url="http://localhost") as client:
        answers = [
            client.post("/v1/decide", json=decision(10 * step + k, prefix, step)).json()
            for step in range(3)
            for k, prefix in enumerate(AGENTS)
        ]
        first, later = answers[: len(AGENTS)], answers[len(AGENTS) :]
        assert all(a["n_reused"] == 0 for a in first)
        assert all(a["n_reused"] > 0 and a["reuse"] == "restored" and a["reuse_tier"] == "ram" for a in later)
        text = client.get("/metrics").text
        assert metric(text, "bmoe_state_store_hits", tier="ram") == len(later)
        assert metric(text, "bmoe_state_store_misses") == len(AGENTS)
        assert metric(text, "bmoe_state_store_states", tier="ram") == len(AGENTS)


def test_without_the_store_interleaved_streams_miss(make_app, tiny_path) -> None:
    with TestClient(make_app(tiny_path), base_url="http://localhost") as client:
        answers = [client.post("/v1/decide", json=decision(k, p, 0)).json() for k, p in enumerate(AGENTS * 2)]
        assert all(a["n_reused"] == 0 for a in answers)  # each replaced the other's state


SYSTEM = {"role": "system", "content": "You are a helpful phone agent."}
TASKS = ["Turn on Wi-Fi, please.", "Call my mother on speaker.", "Set an alarm for seven tomorrow."]


def cached_on_interleaved_turns(client) -> list[list[int]]:
    """Each agent's conversation, turn by turn, round robin: each turn's cached_tokens."""
    histories = [[SYSTEM, {"role": "user", "content": t}] for t in TASKS]
    cached: list[list[int]] = [[] for _ in TASKS]
    for step in range(3):
        for k, history in enumerate(histories):
            body = client.post("/v1/chat/completions", json={"messages": history, "max_tokens": 6}).json()
            cached[k].append(body["usage"]["prompt_tokens_details"]["cached_tokens"])
            history += [body["choices"][0]["message"], {"role": "user", "content": f"Next step {step}, go on."}]
    return cached


def test_interleaved_conversations_each_restore_their_own_state(make_app, tiny_path) -> None:
    with TestClient(make_app(tiny_path, state_ram_mib=16), base_url="http://localhost") as client:
        cached = cached_on_interleaved_turns(client)
        shared = cached[1][0]  # the second agent's first turn: what all conversations share
        assert all(c > shared for turns in cached for c in turns[1:]), cached
        assert metric(client.get("/metrics").text, "bmoe_state_store_hits", tier="ram") >= 2 * len(TASKS)


def test_without_the_store_interleaved_conversations_reuse_only_what_they_share(make_app, tiny_path) -> None:
    with TestClient(make_app(tiny_path), base_url="http://localhost") as client:
        cached = cached_on_interleaved_turns(client)
        assert len({c for turns in cached for c in turns[1:]}) == 1  # each turn: the shared system prompt only


def test_a_decision_between_two_chat_turns_leaves_the_conversation_restorable(make_app, tiny_path) -> None:
    with TestClient(make_app(tiny_path, state_ram_mib=16), base_url="http://localhost") as client:
        history = [SYSTEM, {"role": "user", "content": TASKS[0]}]
        first = client.post("/v1/chat/completions", json={"messages": history, "max_tokens": 6}).json()
        client.post("/v1/decide", json=decision(1, AGENTS[2], 0))
        history += [first["choices"][0]["message"], {"role": "user", "content": "Go on."}]
        second = client.post("/v1/chat/completions", json={"messages": history, "max_tokens": 6}).json()
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > first["usage"]["prompt_tokens"] // 2


def test_metrics_count_hits_misses_bytes_and_evictions_per_tier(make_app, tiny_path, tmp_path) -> None:
    """The RAM tier off over a flash tier: three interleaved streams, twice. Every lookup misses
    RAM; the first round misses flash too, the second hits it."""
    app = make_app(tiny_path, state_ram_mib=0, state_disk_mib=16, state_dir=tmp_path / "states")
    with TestClient(app, base_url="http://localhost") as client:
        answers = [
            client.post("/v1/decide", json=decision(10 * step + k, prefix, step)).json()
            for step in range(2)
            for k, prefix in enumerate(AGENTS)
        ]
        assert [a["reuse_tier"] for a in answers[len(AGENTS) :]] == ["disk"] * len(AGENTS)
        text = client.get("/metrics").text
        n = len(AGENTS)
        assert metric(text, "bmoe_state_store_hits", tier="disk") == n
        assert metric(text, "bmoe_state_store_hits", tier="ram") == 0
        assert metric(text, "bmoe_state_store_tier_misses", tier="ram") == 2 * n
        assert metric(text, "bmoe_state_store_tier_misses", tier="disk") == n
        assert metric(text, "bmoe_state_store_misses") == n
        assert metric(text, "bmoe_state_store_states", tier="disk") == n
        assert metric(text, "bmoe_state_store_bytes", tier="disk") > 0
        assert metric(text, "bmoe_state_store_bytes", tier="ram") == 0
        assert metric(text, "bmoe_state_store_evictions", tier="disk") == 0
