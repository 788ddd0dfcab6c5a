from __future__ import annotations

WS = b" \t\n\v\f\r"


def partition(data: bytes, order: list[tuple[bytes, bool, bool]]) -> list[tuple[str, bytes]]:
    """llama.cpp's partition, step by step: ``order`` is its special tokens as (text, lstrip,
    rstrip), longest first. Each search runs to the end of the whole text and a match beyond the
    fragment ends the fragment's scan, as in llama.cpp."""
    frags: list[tuple] = [("raw", 0, len(data))] if data else []
    for text, lstrip, rstrip in order:
        out: list[tuple] = []
        for frag in frags:
            if frag[0] != "raw":
                out.append(frag)
                continue
            base, length = frag[1], frag[2]
            while True:
                match = data.find(text, base)
                if match < 0 or match + len(text) > base + length:
                    out.append(("raw", base, length))
                    break
                if match > base:
                    left = match - base
                    if lstrip:
                        while left > 0 and data[base + left - 1] in WS:
                            left -= 1
                    if left > 0:
                        out.append(("raw", base, left))
                out.append(("tok", text))
                if match + len(text) < base + length:
                    right_at = match + len(text)
                    right = length - (match - base + len(text))
                    if rstrip:
                        while right > 0 and data[right_at] in WS:
                            right_at, right = right_at + 1, right - 1
                    if right <= 0:
                        break
                    base, length = right_at, right
                else:
                    break
        frags = out
    return [("raw", data[f[1] : f[1] + f[2]]) if f[0] == "raw" else f for f in frags]
