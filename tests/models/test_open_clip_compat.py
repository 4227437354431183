"""With softmax in both towers our CLIP is open_clip's: same keys, strict loading both ways, same outputs."""

import open_clip
import pytest
import torch

import models
from models import create_model


def inputs(name, b=2):
    size = open_clip.get_model_config(name)["vision_cfg"]["image_size"]
    images = torch.randn(b, 3, size, size, generator=torch.Generator().manual_seed(1))
    text = models.tokenizer(name)(["a photo of a cat", "a diagram of a transformer"][:b])
    return images, text


def assert_same_embeddings(a, b, name):
    """Unnormalised image and text embeddings within 1e-5; on tiny sizes the whole forward too."""
    images, text = inputs(name)
    with torch.no_grad():
        assert (a.encode_image(images) - b.encode_image(images)).abs().max() <= 1e-5
        assert (a.encode_text(text) - b.encode_text(text)).abs().max() <= 1e-5
        if name.startswith("tiny"):
            for x, y in zip(a(images, text), b(images, text)):
                assert (x - y).abs().max() <= 1e-5


@pytest.mark.parametrize("name", ["ViT-S-16", "ViT-B-16"])
def test_open_clip_weights_load_strictly_and_give_the_same_embeddings(name):
    theirs = open_clip.create_model(name).eval()
    ours = create_model(name).eval()
    assert set(ours.state_dict()) == set(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict(), strict=True)
    assert_same_embeddings(ours, theirs, name)


@pytest.mark.parametrize("name,suffix", [("tiny-s", ".safetensors"), ("tiny-m", ".pt"), ("ViT-S-16", ".safetensors")])
def test_exported_checkpoint_loads_in_open_clip(name, suffix, tmp_path):
    ours = create_model(name).eval()
    path = models.export_open_clip(ours, tmp_path / f"model{suffix}")
    assert models.read_state_dict(path)["logit_scale"].shape == ()  # open_clip's 0-dim scalar, same key
    theirs = open_clip.create_model(name, pretrained=str(path)).eval()
    assert_same_embeddings(ours, theirs, name)


def test_export_refuses_non_softmax_models(tmp_path):
    other = next((n for n in sorted(models.attention.ATTENTIONS) if n != "softmax"), None)
    if other is None:
        pytest.skip("only softmax is registered")
    with pytest.raises(ValueError, match="open_clip only has softmax attention"):
        models.export_open_clip(create_model("tiny-s", image_attention=other), tmp_path / "x.pt")


def test_open_clip_checkpoint_file_initialises_a_linear_model(tmp_path):
    causal = [n for n, c in sorted(models.attention.ATTENTIONS.items()) if n != "softmax" and c.supports_causal]
    if not causal:
        pytest.skip("no causal non-softmax attention is registered")
    theirs = open_clip.create_model("tiny-s")
    path = tmp_path / "open_clip.pt"
    torch.save({"epoch": 1, "state_dict": {"module." + k: v for k, v in theirs.state_dict().items()}}, path)
    model = models.build_clip(
        models.ModelConfig(name="tiny-s", image_attention=causal[0], text_attention=causal[0], pretrained=str(path))
    )
    sd, own = theirs.state_dict(), model.state_dict()
    assert set(sd) <= set(own)  # a linear variant keeps every softmax weight (and may add its own)
    for key, value in sd.items():
        # open_clip's 0-dim logit_scale arrives as our [1]
        torch.testing.assert_close(own[key], value.reshape(own[key].shape), rtol=0, atol=0, msg=key)
    assert sd["logit_scale"].shape == () and own["logit_scale"].shape == (1,)
