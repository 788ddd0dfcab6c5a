"""Benchmark: structured outputs (#36 item 7), three comparisons in one run, each timed in rounds
that interleave its sides (so that load from other processes hits both alike):

* enum: an enum schema answered without decoding it (``Session.walk_choices``, the temperature-0
  path of server/choice_answer.py: a prefill, decodes only where the choices share tokens; and
  one ``decide`` over the choices, the temperature > 0 path) against the same answer by
  token-by-token constrained greedy decoding (``generate`` with the schema). Each from an empty
  KV (a whole prefill each). Target: constrained decoding's wall >= 2x the decision's.
* jump-forward: an object schema that is not an enum (keys, punctuation), generated greedy with
  and without ``jump_forward``: tokens of answer per second of decode.
* grammar overhead: decode milliseconds per token constrained (a schema of one long free string)
  against unconstrained decoding of the same prompt; and the matcher's own cost, replaying the
  constrained answer's tokens through a fresh mask (mask + advance per token) over the
  unconstrained decode's ms/token. Target: <= 1.1x.

Streamed (``moe_stream``, cache off) on the bench model (bench/synthetic_moe.py) in a child under
a cgroup-v1 memory limit (``--bench-model``, needs root), or on the tiny qwen3moe in process:

    .venv/bin/python bench/structured.py [--bench-model --limit-gib 2.5] [--rounds 3]

Times are medians over ``--rounds``; the spread (max - min over median) is printed with them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import record  # noqa: E402

GOAL_ENUM = 2.0
GOAL_OVERHEAD = 1.1
ASK = "Read the review and classify its sentiment. Review: the battery lasts two days and the screen is sharp."
ENUM = {"enum": ["positive", "negative", "neutral", "mixed"]}
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "country": {"type": "string", "maxLength": 12},
        "population_in_millions": {"type": "integer"},
        "is_capital": {"type": "boolean"},
    },
    "required": ["city", "country", "population_in_millions", "is_capital"],
    "additionalProperties": False,
}
CITY_ASK = "Give a large European city as JSON."
FREE = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
FREE_ASK = "Write a short story about a lighthouse."


def _spread(xs: list[float]) -> float:
    m = statistics.median(xs)
    return (max(xs) - min(xs)) / m if m > 0 else 0.0


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def measure(session, rounds: int, n_predict: int) -> dict:
    from bmoe.constrain import Constraint, TokenMask, finite_texts
    from bmoe.constrain.schema import schema_grammar
    from bmoe.llama.grammar import grammar_tokenizer
    from bmoe.session import DecideRequest, GenerateRequest

    texts = finite_texts(schema_grammar(ENUM))
    assert texts is not None

    def gen(prompt: str, n: int, **kw):
        return session.generate(GenerateRequest(prompt=prompt, n_predict=n, clear_kv=True, temperature=0.0, **kw))

    enum_req = GenerateRequest(prompt=ASK, n_predict=16, clear_kv=True, temperature=0.0, json_schema=ENUM)
    dec_req = DecideRequest(id=0, prefix="", suffix=ASK, choices=texts, scoring="full", reuse_prefix=False)
    res: dict[str, list] = {k: [] for k in ("gen", "walk", "decide", "jf_on", "jf_off", "free", "plain", "mask")}
    same = []
    gen(ASK, 1)  # warm: the first call pays for page faults and the grammar tokenizer
    gtok, free_c = grammar_tokenizer(session.model), Constraint("json_schema", "bench", schema_grammar(FREE))
    row = session.next_token_logprobs([0])  # any logit row of the vocabulary's size
    for _ in range(rounds):
        t_gen, g = _timed(lambda: session.generate(enum_req))
        t_walk, w = _timed(lambda: session.walk_choices(enum_req, texts))
        t_dec, d = _timed(lambda: session.decide(dec_req))
        same.append(g.text == w.text)
        res["gen"].append((t_gen, g.n_tokens))
        res["walk"].append((t_walk, len(w.tokens)))
        res["decide"].append((t_dec, 0))
        for jf in (True, False):
            r = gen(CITY_ASK, n_predict, json_schema=CITY, jump_forward=jf)
            res["jf_on" if jf else "jf_off"].append((r.decode_s, r.n_tokens))
        free = gen(FREE_ASK, n_predict, json_schema=FREE)
        plain = gen(FREE_ASK, n_predict)
        res["free"].append((free.decode_s, free.n_tokens))
        res["plain"].append((plain.decode_s, plain.n_tokens))
        mask = TokenMask(gtok, free_c, session.model.n_vocab)
        t0 = time.perf_counter()
        for tok in free.tokens:
            mask.mask(row)
            if mask.advance(tok):
                break
        res["mask"].append((time.perf_counter() - t0, len(free.tokens)))
        del d
    return {"rounds": res, "same_text": all(same)}


def summarize(m: dict) -> tuple[list[dict], list[dict], list[str]]:
    r = m["rounds"]

    def med(key: str) -> float:
        return statistics.median(t for t, _ in r[key])

    def per_tok(key: str) -> list[float]:
        return [t / n * 1000.0 for t, n in r[key] if n > 0]

    def tok_s(key: str) -> list[float]:
        return [n / t for t, n in r[key] if t > 0]

    enum_rows = [
        {
            "name": name,
            "wall_ms": med(key) * 1000.0,
            "spread": _spread([t for t, _ in r[key]]),
            "decoded": statistics.median(n for _, n in r[key]),
        }
        for name, key in (
            ("constrained decoding (T=0)", "gen"),
            ("greedy walk (T=0, no decode after the split)", "walk"),
            ("one decision (T>0)", "decide"),
        )
    ]
    jf_rows = [
        {"name": name, "tok_s": statistics.median(tok_s(key)), "spread": _spread(tok_s(key))}
        for name, key in (("without jump-forward", "jf_off"), ("with jump-forward", "jf_on"))
    ]
    plain, free, mask = (
        statistics.median(per_tok("plain")),
        statistics.median(per_tok("free")),
        statistics.median(per_tok("mask")),
    )
    oh_rows = [
        {"name": "unconstrained decode", "ms_tok": plain, "spread": _spread(per_tok("plain"))},
        {"name": "constrained decode (free string)", "ms_tok": free, "spread": _spread(per_tok("free"))},
        {"name": "unconstrained + the matcher's own cost", "ms_tok": plain + mask, "spread": _spread(per_tok("mask"))},
    ]
    cols_enum = (
        ("name", "path", ""),
        ("wall_ms", "wall ms (median)", ".1f"),
        ("spread", "spread", ".0%"),
        ("decoded", "tokens sampled", ".0f"),
    )
    tables = [
        record.table(
            "enum schema: decision against constrained decoding",
            cols_enum,
            enum_rows,
            {"row": str(enum_rows[0]["name"]), "key": "wall_ms", "label": "of decoding"},
        ),
        record.table(
            "object schema: jump-forward",
            (("name", "mode", ""), ("tok_s", "answer tok/s", ".2f"), ("spread", "spread", ".0%")),
            jf_rows,
            {"row": str(jf_rows[0]["name"]), "key": "tok_s", "label": "of without"},
        ),
        record.table(
            "grammar per-token overhead",
            (("name", "mode", ""), ("ms_tok", "ms/token", ".2f"), ("spread", "spread", ".0%")),
            oh_rows,
            {"row": str(oh_rows[0]["name"]), "key": "ms_tok", "label": "of unconstrained"},
        ),
    ]
    speed = enum_rows[0]["wall_ms"] / max(enum_rows[1]["wall_ms"], 1e-9)
    speed_dec = enum_rows[0]["wall_ms"] / max(enum_rows[2]["wall_ms"], 1e-9)
    overhead = (plain + mask) / plain
    targets = [
        record.target(
            "enum: constrained decoding / greedy walk (T=0)", round(speed, 3), f">= {GOAL_ENUM:g}x", speed >= GOAL_ENUM
        ),
        record.target(
            "enum: constrained decoding / one decision (T>0)",
            round(speed_dec, 3),
            f">= {GOAL_ENUM:g}x",
            speed_dec >= GOAL_ENUM,
        ),
        record.target(
            "grammar overhead: (decode + matcher) / decode",
            round(overhead, 3),
            f"<= {GOAL_OVERHEAD:g}x",
            overhead <= GOAL_OVERHEAD,
        ),
    ]
    notes = [
        f"the greedy walk's text equals constrained decoding's in every round: {m['same_text']}",
        f"constrained decode (free string) / unconstrained: {free / plain:.3f}x (different tokens, so compared per token)",
    ]
    return tables, targets, notes


def child(a: argparse.Namespace) -> int:
    from bmoe.config import SessionConfig
    from bmoe.session import Session

    cfg = SessionConfig(model=a.model, n_ctx=1024, n_threads=a.threads, decide=True, moe_stream=True, cache_mb=0)
    with Session(cfg) as s:
        out = measure(s, a.rounds, a.n_predict)
    a.out.write_text(json.dumps(out))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", default="run", choices=("run", "child"))
    ap.add_argument("--bench-model", action="store_true", help="the synthetic bench model under --limit-gib (root)")
    ap.add_argument("--model", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--work", type=Path, default=HERE / "out")
    ap.add_argument("--limit-gib", type=float, default=2.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-predict", type=int, default=48)
    record.add_args(ap)
    a = ap.parse_args(argv)
    if a.mode == "child":
        return child(a)
    a.work.mkdir(parents=True, exist_ok=True)
    a.out = a.work / "structured.json"
    if a.bench_model:
        from cgroup_run import run_limited
        from synthetic_moe import write_synthetic

        model = write_synthetic(a.work)
        cmd = [sys.executable, __file__, "child", "--model", str(model), "--out", str(a.out)]
        cmd += ["--rounds", str(a.rounds), "--threads", str(a.threads), "--n-predict", str(a.n_predict)]
        o = run_limited(cmd, int(a.limit_gib * 2**30), timeout_s=3600, tag="structured")
        if o.returncode != 0:
            print(f"# child failed: rc {o.returncode} {o.stderr_tail[-600:]}")
            return 1
        where = f"bench model, streamed cache off, {a.limit_gib:g} GiB limit, peak {o.max_usage_mib} MiB"
    else:
        from bmoe.testing import default_tiny_dir, write_tiny

        a.model = write_tiny("qwen3moe", "q8_0", default_tiny_dir())
        child(a)
        where = "tiny qwen3moe, streamed cache off, no memory limit"
    m = json.loads(a.out.read_text())
    tables, targets, notes = summarize(m)
    for t in tables:
        print(f"# {t['title']}")
        for row in t["rows"]:
            print("  ", row)
    for t in targets:
        print(f"# target {t['target']}: {t['verdict']} ({t['value']}, goal {t['goal']})")
    rec = record.record(
        "structured",
        command=record.invocation("structured.py", argv),
        config={"model": where, "rounds": a.rounds, "threads": a.threads, "n_predict": a.n_predict},
        tables=tables,
        targets=targets,
        notes=notes,
        machine_facts=record.machine(disk=a.work),
    )
    record.write(rec, a.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
