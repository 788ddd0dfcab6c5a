"""bmoe.ray.data without Ray: rows answered by one session, result order and its check, sizing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bmoe.config import SessionConfig
from bmoe.decide.types import DecideRequest, RenderRule
from bmoe.errors import ConfigError
from bmoe.ray.data import RayOptions, RowsLost, actor_sizing, answer_lines, answer_local, decide_line, in_order
from bmoe.ray.data.rows import as_command_line
from bmoe.session import Session
from bmoe.wire.protocol import parse_line
from bmoe.wire.records import decide_fields
from helpers.rows import BAD, answers, decide_rows, keys, with_bad_rows


@pytest.fixture(scope="module")
def tiny_cfg(tiny_models) -> SessionConfig:
    return SessionConfig(model=tiny_models("qwen3moe", "q8_0"), decide=True, decide_batch=4, n_ctx=512, n_threads=1)


def test_rows_answer_what_one_session_answers_one_by_one(tiny_cfg: SessionConfig) -> None:
    rows = with_bad_rows(decide_rows(4))
    got = answer_local(rows, tiny_cfg)  # grouped by prefix, decide_many per group
    with Session(tiny_cfg) as s:
        want = []
        for line in rows:
            try:
                want.append(decide_fields(s.decide(parse_line(as_command_line(line)).request)))
            except Exception as e:  # noqa: BLE001 - the refusals, compared by row below
                want.append({"id": None, "error": str(e)})
    assert len(got) == len(rows)
    for g, w, line in zip(got, want, rows):
        if line in BAD:
            assert "error" in g and g["error"], line
        else:
            assert answers([g]) == answers([w]) and keys([g]) == keys([w])
    batched = {r.get("batch_id") for r in got if "batch_id" in r}
    assert batched, "no row was prefilled together with others"


def test_bad_rows_get_one_line_errors_in_place(tiny_cfg: SessionConfig) -> None:
    gen = '{"cmd":"generate","id":5,"prompt":"Hello","n_predict":2}'
    rows = BAD + [gen]
    with Session(tiny_cfg) as s:
        got = answer_lines(s, rows)
        assert s.decide(DecideRequest(id=1, prefix="a", suffix="b", choices=("A", "B"))).error is None  # still usable
    errors = [g["error"] for g in got[: len(BAD)]]
    assert errors[0].startswith("request is not valid JSON")
    assert errors[1] == "decide: missing field 'choices'"
    assert errors[2].startswith("a row is one decide or generate request; stats is not answered here")
    assert "both start with token" in errors[3] and got[3]["id"] == 8
    assert errors[4] == "decide: unknown field(s) 'colour'" and got[4]["id"] == 9
    assert all("\n" not in e for e in errors)
    assert got[-1]["id"] == 5 and got[-1]["tokens"] == 2 and "text" in got[-1]


def test_decide_line_round_trips() -> None:
    req = DecideRequest(id=3, prefix="p", suffix="s", choices=("A", "B"), reuse_prefix=False, abstain_below=0.25)
    assert parse_line(decide_line(req)).request == req
    full = DecideRequest(
        id=4, prefix="", suffix="s", choices=("yes", "no"), scoring="full", best_by="uncond", unconditional="Answer:"
    )
    assert parse_line(decide_line(full)).request == full
    structured = DecideRequest(
        id=5,
        prefix="p",
        suffix="s",
        choices=(),
        question="Which is larger?",
        options=("7", "12", "9"),
        debias="permute",
        render=RenderRule(cue="Answer:", labels=("1", "2", "3")),
    )
    assert parse_line(decide_line(structured)).request == structured
    plain_structured = DecideRequest(id=6, prefix="", suffix="", choices=(), question="q", options=("a", "b"))
    assert parse_line(decide_line(plain_structured)).request == plain_structured


def test_in_order_finds_lost_and_duplicated_rows() -> None:
    assert in_order([(1, {"id": 1}), (0, {"id": 0})], 2) == [{"id": 0}, {"id": 1}]
    with pytest.raises(RowsLost, match=r"1 row\(s\) missing \[1\], 0 duplicated"):
        in_order([(0, {})], 2)
    with pytest.raises(RowsLost, match=r"0 row\(s\) missing \[\], 1 duplicated or unknown \[0\]"):
        in_order([(0, {}), (1, {}), (0, {})], 2)
    with pytest.raises(RowsLost, match=r"unknown \[5\]"):
        in_order([(0, {}), (5, {})], 1)


def test_sizing_adds_weights_kv_and_overhead() -> None:
    from bmoe.testing import smollm2_gguf_path

    smollm2 = smollm2_gguf_path()
    cfg = SessionConfig(model=smollm2, decide=True, n_ctx=4096, decide_batch=1)
    s = actor_sizing(cfg, num_cpus=2, flash_resource="nvme0")
    # SmolLM2-135M: 30 layers, 3 KV heads of 64, f16 K and V: 22.5 KiB a token (docs/decide.md)
    assert s.kv == 4096 * 30 * 3 * (64 + 64) * 2 == 4096 * 22.5 * 1024
    assert s.weights == 96576768  # every tensor of the file: it runs resident
    assert s.memory == s.weights + s.kv + s.overhead and s.num_cpus == 2 and s.resources == {"nvme0": 1.0}
    batched = actor_sizing(SessionConfig(model=smollm2, decide=True, n_ctx=4096, decide_batch=8, kv_f32=True))
    assert batched.kv == s.kv * 9 * 2  # 8 side sequences + the main one, f32
    # decide_batch auto (the default) may open up to 8 side sequences: the actor is sized for them
    assert actor_sizing(SessionConfig(model=smollm2, decide=True, n_ctx=4096)).kv == s.kv * 9
    assert actor_sizing(SessionConfig(model=smollm2, n_ctx=4096)).kv == s.kv  # no decide: one sequence
    assert actor_sizing(cfg, memory_mb=100).memory == 100 * 2**20


def test_sizing_of_a_streamed_model(tiny_models) -> None:
    from bmoe.stream.layout import read_layout

    path = tiny_models("qwen3moe", "q8_0")
    layout = read_layout(path)
    s = actor_sizing(SessionConfig(model=path, moe_stream=True, cache_mb=3))
    # the budget, but never more than the model's experts: a bigger cache holds nothing more
    assert s.weights == layout.dense_nbytes + min(3 * 2**20, layout.expert_nbytes)
    huge = actor_sizing(SessionConfig(model=path, moe_stream=True, cache_mb=1 << 20))
    assert huge.weights == layout.dense_nbytes + layout.expert_nbytes
    with pytest.raises(ConfigError, match="cache_mb: auto sizes the cache"):
        actor_sizing(SessionConfig(model=path, moe_stream=True, cache_mb="auto"))
    assert actor_sizing(
        SessionConfig(model=path, moe_stream=True, cache_mb="auto", cache_ceil_mb=5)
    ).weights == layout.dense_nbytes + min(5 * 2**20, layout.expert_nbytes)
    # the memory given: nothing is computed, so cache_mb auto needs no ceiling
    given = actor_sizing(SessionConfig(model=path, moe_stream=True, cache_mb="auto"), memory_mb=8000)
    assert (given.memory, given.weights, given.kv, given.overhead) == (8000 * 2**20, None, None, None)
    assert given.describe() == "num_cpus=1, memory=8000 MiB (given)"


def test_ray_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="actors: must be an integer >= 1, got 0"):
        RayOptions(actors=0)
    with pytest.raises(ConfigError, match="max_restarts"):
        RayOptions(max_restarts=-1)
    assert json.loads(json.dumps(RayOptions().address)) == "local"


def test_the_serve_builder_takes_bmoe_server_flags() -> None:
    from bmoe.ray.serve import build
    from bmoe.testing import smollm2_gguf_path

    app = build({"flags": f"-m {smollm2_gguf_path()} --api-key k --max-queue 3 -c 512", "replicas": "2"})
    dep = app._bound_deployment
    assert dep.num_replicas == 2 and dep.max_ongoing_requests == 4
    cfg, settings = dep.init_args
    assert cfg["n_ctx"] == 512 and cfg["n_threads"] == 1 and cfg["decide"] is True
    assert settings.api_key == "k" and settings.max_queue == 3
    assert dep.ray_actor_options["num_cpus"] == 1 and dep.ray_actor_options["memory"] > 512 * 2**20
    with pytest.raises(ConfigError, match="unknown argument"):
        build({"flags": "", "replica": "2"})


def test_bmoe_batch_refusals_are_one_line(tmp_path, capsys) -> None:
    from bmoe.ray.batch import main

    out = tmp_path / "out.jsonl"
    assert main([str(tmp_path / "missing.jsonl"), "--out", str(out)]) == 1
    assert capsys.readouterr().err.strip().startswith(f"bmoe-batch: cannot read {tmp_path / 'missing.jsonl'}")
    data = tmp_path / "d.jsonl"
    data.write_text('{"prefix":"p","suffix":"s","choices":["A","B"]}\n')
    assert main([str(data), "--out", str(out), "-m", str(tmp_path / "none.gguf")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model: file not found" in err
    assert main([str(data), "--out", str(out), "-c", "4", "-m", str(data)]) == 1
    assert "--ctx-size (n_ctx): must be an integer >= 16, got 4" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([str(data), "--out", str(out), "--actors", "0"])
    assert e.value.code == 2 and "--actors: takes an integer >= 1, got '0'" in capsys.readouterr().err
    assert not out.exists()


def test_a_failure_is_told_apart_from_a_refusal() -> None:
    from bmoe.decide.errors import DecideRefusal
    from bmoe.decide.types import DecideResult

    class Broken:  # a session whose engine fails one request, refuses one and answers none
        def decide_many(self, requests):  # type: ignore[no-untyped-def]
            if requests[0].prefix == "raise":
                raise RuntimeError("bug")
            return [
                DecideResult.failed(requests[0].id, "decide: the backend lost the sequence", RuntimeError()),
                DecideResult.failed(requests[1].id, "decide: refused", DecideRefusal("refused")),
            ]

    rows = [
        '{"id":1,"prefix":"p","suffix":"s","choices":["A","B"]}',
        '{"id":2,"prefix":"p","suffix":"s","choices":["A","B"]}',
        '{"id":3,"prefix":"raise","suffix":"s","choices":["A","B"]}',
    ]
    assert answer_lines(Broken(), rows) == [  # type: ignore[arg-type]
        {"id": 1, "error": "decide: the backend lost the sequence", "failed": True},
        {"id": 2, "error": "decide: refused"},
        {"id": 3, "error": "internal error: RuntimeError: bug", "failed": True},
    ]


def _pride_row(rid: int, prefix: str) -> str:
    return json.dumps(
        {
            "id": rid,
            "prefix": prefix,
            "question": f"Which is bigger, {rid} or {rid + 1}?",
            "options": [str(rid), str(rid + 1)],
            "debias": "pride",
        }
    )


def test_pride_rows_are_answered_in_input_order(tiny_models) -> None:
    """The prior comes from the first pride rows a session answers: those of the file, not of the
    prefixes' sorted order (here the second row's prefix sorts first)."""
    cfg = SessionConfig(
        model=tiny_models("qwen3moe", "q8_0"),
        decide=True,
        decide_batch=4,
        n_ctx=512,
        n_threads=1,
        decide_pride_sample=1,
    )
    plain = '{"id": 9, "prefix": "Apple task.", "suffix": " Pick:", "choices": ["A", "B"]}'
    rows = [_pride_row(1, "Zebra task."), plain, _pride_row(2, "Apple task."), _pride_row(3, "Zebra task.")]
    got = answer_local(rows, cfg)
    assert [g["id"] for g in got] == [1, 9, 2, 3] and all("error" not in g for g in got), got
    assert [g.get("pride_stage") for g in got] == ["sample", None, "prior", "prior"]


def test_bmoe_batch_refuses_pride_rows_on_ray_before_ray_starts(tiny_models, tmp_path, capsys, monkeypatch) -> None:
    import sys

    import bmoe.ray.data
    from bmoe.ray.batch import main

    monkeypatch.setitem(sys.modules, "ray", None)  # an import of Ray would fail the test
    data = tmp_path / "d.jsonl"
    data.write_text(
        "\n".join(
            [
                _pride_row(1, "P."),
                '{"prefix":"p","suffix":"s","choices":["A","B"]}',
                _pride_row(2, "P."),
                _pride_row(3, "Q."),
            ]
        )
        + "\n"
    )
    out = tmp_path / "out.jsonl"
    assert main([str(data), "--out", str(out), "--ray", "local", "-m", str(tiny_models("qwen3moe", "q8_0"))]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        'bmoe-batch: --ray: 3 rows use "debias": "pride", whose prior a session estimates from the first rows it '
        'answers; each Ray actor has its own session and gets the rows in another order, so the answers would not '
        'be those of one process; run them without --ray'
    ]
    assert not out.exists()
    with pytest.raises(ConfigError, match='--ray: 3 rows use "debias": "pride"'):  # the library refuses them too
        bmoe.ray.data.answer(
            data.read_text().splitlines(), SessionConfig(model=tiny_models("qwen3moe", "q8_0")), RayOptions()
        )


def test_bmoe_batch_checks_out_before_any_work(tiny_models, tmp_path, unwritable_dir, capsys, monkeypatch) -> None:
    """An --out that cannot take the results, or that is the input file by any name, is refused
    before the model opens: neither a lost run nor overwritten data."""
    import os

    import bmoe.ray.data.run
    from bmoe.ray.batch import main

    def no_session(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("the model was opened")

    monkeypatch.setattr(bmoe.ray.data.run, "Session", no_session)
    text = '{"prefix":"p","suffix":"s","choices":["A","B"]}\n'
    data = tmp_path / "d.jsonl"
    data.write_text(text)
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.jsonl").symlink_to(data)
    os.link(data, tmp_path / "hard.jsonl")
    model = str(tiny_models("qwen3moe", "q8_0"))
    for out, msg in [
        (data, "is the input file"),
        (tmp_path / "sub" / ".." / "d.jsonl", "is the input file"),
        (tmp_path / "link.jsonl", "is the input file"),
        (tmp_path / "hard.jsonl", "is the input file"),
    ]:
        assert main([str(data), "--out", str(out), "-m", model]) == 1
        assert capsys.readouterr().err.splitlines() == [
            f"bmoe-batch: --out: {out} is the input file {data}; give another path (the results would replace the data)"
        ]
    for out, msg in [
        (
            tmp_path,
            f"{tmp_path} is a folder; give the path of a regular file, or of one that does not exist "
            "yet (the results are written beside it and renamed over it)",
        ),
        (data / "r.jsonl", f"cannot write {data / 'r.jsonl'}: Not a directory"),
        (
            tmp_path / "missing" / "r.jsonl",
            f"cannot write {tmp_path / 'missing' / 'r.jsonl'}: No such file or directory",
        ),
        (unwritable_dir / "r.jsonl", f"cannot write {unwritable_dir / 'r.jsonl'}: Permission denied"),
    ]:
        assert main([str(data), "--out", str(out), "-m", model]) == 1
        assert capsys.readouterr().err.splitlines() == [f"bmoe-batch: --out: {msg}"]
    assert data.read_text() == text and sorted(p.name for p in tmp_path.iterdir()) == [
        "d.jsonl",
        "hard.jsonl",
        "link.jsonl",
        "read-only",
        "sub",
    ]


def test_bmoe_batch_refuses_a_special_file_as_out(tiny_models, tmp_path, capsys, monkeypatch) -> None:
    """A FIFO, a device or a link to one named by --out is refused before any work and left as it
    was: the results would be renamed over it (run as root, ``--out /dev/null`` replaced the
    system's /dev/null)."""
    import os
    import stat

    import bmoe.ray.data.run
    from bmoe.ray.batch import main

    def no_session(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("the model was opened")

    monkeypatch.setattr(bmoe.ray.data.run, "Session", no_session)
    data = tmp_path / "d.jsonl"
    data.write_text('{"prefix":"p","suffix":"s","choices":["A","B"]}\n')
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    null_link = tmp_path / "null"
    null_link.symlink_to("/dev/null")
    model = str(tiny_models("qwen3moe", "q8_0"))
    for out, what in [
        (fifo, "a FIFO (named pipe)"),
        (Path("/dev/null"), "a character device"),
        (null_link, "a character device"),
    ]:
        assert main([str(data), "--out", str(out), "-m", model]) == 1
        assert capsys.readouterr().err.splitlines() == [
            f"bmoe-batch: --out: {out} is {what}; give the path of a regular file, or of one that does not exist "
            "yet (the results are written beside it and renamed over it)"
        ]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and null_link.is_symlink()
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl", "f", "null"]  # no part file left
