"""Recurrent inference (no KV cache): every causal attention with a state of fixed size runs token by token through
`init_state` / `step`, equal to its causal forward at every position, with a state that does not grow; the text
tower encodes through the steps; every other attention, and any two-sided layer, refuses in one line."""

import pytest
import torch

from models import ModelConfig, build_clip
from models.attention import ATTENTIONS, build_attention, rope

DIM, HEADS = 32, 4
NAMES = sorted(ATTENTIONS)
RECURRENT = [n for n in NAMES if ATTENTIONS[n].supports_recurrent]
REFUSED = [n for n in NAMES if not ATTENTIONS[n].supports_recurrent]
TOL = {torch.float64: 1e-5, torch.float32: 1e-4}


def layer(name, dtype=torch.float64, **options):
    torch.manual_seed(0)
    return build_attention(name, DIM, HEADS, causal=True, **options).to(dtype)


def at(table, t):
    """RoPE's (cos, sin) of position t alone, or None."""
    return None if table is None else (table[0][t : t + 1], table[1][t : t + 1])


def stepped(m, x, table=None):
    """x [B, N, C] through m.step one token at a time -> ([B, N, C], the final state)."""
    state, out = m.init_state(x.shape[0], x.device, x.dtype), []
    for t in range(x.shape[1]):
        y, state = m.step(x[:, t], state, at(table, t))
        out.append(y)
    return torch.stack(out, 1), state


def test_every_finite_state_causal_variant_is_recurrent():
    finite = {"linear_affine", "linear_affine_nodenom", "linear_elu", "retention", "ssd", "gla", "deltanet", "hedgehog"}
    assert set(RECURRENT) == finite


@pytest.mark.parametrize("name", RECURRENT)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("n", [1, 7, 70])  # 70: past the 64- and 16-token chunks, a multiple of neither
@pytest.mark.parametrize("use_rope", [False, True], ids=["plain", "rope"])
def test_step_equals_the_causal_forward(name, dtype, n, use_rope):
    m = layer(name, dtype)
    x = torch.randn(2, n, DIM, dtype=dtype)
    table = rope.text_table(n, DIM // HEADS) if use_rope else None
    with torch.no_grad():
        ys, _ = stepped(m, x, table)
        torch.testing.assert_close(ys, m(x, None, table), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("name", RECURRENT)
def test_step_with_small_chunks_and_qk_norm(name):
    m = layer(name, chunk_size=4)
    m.enable_qk_norm()
    m.double()
    x = torch.randn(1, 13, DIM, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(stepped(m, x)[0], m(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", RECURRENT)
def test_the_state_does_not_grow(name):
    m = layer(name, torch.float32)
    x = torch.randn(2, 30, DIM)
    with torch.no_grad():
        _, after_3 = stepped(m, x[:, :3])
        _, after_30 = stepped(m, x)
    assert [s.shape for s in after_3] == [s.shape for s in after_30]
    assert sum(s.nbytes for s in after_3) == sum(s.nbytes for s in after_30) == sum(s.nbytes for s in m.init_state(2))


def test_softmax_refuses_in_one_line():
    m = layer("softmax")
    for call in (lambda: m.init_state(1), lambda: m.step(torch.randn(1, DIM, dtype=torch.float64), ())):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == "softmax needs its KV cache: no recurrent state"


@pytest.mark.parametrize("name", REFUSED)
def test_every_other_variant_refuses_in_one_line(name):
    with pytest.raises(ValueError, match=name) as err:
        ATTENTIONS[name].check_recurrent(True)
    assert "\n" not in str(err.value) and "no recurrent state" in str(err.value)


@pytest.mark.parametrize("name", [n for n in RECURRENT if ATTENTIONS[n].supports_bidirectional])
def test_a_two_sided_layer_refuses_in_one_line(name):
    m = build_attention(name, DIM, HEADS, causal=False)
    with pytest.raises(ValueError, match="two-sided") as err:
        m.init_state(1)
    assert "\n" not in str(err.value)


def tokens(context=16, eots=(3, 9, 15)):
    """Random caption ids [len(eots), context]: the end-of-text id (the largest) at each row's position, 0 after."""
    torch.manual_seed(1)
    text = torch.randint(1, 49407, (len(eots), context))
    for row, eot in enumerate(eots):
        text[row, eot], text[row, eot + 1 :] = 49407, 0
    return text


@pytest.mark.parametrize("name", RECURRENT)
def test_text_tower_encodes_the_same_features_recurrently(name):
    torch.manual_seed(0)
    model = build_clip(ModelConfig(name="demo-w32", text_attention=name)).eval()
    text = tokens()
    with torch.no_grad():
        torch.testing.assert_close(model.encode_recurrent(text), model.encode_text(text), atol=1e-4, rtol=1e-4)


def test_text_tower_with_rope_qk_norm_layer_scale_and_a_hybrid_stack():
    torch.manual_seed(0)
    cfg = ModelConfig(
        name="demo-w32", text_attention=["gla", "linear_elu"], text_pos_embed="rope", qk_norm=True, layer_scale=0.5
    )
    model = build_clip(cfg).eval()
    text = tokens(eots=(0, 6, 15))
    with torch.no_grad():
        torch.testing.assert_close(model.encode_recurrent(text), model.encode_text(text), atol=1e-4, rtol=1e-4)


def test_text_tower_names_the_layer_without_a_state():
    model = build_clip(ModelConfig(name="demo-w32", text_attention=["linear_elu", "softmax"]))
    with pytest.raises(ValueError) as err:
        model.encode_recurrent(tokens())
    assert str(err.value) == "text tower layer 1: softmax needs its KV cache: no recurrent state"


def test_image_tower_refuses():
    model = build_clip(ModelConfig(name="demo-w32", image_attention="linear_elu", text_attention="linear_elu"))
    with pytest.raises(ValueError, match="layer 0: linear_elu is two-sided here"):
        model.visual.transformer.init_state(1)
