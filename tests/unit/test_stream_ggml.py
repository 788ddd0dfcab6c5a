"""The ctypes ggml_tensor view against libggml-base, and the refusal when it does not match."""

from __future__ import annotations

import ctypes

import pytest

from bmoe.llama import ggml_tensor as gt  # noqa: E402


def test_self_check_passes_on_the_pinned_library() -> None:
    g = gt.self_check()
    assert ctypes.sizeof(gt.GgmlTensor) == g.lib.ggml_tensor_overhead() - gt.GGML_OBJECT_SIZE
    assert (gt.NAME_OFFSET, gt.DATA_OFFSET) == (256, 248)


def test_uses_the_instance_llama_cpp_loaded() -> None:
    g = gt.GgmlBase()
    maps = [line.split()[-1] for line in open("/proc/self/maps") if "libggml-base" in line]
    assert len(set(maps)) == 1  # no second copy mapped (lib/libggml-base.so is a separate file)
    assert g.lib._name.startswith("libggml-base.so")


def _swapped(a: str, b: str) -> type[ctypes.Structure]:
    fields = list(gt.GgmlTensor._fields_)
    names = [f[0] for f in fields]
    i, j = names.index(a), names.index(b)
    fields[i], fields[j] = fields[j], fields[i]
    return type("Swapped", (ctypes.Structure,), {"_fields_": fields})


@pytest.mark.parametrize("a,b", [("data", "view_offs"), ("view_src", "data")])
def test_a_wrong_layout_of_the_same_size_refuses_streaming(monkeypatch: pytest.MonkeyPatch, a: str, b: str) -> None:
    monkeypatch.setattr(gt, "GgmlTensor", _swapped(a, b))
    with pytest.raises(gt.GgmlLayoutError, match=r"llama-cpp-python 0\.3\.36.*--moe-stream is refused"):
        gt.self_check()


def test_a_wrong_size_refuses_streaming(monkeypatch: pytest.MonkeyPatch) -> None:
    fields = [f for f in gt.GgmlTensor._fields_ if f[0] != "view_offs"]
    monkeypatch.setattr(gt, "GgmlTensor", type("Short", (ctypes.Structure,), {"_fields_": fields}))
    with pytest.raises(gt.GgmlLayoutError, match=r"sizeof\(ggml_tensor\) is 336, the view has 328"):
        gt.self_check()
