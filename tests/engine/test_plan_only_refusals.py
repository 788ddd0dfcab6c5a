"""--plan-only refuses what opening refuses, with the same line (docs/plan.md): a bad model file
(#38.8) and a setting the file does not allow (#38.9), both from the one check opening runs
(bmoe.runtime.opening.check_opening); and it takes no prompt and no session."""

from __future__ import annotations

from pathlib import Path

import pytest

from bmoe.cli.main import main
from bmoe.stream import read_layout
from bmoe.stream.layout import read_header


@pytest.fixture(scope="module")
def bad_files(tiny_models, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """name -> (file, the line after 'bmoe-cli: ' that both opening and --plan-only print)."""
    good = tiny_models("qwen3moe", "q8_0")
    data = good.read_bytes()
    start = min(t.offset for t in read_header(good).tensors)
    last = max(read_layout(good).experts, key=lambda t: t.offset)
    d = tmp_path_factory.mktemp("plan_bad")
    files = {
        n: d / f"{n}.gguf"
        for n in (
            "empty",
            "text",
            "cut_in_header",
            "cut_in_tensor_data",
            "cut_in_last_expert",
            "old_version",
            "folder",
            "missing",
        )
    }
    files["empty"].write_bytes(b"")
    files["text"].write_text("this is not a model\n")
    files["cut_in_header"].write_bytes(data[: start // 2])
    cut_data = (start + len(data)) // 2
    files["cut_in_tensor_data"].write_bytes(data[:cut_data])
    cut_last = last.offset + last.nbytes // 2
    files["cut_in_last_expert"].write_bytes(data[:cut_last])
    files["old_version"].write_bytes(b"GGUF" + b"\0" * 12)
    files["folder"].mkdir()
    first_cut = min((t for t in read_header(good).tensors if t.offset + t.nbytes > cut_data), key=lambda t: t.offset)
    f = files
    return {
        "empty": (f["empty"], f"model: {f['empty']} is empty (0 bytes), not a GGUF model"),
        "text": (f["text"], f"model: {f['text']} is not a GGUF file (it does not start with the bytes 'GGUF')"),
        "cut_in_header": (
            f["cut_in_header"],
            f"model: cannot read GGUF {f['cut_in_header']}: the header runs past "
            f"the end of the file ({start // 2} bytes): the file is truncated or damaged",
        ),
        "cut_in_tensor_data": (
            f["cut_in_tensor_data"],
            f"model: GGUF {f['cut_in_tensor_data']} is truncated or damaged: "
            f"tensor {first_cut.name} needs bytes {first_cut.offset}..{first_cut.offset + first_cut.nbytes} "
            f"but the file has {cut_data} bytes",
        ),
        "cut_in_last_expert": (
            f["cut_in_last_expert"],
            f"model: GGUF {f['cut_in_last_expert']} is truncated or damaged: "
            f"tensor {last.name} needs bytes {last.offset}..{last.offset + last.nbytes} but the file "
            f"has {cut_last} bytes",
        ),
        "old_version": (
            f["old_version"],
            f"model: cannot read GGUF {f['old_version']}: GGUF version 0 is not supported",
        ),
        "folder": (f["folder"], f"model: {f['folder']} is a folder, not a .gguf file"),
        "missing": (f["missing"], f"model: file not found: {f['missing']}"),
    }


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    return rc, out, lines[-1] if lines else ""


@pytest.mark.parametrize(
    "case",
    ["empty", "text", "cut_in_header", "cut_in_tensor_data", "cut_in_last_expert", "old_version", "folder", "missing"],
)
def test_a_bad_model_file_is_refused_as_opening_refuses_it(case: str, bad_files, capsys, tmp_path: Path) -> None:
    path, line = bad_files[case]
    assert _run(["-m", str(path), "--plan-only"], capsys) == (1, "", f"bmoe-cli: {line}")
    # opening, resident and streamed, says the same (streamed: before any dense twin is begun)
    assert _run(["-m", str(path), "-p", "hi", "-n", "1"], capsys) == (1, "", f"bmoe-cli: {line}")
    twins = tmp_path / "twins"
    assert _run(["-m", str(path), "--moe-stream", "--twin-dir", str(twins), "-p", "hi"], capsys) == (
        1,
        "",
        f"bmoe-cli: {line}",
    )
    assert not twins.exists()


def test_settings_the_file_does_not_allow_are_refused_as_opening_refuses_them(tiny_models, capsys) -> None:
    from bmoe.config import default_model

    moe, dense = tiny_models("qwen3moe", "q8_0"), default_model()
    cases = [
        (
            ["-m", str(moe), "--n-expert-used", "99"],
            "bmoe-cli: --n-expert-used (n_expert_used): 99 is more than the model's 16 experts (qwen3moe.expert_count)",
        ),
        (
            ["-m", str(dense), "--moe-stream"],
            f"bmoe-cli: --moe-stream: {dense} (llama) has no expert tensors: it is a dense model and there is nothing "
            "to stream; run it without --moe-stream",
        ),
        (
            ["-m", str(dense), "--n-expert-used", "1"],
            "bmoe-cli: --n-expert-used (n_expert_used): the model has no experts (llama.expert_count is not set): it is "
            "a dense model, with no experts per token to change",
        ),
        (
            ["-m", str(moe), "--moe-stream", "--cache-mb", "1"],
            f"bmoe-cli: --moe-stream: {moe}: cache_mb: 1 is below the floor of 2 MiB, one token's routed "
            "experts (4 layers x 2 experts x 0.20 MiB); a smaller cache only churns. Give 2 or more, 0 (cache off), "
            "or set cache_force",
        ),
    ]
    for argv, line in cases:
        rc, out, last = _run([*argv, "--plan-only"], capsys)
        assert (rc, out, last) == (1, "", line), argv
        assert _run([*argv, "-p", "hi", "-n", "1"], capsys)[2] == line, argv  # opening's own line


@pytest.mark.parametrize(
    "flags, named",
    [
        (["-p", "hi"], "-p/--prompt"),
        (["--session"], "--session"),
        (["--json"], "--json"),
        (["--progress"], "--progress"),
    ],
)
def test_plan_only_takes_no_prompt_and_no_session(flags: list[str], named: str, tiny_models, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["-m", str(tiny_models("qwen3moe", "q8_0")), "--plan-only", *flags])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == ""
    assert err.splitlines()[-1] == (
        f"bmoe-cli: error: argument --plan-only: not allowed with argument {named} (it prints the plan and exits)"
    )
