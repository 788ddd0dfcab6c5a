"""A trie over token ids: which kept sequence is the longest prefix of a prompt.

Each node is one token; a node that ends a kept sequence holds its value. Lookups walk the
prompt once, so they cost the prompt's length whatever the number of kept states.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

V = TypeVar("V")

_NONE = object()


class _Node:
    __slots__ = ("children", "value")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.value: object = _NONE


class TokenTrie(Generic[V]):
    """Values keyed by token sequences, with the longest-kept-prefix lookup."""

    def __init__(self) -> None:
        self._root = _Node()
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def put(self, tokens: Sequence[int], value: V) -> None:
        node = self._root
        for t in tokens:
            node = node.children.setdefault(int(t), _Node())
        if node.value is _NONE:
            self._n += 1
        node.value = value

    def get(self, tokens: Sequence[int]) -> V | None:
        node: _Node | None = self._root
        for t in tokens:
            node = node.children.get(int(t)) if node is not None else None
        return None if node is None or node.value is _NONE else node.value  # type: ignore[return-value]

    def remove(self, tokens: Sequence[int]) -> None:
        """Forget the value at ``tokens`` (nothing when there is none); empty branches are pruned."""
        path = [self._root]
        for t in tokens:
            nxt = path[-1].children.get(int(t))
            if nxt is None:
                return
            path.append(nxt)
        if path[-1].value is _NONE:
            return
        path[-1].value = _NONE
        self._n -= 1
        for i in range(len(tokens), 0, -1):
            node = path[i]
            if node.value is not _NONE or node.children:
                break
            del path[i - 1].children[int(tokens[i - 1])]

    def extended(self, tokens: Sequence[int]) -> bool:
        """Whether a longer kept sequence starts with ``tokens`` (empty branches are pruned, so a
        node with children leads to one)."""
        node: _Node | None = self._root
        for t in tokens:
            node = node.children.get(int(t)) if node is not None else None
        return node is not None and bool(node.children)

    def longest(self, tokens: Sequence[int]) -> tuple[int, V | None, int]:
        """``(n, value, depth)``: the longest kept sequence that is a prefix of ``tokens`` (its
        length ``n`` and value; 0 and None when none is), and ``depth``, how many leading tokens
        of ``tokens`` some kept sequence shares (where the deepest of them parts from it)."""
        node = self._root
        best_n, best = 0, None
        depth = 0
        if node.value is not _NONE:
            best = node.value
        for t in tokens:
            nxt = node.children.get(int(t))
            if nxt is None:
                break
            node = nxt
            depth += 1
            if node.value is not _NONE:
                best_n, best = depth, node.value
        return best_n, best, depth  # type: ignore[return-value]

    def items(self) -> Iterator[tuple[tuple[int, ...], V]]:
        stack: list[tuple[_Node, tuple[int, ...]]] = [(self._root, ())]
        while stack:
            node, key = stack.pop()
            if node.value is not _NONE:
                yield key, node.value  # type: ignore[misc]
            for t, child in node.children.items():
                stack.append((child, key + (t,)))
