"""``bmoe-cli -p`` on the default model (SmolLM2): as llama.cpp's CLI, stdout holds the answer alone
and stderr the perf summary and BMOE_DONE; ``--json`` puts the BMOE_DONE object alone on stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROMPT = "Name three colors of the rainbow."
# no -m: the default model, SmolLM2-135M-Instruct; greedy (the default temperature), 8 tokens
CLI = [sys.executable, "-m", "bmoe.cli.main", "-p", PROMPT, "-n", "8", "-c", "256", "-t", "1"]
ENV = {**os.environ, "PYTHONIOENCODING": "utf-8"}


def _run(*extra: str) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(CLI + list(extra), capture_output=True, text=True, encoding="utf-8", env=ENV, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p


def _done(stderr: str) -> dict:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("BMOE_")]
    assert len(lines) == 1 and lines[0].startswith("BMOE_DONE "), stderr[-2000:]
    return json.loads(lines[0].removeprefix("BMOE_DONE "))


def test_stdout_is_the_answer_alone_and_json_is_one_done_object() -> None:
    plain = _run()
    done = _done(plain.stderr)
    assert done["tokens"] > 0 and done["text"].strip()
    assert plain.stdout == done["text"] + "\n"  # the answer, streamed, and one newline: nothing else
    assert "bmoe-cli: no -m given, using the default model" in plain.stderr
    summary = f"\ngeneration: {done['tokens']} tokens in "
    assert "\nprefill: " in plain.stderr and summary in plain.stderr  # the perf summary
    assert not any(ln.startswith("BMOE_") for ln in plain.stdout.splitlines())

    as_json = _run("--json")
    assert as_json.stdout.endswith("\n") and as_json.stdout.count("\n") == 1
    obj = json.loads(as_json.stdout)
    assert obj["text"] == plain.stdout.removesuffix("\n") and obj["tokens"] == done["tokens"]
    assert obj.keys() == done.keys()
    assert summary in as_json.stderr and "BMOE_DONE" not in as_json.stderr


def test_progress_lines_go_to_stderr_and_the_answer_to_stdout() -> None:
    p = _run("--progress")
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("BMOE_")]
    assert lines[-1].startswith("BMOE_DONE ") and any(ln.startswith("BMOE_PROGRESS ") for ln in lines)
    assert p.stdout == json.loads(lines[-1].removeprefix("BMOE_DONE "))["text"] + "\n"
