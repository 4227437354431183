"""The text tower leaves out the padding after the batch's last end-of-text token on the CPU (models/text.py): exact
because every attention a text tower can take gives the same first positions on a shorter sequence."""

import pytest
import torch

from models import ModelConfig, build_clip
from models.attention import ATTENTIONS, build_attention

DIM, HEADS = 32, 4
TWO_SIDED_ONLY = {"efficient", "fastmax_released", "linformer", "retention_2d"}  # a text tower refuses them
CAUSAL = sorted(set(ATTENTIONS) - TWO_SIDED_ONLY)


@pytest.mark.parametrize("name", sorted(TWO_SIDED_ONLY))
def test_the_two_sided_only_attentions_refuse_to_be_causal(name):
    with pytest.raises(ValueError, match="cannot be causal"):
        build_attention(name, DIM, HEADS, causal=True)


@pytest.mark.parametrize("name", CAUSAL)
def test_every_causal_attention_gives_the_same_prefix_on_a_shorter_sequence(name):
    torch.manual_seed(0)
    m = build_attention(name, DIM, HEADS, causal=True).double()
    x = torch.randn(2, 20, DIM, dtype=torch.float64)
    with torch.no_grad():
        full, prefix = m(x, None, None)[:, :13], m(x[:, :13], None, None)
    torch.testing.assert_close(prefix, full, atol=1e-9, rtol=1e-9)
    assert not torch.allclose(m(x[:, 5:18], None, None), full)  # a different sequence differs: the check can fail


@pytest.mark.parametrize("attention", ["softmax", "linear_affine_nodenom", "gla", "deltanet"])
def test_trimmed_text_features_equal_the_full_contexts(attention):
    torch.manual_seed(0)
    model = build_clip(ModelConfig(name="demo-w32", image_attention="softmax", text_attention=attention)).double()
    text = torch.zeros(3, 16, dtype=torch.long)
    for row, length in enumerate([4, 9, 6]):  # the longest caption ends at position 8: 7 positions of padding left
        text[row, : length - 1] = torch.randint(1, 1000, (length - 1,))
        text[row, length - 1] = model.vocab_size - 1  # end of text: the largest id
    with torch.no_grad():
        trimmed = model.encode_text(text)
        model.trim_padding = False
        full = model.encode_text(text)
    torch.testing.assert_close(trimmed, full, atol=1e-10, rtol=1e-10)
