"""Hedgehog's learnable feature map (models/attention/hedgehog.py); the registry-wide tests (tests/models/
test_attention.py, test_rope.py) check it against reference.hedgehog, causal and not, with padding and gradients."""

import pytest
import torch

from models.attention import build_attention
from models.attention.hedgehog import feature_map


def test_identity_start_is_the_softmax_of_q_and_of_minus_q():
    layer = build_attention("hedgehog", 32, 4)
    assert layer.feature_q.shape == layer.feature_k.shape == (4, 8, 8)
    x = torch.randn(2, 4, 5, 8)
    expected = torch.cat([x.softmax(-1), (-x).softmax(-1)], -1)
    torch.testing.assert_close(feature_map(x, layer.feature_q), expected)
    phi = feature_map(x, torch.randn(4, 8, 3))
    assert phi.shape == (2, 4, 5, 6) and (phi > 0).all()
    torch.testing.assert_close(phi.sum(-1), torch.full((2, 4, 5), 2.0))  # each half sums to one


def test_feature_dim_and_bad_options():
    assert build_attention("hedgehog", 32, 4, feature_dim=16).feature_k.shape == (4, 8, 16)
    with pytest.raises(ValueError, match="feature_dim=0 must be a positive integer"):
        build_attention("hedgehog", 32, 4, feature_dim=0)
    with pytest.raises(ValueError, match="unknown options length; it takes feature_dim and chunk_size"):
        build_attention("hedgehog", 32, 4, length=3)
