"""Dense twins: one per source file, written atomically, stale ones removed, garbage collected,
and rewritten when the source's bytes changed in place (issue #12 item 4)."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from bmoe.stream import read_layout
from bmoe.stream import twin as twin_mod
from bmoe.stream.twin import dense_ranges, dense_twin


def _copy(tiny_models, tmp_path: Path, name: str) -> Path:  # noqa: ANN001
    path = tmp_path / "models" / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(tiny_models("qwen3moe", "q8_0").read_bytes())
    return path


def _twins(cache: Path) -> list[Path]:
    """The twin folders in the cache (temporary folders start with a dot)."""
    return sorted(d for d in cache.iterdir() if d.is_dir() and not d.name.startswith("."))


def _touch_mtime(path: Path, delta_ns: int = 10**9) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + delta_ns))


def _dense_bytes_equal(twin: Path, model: Path) -> bool:
    layout = read_layout(model)
    src, dst = model.read_bytes(), twin.read_bytes()
    return all(src[a:b] == dst[a:b] for a, b in dense_ranges(layout, 0))


def test_a_new_twin_of_a_path_removes_its_stale_twins(tiny_models, tmp_path: Path) -> None:
    a, b = _copy(tiny_models, tmp_path, "a.gguf"), _copy(tiny_models, tmp_path, "b.gguf")
    cache = tmp_path / "twins"
    old_a = dense_twin(read_layout(a), cache)
    twin_b = dense_twin(read_layout(b), cache)
    assert len(_twins(cache)) == 2
    _touch_mtime(a)  # a new identity of a.gguf: its twin is stale
    new_a = dense_twin(read_layout(a), cache)
    assert new_a.parent != old_a.parent
    assert _twins(cache) == sorted([new_a.parent, twin_b.parent])  # a's stale twin is gone, b's stays
    assert dense_twin(read_layout(b), cache) == twin_b


def test_two_writers_of_the_same_twin_at_once_both_get_a_whole_twin(tiny_models, tmp_path: Path, monkeypatch) -> None:
    """Two processes opening the same model for the first time at once: the first is held in the
    middle of its copy while the second writes the whole twin; both must end with one whole twin."""
    model = _copy(tiny_models, tmp_path, "m.gguf")
    layout, cache = read_layout(model), tmp_path / "twins"
    copy, held, go, first = twin_mod._copy, threading.Event(), threading.Event(), []

    def slow_copy(*args):  # noqa: ANN002, ANN202
        if not first:
            first.append(threading.get_ident())
        if first[0] == threading.get_ident() and not go.is_set():
            held.set()
            go.wait(60)
        return copy(*args)

    monkeypatch.setattr(twin_mod, "_copy", slow_copy)
    results: dict[str, object] = {}

    def write(who: str) -> None:
        try:
            results[who] = dense_twin(layout, cache)
        except Exception as e:  # noqa: BLE001 - the assertion below shows it
            results[who] = e

    t = threading.Thread(target=write, args=("first",))
    t.start()
    assert held.wait(60)
    write("second")  # runs to the end while the first is held inside its copy
    go.set()
    t.join(60)
    assert isinstance(results["first"], Path) and results["first"] == results["second"], results
    assert _twins(cache) == [results["second"].parent]
    assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []  # no temporary left behind
    assert _dense_bytes_equal(results["first"], model)


def test_a_twin_of_a_file_overwritten_in_place_is_rewritten(tiny_models, tmp_path: Path) -> None:
    """Same size, mtime and inode, other bytes: the content sample recorded with the twin differs,
    so the next open writes a new twin instead of loading stale dense weights."""
    model = _copy(tiny_models, tmp_path, "m.gguf")
    cache = tmp_path / "twins"
    first = dense_twin(read_layout(model), cache)
    (a1, b1), (a2, b2) = dense_ranges(read_layout(model), 0)[1:3]  # layer 1's and layer 2's dense tensors
    assert b1 - a1 == b2 - a2
    st = model.stat()
    with open(model, "r+b") as f:
        f.seek(a2)
        other = f.read(b2 - a2)
        f.seek(a1)
        f.write(other)  # layer 1's dense tensors now hold layer 2's bytes
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (model.stat().st_size, model.stat().st_mtime_ns, model.stat().st_ino) == (
        st.st_size,
        st.st_mtime_ns,
        st.st_ino,
    )
    again = dense_twin(read_layout(model), cache)
    assert _dense_bytes_equal(again, model)
    assert _twins(cache) == [again.parent] and first == again


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_gc_twins_removes_twins_whose_source_is_gone_or_changed(tiny_models, tmp_path: Path) -> None:
    from bmoe.stream.twin import gc_twins

    gone, changed, kept = (_copy(tiny_models, tmp_path, n) for n in ("gone.gguf", "changed.gguf", "kept.gguf"))
    cache = tmp_path / "twins"
    twins = {p.name: dense_twin(read_layout(p), cache).parent for p in (gone, changed, kept)}
    gone.unlink()
    _touch_mtime(changed)  # changed since its twin was written; no session opened it since
    unfinished = cache / f".{twins['kept.gguf'].name}.tmp-{_dead_pid()}-0123abcd"  # a writer that died
    unfinished.mkdir()
    (unfinished / "kept.gguf").write_bytes(b"half")
    stranger = cache / "notes.txt"  # not a twin: never touched
    stranger.write_text("mine")
    report = gc_twins(cache)
    why = {e.path: e.why for e in report.removed}
    assert set(why) == {twins["gone.gguf"], twins["changed.gguf"], unfinished}, why
    assert f"{gone} is gone" in why[twins["gone.gguf"]]
    assert f"{changed} changed" in why[twins["changed.gguf"]]
    assert [e.path for e in report.kept] == [twins["kept.gguf"]]
    assert _twins(cache) == [twins["kept.gguf"]] and stranger.read_text() == "mine"
    assert all(e.nbytes > 0 for e in report.removed if e.path != unfinished)
    assert gc_twins(cache).removed == ()  # nothing left to do


def test_gc_twins_budget_keeps_the_most_recently_used(tiny_models, tmp_path: Path) -> None:
    from bmoe.stream.twin import gc_twins

    models = [_copy(tiny_models, tmp_path, f"{n}.gguf") for n in ("a", "b", "c")]
    cache = tmp_path / "twins"
    twins = [dense_twin(read_layout(p), cache).parent for p in models]
    for i, d in enumerate(twins):  # a used longest ago, then b, then c
        os.utime(d / "twin.json", (1_000_000 + i, 1_000_000 + i))
    assert dense_twin(read_layout(models[0]), cache).parent == twins[0]  # a used again: now the newest
    one = gc_twins(cache).kept[0].nbytes
    report = gc_twins(cache, max_bytes=one + one // 2)
    assert [e.path for e in report.removed] == [twins[1], twins[2]]
    assert all("budget" in e.why for e in report.removed)
    assert _twins(cache) == [twins[0]]


def test_bmoe_cli_gc_twins_prints_what_it_removed_and_exits_0(tiny_models, tmp_path: Path, capsys) -> None:
    from bmoe.cli.main import main

    gone, kept = _copy(tiny_models, tmp_path, "gone.gguf"), _copy(tiny_models, tmp_path, "kept.gguf")
    cache = tmp_path / "twins"
    gone_twin = dense_twin(read_layout(gone), cache).parent
    kept_twin = dense_twin(read_layout(kept), cache).parent
    gone.unlink()
    assert main(["--gc-twins", "--twin-dir", str(cache)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"removed {gone_twin} (its source {gone} is gone, ")
    assert out[-1].startswith("bmoe-cli: --gc-twins: removed 1 twin (") and "kept 1 (" in out[-1]
    assert _twins(cache) == [kept_twin]
    assert main(["--gc-twins", "0", "--twin-dir", str(cache)]) == 0  # a budget of 0 MiB: all go
    assert _twins(cache) == []
    assert main(["--gc-twins", "--twin-dir", str(tmp_path / "none")]) == 0  # no cache yet: nothing to do
    assert "removed 0 twins" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["-1", "x"])
def test_bmoe_cli_gc_twins_refuses_a_bad_budget(bad: str, capsys) -> None:
    from bmoe.cli.main import main

    with pytest.raises(SystemExit) as e:
        main([f"--gc-twins={bad}"])
    assert e.value.code == 2 and "--gc-twins" in capsys.readouterr().err


def _legacy_twin(cache: Path, model: Path, key: str) -> Path:
    """A twin as bmoe wrote them before twin.json: a stamp per shard, no source path."""
    import json

    st = model.stat()
    d = cache / f"{model.stem}-{key}"
    d.mkdir(parents=True)
    (d / model.name).write_bytes(b"\0" * 64)
    (d / f"{model.name}.source.json").write_text(
        json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino, "device": st.st_dev})
    )
    return d


def test_twins_of_the_older_format_are_removed(tiny_models, tmp_path: Path) -> None:
    from bmoe.stream.twin import gc_twins

    mine, other = _copy(tiny_models, tmp_path, "mine.gguf"), _copy(tiny_models, tmp_path, "other.gguf")
    cache = tmp_path / "twins"
    _legacy_twin(cache, mine, "0" * 16)
    old_other = _legacy_twin(cache, other, "1" * 16)
    new = dense_twin(read_layout(mine), cache).parent  # the same inode as old_mine's stamp: it goes now
    assert _twins(cache) == sorted([new, old_other])
    report = gc_twins(cache)  # the other one's goes with the gc: format 1 is never read again
    assert [(e.path, e.why) for e in report.removed] == [
        (old_other, "written by an older bmoe (twin format 1), never used again")
    ]
    assert _twins(cache) == [new]


def test_bmoe_cli_gc_twins_names_a_folder_it_cannot_list(tmp_path: Path, capsys, monkeypatch) -> None:
    from bmoe.cli.main import main

    cache = tmp_path / "twins"
    cache.mkdir()

    def refuse(self):  # noqa: ANN001 - as an unreadable folder does for a user without the right (root can read any)
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "iterdir", refuse)
    assert main(["--gc-twins", "--twin-dir", str(cache)]) == 1
    assert capsys.readouterr().err == f"bmoe-cli: --gc-twins: cannot list the twins folder {cache}: Permission denied\n"


def test_a_folder_this_user_cannot_enter_is_left_alone(tiny_models, tmp_path: Path, monkeypatch) -> None:
    # Another user's twin (mode 0700) in a shared cache folder: its twin.json cannot even be
    # checked for (EACCES). Neither gc nor writing a twin of another model may fail on it.
    from bmoe.stream.twin import MANIFEST, gc_twins

    cache = tmp_path / "twins"
    theirs = cache / "theirs-0123456789abcdef"  # named like any twin
    theirs.mkdir(parents=True)
    real_exists = Path.exists

    def exists(self, *a, **kw):  # noqa: ANN001 - as the kernel answers a user without the right (root passes)
        if self.parent == theirs:
            raise PermissionError(13, "Permission denied", str(self))
        return real_exists(self, *a, **kw)

    monkeypatch.setattr(Path, "exists", exists)
    report = gc_twins(cache)
    assert report.removed == () and theirs.is_dir()
    model = _copy(tiny_models, tmp_path, "mine.gguf")
    twin = dense_twin(read_layout(model), cache)
    assert (twin.parent / MANIFEST).is_file() and theirs.is_dir()
