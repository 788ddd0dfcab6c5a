"""One-shot mode: answer one prompt. As llama.cpp's CLI: the answer alone on stdout (so
``bmoe-cli -p ... > answer.txt`` holds just the answer), everything else on stderr."""

from __future__ import annotations

from typing import TextIO

from bmoe.session import GenerateRequest, Session
from bmoe.wire import records


def run_oneshot(
    session: Session, prompt: str, *, progress: bool, out: TextIO, err: TextIO, as_json: bool = False
) -> int:
    """Generate one answer. ``out`` gets the answer text, streamed token by token and ended by one
    newline, or with ``as_json`` only one line, the BMOE_DONE object (its ``text`` is the answer).
    ``err`` gets the BMOE_LOAD/BMOE_PROGRESS lines of ``progress``, the perf summary for people
    and, without ``as_json``, the BMOE_DONE line. With ``progress`` the answer is written to ``out``
    when the generation ends (the progress lines carry each token's ``delta_text``), so that on a
    terminal the text does not run into them."""
    steps = session.config.n_predict
    stream_text = not (progress or as_json)

    def on_step(step) -> None:
        if progress:
            err.writelines(ln + "\n" for ln in records.step_lines(step, steps, session.dense_resident_frac()))
            err.flush()
        if stream_text:
            out.write(step.delta_text)
            out.flush()

    result = session.generate(GenerateRequest(prompt=prompt), on_step=on_step)
    if as_json:
        out.write(records.json_object(records.done_fields(result)) + "\n")
    else:
        out.write(("" if stream_text else result.text) + "\n")
    out.flush()
    err.write("\n" + records.summary(result) + "\n")
    if not as_json:
        err.write(records.done(result) + "\n")
    err.flush()
    return 0
