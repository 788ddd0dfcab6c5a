"""A dense twin of a GGUF: the same file with every expert byte range a hole, so that llama.cpp's
``MAP_POPULATE`` reads only the dense weights at open. Why, and where twins live and when they go:
docs/streaming.md, "What opening a streamed model reads" and "Dense twins".

One folder per source file (named after its path, size, mtime and inode) holds each shard's twin
and ``twin.json``. It is written into a folder unique to the process and renamed into place, so two
processes opening the same model cannot mix their writes; it is rewritten when the source's
content sample differs. ``gc_twins`` removes the twins of sources gone or changed, and the least
recently used over a size budget.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from bmoe.errors import BmoeError
from bmoe.stream.content import ContentSample, dense_ranges
from bmoe.stream.layout import FileId, ModelLayout

__all__ = [
    "FORMAT",
    "GcEntry",
    "GcReport",
    "Twin",
    "TwinError",
    "allocated_bytes",
    "default_twin_dir",
    "dense_ranges",
    "dense_twin",
    "gc_twins",
    "open_twin",
    "twin_dir",
]

_CHUNK = 8 << 20
FORMAT = 2  # 1: a "<shard>.source.json" stamp per shard, no content sample, no source path
MANIFEST = "twin.json"
_TEMP_RE = re.compile(r"^\..+\.(?:tmp|old)-(?P<pid>\d+)-[0-9a-f]+$")
_LEGACY_NAME_RE = re.compile(r"^.+-[0-9a-f]{16}$")
_TEMP_MAX_AGE_S = 24 * 3600  # a temporary folder this old is left over, whoever wrote it


class TwinError(BmoeError, OSError):
    """The dense twin could not be written (disk full, no sparse files, ...)."""


def default_twin_dir() -> Path:
    """Where twins are kept without ``--twin-dir``: $BMOE_CACHE_DIR/twins, else ~/.cache/bmoe/twins."""
    env = os.environ.get("BMOE_CACHE_DIR")
    return (Path(env) if env else Path.home() / ".cache" / "bmoe") / "twins"


def _source(f: FileId) -> dict[str, object]:
    return {"path": str(f.path.resolve()), "size": f.size, "mtime_ns": f.mtime_ns, "inode": f.inode, "device": f.device}


def _copy(src: int, dst: int, a: int, b: int) -> None:
    off = a
    while off < b:
        n = min(_CHUNK, b - off)
        try:
            done = os.copy_file_range(src, dst, n, off, off)
        except OSError:  # cross-device or unsupported: plain copy
            data = os.pread(src, n, off)
            done = os.pwrite(dst, data, off) if data else 0
        if done <= 0:
            raise TwinError(f"copying bytes {off}..{b} into the dense twin made no progress")
        off += done


def twin_dir(layout: ModelLayout, cache_dir: Path) -> Path:
    """The twin's folder: ``<stem>-<hash of the format and every shard's path, size, mtime, inode>``."""
    key = hashlib.sha256(json.dumps([FORMAT, [_source(f) for f in layout.files]]).encode()).hexdigest()[:16]
    return Path(cache_dir) / f"{layout.files[0].path.stem}-{key}"


@dataclass(frozen=True, slots=True)
class Twin:
    path: Path  # the first shard of the twin: what llama.cpp loads
    content: ContentSample  # the source's sample the twin was made from (and that it has now)
    written: bool  # written by this call (False: an existing twin was reused)


def _manifest(folder: Path) -> dict | None:
    try:
        m = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) else None


def _is_whole(folder: Path, layout: ModelLayout, content: ContentSample) -> bool:
    """Whether ``folder`` holds a finished twin of these sources with this content."""
    m = _manifest(folder)
    if m is None or m.get("format") != FORMAT or m.get("sources") != [_source(f) for f in layout.files]:
        return False
    if not content.matches_json(m.get("content")):
        return False
    try:
        return all((folder / f.path.name).stat().st_size == f.size for f in layout.files)
    except OSError:
        return False


def open_twin(layout: ModelLayout, cache_dir: Path, content: ContentSample | None = None) -> Twin:
    """The dense twin of ``layout``'s files, written now if there is none whose sources and content
    sample match the files as they are (``content``: their sample, taken now if not given)."""
    cache_dir = Path(cache_dir)
    if content is None:
        try:
            content = ContentSample.take(layout)
        except OSError as exc:
            raise TwinError(f"cannot sample {exc.filename or layout.files[0].path}: {exc.strerror or exc}") from exc
    final = twin_dir(layout, cache_dir)
    first = final / layout.files[0].path.name
    if _is_whole(final, layout, content):
        with contextlib.suppress(OSError):
            os.utime(final / MANIFEST)  # last used: what the gc budget keeps
        return Twin(first, content, written=False)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TwinError(f"cannot make the dense twin's folder {cache_dir}: {exc.strerror or exc}") from exc
    tmp = cache_dir / f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        tmp.mkdir()
        for idx, f in enumerate(layout.files):
            _write_shard(f, tmp / f.path.name, dense_ranges(layout, idx))
        manifest = {
            "format": FORMAT,
            "sources": [_source(f) for f in layout.files],
            "content": content.to_json(),
            "written_unix": time.time(),
        }
        _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
        _install(tmp, final, layout, content)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, TwinError):
            raise
        raise TwinError(f"cannot write the dense twin of {layout.files[0].path} in {cache_dir}: {exc}") from exc
    _remove_stale(cache_dir, final, layout)
    return Twin(first, content, written=True)


def dense_twin(layout: ModelLayout, cache_dir: Path) -> Path:
    """Path of the first shard of the dense twin (written now if missing or stale)."""
    return open_twin(layout, cache_dir).path


def _write_shard(f: FileId, dst: Path, ranges: list[tuple[int, int]]) -> None:
    src_fd = os.open(f.path, os.O_RDONLY)
    try:
        dst_fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(dst_fd, f.size)  # all holes; only the dense ranges get blocks
            for a, b in ranges:
                _copy(src_fd, dst_fd, a, b)
            os.fsync(dst_fd)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


def _write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _install(tmp: Path, final: Path, layout: ModelLayout, content: ContentSample) -> None:
    """Rename the finished ``tmp`` folder to ``final`` (one atomic rename). If another process
    installed a whole twin there first, use it; a stale one (other content) is moved aside."""
    for _ in range(4):
        try:
            os.rename(tmp, final)
            return
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        if _is_whole(final, layout, content):  # another process won: its twin is ours
            shutil.rmtree(tmp, ignore_errors=True)
            return
        trash = final.with_name(f".{final.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
        with contextlib.suppress(FileNotFoundError):
            os.rename(final, trash)  # a rename is atomic: a session that maps it keeps its pages
        shutil.rmtree(trash, ignore_errors=True)
    raise TwinError(f"cannot put the dense twin in place at {final}: other processes keep replacing it")


def _remove_stale(cache_dir: Path, keep: Path, layout: ModelLayout) -> None:
    """Remove the other twins of the same source path (its earlier identities), and twins of the
    older format made from this very file (they carry no path, but the same inode)."""
    path = str(layout.files[0].path.resolve())
    ident = (layout.files[0].device, layout.files[0].inode)
    try:
        folders = list(cache_dir.iterdir())
    except OSError:
        return
    for d in folders:
        if d == keep or d.name.startswith(".") or d.is_symlink() or not d.is_dir():
            continue
        m = _manifest(d)
        if m is not None:
            sources = m.get("sources")
            stale = (
                isinstance(sources, list)
                and bool(sources)
                and isinstance(sources[0], dict)
                and sources[0].get("path") == path
            )
        else:
            stale = ident in _legacy_idents(d)
        if stale:
            with contextlib.suppress(OSError):  # the new twin is in place either way
                _remove(d)


def _remove(folder: Path) -> None:
    """Rename aside first (atomic), then delete: a half-deleted folder never looks like a twin."""
    trash = folder.with_name(f".{folder.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.rename(folder, trash)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise TwinError(f"cannot remove the dense twin {folder}: {exc.strerror or exc}") from exc
    shutil.rmtree(trash, ignore_errors=True)


def _legacy_idents(folder: Path) -> set[tuple[int, int]]:
    """(device, inode) of each source of a format-1 twin; empty if ``folder`` is not one."""
    if not _LEGACY_NAME_RE.match(folder.name):
        return set()
    out = set()
    try:  # a folder this user cannot enter (another user's, 0700) is not ours: EACCES is "no"
        if (folder / MANIFEST).exists():
            return set()
        names = [p.name for p in folder.iterdir()]
        if not names or not all(n.endswith((".gguf", ".source.json", ".tmp")) for n in names):
            return set()
        for n in names:
            if n.endswith(".source.json"):
                s = json.loads((folder / n).read_text())
                out.add((int(s["device"]), int(s["inode"])))
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    return out


def allocated_bytes(path: Path) -> int:
    """Bytes the filesystem really holds for ``path`` (a sparse twin: about the dense bytes)."""
    return os.stat(path).st_blocks * 512


def _folder_bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for n in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, n)).st_blocks * 512
    return total


@dataclass(frozen=True, slots=True)
class GcEntry:
    path: Path  # a twin's folder (or a temporary one)
    why: str  # why it was removed, or "" when kept
    nbytes: int  # bytes it took on disk


@dataclass(frozen=True, slots=True)
class GcReport:
    removed: tuple[GcEntry, ...]
    kept: tuple[GcEntry, ...]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone else's process
        return True
    return True


def _stale_because(m: dict) -> str:
    """Why a twin's sources no longer match the files ("" while they do)."""
    if m.get("format") != FORMAT:
        return f"written by a bmoe with twin format {m.get('format')!r}, not {FORMAT}"
    sources = m.get("sources")
    if not isinstance(sources, list) or not sources:
        return "its twin.json names no source"
    for s in sources:
        try:
            path = Path(s["path"])
            now = FileId.of(path)
        except FileNotFoundError:
            return f"its source {s.get('path')} is gone"
        except (OSError, KeyError, TypeError) as exc:
            return f"its source {s.get('path') if isinstance(s, dict) else s!r} cannot be checked ({exc})"
        if _source(now) != s:
            return f"its source {path} changed (size, mtime or inode) since the twin was written"
    return ""


def gc_twins(cache_dir: Path, max_bytes: int | None = None) -> GcReport:
    """Remove from ``cache_dir`` the twins whose source file is gone or changed (size, mtime or
    inode), those of another twin format, and temporary folders of writers that are gone; then,
    with ``max_bytes``, the least recently used twins until the rest take at most that much.
    Anything that is not a twin is left alone. Returns what was removed and what was kept."""
    cache_dir = Path(cache_dir)
    removed: list[GcEntry] = []
    kept: list[tuple[float, GcEntry]] = []
    if not cache_dir.is_dir():
        return GcReport((), ())
    try:
        entries = sorted(cache_dir.iterdir())
    except OSError as e:
        raise TwinError(f"cannot list the twins folder {cache_dir}: {e.strerror or e}") from None
    for d in entries:
        if d.is_symlink() or not d.is_dir():
            continue
        t = _TEMP_RE.match(d.name)
        if t:
            try:
                age = time.time() - d.stat().st_mtime
            except FileNotFoundError:
                continue
            if not _pid_alive(int(t["pid"])) or age > _TEMP_MAX_AGE_S:
                nbytes = _folder_bytes(d)
                shutil.rmtree(d, ignore_errors=True)
                removed.append(GcEntry(d, "left over by a writer that is gone", nbytes))
            continue
        m = _manifest(d)
        if m is None:
            if _legacy_idents(d):
                why = "written by an older bmoe (twin format 1), never used again"
            else:
                continue  # not a twin: not ours to remove
        else:
            why = _stale_because(m)
        nbytes = _folder_bytes(d)
        if why:
            _remove(d)
            removed.append(GcEntry(d, why, nbytes))
        else:
            try:
                used = (d / MANIFEST).stat().st_mtime
            except OSError:
                used = 0.0
            kept.append((used, GcEntry(d, "", nbytes)))
    if max_bytes is not None:
        kept.sort(key=lambda k: k[0])  # least recently used first
        total = sum(e.nbytes for _, e in kept)
        while kept and total > max_bytes:
            _, entry = kept.pop(0)
            _remove(entry.path)
            total -= entry.nbytes
            removed.append(
                GcEntry(
                    entry.path, f"least recently used, over the budget of {max_bytes / 2**20:.0f} MiB", entry.nbytes
                )
            )
    return GcReport(tuple(removed), tuple(e for _, e in sorted(kept, key=lambda k: str(k[1].path))))
