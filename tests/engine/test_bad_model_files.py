"""Every model file a user can get wrong ends in one line that names it, exit 1, no traceback.

Each bad file goes to bmoe-cli one-shot, bmoe-cli --session and bmoe-server, resident and with
--moe-stream, as real subprocesses: what a user sees is the process's exit code, its stderr's last
line and (--session) its stdout, so nothing here calls main() in-process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from bmoe.stream import read_layout
from bmoe.stream.layout import read_header

TIMEOUT_S = 120
MODES = (("bmoe-cli", False), ("bmoe-cli", True), ("bmoe-server", False))  # (prog, --session)

# name -> does a --moe-stream open get as far as writing the dense twin? Only for the file whose
# layout is sound and that llama.cpp then refuses; every other one must be refused before.
CASES = {
    "missing": False,
    "directory": False,
    "empty": False,
    "text": False,
    "bad_magic": False,
    "cut_in_header": False,
    "cut_in_tensor_data": False,
    "cut_in_last_expert": False,
    "refused_by_llama_cpp": True,
}


@pytest.fixture(scope="module")
def bad_files(tiny_models, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    good = tiny_models("qwen3moe", "q8_0")
    data = good.read_bytes()
    layout = read_layout(good)
    data_start = min(t.offset for t in read_header(good).tensors)
    last = max(layout.experts, key=lambda t: t.offset)
    assert last.offset + last.nbytes == len(data)  # the last expert tensor ends the file

    d = tmp_path_factory.mktemp("bad_models")
    files = {name: d / name / "model.gguf" for name in CASES}
    for f in files.values():
        f.parent.mkdir()
    files["directory"].mkdir()
    files["empty"].write_bytes(b"")
    files["text"] = files["text"].with_name("x.gguf")
    files["text"].write_text("this is not a model\n")
    files["bad_magic"].write_bytes(bytes([data[0] ^ 0x01]) + data[1:])

    cuts = {
        "cut_in_header": data_start // 2,  # inside the metadata (the vocabulary)
        "cut_in_tensor_data": (data_start + len(data)) // 2,
        "cut_in_last_expert": last.offset + last.nbytes // 2,
    }
    assert cuts["cut_in_header"] > 1024 and data_start < cuts["cut_in_tensor_data"] < last.offset
    for name, n in cuts.items():
        files[name].write_bytes(data[:n])
    # Sound layout, but llama.cpp misses a hyperparameter: with --moe-stream, llama.cpp refuses
    # the dense twin, and the message must still name the user's file.
    key = b"qwen3moe.block_count"
    assert data.count(key) == 1
    files["refused_by_llama_cpp"].write_bytes(data.replace(key, b"qwen3moe.block_cOunt"))
    return files


@dataclass(frozen=True)
class Run:
    prog: str  # "bmoe-cli" or "bmoe-server"
    session: bool
    stream: bool
    cache: Path  # this run's --twin-dir (and $BMOE_CACHE_DIR)
    rc: int
    stdout: str
    stderr: str

    @property
    def label(self) -> str:
        mode = "--session" if self.session else "-p" if self.prog == "bmoe-cli" else "serve"
        return f"{self.prog} {mode}{' --moe-stream' if self.stream else ''}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(model: Path, prog: str, session: bool, stream: bool, cache: Path) -> Run:
    if prog == "bmoe-cli":
        argv = [sys.executable, "-m", "bmoe.cli", "-m", str(model)]
        argv += ["--session"] if session else ["-p", "hi", "-n", "2"]
    else:
        argv = [sys.executable, "-m", "bmoe.server", "-m", str(model), "--port", str(_free_port())]
    if stream:
        argv += ["--moe-stream", "--twin-dir", str(cache)]
    env = {**os.environ, "BMOE_CACHE_DIR": str(cache)}
    env.pop("BMOE_LLAMA_LOG", None)
    p = subprocess.run(
        argv, input='{"cmd":"close"}\n' if session else "", capture_output=True, text=True, timeout=TIMEOUT_S, env=env
    )
    return Run(prog, session, stream, cache, p.returncode, p.stdout, p.stderr)


def _problems(run: Run, model: Path) -> list[str]:
    out: list[str] = []
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if run.rc != 1:
        out.append(f"exit code {run.rc}, expected 1")
    if "Traceback" in run.stderr:
        out.append("a traceback on stderr")
    if not last.startswith(f"{run.prog}: "):
        out.append(f"the last stderr line does not start with '{run.prog}: '")
    if str(model) not in last:
        out.append("the last stderr line does not name the model file")
    if str(run.cache) in last:
        out.append("the last stderr line names the twin cache, not the user's file")
    if run.session:
        records = [ln for ln in run.stdout.splitlines() if ln.strip()]
        if len(records) != 1 or not records[0].startswith("BMOE_ERROR {"):
            out.append(f"stdout is not exactly one BMOE_ERROR line: {run.stdout!r}")
        else:
            rec = json.loads(records[0].removeprefix("BMOE_ERROR "))
            if rec.get("fatal") is not True or str(model) not in rec.get("msg", ""):
                out.append(f"the BMOE_ERROR record is not fatal or does not name the file: {rec}")
    elif run.stdout.strip():
        out.append(f"stdout is not empty: {run.stdout!r}")
    return [f"{run.label}: {p}\n    stderr: {run.stderr.strip()!r}" for p in out]


@pytest.mark.slow  # 54 processes of ~0.4 s CPU each: 15-40 s on 2 cores, with the fixture
@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_model_file_ends_in_one_line_naming_it(case: str, bad_files: dict[str, Path], tmp_path: Path) -> None:
    model = bad_files[case]
    modes = [(prog, session, stream) for prog, session in MODES for stream in (False, True)]
    jobs = [(*mode, tmp_path / f"cache-{i}") for i, mode in enumerate(modes)]
    with ThreadPoolExecutor(3) as pool:  # the runs only fail to start: ~0.5 s of CPU each
        runs = list(pool.map(lambda job: _run(model, *job), jobs))
    problems = [p for run in runs for p in _problems(run, model)]
    assert not problems, "\n".join(problems)
    for run in runs:
        if run.stream and not CASES[case]:  # refused before a twin (or its folder) was begun
            begun = list(run.cache.rglob("*")) if run.cache.exists() else []
            assert not begun, f"{run.label}: a dense twin was begun for {case}: {begun}"
        elif run.stream:
            assert list(run.cache.rglob("*.gguf")), f"{run.label}: expected llama.cpp to be handed a dense twin"


@pytest.mark.parametrize("case", ["empty", "bad_magic", "cut_in_last_expert", "refused_by_llama_cpp"])
def test_a_stand_in_file_that_llama_cpp_cannot_load_is_reported_as_the_users(
    case: str, bad_files: dict[str, Path], tmp_path: Path
) -> None:
    # What a dense twin is to LlamaModel: the file it opens stands in for the one the user named.
    from bmoe.llama.model import LlamaModel, ModelLoadError, ModelLoadParams

    stand_in = tmp_path / "twins" / "model-0123456789abcdef" / "model.gguf"
    stand_in.parent.mkdir(parents=True)
    stand_in.write_bytes(bad_files[case].read_bytes())
    user = tmp_path / "mine.gguf"
    with pytest.raises(ModelLoadError) as e:
        LlamaModel(ModelLoadParams(path=stand_in, user_path=user))
    assert str(e.value).startswith("model: ") and str(user) in str(e.value)
    assert str(stand_in.parent) not in str(e.value)


def test_stream_setup_errors_name_the_users_file(tmp_path: Path) -> None:
    import gguf
    import numpy as np

    from bmoe.config import SessionConfig
    from bmoe.errors import ModelFileError
    from bmoe.runtime.expert_streaming import StreamSetupError, open_streaming

    path = tmp_path / "mystery.gguf"
    w = gguf.GGUFWriter(str(path), "mystery-moe")
    w.add_uint32("mystery-moe.expert_used_count", 2)
    w.add_tensor("blk.0.ffn_up_exps.weight", np.zeros((4, 2, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    config = SessionConfig(model=path, moe_stream=True, twin_dir=tmp_path / "twins")
    with pytest.raises(StreamSetupError, match=rf"^--moe-stream: {path}: .*architecture 'mystery-moe'") as e:
        open_streaming(config)
    assert isinstance(e.value, ModelFileError)  # the file's fault, as architecture.md's error root says
    path.write_bytes(path.read_bytes()[:-100])  # a message that names the file already is kept as is
    with pytest.raises(StreamSetupError, match=rf"^--moe-stream: GGUF {path} is truncated or damaged: ") as e:
        open_streaming(config)
    assert isinstance(e.value, ModelFileError)
    assert not (tmp_path / "twins").exists()
