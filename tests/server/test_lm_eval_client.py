"""lm-evaluation-harness (pinned 0.4.13) as a client: its `local-completions` model against a live
bmoe-server on SmolLM2, on a multiple-choice task written here (a task YAML over a local JSONL
file; nothing is downloaded). Its acc and acc_norm equal the ones computed independently from the
session's own log-likelihoods (perplexity over context + continuation, prefilled whole), and what
`bmoe-eval --scoring full` reports on the same items (accuracy by "sum" and by "norm")."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import lm_eval  # the test extra (scripts/setup.sh --test)
import numpy as np

from helpers.server import metric

# (question, choices, gold). Choices of different lengths, so that acc (summed log-likelihood) and
# acc_norm (divided by the choice's length in characters) pick differently on some items; some
# choices share their first tokens, so a request reuses more than the question.
ITEMS = [
    ("What is the capital of France?", ["Paris", "Berlin", "Madrid"], 0),
    ("How many legs does a spider have?", ["six", "eight", "four"], 1),
    ("Which one is a fruit?", ["carrot", "potato", "apple"], 2),
    ("What colour is the sky on a clear day?", ["blue", "green", "bright red with yellow stripes"], 0),
    ("Which animal says moo?", ["the cow", "the cat", "the dog"], 0),
    ("What is two plus two?", ["four", "five", "twenty-two"], 0),
    ("Which is the largest planet?", ["Jupiter", "Mars", "the Moon"], 0),
    ("What do bees make?", ["honey", "milk", "silk"], 0),
]
TEMPLATE = "Question: {q}\nAnswer:"
# The server's scores (context kept from the previous request, continuation prefilled) against the
# whole prompt prefilled in one piece: not the same pieces, so a tolerance (docs/server.md "What is
# exact"); measured 0 with flash attention off, which both sessions here use.
TOL = 0.05

TASK_YAML = """\
task: bmoe_mc_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
  cache_dir: {cache}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: gold
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""


def write_task(folder: Path) -> None:
    data = folder / "items.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": c, "gold": g}) + "\n" for q, c, g in ITEMS))
    (folder / "bmoe_mc_local.yaml").write_text(TASK_YAML.format(data=data, cache=folder / "hf-cache"))


def session_loglikelihood(session, context: str, continuation: str) -> float:
    """lm-eval's rule, on the session directly: the context's trailing spaces move to the
    continuation, the pair is tokenized whole and split after the context's tokens, and the
    continuation's token log-probs are summed; here from perplexity() over the whole prompt."""
    n_space = len(context) - len(context.rstrip())
    if n_space:
        context, continuation = context[:-n_space], context[-n_space:] + continuation
    tok = lambda text: session.model.tokenize(text, add_special=False, parse_special=True)  # noqa: E731
    whole, n_ctx = tok(context + continuation), len(tok(context))
    lp = session.perplexity(tokens=whole).token_logprobs  # lp[k] scores token k + 1
    return float(lp[n_ctx - 1 :].sum())


def test_lm_eval_local_completions_against_bmoe_server(make_app, smol_path, live, tmp_path, monkeypatch) -> None:
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    app = make_app(smol_path, n_ctx=512, flash_attn=False)
    server = live(app)
    write_task(tmp_path)
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(
        model="local-completions",
        # tokenizer_backend "auto" would find /tokenizer_info and /tokenize by itself; named here so
        # that a server without them fails the test instead of reaching for a download
        model_args={
            "base_url": server.url + "/v1/completions",
            "model": "smollm2",
            "tokenizer_backend": "remote",
            "max_length": 512,
            "max_retries": 1,
        },
        tasks=["bmoe_mc_local"],
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        log_samples=True,
        bootstrap_iters=0,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
    )
    got = out["results"]["bmoe_mc_local"]
    samples = sorted(out["samples"]["bmoe_mc_local"], key=lambda s: s["doc_id"])
    assert len(samples) == len(ITEMS)

    session = app.state.session  # lm-eval is done: the test reads the same session directly
    acc, acc_norm, worst = [], [], 0.0
    for (q, choices, gold), sample in zip(ITEMS, samples, strict=True):
        lls = np.array([session_loglikelihood(session, TEMPLATE.format(q=q), " " + c) for c in choices])
        served = np.array([ll for ll, _greedy in sample["filtered_resps"]])
        np.testing.assert_allclose(served, lls, atol=TOL, rtol=0, err_msg=q)
        worst = max(worst, float(np.abs(served - lls).max()))
        chars = np.array([len(c) for c in choices])  # lm-eval: the choice's characters, no delimiter
        norm = lls / chars
        # every pick is clear of what the tolerance could move, so the comparison is well posed
        for scores, slack in ((lls, 2 * TOL), (norm, 2 * TOL / chars.min())):
            top2 = np.sort(scores)[-2:]
            assert top2[1] - top2[0] > slack, (q, scores)
        acc.append(float(np.argmax(lls) == gold))
        acc_norm.append(float(np.argmax(norm) == gold))
        assert (sample["acc"], sample["acc_norm"]) == (acc[-1], acc_norm[-1]), q
    assert got["acc,none"] == np.mean(acc) and got["acc_norm,none"] == np.mean(acc_norm)
    assert acc != acc_norm  # the two rules disagree somewhere: acc_norm's division was exercised
    # consecutive requests sharing a question reused its KV (lm-eval sends one request per choice)
    text = httpx.get(server.url + "/metrics").text
    print(
        f"lm-eval on {len(ITEMS)} items: acc {got['acc,none']:.3f}, acc_norm {got['acc_norm,none']:.3f}; "
        f"max |served - session| {worst:.2g} nats; tokens reused {metric(text, 'bmoe_reused_tokens_total'):.0f}, "
        f"prefilled {metric(text, 'bmoe_prompt_tokens_total'):.0f}"
    )
    assert metric(text, "bmoe_reused_tokens_total") > 0
    assert metric(text, "bmoe_http_requests_total", route="/v1/completions", status="200") == sum(
        len(c) for _, c, _ in ITEMS
    )

    # bmoe-eval on the same items: the prompt raw (no chat template), every choice scored whole after
    # it with lm-eval's delimiter in front; its accuracy by sum and by norm are lm-eval's acc, acc_norm
    from bmoe.eval.main import main as bmoe_eval

    data = tmp_path / "bmoe-eval.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {"suffix": TEMPLATE.format(q=q), "choices": [" " + c for c in choices], "gold": gold, "scoring": "full"}
            )
            + "\n"
            for q, choices, gold in ITEMS
        )
    )
    out_dir = tmp_path / "bmoe-eval"
    assert (
        bmoe_eval(
            [
                str(data),
                "--out",
                str(out_dir),
                "-m",
                str(smol_path),
                "--no-chat",
                "--flash-attn",
                "off",
                "--decide-batch",
                "4",
                "-c",
                "512",
                "-t",
                "1",
            ]
        )
        == 0
    )
    ours = json.loads((out_dir / "metrics.json").read_text())["accuracy_by"]
    assert (ours["sum"], ours["norm"]) == (got["acc,none"], got["acc_norm,none"])
