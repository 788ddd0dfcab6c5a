"""bench/synthetic_mmproj.py's synthetic projector and bench/images.py's measurement, on small
shapes: the file is the same bytes every time it is written, has the qwen3vl tower's tensors (no
DeepStack), and a session over a small synthetic qwen3moe of the same width encodes an image into
the tokens its size makes and prefills them, resident and streamed."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import gguf  # noqa: E402
import images as bench_images  # noqa: E402
import synthetic_mmproj as smp  # noqa: E402
import synthetic_moe as sm  # noqa: E402

LM = sm.SyntheticSpec(
    n_layer=2,
    n_embd=128,
    n_head=2,
    n_head_kv=1,
    head_dim=64,
    n_expert=16,
    n_expert_used=4,
    n_ff_exp=64,
    label="imgtest",
)
VISION = smp.VisionSpec(depth=2, n_embd=64, n_head=2, n_ff=128, n_pos_embd=64, out_dim=LM.n_embd)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("bench-images")
    return sm.write_synthetic(work, LM), smp.write_mmproj(work, VISION)


def test_real_defaults_are_qwen3_vl_30b_a3b_vision_tower_into_the_bench_model() -> None:
    s = smp.VisionSpec()
    assert (s.depth, s.n_embd, s.n_head, s.n_ff, s.patch_size, s.merge, s.n_pos_embd) == (
        27,
        1152,
        16,
        4304,
        16,
        2,
        2304,
    )
    assert s.out_dim == sm.SyntheticSpec().n_embd == 2048
    assert s.image_size == 768
    assert [s.n_tokens(w, w) for w in (256, 512, 1024)] == [64, 256, 1024]
    with pytest.raises(ValueError, match="multiples of 32"):
        s.n_tokens(100, 64)


def test_two_writes_give_the_same_bytes_and_a_current_file_is_reused(tmp_path: Path, models: tuple[Path, Path]) -> None:
    again = smp.write_mmproj(tmp_path, VISION)
    assert again.name == models[1].name == "mmproj-synthetic-qwen3vl-2x64-to128-f16.gguf"
    assert again.read_bytes() == models[1].read_bytes()
    mtime = again.stat().st_mtime_ns
    assert smp.write_mmproj(tmp_path, VISION) == again and again.stat().st_mtime_ns == mtime
    other = smp.write_mmproj(tmp_path / "seed", dataclasses.replace(VISION, seed=31))
    assert other.read_bytes() != again.read_bytes()


def test_file_holds_the_qwen3vl_tower_without_deepstack(models: tuple[Path, Path]) -> None:
    r = gguf.GGUFReader(models[1])
    assert r.fields["clip.projector_type"].contents() == "qwen3vl_merger"
    assert r.fields["clip.vision.block_count"].contents() == VISION.depth
    assert r.fields["clip.vision.projection_dim"].contents() == LM.n_embd
    t = {x.name: x for x in r.tensors}
    assert len(t) == 4 + 12 * VISION.depth + 6
    assert not [n for n in t if "deepstack" in n]
    d, merged = VISION.n_embd, 4 * VISION.n_embd
    assert list(t["v.blk.1.attn_qkv.weight"].shape) == [d, 3 * d]  # ggml order
    assert list(t["v.blk.0.ffn_down.weight"].shape) == [VISION.n_ff, d]
    assert list(t["mm.0.weight"].shape) == [merged, merged]
    assert list(t["mm.2.weight"].shape) == [merged, LM.n_embd]
    assert t["mm.2.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert t["v.position_embd.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert np.array_equal(np.asarray(t["mm.0.bias"].data), smp.tensor_data(VISION, smp.tensor_plan(VISION)[-3]))


def test_a_session_encodes_an_image_into_the_tokens_its_size_makes(models: tuple[Path, Path]) -> None:
    from bmoe.config import SessionConfig
    from bmoe.session import Session
    from bmoe.testing import png_bytes

    model, mmproj = models
    with Session(
        SessionConfig(model=model, mmproj=mmproj, chat="chatml", decide=True, n_ctx=512, n_threads=2, plan="off")
    ) as s:
        projector = s.runtime.images.projector
        assert not projector.mrope  # a qwen3moe: one position per image token
        for w, h in ((128, 96), (256, 192)):
            image = projector.load(png_bytes(w, h, seed=3), f"{w}x{h}.png")
            assert (image.n_tokens, image.n_pos) == (VISION.n_tokens(w, h),) * 2 == ((w // 32) * (h // 32),) * 2
            embd = projector.encode(image)
            assert embd.shape == (image.n_tokens, LM.n_embd) and np.isfinite(embd).all()


def test_a_projector_of_another_width_is_refused(tmp_path: Path, models: tuple[Path, Path]) -> None:
    from bmoe.config import SessionConfig
    from bmoe.llama.mtmd import ProjectorError
    from bmoe.session import Session

    narrow = smp.write_mmproj(tmp_path, dataclasses.replace(VISION, out_dim=64))
    with pytest.raises(ProjectorError, match="does not match"):
        Session(SessionConfig(model=models[0], mmproj=narrow, chat="chatml", n_ctx=256, n_threads=2, plan="off"))


def test_the_bench_measures_encode_and_prefill_of_every_image_resident_and_streamed(
    tmp_path: Path, models: tuple[Path, Path]
) -> None:
    from bmoe.stream import read_layout
    from bmoe.testing import write_png

    model, mmproj = models
    images = [
        ("128x96", write_png(tmp_path / "a.png", 128, 96, seed=5)),
        ("64x256", write_png(tmp_path / "b.png", 64, 256, seed=6)),
    ]
    # (these experts are under 1 MiB, so the 30% cache rounds to --cache-mb 0 here: the mode's path, not its cache)
    modes = bench_images.bench_modes(read_layout(model).expert_nbytes, 30, 2, tmp_path / "twins")
    assert list(modes) == ["resident", "streamed, cache off, read-ahead", "streamed, cache 30%, read-ahead"]
    assert modes["streamed, cache off, read-ahead"]["prefetch"] is True
    for name, mode in modes.items():
        out = bench_images.measure(model, mmproj, images, mode, threads=2, n_ctx=512)
        assert {size: t["n_tokens"] for size, t in out.items()} == {"128x96": 12, "64x256": 16}, name
        assert all(t["encode_s"] > 0 and t["prefill_s"] > 0 for t in out.values())
