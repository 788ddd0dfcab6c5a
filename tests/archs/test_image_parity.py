"""Each tiny vision-language model over an image computes what transformers computes (issue #30,
part 4): bmoe.testing.VL_ARCHS, qwen3vlmoe (Qwen3-VL-MoE) and glm4vmoe (GLM-4.5V, language model
glm4moe).

Both sides read the same HF folder: llama.cpp its converted F32 language model and F32 projector
(``--mmproj``), transformers the whole vision-language model, with its own image processor. The
image is 128 x 96, multiples of the 32 px a merged patch covers (both towers: 16 px patches, 2 x 2
merged) and within the processor's pixel bounds, so neither side resizes it: both see the same
pixels, normalised the same way, as 4 x 3 merged patches (12 image tokens over 4 M-RoPE positions).
The tokens around an image (Qwen-VL's ``<|vision_start|>``/``<|vision_end|>``, GLM-4.5V's
``<|begin_of_image|>``/``<|end_of_image|>``) are special tokens of the recipe's vocabulary, the
config's ids pointing at them, so mtmd's are the tokens transformers' input holds too (asserted).

Compared: the next-token log-softmax after every prefix that holds the image whole (the text
after it, whose positions start max(w, h)/32 on), and after the text before it, F32 weights, F32
KV cache, flash attention off. The text before the image keeps the text parity's 1e-3. After it
the bound is IMAGE_TOL = 5e-3, for both models (measured: qwen3vlmoe 1.9e-3, glm4vmoe 6.2e-4):
the two vision encoders' outputs for the same pixels already differ (qwen3vlmoe 4e-5, 4.5e-4 of
their largest value; glm4vmoe 2e-6, 5.4e-4 of theirs; checked here, EMBD_RTOL), which the language
model carries into the logits. For qwen3vlmoe that gap is the encoder's alone (the text positions
agree to 1e-3 and the image's tokens, positions and M-RoPE layout are asserted equal), and it is
not the position-embedding interpolation (a 128 x 128 image, which needs none, differs as much);
an activation or norm computed another way in llama.cpp's clip graph is the likely cause, not found
yet. A wrong image (another one, or the pixels in another order) moves the logits by orders of
magnitude more (a second seeded image moves them by 3.1 and 1.9).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bmoe.config import SessionConfig
from bmoe.numerics import log_softmax
from bmoe.session import Session
from bmoe.testing import VL_ARCHS, hf_dir, load_reference, write_hf_mmproj, write_png

pytestmark = pytest.mark.reference

BEFORE = "Look at this screen:"
AFTER = " Which button turns on Wi-Fi? Answer with its name."
IMAGE_TOL = 5e-3
EMBD_RTOL = 1e-3
# The config keys of the token before an image, the one after it, and the one each of its embeddings
# stands in for in transformers' input.
IMAGE_TOKEN_KEYS = {
    "qwen3vlmoe": ("vision_start_token_id", "vision_end_token_id", "image_token_id"),
    "glm4vmoe": ("image_start_token_id", "image_end_token_id", "image_token_id"),
}


@pytest.mark.parametrize("arch", VL_ARCHS)
def test_logits_after_an_image_match_transformers(tiny_models, tiny_dir, tmp_path, arch: str) -> None:
    from PIL import Image as PILImage
    from transformers import AutoImageProcessor

    png = write_png(tmp_path / "screen.png", 128, 96, seed=1)
    cfg = SessionConfig(
        model=tiny_models(arch, "f32"),
        mmproj=write_hf_mmproj(arch, tiny_dir),
        n_ctx=128,
        n_batch=128,
        n_ubatch=128,
        kv_f32=True,
        flash_attn=False,
        chat="none",
    )
    model = load_reference(arch, tiny_dir)
    start, end_token, image_pad = (getattr(model.config, k) for k in IMAGE_TOKEN_KEYS[arch])
    with Session(cfg) as s:
        rt = s.runtime
        [img] = rt.read_images([str(png)])
        assert (img.before, img.after, img.n_tokens, img.n_pos) == ((start,), (end_token,), 12, 4)
        embd = rt.images.projector.encode(img)  # [12, 64] (qwen3vlmoe: then deepstack layer 0's 64)
        head = rt.tokenize_prompt(BEFORE)
        tokens = head + rt.images.tokens(img) + rt.model.tokenize(AFTER, add_special=False, parse_special=False)
        ids = [image_pad if t < -1 else t for t in tokens]  # transformers' form: the image's pad tokens

        proc = AutoImageProcessor.from_pretrained(hf_dir(arch, tiny_dir))
        pix = proc(images=[PILImage.open(png).convert("RGB")], return_tensors="pt")
        assert pix["image_grid_thw"].tolist() == [[1, 6, 8]]  # not resized: 96/16 x 128/16 patches
        with torch.no_grad():
            vis = model.model.visual(pix["pixel_values"], grid_thw=pix["image_grid_thw"])
            want = torch.cat([vis.pooler_output, *(getattr(vis, "deepstack_features", None) or ())], -1).numpy()
            ref = log_softmax(
                model(
                    input_ids=torch.tensor([ids]),
                    pixel_values=pix["pixel_values"],
                    mm_token_type_ids=torch.tensor([[int(t == image_pad) for t in ids]]),  # 1: an image's token
                    image_grid_thw=pix["image_grid_thw"],
                    use_cache=False,
                )
                .logits[0]
                .float()
                .numpy()
            )

        gap = float(np.max(np.abs(embd - want)))
        assert embd.shape == want.shape and gap <= EMBD_RTOL * float(np.max(np.abs(want))), gap
        end = len(head) + 1 + img.n_tokens + 1  # the prefix through the token that closes the image
        worst_after, worst_before = 0.0, 0.0
        for n in [*range(1, len(head) + 1), *range(end, len(tokens) + 1)]:
            rt.kv.reset()
            ours = log_softmax(rt.kv.append(tokens[:n]))
            d = float(np.max(np.abs(ours - ref[n - 1])))
            if n < end:
                worst_before = max(worst_before, d)
            else:
                worst_after = max(worst_after, d)
    print(
        f"\n{arch} with a 128x96 image: image embeddings max |d| {gap:.3g} (of {float(np.max(np.abs(want))):.3g}); "
        f"max |d log-softmax| before it {worst_before:.3g}, after it {worst_after:.3g} "
        f"({len(tokens) - end + 1} positions)"
    )
    assert worst_before <= 1e-3
    assert worst_after <= IMAGE_TOL, f"after the image: max |d log-softmax| = {worst_after:.3g}"
