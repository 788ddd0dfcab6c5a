"""Where the prefix ends in the prompt's tokens.

The model sees ``prefix + suffix`` rendered as one user message; the split only says how many of
those tokens are worth keeping. It is found on tokens, never on text offsets: the prefix is
rendered and tokenized alone, and the boundary is where the two token lists stop agreeing, less
one token. The token given back covers a tokenizer merge across the join: the prefix's last token
alone can be a shorter piece of a token the next, longer prefix will produce there, and a kept
state ending on it would then never match again.
"""

from __future__ import annotations

from dataclasses import dataclass

from bmoe.decide.errors import DecideRequestError
from bmoe.decide.port import PromptRenderer, is_image_token
from bmoe.image_refs import ImageSource
from bmoe.numerics import common_prefix_len
from bmoe.rules import IMAGE_MARKER, place_images


@dataclass(frozen=True, slots=True)
class SplitPrompt:
    """The whole prompt's tokens and how many of them form the keepable prefix."""

    tokens: tuple[int, ...]  # [n_tokens], prefix + suffix as the model sees them
    n_prefix: int  # tokens[:n_prefix] is the prefix; always < n_tokens when n_tokens > 0

    @property
    def prefix_tokens(self) -> tuple[int, ...]:
        return self.tokens[: self.n_prefix]

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


def split_prompt(
    renderer: PromptRenderer,
    prefix: str,
    suffix: str,
    images: tuple[ImageSource, ...] = (),
    history: tuple[tuple[str, str], ...] = (),
) -> SplitPrompt:
    """Render and tokenize the prompt, and find the prefix boundary on its tokens. ``images``
    go at the markers of ``prefix + suffix``, or without one in front of the prefix; ``history``
    (messages before the user's) is rendered in front, and so falls in the prefix."""
    n_markers = (prefix + suffix).count(IMAGE_MARKER) if images else 0
    if n_markers and n_markers != len(images):
        raise DecideRequestError(
            f"decide: images: {len(images)} image(s) but the prompt has {n_markers} image "
            f"marker(s) {IMAGE_MARKER}; put one marker where each image goes, or none (then the "
            "images go in front of the prefix)",
            field="images",
        )
    if images and not n_markers:
        prefix = place_images(prefix, len(images))
    texts = [renderer.render_user(prefix + suffix, history), renderer.render_user(prefix, history)]
    whole, alone = renderer.tokenize_prompts(texts, images) if images else renderer.tokenize_prompts(texts)
    tokens = tuple(whole)
    # Giving one token back also keeps at least one token after the prefix, so the logits the
    # decision reads always come from a prefill made in this call.
    n_prefix = max(0, common_prefix_len(tokens, alone) - 1)
    # An image is prefilled whole: a boundary inside one moves to its start.
    while 0 < n_prefix < len(tokens) and is_image_token(tokens[n_prefix]) and tokens[n_prefix - 1] == tokens[n_prefix]:
        n_prefix -= 1
    return SplitPrompt(tokens=tokens, n_prefix=n_prefix)
