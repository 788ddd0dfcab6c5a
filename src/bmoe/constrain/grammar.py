"""GBNF grammars (llama.cpp's grammar language) as answer constraints, compiled by llguidance.

A grammar that does not parse, or names a rule it never defines, is refused naming the field.
A grammar that parses but accepts no text at all is found only against the model's vocabulary,
when its first mask is empty (``TokenMask``): then too the refusal comes before any decoding.
"""

from __future__ import annotations

from llguidance import LLMatcher
from llguidance import gbnf_to_lark as gbnf

from bmoe.constrain.schema import ConstraintError

MAX_GRAMMAR_CHARS = 1 << 20


def _ends(node: object, ok: set[str]) -> bool:
    """Whether ``node`` derives some finite text, given the rules known to (``ok``)."""
    if isinstance(node, (gbnf.LiteralNode, gbnf.RegexNode)):
        return True
    if isinstance(node, gbnf.RuleRefNode):
        return node.name in ok
    if isinstance(node, gbnf.SequenceNode):
        return all(_ends(n, ok) for n in node.nodes)
    if isinstance(node, gbnf.AlternativeNode):
        return any(_ends(n, ok) for n in node.alternatives)
    if isinstance(node, gbnf.RepetitionNode):
        return node.min_times == 0 or _ends(node.node, ok)
    return True


def _check_productive(rules: dict, field: str) -> None:
    """Refuse a grammar whose root derives no finite text (its rules only ever refer on)."""
    ok: set[str] = set()
    grew = True
    while grew:
        new = {name for name, r in rules.items() if name not in ok and _ends(r.alternatives, ok)}
        ok |= new
        grew = bool(new)
    if "root" in rules and "root" not in ok:
        raise ConstraintError(field, "accepts no text at all (its root rule never ends)")


def gbnf_grammar(text: object, field: str = "grammar") -> str:
    """The llguidance grammar of GBNF ``text`` (its start rule is ``root``)."""
    if not isinstance(text, str) or not text.strip():
        raise ConstraintError(field, "must be a non-empty GBNF grammar (a string with a root rule)")
    if len(text) > MAX_GRAMMAR_CHARS:
        raise ConstraintError(field, f"is longer than {MAX_GRAMMAR_CHARS} characters")
    try:
        lark = gbnf.gbnf_to_lark(text)
    except Exception as e:  # the converter's parse errors: GbnfToLarkError, or a bare Exception
        raise ConstraintError(field, "does not parse as GBNF: " + " ".join(str(e).split())) from None
    _check_productive(gbnf.GrammarParser().parse(text), field)
    grammar = LLMatcher.grammar_from_lark(lark)
    failed, why = LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        raise ConstraintError(field, "is refused by the grammar engine: " + " ".join((why or ["?"])[0].split()))
    return grammar
