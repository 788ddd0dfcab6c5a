"""Write bmoe-eval's shipped data sets (docs/eval.md#the-shipped-sets). Deterministic: the same
files come out on every run, and every gold answer follows from how its item was built.

    python src/bmoe/eval/data/generate.py [OUT_DIR]    (default: this folder)

Standard library only. Every row: ``id``, ``split`` (every third item, or every third task of the
phone agent, is "calib", the rest "test") and ``gold``, the index of the right answer. The
arithmetic, ordering and units rows are in decide's structured form (``prefix``, ``question``,
``options``, ``render``: bmoe writes the lettered option list); the phone agent's are plain
(``prefix``, ``suffix``, ``choices``: letters), its screen text written here.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

LETTERS = "ABCDE"
ASK = " Answer with the letter."


def _split(i: int) -> str:
    return "calib" if i % 3 == 0 else "test"


def _options(texts: list[str]) -> str:
    return " ".join(f"{LETTERS[k]}) {t}" for k, t in enumerate(texts))


# The structured form's rendering rule that writes " {question} Options: A) x B) y. Answer with the
# letter.", the same text as the phone agent's hand-written suffixes (docs/decide.md "Order debiasing").
RENDER = {"template": " {question} Options: {options}. {cue}", "joiner": " "}


def _row(name: str, i: int, prefix: str, question: str, options: list[str], gold: int, split: str) -> dict:
    """A row in the structured form: bmoe renders the options (labels A, B, ...), so --debias can
    reorder them; gold indexes the options in this order."""
    return {
        "id": f"{name}-{i:03d}",
        "split": split,
        "prefix": prefix,
        "question": question,
        "options": options,
        "render": RENDER,
        "gold": gold,
    }


def arithmetic(n: int = 120) -> list[dict]:
    """Which of two expressions (a + b, a - b or a x b) has the larger value; never equal."""
    rng = random.Random(1)
    prefix = "You compare two arithmetic expressions and say which one has the larger value."
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "x": lambda a, b: a * b}
    rows: list[dict] = []
    while len(rows) < n:
        exprs = []
        for _ in range(2):
            op = rng.choice("+-x")
            a, b = (rng.randint(2, 12), rng.randint(2, 12)) if op == "x" else (rng.randint(10, 99), rng.randint(2, 60))
            exprs.append((f"{a} {op} {b}", ops[op](a, b)))
        if exprs[0][1] == exprs[1][1]:
            continue
        gold = 0 if exprs[0][1] > exprs[1][1] else 1
        i = len(rows)
        rows.append(
            _row("arithmetic", i, prefix, "Which expression is larger?", [e for e, _ in exprs], gold, _split(i))
        )
    return rows


WORDS = [
    "apple",
    "banana",
    "cherry",
    "grape",
    "lemon",
    "mango",
    "melon",
    "olive",
    "peach",
    "pear",
    "plum",
    "kiwi",
    "lime",
    "date",
    "fig",
    "orange",
    "papaya",
    "quince",
    "raisin",
    "tomato",
]


def ordering(n: int = 120) -> list[dict]:
    """The smallest or largest of four numbers, or the word of four that comes first alphabetically."""
    rng = random.Random(2)
    prefix = "You answer questions about the order of numbers and words."
    rows = []
    for i in range(n):
        kind = (i // 3) % 3  # not i % 3: each split gets all three kinds
        if kind == 2:
            options = rng.sample(WORDS, 4)
            question, gold = "Which word comes first in alphabetical order?", options.index(min(options))
        else:
            nums = rng.sample(range(1, 100), 4)
            options = [str(x) for x in nums]
            pick = min if kind == 0 else max
            question = f"Which number is the {'smallest' if kind == 0 else 'largest'}?"
            gold = nums.index(pick(nums))
        rows.append(_row("ordering", i, prefix, question, options, gold, _split(i)))
    return rows


# (big unit, small unit, how many small units in one big one)
CONVERSIONS = [
    ("metres", "centimetres", 100),
    ("kilometres", "metres", 1000),
    ("kilograms", "grams", 1000),
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
    ("days", "hours", 24),
    ("weeks", "days", 7),
    ("litres", "millilitres", 1000),
    ("feet", "inches", 12),
    ("years", "months", 12),
]


def units(n: int = 120) -> list[dict]:
    """How many small units in N big ones; each wrong option is off by a factor of 10 or 100, or
    by one big unit, or is N plus the factor (added instead of multiplied), so exactly one option
    equals N times the factor."""
    rng = random.Random(3)
    prefix = "You convert between units of measurement."
    rows = []
    for i in range(n):
        big, small, f = CONVERSIONS[i % len(CONVERSIONS)]
        k = rng.randint(2, 9)
        right = k * f
        wrong = rng.sample([right * 10, (k + 1) * f, (k - 1) * f, k * f * 100, k + f], 3)
        options = [right, *wrong]
        rng.shuffle(options)
        rows.append(
            _row(
                "units",
                i,
                prefix,
                f"How many {small} are in {k} {big}?",
                [str(x) for x in options],
                options.index(right),
                _split(i),
            )
        )
    return rows


# Settings section -> the switches on its screen
SECTIONS = {
    "Network & internet": ["Wi-Fi", "Mobile data", "Airplane mode", "Hotspot"],
    "Connected devices": ["Bluetooth", "NFC"],
    "Display": ["Dark theme", "Auto-rotate"],
    "Sound": ["Do not disturb", "Vibrate"],
    "Battery": ["Battery saver"],
    "Location": ["Use location"],
}
APPS = ["Camera", "Messages", "Clock", "Photos", "Phone", "Calendar", "Maps"]


def phone_agent() -> list[dict]:
    """An agent turning one switch on or off: Home -> Settings -> the switch's section -> the
    switch's screen, one decision per screen, the history growing in the prefix. The switch is
    always in the state the task changes, so the last step's answer is the task's verb."""
    rng = random.Random(4)
    rows: list[dict] = []
    tasks = [
        (section, switch, verb)
        for section, switches in SECTIONS.items()
        for switch in switches
        for verb in ("on", "off")
    ]
    for t, (section, switch, verb) in enumerate(tasks):
        split = _split(t)
        head = f"You control a phone. Task: turn {verb} {switch}. History:"
        history: list[str] = []
        screens: list[tuple[str, list[str], str, str | None]] = []
        home = ["Open Settings", *(f"Open {a}" for a in rng.sample(APPS, 2))]
        screens.append(("Home", home, "Open Settings", "opened Settings"))
        others = [s for s in SECTIONS if s != section]
        screens.append(("Settings", [section, *rng.sample(others, 2)], section, f"opened {section}"))
        items = list(SECTIONS[section]) + ["Back"]
        screens.append((section, items, switch, f"opened {switch}"))
        state = "off" if verb == "on" else "on"
        screens.append((f"{switch} (now {state})", ["Turn on", "Turn off", "Back"], f"Turn {verb}", None))
        for name, options, right, done in screens:
            options = list(options)
            rng.shuffle(options)
            i = len(rows)
            prefix = head + ("".join(f" {h}," for h in history)[:-1] + "." if history else "")
            suffix = f"{'' if history else ' none.'} Screen: {name}. Options: {_options(options)}.{ASK}"
            rows.append(
                {
                    "id": f"phone_agent-{i:03d}",
                    "split": split,
                    "prefix": prefix,
                    "suffix": suffix,
                    "choices": list(LETTERS[: len(options)]),
                    "gold": options.index(right),
                }
            )
            if done:
                history.append(done)
    return rows


SETS = {"arithmetic": arithmetic, "ordering": ordering, "units": units, "phone_agent": phone_agent}


def write(out_dir: Path) -> list[Path]:
    paths = []
    for name, make in SETS.items():
        path = out_dir / f"{name}.jsonl"
        path.write_text(
            "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in make()), encoding="utf-8"
        )
        paths.append(path)
    return paths


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
    for p in write(target):
        print(p)
