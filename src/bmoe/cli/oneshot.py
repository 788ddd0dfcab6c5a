"""One-shot mode: answer one prompt, print the answer and a perf summary for people."""
from __future__ import annotations

from typing import TextIO

from bmoe.session import GenerateRequest, Session
from bmoe.wire import records as telemetry


def run_oneshot(session: Session, prompt: str, *, progress: bool, out: TextIO) -> int:
    steps = session.config.n_predict

    def on_step(step) -> None:
        if progress:
            out.writelines(ln + "\n" for ln in telemetry.step_lines(step, steps, session.dense_resident_frac()))
        else:
            out.write(step.delta_text)
        out.flush()

    result = session.generate(GenerateRequest(prompt=prompt), on_step=on_step)
    if progress:
        out.write(result.text)
    out.write("\n\n" + telemetry.summary(result) + "\n")
    out.write(telemetry.done(result) + "\n")
    out.flush()
    return 0
