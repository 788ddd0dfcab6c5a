"""DIR/results.jsonl and DIR/run.json: what a run answered, and what it answered it for.

Rows are appended (and flushed) as they are answered, so an interrupted run loses nothing it
finished; a rerun with the same data, model and settings skips the lines already there. run.json
names that data, model and settings; a rerun that differs in any of them is refused before the
model opens (docs/eval.md#resume).
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from bmoe.errors import BmoeError, ConfigError
from bmoe.out_paths import not_regular

RESULTS = "results.jsonl"
RUN = "run.json"
LOCK = ".bmoe-eval.lock"  # held (flock) for the whole run: two runs never answer into one folder


class OutputError(BmoeError):
    """A file of the output folder could not be written (a full disk, ...); what was answered is kept."""


def cannot_write(path: Path, e: OSError, results: Path) -> OutputError:
    return OutputError(
        f"cannot write {path}: {e.strerror or e}; the rows answered so far are kept in {results}: "
        "make room and rerun the same command to resume"
    )


@contextmanager
def writing(path: Path, results: Path) -> Iterator[None]:
    """Turn an OSError while ``path`` is written into the refusal naming it: a write that fails once
    the file is open (a full disk) carries no file name of its own."""
    try:
        yield
    except OSError as e:
        raise cannot_write(path, e, results) from None


# run.json keys that must be equal for a rerun to resume, and how a mismatch is named
IDENTITY = {
    "data_sha256": "the data (sha256 of the file)",
    "model": "the model file",
    "model_size": "the model file's size",
    "model_mtime_ns": "the model file's modification time",
    "chat": "the chat template setting (--chatml / --no-chat)",
    "flash_attn": "--flash-attn",
    "kv_f32": "--kv-f32",
    "abstain_below": "--abstain-below",
    "scoring": "--scoring",
    "debias": "--debias",
    "decide_pride_sample": "--decide-pride-sample",  # null when no row uses pride: it changes no other
}


def identity(
    data_sha256: str,
    model: Path,
    *,
    chat: str,
    flash_attn: bool | None,
    kv_f32: bool,
    abstain_below: float | None,
    scoring: str | None,
    debias: str | None = None,
    decide_pride_sample: int | None = None,
) -> dict[str, Any]:
    st = model.stat()
    return {
        "data_sha256": data_sha256,
        "model": str(model.resolve()),
        "model_size": st.st_size,
        "model_mtime_ns": st.st_mtime_ns,
        "chat": chat,
        "flash_attn": flash_attn,
        "kv_f32": kv_f32,
        "abstain_below": abstain_below,
        "scoring": scoring,
        "debias": debias,
        "decide_pride_sample": decide_pride_sample,
    }


class ResultStore:
    """The results file of one output folder."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.results = out / RESULTS
        self.run = out / RUN
        self._fh: IO[str] | None = None
        self._lock: int | None = None

    def open(self, ident: dict[str, Any], info: dict[str, Any], others: Iterable[str] = ()) -> dict[int, dict]:
        """Make the folder, check a previous run's identity and return its rows by line number.

        Raises ConfigError (nothing written) when the folder holds another run's results, or when
        the folder, or a file the run writes there (results.jsonl, run.json and ``others``),
        cannot be written: found now, before any work, rather than once the rows are answered."""
        if self.out.exists() and not self.out.is_dir():
            raise ConfigError(f"--out: {self.out} is a file, not a folder")
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--out: cannot make the folder {self.out}: {e.strerror or e}") from None
        self._check_writable((RESULTS, RUN, *others))
        self._take_lock()
        done: dict[int, dict] = {}
        if self.results.exists() and self.results.read_text(encoding="utf-8", errors="replace").strip():
            self._check_identity(ident)
            done = self._read()
        with writing(self.run, self.results):
            self.run.write_text(json.dumps({**ident, **info}, indent=1) + "\n")
        return done

    def _check_writable(self, names: Iterable[str]) -> None:
        """A file can be made in the folder, and each of ``names`` that exists can be written."""
        try:
            tempfile.TemporaryFile(dir=self.out).close()
        except OSError as e:
            raise ConfigError(f"--out: cannot write in the folder {self.out}: {e.strerror or e}") from None
        for name in names:
            path = self.out / name
            what = not_regular(path)
            if what is not None:
                raise ConfigError(
                    f"--out: {path} is {what}; the run writes a regular file of that name "
                    "(remove it, or give another --out)"
                )
            if path.exists():
                try:
                    path.open("a").close()  # opened to append, nothing written: the file is unchanged
                except OSError as e:
                    raise ConfigError(f"--out: cannot write {path}: {e.strerror or e}") from None

    def _take_lock(self) -> None:
        """Hold the folder's lock file for the run, or refuse: another run is answering into it."""
        path = self.out / LOCK
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise ConfigError(f"--out: cannot write {path}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(
                f"--out: {self.out} is in use by another bmoe-eval run (it holds {path}); wait for "
                "it to end, or give another --out"
            ) from None
        self._lock = fd

    def unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor releases the flock
            self._lock = None

    def _check_identity(self, ident: dict[str, Any]) -> None:
        again = f"give another --out, or delete {self.results} to start over"
        try:
            before = json.loads(self.run.read_text())
        except FileNotFoundError:
            raise ConfigError(
                f"--out: {self.results} exists but {self.run} does not, so what it answered cannot be checked; {again}"
            ) from None
        except (OSError, ValueError) as e:
            raise ConfigError(f"--out: {self.run} cannot be read ({e}); {again}") from None
        for key, what in IDENTITY.items():
            if before.get(key) != ident[key]:
                raise ConfigError(
                    f"--out: {self.results} holds the results of another run: {what} differs "
                    f"({key} was {json.dumps(before.get(key))}, now {json.dumps(ident[key])}); {again}"
                )

    def _read(self) -> dict[int, dict]:
        """The rows already answered, by line; a last line cut short by an interruption is dropped."""
        text = self.results.read_text(encoding="utf-8")
        lines = text.split("\n")
        done: dict[int, dict] = {}
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                key = row["line"]
            except (ValueError, KeyError, TypeError):
                if i == len(lines) - 1:  # no newline after it: the write was interrupted
                    with writing(self.results, self.results):
                        self.results.write_text(
                            "\n".join(lines[:-1]) + ("\n" if len(lines) > 1 else ""), encoding="utf-8"
                        )
                    break
                raise ConfigError(
                    f"--out: {self.results} line {i + 1} is not a result row; delete the file to start over"
                ) from None
            done[key] = row  # a row asked again (a refusal) replaces the earlier one
        else:
            if lines[-1].strip():  # a whole row without its newline: end the file before appending
                with writing(self.results, self.results), self.results.open("a", encoding="utf-8") as fh:
                    fh.write("\n")
        return done

    def append(self, row: dict) -> None:
        try:
            if self._fh is None:  # made on the first row: a run that answered nothing leaves no file
                self._fh = self.results.open("a", encoding="utf-8")
            self._fh.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
            self._fh.flush()
        except OSError as e:  # a cut last line is dropped when the run resumes
            raise cannot_write(self.results, e, self.results) from None

    def close(self) -> None:
        if self._fh is not None:
            fh, self._fh = self._fh, None
            try:
                fh.close()
            except OSError:  # its buffered tail could not be written: the write already said why
                pass

    def finish(self, rows: Iterable[dict]) -> None:
        """Rewrite the file with ``rows`` (already in input order), atomically."""
        self.close()
        tmp = self.results.with_name(RESULTS + ".tmp")
        try:
            with tmp.open("w", encoding="utf-8") as fh:
                for row in rows:
                    fh.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
            os.replace(tmp, self.results)
        except OSError as e:  # the appended file is still whole: only its reordering is lost
            tmp.unlink(missing_ok=True)
            raise cannot_write(self.results, e, self.results) from None
