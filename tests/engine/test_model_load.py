"""LlamaModel once llama.cpp has loaded the file: a step after the load that fails frees the
model (its weights, anonymous ones included, are the size of the model's dense part) and ends in
one line that names the user's file, never the stand-in (a dense twin) llama.cpp loaded."""

from __future__ import annotations

import llama_cpp
import pytest

from bmoe.errors import BmoeError
from bmoe.llama import model as model_mod
from bmoe.llama.dense_anon import DenseAnonError
from bmoe.llama.model import LlamaModel, ModelLoadError, ModelLoadParams


@pytest.fixture()
def loads_and_frees(monkeypatch) -> tuple[list[int], list[int]]:
    """(pointers llama.cpp loaded, pointers freed): both calls still go through."""
    loaded: list[int] = []
    freed: list[int] = []
    load, free = llama_cpp.llama_model_load_from_file, llama_cpp.llama_model_free

    def _load(path, params):
        ptr = load(path, params)
        loaded.append(ptr)
        return ptr

    def _free(ptr):
        freed.append(ptr)
        return free(ptr)

    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", _load)
    monkeypatch.setattr(llama_cpp, "llama_model_free", _free)
    return loaded, freed


@pytest.mark.parametrize(
    "step, error, kind",
    [
        ("drop_unused", FileNotFoundError(2, "No such file or directory"), ModelLoadError),
        (
            "AnonDense.move",
            DenseAnonError("dense_weights: anon: moving 4096 bytes ... failed; use mmap"),
            DenseAnonError,
        ),
    ],
)
def test_a_failure_after_the_load_frees_the_model_and_names_the_users_file(
    step, error, kind, loads_and_frees, tiny_models, tmp_path, monkeypatch
) -> None:
    loaded, freed = loads_and_frees
    path = tiny_models("lfm2moe", "q4_k_m")
    if isinstance(error, OSError):
        error.filename = str(path)  # as os.open(<twin>) would name it

    def fail(*args, **kwargs):
        raise error

    if step == "drop_unused":
        monkeypatch.setattr(model_mod, "drop_unused", fail)
    else:
        monkeypatch.setattr(model_mod.AnonDense, "move", fail)
    user = tmp_path / "mine.gguf"
    ranges = ((path, ((0, 4096),)),)
    with pytest.raises(kind) as e:
        LlamaModel(ModelLoadParams(path=path, user_path=user, anon_ranges=ranges, unused_ranges=ranges))
    assert isinstance(e.value, BmoeError)
    assert len(loaded) == 1 and loaded[0] and freed == loaded
    if kind is ModelLoadError:
        assert str(e.value) == (
            f"model: setting up {user} failed after llama.cpp loaded it (No such file or directory)"
        )
        assert str(path) not in str(e.value)


def test_a_model_that_loads_is_freed_once_by_close(loads_and_frees, tiny_models) -> None:
    loaded, freed = loads_and_frees
    m = LlamaModel(ModelLoadParams(path=tiny_models("lfm2moe", "q4_k_m")))
    assert m.n_vocab > 0 and not freed
    m.close()
    m.close()
    assert freed == loaded


def test_a_twin_removed_before_the_load_is_named_as_such(tmp_path) -> None:  # noqa: ANN001
    # The user's file is there; the dense twin llama.cpp was to load went (another process's
    # --gc-twins) between its writing and the load: "file not found: <user's file>" would be wrong.
    user = tmp_path / "model.gguf"
    user.write_bytes(b"GGUF")
    twin = tmp_path / "twins" / "model.gguf"
    with pytest.raises(
        ModelLoadError,
        match=rf"^model: the dense twin of {user} was removed while the session "
        r"opened \(--gc-twins in another process\?\); open it again$",
    ):
        model_mod.refuse_early(twin, user)
    user.unlink()  # both gone: the user's file is what is missing
    with pytest.raises(ModelLoadError, match=rf"^model: file not found: {user}$"):
        model_mod.refuse_early(twin, user)
