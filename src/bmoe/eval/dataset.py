"""An evaluation data set: JSONL, one decision per line with its gold answer (docs/eval.md).

Each line's decide fields go through the session line protocol's own check of a decide request
(``decide_object``, what ``parse_line`` runs for ``"cmd":"decide"``), so a field the protocol
gains later flows through here unchanged. Only the
evaluation's own fields are taken off first: ``gold`` (required), ``id`` and ``split``.
A line that cannot be used is skipped with its line number and the reason; the others run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import BinaryIO

from bmoe.decide.types import DecideRequest
from bmoe.errors import ConfigError
from bmoe.wire.protocol import MAX_LINE_BYTES, ProtocolError, decide_object, decode_line, read_json, read_lines

EVAL_FIELDS = ("gold", "id", "split")


class BadRow(ValueError):
    """A data line that cannot be evaluated; the message says why (without the line number)."""


@dataclass(frozen=True, slots=True)
class Row:
    line: int  # 1-based line number in the data file; also the decision's request id
    request: DecideRequest
    gold: int
    data_id: str | int | None = None
    split: str | None = None


@dataclass(frozen=True, slots=True)
class Dataset:
    path: Path
    sha256: str
    rows: tuple[Row, ...]
    skipped: tuple[tuple[int, str], ...]  # (line, why) of each line that was left out


def parse_row(text: str, line: int, defaults: dict | None = None) -> Row:
    """One data line -> a Row; ``defaults`` (decide fields: bmoe-eval's --abstain-below,
    --scoring and --debias) fill in the fields the line does not set itself."""
    try:
        obj = read_json(text)
    except ProtocolError as e:
        raise BadRow(str(e)) from None
    if not isinstance(obj, dict):
        raise BadRow(f"must be a JSON object, got {type(obj).__name__}")
    if obj.pop("cmd", "decide") != "decide":
        raise BadRow('"cmd" may only be "decide" here (or left out)')
    gold, data_id, split = obj.pop("gold", None), obj.pop("id", None), obj.pop("split", None)
    if gold is None:
        raise BadRow('missing field "gold" (the index of the right choice)')
    if isinstance(gold, bool) or not isinstance(gold, int):
        raise BadRow(f'"gold" must be an integer index into "choices", got {json.dumps(gold)[:60]}')
    if data_id is not None and (isinstance(data_id, bool) or not isinstance(data_id, (int, str))):
        raise BadRow(f'"id" must be a string or an integer, got {json.dumps(data_id)[:60]}')
    if split is not None and not isinstance(split, str):
        raise BadRow(f'"split" must be a string, got {json.dumps(split)[:60]}')
    for name, value in (defaults or {}).items():
        obj.setdefault(name, value)
    try:
        request = decide_object({"id": line, **obj}).request
    except ProtocolError as e:
        raise BadRow(str(e)) from None
    # the structured form: gold indexes the options in their given order (the choices are their labels)
    n, what = (len(request.choices), "choices") if request.options is None else (len(request.options), "options")
    if not 0 <= gold < n:
        raise BadRow(f'"gold" is {gold} but there are {n} {what} (0..{n - 1})')
    return Row(line=line, request=request, gold=gold, data_id=data_id, split=split)


class _Hashed:
    """A binary file read line by line whose every byte read also goes into ``digest``."""

    def __init__(self, f: BinaryIO, digest: "hashlib._Hash") -> None:
        self._f, self._digest = f, digest

    def readline(self, size: int = -1, /) -> bytes:
        chunk = self._f.readline(size)
        self._digest.update(chunk)
        return chunk


def load(path: Path, defaults: dict | None = None) -> Dataset:
    """Read and check every line, streaming the file (a line over the limit is skipped without
    being held); raises ConfigError only when the file itself cannot be read."""
    rows: list[Row] = []
    skipped: list[tuple[int, str]] = []
    digest = hashlib.sha256()
    try:
        with path.open("rb") as f:
            for n, chunk in enumerate(read_lines(_Hashed(f, digest)), start=1):
                try:
                    if chunk is None:
                        raise BadRow(f"longer than the protocol's limit of {MAX_LINE_BYTES} bytes")
                    text = decode_line(chunk)
                    if not text.strip():
                        continue
                    rows.append(parse_row(text, n, defaults))
                except (BadRow, ProtocolError) as e:
                    skipped.append((n, str(e)))
    except FileNotFoundError:
        raise ConfigError(f"data: file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"data: {path} is a folder, not a JSONL file") from None
    except OSError as e:
        raise ConfigError(f"data: cannot read {path}: {e.strerror or e}") from None
    return Dataset(path=path, sha256=digest.hexdigest(), rows=tuple(rows), skipped=tuple(skipped))


def _data_folder() -> Path:
    return Path(str(resources.files("bmoe.eval").joinpath("data")))


def shipped_sets() -> dict[str, Path]:
    """The data sets that ship with bmoe (``bmoe-eval --set NAME``), by name."""
    return {p.stem: p for p in sorted(_data_folder().glob("*.jsonl"))}


def shipped_set(name: str) -> Path:
    sets = shipped_sets()
    if name not in sets:
        raise ConfigError(f"--set: no shipped set named {name!r}; the sets are {', '.join(sets)}")
    return sets[name]
