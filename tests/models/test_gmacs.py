"""models.summary's GMACs per sample, the compute axis of every scaling comparison, against counts by hand.

Per layer of a tower with N tokens, width C, H heads of size D = C / H and MLP ratio 4:
    qkv 3 N C^2, output projection N C^2, MLP 8 N C^2, plus the attention:
    softmax (SDPA, causal or not)        2 H N^2 D            (q k^T and A v)
    linear, non-causal                   2 H N D^2            (the state k^T v, then q S)
    linear, causal, N <= QUADRATIC_MAX   2 H N^2 D            (the causal N x N weights built directly, W v)
    linear, causal, longer, in chunks of C' = 64 tokens, M = ceil(N / C') chunks:
                                         2 H M C'^2 D + 2 H M C' D^2   (inside chunks; the chunk states, q S)
Image tower: + the patch embedding (N - 1) 3 P^2 C and the projection C E of the class token; text tower: + the
projection C E of the end-of-text token. Row norms (q^, k^) are elementwise work, not counted, except that an
implementation may take them as a batched matmul: at most 2 H N D per layer more.
"""

import math

import pytest

import models
from models.attention.ops.causal import QUADRATIC_MAX
from models.config import size_config


def tower_macs(layers: int, width: int, heads: int, tokens: int, attention: str, causal: bool) -> int:
    d = width // heads
    dense = 12 * tokens * width**2
    if attention == "softmax" or (causal and tokens <= QUADRATIC_MAX):
        attend = 2 * heads * tokens**2 * d
    elif not causal:
        attend = 2 * heads * tokens * d**2
    else:
        chunk = 64
        chunks = math.ceil(tokens / chunk)
        attend = 2 * heads * chunks * chunk**2 * d + 2 * heads * chunks * chunk * d**2
    return layers * (dense + attend)


def by_hand(name: str, attention: str) -> tuple[int, int, int]:
    """(image MACs, text MACs, slack for row norms done as matmuls) of one image and one full-context text."""
    cfg = size_config(name)
    vision, text, embed = cfg["vision_cfg"], cfg["text_cfg"], cfg["embed_dim"]
    patches = (vision["image_size"] // vision["patch_size"]) ** 2
    width, heads = vision["width"], vision["width"] // vision["head_width"]
    image = tower_macs(vision["layers"], width, heads, patches + 1, attention, causal=False)
    image += patches * 3 * vision["patch_size"] ** 2 * width + width * embed
    length = text["context_length"]
    text_macs = tower_macs(text["layers"], text["width"], text["heads"], length, attention, causal=True)
    text_macs += text["width"] * embed
    slack = 2 * (vision["layers"] * width * (patches + 1) + text["layers"] * text["width"] * length)
    return image, text_macs, slack


@pytest.mark.parametrize("name", ["tiny-s", "tiny-m"])
@pytest.mark.parametrize("attention", ["softmax", "linear_affine_nodenom"])
def test_gmacs_match_the_count_by_hand(name, attention):
    summary = models.summary(models.create_model(name, image_attention=attention, text_attention=attention))
    image, text, slack = by_hand(name, attention)
    counted_image, counted_text = round(summary["image_gmacs"] * 1e9), round(summary["text_gmacs"] * 1e9)
    if attention == "softmax":
        assert (counted_image, counted_text) == (image, text)
    else:
        assert 0 <= counted_image - image <= slack and 0 <= counted_text - text <= slack, (
            counted_image - image,
            counted_text - text,
            slack,
        )
    assert summary["gmacs_per_sample"] == pytest.approx(summary["image_gmacs"] + summary["text_gmacs"])


def test_tiny_s_numbers():
    """The same counts written out for tiny-s (17 image tokens, 32 text tokens, width 64, 2 heads of 32, 2 layers):
    image 2 x (835,584 + 2 x 2 x 17 x 32^2) + 196,608 + 4,096; text 2 x (1,572,864 + 2 x 2 x 32^2 x 32) + 4,096
    (32 <= QUADRATIC_MAX: the causal weights are built directly)."""
    assert by_hand("tiny-s", "linear_affine_nodenom")[:2] == (2 * (835_584 + 69_632) + 200_704, 3_411_968)
    assert by_hand("tiny-s", "softmax")[:2] == (1_945_856, 3_411_968)
