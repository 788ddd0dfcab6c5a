"""Every repository file that docs/*.md, README.md and the module docstrings name exists (#40.10):
a file that is renamed or deleted takes its citations with it.

Three rules, from strict to lenient:
- a relative Markdown link target ``[x](decide.md#images)`` exists next to the page;
- a path from the repository root (``src/bmoe/session.py``, ``bench/plan.py``, ``docs/decide.md``)
  exists at that path;
- any other ``.py`` or ``.md`` name (``reader.py``, ``llama/mremap_mover.py``) is the end of some
  file's path in the repository (docstrings name their neighbours without the folder).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP = ("src/", "bench/", "tests/", "docs/", "scripts/")
# A file name or path ending .py or .md, not inside a longer word or path.
NAME = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w-]+\.(?:py|md))(?![\w/])")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# Files named that are not this repository's, each with why.
NOT_OURS = {
    "convert_hf_to_gguf.py": "llama.cpp's converter, installed with llama-cpp-python",
    "tokenization_bmoe_ranks.py": "written into a tiny model's folder by bmoe.testing.hf_tokenizer",
    "report.md": "what bmoe-eval writes beside its results (runs/x/report.md)",
    "docs/benchmarks-gpt-oss.md": "the C++ original's page, cited in docs/streaming.md as its source",
    "docs/expert-dropping.md": "the C++ original's page, cited in docs/streaming.md as its source",
}


def texts(root: Path) -> Iterator[tuple[Path, str]]:
    """(file, text to check): the Markdown pages whole, and each Python module's docstring."""
    for page in sorted(root.glob("docs/*.md")) + [root / "README.md"]:
        yield page, page.read_text()
    for top in ("src", "bench", "scripts", "tests"):
        for module in sorted((root / top).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(module.read_text()), clean=False)
            if doc:
                yield module, doc


def missing(root: Path, where: Path, text: str, files: list[str]) -> tuple[list[str], int]:
    """The names in ``text`` (found in ``where``) that name no file, and how many names it holds."""
    bad, seen = [], 0
    if where.suffix == ".md":
        for m in LINK.finditer(text):
            target = m.group(1)
            if ":" in target:  # https:, mailto:
                continue
            seen += 1
            if not (where.parent / target).exists():
                bad.append(target)
        text = LINK.sub("]", text)  # checked as links, not again as names
    for word in text.split():
        if "://" in word:  # a URL's path is someone else's
            continue
        for m in NAME.finditer(word):
            name = m.group(1).removeprefix("./")
            seen += 1
            if name in NOT_OURS or name.rsplit("/", 1)[-1] in NOT_OURS:
                continue
            if name.startswith(TOP):
                found = (root / name).exists()
            else:
                found = any(f == name or f.endswith("/" + name) for f in files)
            if not found:
                bad.append(name)
    return bad, seen


def repo_files(root: Path) -> list[str]:
    skip = {".git", ".venv", "node_modules", "__pycache__", ".pytest_cache", "build", "dist"}
    return [
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not skip.intersection(p.relative_to(root).parts)
    ]


def test_every_file_the_docs_name_exists() -> None:
    files = repo_files(ROOT)
    stale, total = [], 0
    for where, text in texts(ROOT):
        bad, seen = missing(ROOT, where, text, files)
        total += seen
        stale += [f"{where.relative_to(ROOT)}: {name}" for name in bad]
    assert total > 500  # the check reads what it should
    assert stale == []


def test_a_stale_name_is_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "reader.py").write_text('"""Reads; see pages.py and reader.py."""\n')
    (tmp_path / "docs" / "a.md").write_text(
        "[b](b.md#x), [a](a.md), `src/pkg/reader.py`, `src/pkg/gone.py`, "
        "`pkg/reader.py` and https://example.com/x/y.py\n"
    )
    files = repo_files(tmp_path)
    page = tmp_path / "docs" / "a.md"
    assert missing(tmp_path, page, page.read_text(), files) == (["b.md", "src/pkg/gone.py"], 5)
    module = tmp_path / "src" / "pkg" / "reader.py"
    assert missing(tmp_path, module, "Reads; see pages.py and reader.py.", files) == (["pages.py"], 2)
